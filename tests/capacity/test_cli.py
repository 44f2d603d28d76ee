"""``python -m sweep.capacity`` end to end: probes on a Ray pool, MLflow runs (study, one per
configuration, probes as their children, fleet sizing), files, and a rerun from the probe
cache. Bad settings stop the command before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[2]


def _env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env["PYTHONPATH"] = str(REPO)
    env["SERVESWEEP_CACHE"] = str(workdir / "servesweep-cache")  # own bundles and probes
    return env


def _run(workdir: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sweep.capacity", "+experiment=capacity_search", *overrides]
    return subprocess.run(cmd, cwd=workdir, env=_env(workdir), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
def test_cli_capacity_search_on_ray_with_mlflow(tmp_path):
    args = ("hydra.sweeper.params.hardware='h100_sxm,l40s'", "cluster.tensor_parallel_size=1",
            "workload.num_requests=300",
            "capacity.target_rate=20", "capacity.pool.num_actors=2")
    done = _run(tmp_path, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    (out,) = (tmp_path / "outputs" / "capacity_search").iterdir()
    answers = pd.read_parquet(out / "capacity.parquet")
    probes = pd.read_parquet(out / "probes.parquet")
    assert list(answers["config"]) == ["h100_sxm", "l40s"]
    assert (answers["status"] == "converged").all() and (answers["rel_gap"] <= 0.02 + 1e-9).all()
    assert (answers["probes"] <= 12).all() and len(probes) == answers["probes"].sum()
    assert (answers["usd_per_hour"] == [2.99, 0.86]).all()
    fleet = pd.read_parquet(out / "fleet.parquet")
    assert fleet["rank"].iloc[0] == 1 and fleet["capacity_rps"].iloc[0] >= 20
    assert (fleet["verify_router"].head(3).dropna() == "least_loaded").all()  # checked as clusters
    assert fleet["verified"].head(min(3, len(fleet))).notna().all()
    meta = json.loads((out / "study.json").read_text())
    assert meta["pool_size"] == 2 and meta["probes_simulated"] == len(probes)
    for name in ("report.html", "plots/pareto.png", "plots/latency_h100_sxm.png"):
        assert (out / name).is_file(), name

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("capacity_search")
    runs = client.search_runs([exp.experiment_id], max_results=500)
    kinds: dict[str, list] = {}
    for run in runs:
        kinds.setdefault(run.data.tags.get("kind"), []).append(run)
    (parent,) = kinds["capacity_search"]
    configs, fleet_runs = kinds["capacity_config"], kinds["fleet_sizing"]
    assert len(configs) == 2 and len(fleet_runs) == 1
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in configs)
    config_ids = {r.info.run_id for r in configs}
    assert len(kinds["capacity_probe"]) == len(probes)
    assert all(r.data.tags["mlflow.parentRunId"] in config_ids for r in kinds["capacity_probe"])
    for run in configs:
        for key in ("max_rate", "goodput_rps", "num_gpus", "usd_per_hour",
                    "usd_per_m_output_tokens", "ttft_ms_p99"):
            assert key in run.data.metrics, key
        # the study's SLO, logged as bounds (not the sweep default's)
        assert run.data.params["slo.ttft_ms_p99.bound"] == "1000.0"
        row = answers[answers["config"] == run.data.tags["config"]].iloc[0]
        assert run.data.metrics["usd_per_m_output_tokens"] == pytest.approx(
            row["usd_per_m_output_tokens"], rel=1e-12)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.html", "capacity.parquet", "pareto.png"} <= artifacts

    again = _run(tmp_path, *args, "tracking.uri=null")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{len(probes)} probes (0 simulated" in again.stdout


@pytest.mark.parametrize(("override", "needle"), [
    ("+slo.bounds.ttft_p99=5", "slo.bounds.ttft_p99=5.0 is not an SLO bound"),
    ("capacity.tolerance=0", "capacity.tolerance=0"),
    ("cluster.tensor_parallel_size=3", "cluster.tensor_parallel_size=3 is not allowed"),
    ("capacity.router=nearest", "capacity.router='nearest' is not allowed"),
])
def test_cli_bad_settings_stop_before_running(tmp_path, override, needle):
    done = _run(tmp_path, override, "tracking.uri=null", timeout=120)
    assert done.returncode != 0
    assert needle in done.stderr and "nothing was run" in done.stderr
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
@pytest.mark.ray
def test_ray_probe_pool_times_out_and_replaces_the_actor(monkeypatch):
    """An overdue probe is reported as failed, its actor replaced, and the pool goes on."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from capacity.pool import RayProbePool
    from capacity.schema import register

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["workload.num_requests=40", "workload.rate=4"])
    point = OmegaConf.to_container(cfg, resolve=True)
    point.pop("capacity")
    slow = {**point, "workload": {**point["workload"], "num_requests": 5000}}  # seconds, not ms
    pool = RayProbePool(1, probe_timeout_s=0.01)
    try:
        pool.submit("slow", slow)
        done = pool.next_done()
        assert done.key == "slow" and "timed out" in done.error
        pool.probe_timeout_s = 300.0
        pool.submit("ok", point)
        done = pool.next_done()
        assert done.error is None and done.value["passed"] in (True, False)
        assert done.value["metrics"]["completed"] == 40
    finally:
        pool.close()
