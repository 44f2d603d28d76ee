"""Point content hash (``sweep.config_hash``) and the finished-run index (``sweep.resume``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose

from sweep.config_hash import HASH_KEY, point_hash
from sweep.recorder import task_config
from sweep.resume import FinishedIndex, finished_counts
from sweep.schema import register

CONF = Path(__file__).resolve().parents[2] / "conf"
register()
pytestmark = [
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
    pytest.mark.usefixtures("hydra_conf"),
]




def h(*overrides: str) -> str:
    return point_hash(task_config(compose("config", overrides=list(overrides))))


def test_hash_is_canonical():
    base = h()
    assert h() == base
    assert h("workload.rate=4") == h("workload.rate=4.0") == base  # 4 (default) in a float field
    point = task_config(compose("config"))
    reordered = dict(reversed(list(point.items())))
    reordered["cluster"] = dict(reversed(list(point["cluster"].items())))
    assert point_hash(reordered) == base


@pytest.mark.parametrize("override", [
    "workload.seed=1", "workload.rate=4.5", "workload.num_requests=201", "cluster.block_size=32",
    "cluster.gpu_memory_utilization=0.8", "cluster.async_scheduling=false", "hardware=a100_80g",
    "model=qwen3_32b", "slo.bounds.ttft_ms_p99=1000", "cluster.enable_prefix_caching=false",
    "workload.input_len=64", "hardware.bundle.variant=bf16-kvfp8",
])
def test_every_simulated_value_changes_the_hash(override):
    assert h(override) != h()


@pytest.mark.parametrize("override", [
    "tracking.uri=null", "tracking.plots=false", "study.name=other", "tracking.experiment=x",
    "study.description=words",
])
def test_bookkeeping_does_not_change_the_hash(override):
    assert h(override) == h()


def test_trace_file_content_is_part_of_the_hash(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 0}\n')
    first = h("workload=trace", f"workload.path={trace}")
    trace.write_text('{"input_toks": 4, "output_toks": 2, "arrival_time_ns": 0}\n')
    assert h("workload=trace", f"workload.path={trace}") != first


def test_hash_is_the_same_in_other_processes_with_other_hash_seeds():
    """Two fresh processes (this one's ConfigStore may hold another test's schema extension)."""
    code = (
        "from hydra import compose, initialize_config_dir\n"
        "from sweep.schema import register\n"
        "from sweep.recorder import task_config\n"
        "from sweep.config_hash import point_hash\n"
        "register()\n"
        f"with initialize_config_dir(config_dir={str(CONF)!r}, version_base='1.3'):\n"
        "    print(point_hash(task_config(compose('config', overrides=['workload.seed=9']))))\n"
    )
    hashes = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout.strip()
        for seed in ("1", "12345")
    ]
    assert len(hashes[0]) == 24 and hashes[0] == hashes[1]
    assert hashes[0] != h("workload.seed=8")


def test_finished_index_trusts_only_finished_runs_and_the_earliest(tmp_path):
    from sweep.tracking import Tracker

    tr = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "resume-index")
    ids = {}
    for name, key, status in [("a1", "aaa", "FINISHED"), ("b", "bbb", "FAILED"),
                              ("c", "ccc", "RUNNING"), ("a2", "aaa", "FINISHED"),
                              ("nohash", None, "FINISHED")]:
        tags = {HASH_KEY: key} if key else {}
        ids[name] = tr.create_run(name, {**tags, "output_dir": f"/out/{name}"})
        tr.log_metrics(ids[name], {"ttft_ms_p99": float(len(ids)), "completed": 5.0})
        tr.log_series(ids[name], {"running": [1.0, 2.0]}, [1, 2])
        if status != "RUNNING":
            tr.finish(ids[name], status)
        time.sleep(0.01)  # distinct start times
    index = FinishedIndex.load(tr.client, tr.experiment_id)
    assert len(index) == 1 and index.get("bbb") is None and index.get("ccc") is None
    got = index.get("aaa")
    assert got is not None and got.run_id == ids["a1"] and got.output_dir == "/out/a1"
    assert got.metrics == {"ttft_ms_p99": 1.0, "completed": 5.0}  # no ts/ series
    assert got.result()["resumed_from"] == ids["a1"]
    assert finished_counts(tr.client, tr.experiment_id) == {"aaa": 2}
