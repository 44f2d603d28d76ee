"""Small real sweeps through the ray_actor launcher: MLflow runs, Parquet table, failures."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from sweep.recorder import RESULTS_FILE, read_results_table
from sweep.summarize import main as summarize_main
from tests.sweep_helpers import run_sweep

ray = pytest.importorskip("ray")

pytestmark = [
    pytest.mark.ray,
    pytest.mark.usefixtures("ray_session"),
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]

REQUIRED_METRICS = (
    "ttft_ms_p99", "tpot_ms_p99", "itl_ms_p99", "e2el_ms_p99", "ttft_ms_median",
    "request_throughput", "output_throughput", "goodput_rps", "slo_attainment_pct",
    "kv_usage_pct_max", "num_preemptions", "prefix_hit_rate", "makespan_s", "job_wall_s",
)


def children(client: MlflowClient, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    kids = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, kids


def test_small_sweep_logs_runs_and_writes_the_results_table(tmp_path, store):
    sweep_dir = tmp_path / "sweep"
    returns = run_sweep(sweep_dir, [
        "+experiment=mem_util_grid",
        "cluster.gpu_memory_utilization=0.5,0.9",
        "workload.rate=1,3",
        "workload.num_requests=80",
        f"tracking.uri={store}",
    ])
    assert len(returns) == 4
    swept = [
        {k: v for k, v in (o.split("=", 1) for o in r.overrides)
         if k in ("cluster.gpu_memory_utilization", "workload.rate")}
        for r in returns
    ]
    assert swept == [
        {"cluster.gpu_memory_utilization": u, "workload.rate": r}
        for u in ("0.5", "0.9") for r in ("1", "3")
    ]
    assert [r.return_value["metrics"]["completed"] for r in returns] == [80] * 4

    client = MlflowClient(store)
    parents, kids = children(client, "mem_util_grid")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["failed_jobs"] == "0"
    assert len(kids) == 4
    assert {k.data.tags["mlflow.parentRunId"] for k in kids} == {parents[0].info.run_id}
    for kid in kids:
        assert kid.info.status == "FINISHED"
        missing = [m for m in REQUIRED_METRICS if m not in kid.data.metrics]
        assert not missing, missing
        assert kid.data.params["model.name"] == "meta-llama/Llama-3.1-8B"
        assert kid.data.params["hardware.name"] == "L40S"
        assert kid.data.metrics["completed"] == 80
        series = client.get_metric_history(kid.info.run_id, "ts/running")
        assert len(series) >= 10 and len({m.step for m in series}) == len(series)
        artifacts = {a.path for a in client.list_artifacts(kid.info.run_id)}
        assert {"requests.parquet", "config_resolved.yaml", "timeseries.svg"} <= artifacts

    table, meta = read_results_table(sweep_dir / RESULTS_FILE)
    assert meta["study"]["name"] == "mem_util_grid"
    assert meta["parent_run_id"] == parents[0].info.run_id
    assert list(table["job"]) == [0, 1, 2, 3]
    assert (table["status"] == "finished").all()
    assert list(table["cluster.gpu_memory_utilization"]) == [0.5, 0.5, 0.9, 0.9]
    assert list(table["workload.rate"]) == [1.0, 3.0, 1.0, 3.0]
    # the table and MLflow hold the same numbers
    by_run = {k.info.run_id: k for k in kids}
    for _, row in table.iterrows():
        assert by_run[row["mlflow_run_id"]].data.metrics["ttft_ms_p99"] == pytest.approx(row["ttft_ms_p99"])
    # less memory -> fewer KV blocks; more load -> higher throughput
    assert table.loc[0, "kv_num_blocks"] < table.loc[2, "kv_num_blocks"]
    assert table.loc[3, "request_throughput"] > table.loc[2, "request_throughput"]
    requests = pd.read_parquet(Path(table.loc[0, "output_dir"]) / "requests.parquet")
    assert len(requests) == 80 and "token_times_ns" in requests

    out = tmp_path / "plot.svg"
    assert summarize_main([str(sweep_dir), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    assert (sweep_dir / "study.svg").is_file()  # the sweep drew its own
    with pytest.raises(SystemExit, match="ending in .svg"):
        summarize_main([str(sweep_dir), "--out", str(tmp_path / "plot.png")])


def test_an_infeasible_point_is_recorded_not_run_and_not_a_failure(tmp_path, store):
    sweep_dir = tmp_path / "sweep"
    returns = run_sweep(sweep_dir, [
        "cluster.max_model_len=1024,32768",  # 1024 is too short for ShareGPT-like requests
        "workload.num_requests=40",
        "tracking.experiment=infeasible",
        f"tracking.uri={store}",
    ])
    values = [r.return_value for r in returns]
    assert values[0]["status"] == "infeasible" and "max_model_len=1024" in values[0]["reason"]
    assert "metrics" in values[1]
    client = MlflowClient(store)
    parents, kids = children(client, "infeasible")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["infeasible_jobs"] == "1"
    assert parents[0].data.tags["failed_jobs"] == "0"
    by_job = {k.data.tags["job_num"]: k for k in kids}
    assert {j: k.info.status for j, k in by_job.items()} == {"0": "FINISHED", "1": "FINISHED"}
    assert by_job["0"].data.tags["status"] == "infeasible"
    assert "max_model_len" in by_job["0"].data.tags["infeasible_reason"]
    table, _ = read_results_table(sweep_dir / RESULTS_FILE)
    assert list(table["status"]) == ["infeasible", "finished"]
    assert (sweep_dir / "0" / "infeasible.txt").is_file()
    # a rerun reuses the infeasible answer, as it does a finished point
    again = run_sweep(sweep_dir, ["cluster.max_model_len=1024,32768", "workload.num_requests=40",
                                  "tracking.experiment=infeasible", f"tracking.uri={store}"])
    assert again[0].return_value["status"] == "infeasible"
    assert len(children(client, "infeasible")[1]) == 2


def test_a_point_failing_at_run_time_exits_non_zero_after_the_others_finish(tmp_path, store):
    """Without the preflight (``hydra.launcher.validator=null``) the too-short max_model_len
    fails inside its job: recorded FAILED with the error, the other point finishes, and the
    sweep exits non-zero."""
    sweep_dir = tmp_path / "sweep"
    with pytest.raises(SystemExit, match="1 of 2 jobs failed"):
        run_sweep(sweep_dir, [
            "cluster.max_model_len=1024,32768", "workload.num_requests=40",
            "tracking.experiment=failing", f"tracking.uri={store}",
            "hydra.launcher.validator=null",
        ])
    client = MlflowClient(store)
    parents, kids = children(client, "failing")
    assert len(parents) == 1 and parents[0].info.status == "FAILED"
    assert parents[0].data.tags["failed_jobs"] == "1"
    status = {k.data.tags["job_num"]: k.info.status for k in kids}
    assert status == {"0": "FAILED", "1": "FINISHED"}
    failed = next(k for k in kids if k.data.tags["job_num"] == "0")
    assert "error.txt" in {a.path for a in client.list_artifacts(failed.info.run_id)}
    table, _ = read_results_table(sweep_dir / RESULTS_FILE)
    assert list(table["status"]) == ["failed", "finished"]
    assert "max_model_len" in table.loc[0, "error"] and "Traceback" in table.loc[0, "error"]
    assert table.loc[1, "completed"] == 40
