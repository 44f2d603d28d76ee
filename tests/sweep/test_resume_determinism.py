"""Determinism and resume of real sweeps (``sweep.app`` on the ray_actor launcher).

* Determinism: a point's metrics are a pure function of its composed config. The same grid
  run in two orders on different numbers of actors, and one point run in this process
  without Ray, give bit-identical metrics (wall-clock timings aside) and per-request tables,
  matched by the ``config_hash`` that both the MLflow run and the Parquet row carry.
* Resume: rerunning a sweep skips every point whose hash has a ``FINISHED`` run in the
  store and runs the rest, so each point ends with exactly one finished run;
  ``hydra.launcher.resume=false`` runs everything again.
* A driver killed with SIGKILL, or stopped with Ctrl-C, mid-sweep loses no finished point:
  the rerun resumes them.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from mlflow.tracking import MlflowClient

from sweep.config_hash import HASH_KEY, point_hash
from sweep.recorder import task_config
from sweep.resume import finished_counts
from tests.store_helpers import finished_points
from tests.sweep.hold_jobs import held_jobs, hold_overrides
from tests.sweep_helpers import run_sweep, sweep_env, table

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]
WALL_CLOCK = ("sim_wall_s", "job_wall_s")  # host timings: the only metrics allowed to differ
POINT = ["+experiment=mem_util_grid", "workload.num_requests=60", "tracking.plots=false"]


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def metrics_by_hash(frame: pd.DataFrame, names: list[str]) -> dict[str, dict[str, float]]:
    return {row[HASH_KEY]: {n: row[n] for n in names} for _, row in frame.iterrows()}


def experiment_id(store: str, name: str) -> tuple[MlflowClient, str]:
    client = MlflowClient(store)
    return client, client.get_experiment_by_name(name).experiment_id


@pytest.mark.usefixtures("ray_session")
def test_same_point_same_metrics_whatever_the_order_or_actor(tmp_path, store):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    run_sweep(a_dir, [*POINT, "workload.rate=1,2,4", "cluster.gpu_memory_utilization=0.5,0.9",
                      "hydra.launcher.num_actors=2", "hydra.launcher.resume=false",
                      f"tracking.uri={store}"])
    run_sweep(b_dir, [*POINT, "workload.rate=4,2,1", "cluster.gpu_memory_utilization=0.9,0.5",
                      "hydra.launcher.num_actors=1", "hydra.launcher.resume=false",
                      f"tracking.uri={store}"])
    a, b = table(a_dir), table(b_dir)
    assert (a.status == "finished").all() and (b.status == "finished").all()
    assert a[HASH_KEY].is_unique and set(a[HASH_KEY]) == set(b[HASH_KEY])
    names = [c for c in a.columns if c in b.columns and pd.api.types.is_float_dtype(a[c])
             and c not in WALL_CLOCK and not c.startswith(("cluster.", "workload.", "slo.",
                                                           "hardware.", "model."))]
    assert len(names) > 30
    ma, mb = metrics_by_hash(a, names), metrics_by_hash(b, names)
    for key in ma:
        diff = {n: (ma[key][n], mb[key][n]) for n in names if not same(ma[key][n], mb[key][n])}
        assert not diff, f"point {key} differs between runs: {diff}"
    # the per-request tables too
    for key in ma:
        ra = pd.read_parquet(Path(a.set_index(HASH_KEY).loc[key, "output_dir"]) / "requests.parquet")
        rb = pd.read_parquet(Path(b.set_index(HASH_KEY).loc[key, "output_dir"]) / "requests.parquet")
        pd.testing.assert_frame_equal(ra, rb, check_exact=True)
    # the MLflow runs carry the same hash as tag and param, and the same numbers
    client, exp = experiment_id(store, "mem_util_grid")
    assert finished_counts(client, exp) == {k: 2 for k in ma}  # resume off: each ran twice
    kids = [r for r in client.search_runs([exp], max_results=100)
            if "mlflow.parentRunId" in r.data.tags]
    assert len(kids) == 2 * len(ma)
    for run in kids:
        key = run.data.tags[HASH_KEY]
        assert run.data.params[HASH_KEY] == key
        assert run.data.metrics["ttft_ms_p99"] == ma[key]["ttft_ms_p99"]
    # and a point run in this process, without Ray, hashes and simulates the same
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*POINT, "workload.rate=2",
                                           "cluster.gpu_memory_utilization=0.9"])
    GlobalHydra.instance().clear()
    from sweep.job import run_point

    key = point_hash(task_config(cfg))
    local = run_point(cfg)["metrics"]
    assert all(same(local[n], ma[key][n]) for n in names if n in local)


@pytest.mark.usefixtures("ray_session")
def test_rerun_skips_finished_points_and_runs_the_rest(tmp_path, store):
    point = [*POINT, "cluster.gpu_memory_utilization=0.9", f"tracking.uri={store}"]
    run_sweep(tmp_path / "first", [*point, "workload.rate=1,2"])
    client, exp = experiment_id(store, "mem_util_grid")
    first = table(tmp_path / "first")
    returns = run_sweep(tmp_path / "second", [*point, "workload.rate=1,2,3,4"])
    second = table(tmp_path / "second")
    assert (second.status == "finished").all() and len(second) == 4
    resumed = second[second["resumed_from"].notna()]
    assert sorted(resumed["workload.rate"]) == [1.0, 2.0]
    # the resumed rows point at the first sweep's runs and carry its numbers
    by_hash = first.set_index(HASH_KEY)
    for _, row in resumed.iterrows():
        assert row["resumed_from"] == by_hash.loc[row[HASH_KEY], "mlflow_run_id"]
        assert row["ttft_ms_p99"] == by_hash.loc[row[HASH_KEY], "ttft_ms_p99"]
        assert row["mlflow_run_id"] == row["resumed_from"]
    assert [r.return_value["metrics"]["completed"] for r in returns] == [60] * 4
    counts = finished_counts(client, exp)
    assert len(counts) == 4 and set(counts.values()) == {1}  # exactly once each
    # opt out: resume=false runs the point again
    run_sweep(tmp_path / "third", [*point, "workload.rate=1", "hydra.launcher.resume=false"])
    again = table(tmp_path / "third")
    assert again["resumed_from"].isna().all() if "resumed_from" in again else True
    assert finished_counts(client, exp)[again.loc[0, HASH_KEY]] == 2


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "Ctrl-C"])
def test_an_interrupted_driver_loses_no_finished_point(tmp_path, sig):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "sweep", "+experiment=mem_util_grid",
           "workload.num_requests=400", "workload.rate=1,2,3,4,5,6", "tracking.plots=false",
           "cluster.gpu_memory_utilization=0.9", "hydra.launcher.num_actors=1",
           "hydra.launcher.progress=false"]
    # Jobs 2.. wait for a file that never comes: the signal lands with two points finished
    # and the third in flight, however fast the engine is.
    release = tmp_path / "release"
    log = tmp_path / "driver.log"
    with log.open("w") as out_file:
        driver = subprocess.Popen([*cmd, *hold_overrides(release, 2), "-m"], cwd=tmp_path,
                                  env=sweep_env(), start_new_session=True,
                                  stdout=out_file, stderr=subprocess.STDOUT)
    finished_before = 0
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.2)
            finished_before = finished_points(tmp_path / "mlflow.db")
            if finished_before >= 2 and 2 in held_jobs(release):
                break
        if driver.poll() is None:
            os.killpg(driver.pid, sig)  # the driver (and, for SIGKILL, the Ray it started)
        driver.wait(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # whatever of this group is left
        driver.wait(timeout=60)
    expected = -signal.SIGKILL if sig == signal.SIGKILL else 130
    assert driver.returncode == expected, log.read_text()[-3000:]
    assert finished_before == 2, log.read_text()[-3000:]
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("mem_util_grid").experiment_id
    before = finished_counts(client, exp)
    out = subprocess.run([*cmd, "-m"], cwd=tmp_path, env=sweep_env(), capture_output=True,
                         text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    after = finished_counts(client, exp)
    assert len(after) == 6 and set(after.values()) == {1}  # every point exactly once
    assert set(before) <= set(after)
    rerun = table(max((tmp_path / "multirun" / "mem_util_grid").iterdir()))
    assert int(rerun["resumed_from"].notna().sum()) == len(before)
