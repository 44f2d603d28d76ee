"""One grid point without Ray: the job glue, its answers, the recorder and a single CLI run."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobReturn, JobStatus
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from sweep import job
from sweep.recorder import RESULTS_FILE, SweepRecorder, read_results_table
from sweep.schema import register
from sweep.summarize import main as summarize_main

REPO = Path(__file__).resolve().parents[2]
register()

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


@pytest.fixture(scope="module")
def small_cfg():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["workload.num_requests=40", "workload.rate=4"])
    GlobalHydra.instance().clear()
    return cfg


@pytest.fixture(scope="module")
def small_result(small_cfg):
    return job.run_point(small_cfg)


def test_run_point_answers_come_from_the_one_ledger(small_cfg, small_result):
    """Metrics, SLO verdict, goodput and cost of a point are ``analysis.answers`` of its
    per-request frame under the config's ``slo``: recomputing them gives the same numbers."""
    from analysis.answers import point_answers
    from analysis.slo import SloSpec

    m = small_result["metrics"]
    requests = pd.read_parquet(io.BytesIO(small_result["requests_parquet"]))
    again = point_answers(requests, SloSpec.from_config(small_cfg.slo), m["usd_per_hour"],
                          int(m["num_gpus"]))
    assert {k: m[k] for k in again.metrics} == again.metrics
    params = dict(small_result["params"])
    assert params.pop("comm_source") == job.point_comm_source(small_cfg)
    assert params == {"slo.ttft_ms_p99.bound": 2000.0,
                      "slo.tpot_ms_p99.bound": 100.0,
                      "slo.goodput.ttft_ms.bound": 2000.0,
                      "slo.goodput.tpot_ms.bound": 100.0,
                      "bundle_source": "roofline"}
    assert m["slo_met"] == 1.0 and m["ttft_ms_p99"] <= 2000
    assert m["usd_per_m_output_tokens"] == pytest.approx(
        m["usd_per_hour"] / (m["good_output_tok_s"] * 3600) * 1e6)
    assert not any(k.startswith(("slo.", "slo_ttft", "slo_tpot")) for k in m)


def test_run_point_returns_plain_metrics_series_and_requests(small_cfg, small_result):
    m = small_result["metrics"]
    assert m["completed"] == 40
    assert all(isinstance(v, float) for v in m.values())
    for key in ("ttft_ms_p99", "tpot_ms_p99", "itl_ms_p99", "e2el_ms_p99", "goodput_rps",
                "kv_usage_pct_max", "num_preemptions", "prefix_hit_rate", "makespan_s",
                "sim_wall_s", "job_wall_s", "usd_per_m_output_tokens", "kv_num_blocks"):
        assert key in m, key
    assert 0 < m["goodput_rps"] <= m["request_throughput"] + 1e-9
    assert m["makespan_s"] > 40 / 4 * 0.5  # 40 requests at 4 req/s take seconds, not ms
    series = small_result["timeseries"]
    assert set(series) >= {"t_s", "running", "waiting", "kv_usage_pct", "gen_throughput"}
    assert len(series["t_s"]) == pytest.approx(m["makespan_s"], abs=2)
    requests = pd.read_parquet(io.BytesIO(small_result["requests_parquet"]))
    assert len(requests) == 40 and requests["finish_ns"].min() > 0


def test_caches_stay_warm_across_points(small_cfg, small_result):
    # Points of one cluster shape share the latency model (its memo stays warm) but never the
    # prefix-cache pools, which hold the previous point's KV.
    a = OmegaConf.merge(small_cfg, {"cluster": {"gpu_memory_utilization": 0.7,
                                                "prefix_storage": "cpu"}})
    b = OmegaConf.merge(a, {"cluster": {"gpu_memory_utilization": 0.5}})
    dep_a, dep_b = job.point_cluster_of(a), job.point_cluster_of(b)
    assert dep_a.instances[0].latency is dep_b.instances[0].latency
    assert dep_a.instances[0].tiers[0] is not dep_b.instances[0].tiers[0]
    assert dep_b.instances[0].capacity.num_blocks < dep_a.instances[0].capacity.num_blocks
    result = job.run_point(OmegaConf.merge(small_cfg, {"cluster": {"gpu_memory_utilization": 0.5}}))
    assert result["metrics"]["kv_num_blocks"] < small_result["metrics"]["kv_num_blocks"]


def test_limits_beyond_the_profiled_range_are_logged_once_per_point(small_cfg, caplog):
    # the roofline bundle is generated for max_num_batched_tokens <= 2048 (profiles.roofline.grid)
    quick = {"workload": {"num_requests": 4, "input_len": 64, "output_len": 4}}
    wide = OmegaConf.merge(small_cfg, quick, {"cluster": {
        "max_num_batched_tokens": 4096, "num_instances": 2}})
    for _ in range(2):  # a warm actor runs the next point with cached instances: warned again
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sweep.job"):
            job.run_point(wide)
        warned = [r.getMessage() for r in caplog.records if r.name == "sweep.job"]
        assert len(warned) == 1, warned  # one message for the point, not one per instance
        assert "max_num_batched_tokens 4096 > profiled 2048" in warned[0]
        assert "extrapolate" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sweep.job"):
        job.run_point(OmegaConf.merge(small_cfg, quick))
    assert not [r for r in caplog.records if r.name == "sweep.job"]


