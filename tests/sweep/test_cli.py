"""End to end through the command line: ``python -m sweep ... -m`` in a fresh directory,
and Ctrl-C in the middle of a sweep. Each test starts its own Ray, so both are slow."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweep.recorder import RESULTS_FILE, read_results_table
from tests.sweep.hold_jobs import hold_overrides
from tests.sweep_helpers import sweep_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]


def _runs(workdir: Path, experiment: str):
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], max_results=200)


def test_cli_study_fills_mlflow_and_the_results_table(tmp_path):
    cmd = [sys.executable, "-m", "sweep", "+experiment=mem_util_grid",
           "cluster.gpu_memory_utilization=0.6,0.9", "workload.rate=1,2,3",
           "workload.num_requests=60", "-m"]
    done = subprocess.run(cmd, cwd=tmp_path, env=sweep_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "6/6" in done.stderr  # the progress bar reached the end
    runs = _runs(tmp_path, "mem_util_grid")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    kids = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(kids) == 6
    assert all(k.info.status == "FINISHED" for k in kids)
    (table_path,) = (tmp_path / "multirun" / "mem_util_grid").glob(f"*/{RESULTS_FILE}")
    table, _ = read_results_table(table_path)
    assert len(table) == 6 and (table["status"] == "finished").all()
    summary = subprocess.run([sys.executable, "-m", "sweep.summarize", str(table_path.parent)],
                             cwd=tmp_path, env=sweep_env(), capture_output=True, text=True, timeout=120)
    assert summary.returncode == 0, summary.stderr
    assert "study mem_util_grid: 6 points, 0 failed" in summary.stdout
    assert (table_path.parent / "study.svg").is_file()


def test_ctrl_c_stops_the_sweep_and_its_ray(tmp_path):
    # jobs 2.. are held (tests/sweep/hold_jobs.py): Ctrl-C lands with jobs in flight
    cmd = [sys.executable, "-m", "sweep", "+experiment=mem_util_grid",
           "workload.num_requests=400", *hold_overrides(tmp_path / "release", 2), "-m"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=sweep_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
        # a non-interactive shell's children ignore SIGINT; restore the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 180
        seen = ""
        fd = proc.stdout.fileno()
        while "ok=1" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:  # raw reads: the progress bar redraws with "\r", no newline follows
                chunk = os.read(fd, 65536)
                if not chunk:  # the sweep closed its output: "ok=1" can no longer come
                    break
                seen += chunk.decode(errors="replace")
        assert "ok=1" in seen, seen[-2000:]
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 30
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(2)
    left = subprocess.run(["ps", "-o", "pid=", "-g", str(proc.pid)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left in the sweep's group: {left.stdout}"
    parents = [r for r in _runs(tmp_path, "mem_util_grid") if "mlflow.parentRunId" not in r.data.tags]
    assert [p.info.status for p in parents] == ["KILLED"]
    (table_path,) = (tmp_path / "multirun" / "mem_util_grid").glob(f"*/{RESULTS_FILE}")
    table, meta = read_results_table(table_path)
    assert meta["status"] == "KILLED" and 1 <= len(table) <= 2
