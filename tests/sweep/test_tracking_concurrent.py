"""Many concurrent MLflow writers on the default store (sqlite): no run lost or corrupted.

The sweep logs from one writer thread in the driver, but several sweeps (or a sweep and a
capacity study) may share one ``mlflow.db``. Here several processes log point runs into one
sqlite store at once, exactly as ``SweepRecorder`` does (``sweep.tracking.Tracker``: create,
params in batches, metrics, a stepped series, an artifact, terminate), while the parent
process writes too. Every run must come back ``FINISHED`` with all its params, metrics,
series points and artifact, and sqlite's integrity check must pass.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from sweep.tracking import Tracker

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

WRITERS = 4
RUNS_EACH = 15
SERIES_LEN = 30

WRITER = """
import sys, pathlib
from sweep.tracking import Tracker
uri, exp, who, n, series_len, art_dir = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
tr = Tracker(uri, exp)
for i in range(n):
    run = tr.create_run(f"{who}-{i}", {"writer": who, "i": str(i), "config_hash": f"{who}:{i}"})
    tr.log_params(run, {f"p{k}": f"{who}-{i}-{k}" for k in range(120)})  # > one batch
    tr.log_metrics(run, {"m_a": float(i), "m_b": 2.0 * i, "writer_i": float(i)})
    tr.log_series(run, {"running": [float(s) for s in range(series_len)]}, list(range(series_len)))
    art = pathlib.Path(art_dir) / f"{who}-{i}.txt"
    art.write_text(f"{who} {i}")
    tr.log_artifact(run, art)
    tr.finish(run, "FINISHED")
print("done", who)
"""


def test_concurrent_writers_lose_and_corrupt_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # artifacts under ./mlruns
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    parent = Tracker(uri, "concurrent")  # the store is created once, before the writers
    arts = tmp_path / "arts"
    arts.mkdir()
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, uri, "concurrent", f"w{k}", str(RUNS_EACH),
             str(SERIES_LEN), str(arts)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )
        for k in range(WRITERS)
    ]
    # the parent writes at the same time, as a sweep driver would
    for i in range(RUNS_EACH):
        run = parent.create_run(f"parent-{i}", {"writer": "parent", "config_hash": f"parent:{i}"})
        parent.log_metrics(run, {"m_a": float(i)})
        parent.finish(run, "FINISHED")
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    elapsed = time.monotonic() - t0

    client = parent.client
    runs = []
    token = None
    while True:
        page = client.search_runs([parent.experiment_id], max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            break
    assert len(runs) == (WRITERS + 1) * RUNS_EACH
    assert {r.info.status for r in runs} == {"FINISHED"}
    keys = [r.data.tags["config_hash"] for r in runs]
    assert len(set(keys)) == len(keys)
    for r in runs:
        who, i = r.data.tags["config_hash"].split(":")
        assert r.data.metrics["m_a"] == float(i)
        if who == "parent":
            continue
        assert len(r.data.params) == 120 and r.data.params["p7"] == f"{who}-{i}-7"
        assert r.data.metrics["m_b"] == 2.0 * int(i)
        history = client.get_metric_history(r.info.run_id, "ts/running")
        assert sorted(m.step for m in history) == list(range(SERIES_LEN))
        assert [a.path for a in client.list_artifacts(r.info.run_id)] == [f"{who}-{i}.txt"]
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    print(f"{len(runs)} runs from {WRITERS + 1} concurrent writers in {elapsed:.1f} s")


OPENER = """
import sys
from sweep.store_lock import open_tracker
t = open_tracker(sys.argv[1], "shared")
run = t.create_run(sys.argv[2], {"who": sys.argv[2]})
t.finish(run, "FINISHED")
print(t.experiment_id)
"""


def test_sweeps_started_together_on_a_fresh_store_all_open_it(tmp_path):
    """Found here: without the lock, 3 processes opening a fresh ``mlflow.db`` at once
    crashed in MLflow's schema migration (2 of 3, reproducibly)."""
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, uri, f"s{k}"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(3)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(out.strip())
    assert len(set(outs)) == 1  # one experiment, created once
    tr = Tracker(uri, "shared")
    runs = tr.client.search_runs([tr.experiment_id])
    assert sorted(r.data.tags["who"] for r in runs) == ["s0", "s1", "s2"]