def test_prefix_sharing_workload_hits_the_prefix_cache(small_cfg):
    shared = OmegaConf.merge(small_cfg, {"workload": {"shared_prefix_len": 512, "num_prefix_groups": 2}})
    on = job.run_point(shared)["metrics"]
    off = job.run_point(OmegaConf.merge(shared, {"cluster": {"enable_prefix_caching": False}}))["metrics"]
    assert on["prefix_hit_rate"] > 0.1
    assert off["prefix_hit_rate"] == 0.0


def test_single_run_recorder_writes_a_top_level_run_and_table(small_cfg, small_result, tmp_path,
                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = OmegaConf.merge(small_cfg, {"tracking": {"uri": uri}})
    rec = SweepRecorder(cfg, tmp_path / "out", num_jobs=1, nested=False)
    rec.start()
    rec.job_done(0, cfg, JobReturn(status=JobStatus.COMPLETED, _return_value=dict(small_result)))
    rec.close("FINISHED")

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("default")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and "mlflow.parentRunId" not in runs[0].data.tags
    assert runs[0].data.metrics["completed"] == 40
    assert runs[0].data.params["cluster.gpu_memory_utilization"] == "0.9"
    table, meta = read_results_table(tmp_path / "out" / RESULTS_FILE)
    assert len(table) == 1 and table.loc[0, "status"] == "finished"
    assert table.loc[0, "ttft_ms_p99"] == pytest.approx(small_result["metrics"]["ttft_ms_p99"])
    assert meta["parent_run_id"] is None and meta["study"]["name"] == "default"
    assert (tmp_path / "out" / "requests.parquet").is_file()
    assert summarize_main([str(tmp_path / "out"), "--no-plot"]) == 0


def test_summarize_explains_a_missing_table(tmp_path):
    with pytest.raises(SystemExit, match="no results table"):
        summarize_main([str(tmp_path)])


def test_cli_single_run_and_a_clean_config_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": ""}
    base = [sys.executable, "-m", "sweep", "workload.num_requests=20", "tracking.uri=null"]
    ok = subprocess.run(base, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert ok.returncode == 0, ok.stderr[-2000:]
    tables = list((tmp_path / "outputs").rglob(RESULTS_FILE))
    assert len(tables) == 1 and not (tmp_path / "mlflow.db").exists()
    bad = subprocess.run(base + ["cluster.gpu_memory_utilization=1.5"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=180)
    assert bad.returncode == 1
    assert "cluster.gpu_memory_utilization=1.5 is not allowed; allowed: 0 < value <= 1" in bad.stderr
    assert "Traceback" not in bad.stderr


# ------------------------------------------------------------- with the reference data
@pytest.mark.groundtruth
def test_trace_workload_replays_the_reference_jsonl(small_cfg, shared_data):
    trace = shared_data / "llmservingsim" / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"
    cfg = OmegaConf.merge(small_cfg, {"workload": {"kind": "trace", "path": str(trace), "limit": 30}})
    metrics = job.run_point(cfg)["metrics"]
    assert metrics["completed"] == 30


@pytest.mark.groundtruth
def test_groundtruth_run_carries_the_simulators_metric_names(small_result, shared_data, tmp_path,
                                                             monkeypatch):
    from sweep.groundtruth import log_groundtruth_run
    from sweep.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "gt")
    gt_dir = shared_data / "llmservingsim" / "groundtruth" / "RTXPRO6000" / "Llama-3.1-8B"
    slo = OmegaConf.create({"bounds": {"ttft_ms_p99": 2000, "tpot_ms_p99": 100},
                            "goodput": {"ttft_ms": 2000, "tpot_ms": 100}})
    run_id, metrics = log_groundtruth_run(tracker, str(gt_dir), slo, parent_id=None,
                                           max_steps=None)
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.tags["source"] == "vllm" and run.info.status == "FINISHED"
    shared = {"ttft_ms_p99", "tpot_ms_p99", "e2el_ms_p99", "request_throughput", "goodput_rps",
              "slo_met", "slo_attainment_pct"}
    assert shared <= set(run.data.metrics) and shared <= set(small_result["metrics"])
    assert run.data.params["slo.ttft_ms_p99.bound"] == "2000.0"
    assert metrics["completed"] == 300
    history = MlflowClient(uri).get_metric_history(run_id, "ts/running")
    assert len(history) > 10
    # bounded as the simulated runs' series are: means over bins, the last step kept
    short_id, _ = log_groundtruth_run(tracker, str(gt_dir), slo, parent_id=None, max_steps=8)
    short = MlflowClient(uri).get_metric_history(short_id, "ts/running")
    assert len(short) == 8 < len(history)
    assert max(m.step for m in short) == max(m.step for m in history)
    # the simulated runs' param names, so the MLflow UI compares like with like
    assert run.data.params["cluster.max_num_seqs"] == str(small_result_params_max_num_seqs())
    assert run.data.params["hardware.name"] == "RTXPRO6000"
    assert run.data.params["model.name"] == "meta-llama/Llama-3.1-8B"
    # LLMServingSim's recorder read a missing attribute: kv_cache_pct is 0 in every row
    assert "kv_usage_pct" in run.data.tags["missing_series"]
    assert MlflowClient(uri).get_metric_history(run_id, "ts/kv_usage_pct") == []
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.type"] == "LOCAL"


def small_result_params_max_num_seqs() -> int:
    return 128  # the Llama ground truth's engine_kwargs.max_num_seqs
