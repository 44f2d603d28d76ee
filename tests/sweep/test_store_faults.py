"""Faults around the sweep's stores: a full disk for the sweep dir, a locked or failing MLflow
store, two sweeps on one store at once, a lost local Ray head. Each asserts 0 results lost,
0 duplicated, a non-zero exit when something is missing, and no run left ``RUNNING``."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import sweep.recorder as recorder_mod
from sweep.config_hash import HASH_KEY
from sweep.resume import finished_counts
from tests.store_helpers import finished_points
from tests.sweep.hold_jobs import held_jobs, hold_overrides
from tests.sweep_helpers import run_sweep, runs_by_status, sweep_env, table

pytestmark = [
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]
POINTS = ["+experiment=mem_util_grid", "workload.num_requests=40", "tracking.plots=false",
          "cluster.gpu_memory_utilization=0.9", "workload.rate=1,2,3"]


def counts(store: str) -> dict[str, int]:
    client = MlflowClient(store)
    return dict(finished_counts(client, client.get_experiment_by_name("mem_util_grid").experiment_id))


def assert_nothing_running(store: str) -> None:
    running = runs_by_status(store, "mem_util_grid").get("RUNNING", [])
    assert not running, [r.info.run_name for r in running]


@pytest.mark.usefixtures("ray_session")
def test_full_disk_for_one_point_is_counted_then_filled_in(tmp_path, store, monkeypatch):
    real = recorder_mod.atomic_write

    def full_for_job_1(path: Path, data):
        if path.parent.name == "1":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(recorder_mod, "atomic_write", full_for_job_1)
    with pytest.raises(SystemExit, match=r"1 point\(s\) missing from .*rerun the same command"):
        run_sweep(tmp_path / "s", [*POINTS, f"tracking.uri={store}"])
    first = table(tmp_path / "s")
    assert list(first["status"]) == ["finished"] * 3  # computed, and kept in the table
    assert list(first["missing"]) == ["", "disk,mlflow", ""]
    assert not list((tmp_path / "s" / "1").glob("*.tmp"))  # no truncated file left
    assert sorted(counts(store).values()) == [1, 1]  # job 1 is not FINISHED in MLflow
    assert_nothing_running(store)
    monkeypatch.setattr(recorder_mod, "atomic_write", real)
    run_sweep(tmp_path / "s", [*POINTS, f"tracking.uri={store}"])  # the fault is cleared
    again = table(tmp_path / "s")
    assert list(again["missing"]) == ["", "", ""]
    assert int(again["resumed_from"].notna().sum()) == 2
    assert sorted(counts(store).values()) == [1, 1, 1]
    assert (tmp_path / "s" / "1" / "metrics.json").is_file()
    assert_nothing_running(store)


@pytest.mark.usefixtures("ray_session")
def test_results_table_on_a_full_disk_exits_non_zero(tmp_path, store, monkeypatch):
    real = recorder_mod.atomic_write

    def no_table(path: Path, data):
        if path.name == recorder_mod.RESULTS_FILE:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(recorder_mod, "atomic_write", no_table)
    with pytest.raises(SystemExit, match="results table .* was not written"):
        run_sweep(tmp_path / "s", [*POINTS, f"tracking.uri={store}"])
    assert not (tmp_path / "s" / recorder_mod.RESULTS_FILE).exists()
    assert sorted(counts(store).values()) == [1, 1, 1]  # the runs themselves are complete
    assert_nothing_running(store)


def _lock_store_on_first_result(db: str, hold_s: float, started: list[threading.Thread]):
    """A ``job_done`` that, on the first result, makes another connection take the sqlite
    store's write lock (``BEGIN EXCLUSIVE``) for ``hold_s`` seconds."""
    original = recorder_mod.SweepRecorder.job_done
    holding = threading.Event()

    def hold_lock():
        con = sqlite3.connect(db, timeout=30)
        con.execute("BEGIN EXCLUSIVE")
        holding.set()
        time.sleep(hold_s)
        con.rollback()
        con.close()

    def job_done(self, idx, cfg, ret):
        if not started:
            started.append(threading.Thread(target=hold_lock, daemon=True))
            started[0].start()
            holding.wait(10)
        return original(self, idx, cfg, ret)

    return job_done


@pytest.mark.usefixtures("ray_session")
def test_a_store_locked_for_a_while_is_waited_out(tmp_path, store, monkeypatch):
    """8 s of lock: MLflow's own sqlite busy timeout (20 s) and our retries wait it out."""
    started: list[threading.Thread] = []
    db = store.removeprefix("sqlite:///")
    monkeypatch.setattr(recorder_mod.SweepRecorder, "job_done",
                        _lock_store_on_first_result(db, 8, started))
    t0 = time.monotonic()
    run_sweep(tmp_path / "s", [*POINTS, f"tracking.uri={store}"])
    assert time.monotonic() - t0 > 8
    assert list(table(tmp_path / "s")["missing"]) == ["", "", ""]
    assert sorted(counts(store).values()) == [1, 1, 1]
    assert_nothing_running(store)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_store_locked_past_the_budget_is_counted_then_filled_in(tmp_path, store):
    """45 s of lock, writes retried for ``tracking.retry_budget_s=5``: the sweep finishes
    what it can, says how many points are missing and exits non-zero; a rerun once the lock
    is gone records each point exactly once and closes what was left open."""
    started: list[threading.Thread] = []
    db = store.removeprefix("sqlite:///")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recorder_mod.SweepRecorder, "job_done",
                   _lock_store_on_first_result(db, 45, started))
        with pytest.raises(SystemExit, match=r"point\(s\) missing from MLflow"):
            run_sweep(tmp_path / "s", [*POINTS, f"tracking.uri={store}",
                                       "tracking.retry_budget_s=5"])
    started[0].join()
    assert "mlflow" in "".join(table(tmp_path / "s")["missing"])
    run_sweep(tmp_path / "s", [*POINTS, f"tracking.uri={store}"])
    assert sorted(counts(store).values()) == [1, 1, 1]
    assert_nothing_running(store)


@pytest.mark.usefixtures("ray_session")
def test_a_store_made_read_only_mid_sweep_is_counted_not_reported_as_success(tmp_path, store,
                                                                           monkeypatch):
    import sweep.tracking as tracking

    # from the first result on, every write of a run's data is refused: log_batch, and the
    # rows a SQL store takes in one transaction
    read_only = threading.Event()
    job_done = recorder_mod.SweepRecorder.job_done

    def refusing(write):
        def refused(self, *args, **kwargs):
            if read_only.is_set():
                raise tracking.TrackingWriteError("attempt to write a readonly database")
            return write(self, *args, **kwargs)
        return refused

    def first_result_locks(self, idx, cfg, ret):
        read_only.set()
        return job_done(self, idx, cfg, ret)

    for name in ("_batch", "_write_rows"):
        monkeypatch.setattr(tracking.Tracker, name, refusing(getattr(tracking.Tracker, name)))
    monkeypatch.setattr(recorder_mod.SweepRecorder, "job_done", first_result_locks)
    with pytest.raises(SystemExit, match=r"3 point\(s\) missing from MLflow \(the sweep's "
                                         r"parent run not closed\)"):
        run_sweep(tmp_path / "s", [*POINTS, f"tracking.uri={store}", "tracking.retry_budget_s=0"])
    assert list(table(tmp_path / "s")["status"]) == ["finished"] * 3
    assert counts(store) == {}  # nothing FINISHED that is not complete
    monkeypatch.undo()
    run_sweep(tmp_path / "s", [*POINTS, f"tracking.uri={store}"])
    assert sorted(counts(store).values()) == [1, 1, 1]
    assert_nothing_running(store)  # the parent the first sweep could not close is closed


def _sweep_cmd(*extra: str) -> list[str]:
    return [sys.executable, "-m", "sweep", "+experiment=mem_util_grid", "tracking.plots=false",
            "hydra.launcher.progress=false", "hydra.launcher.num_actors=1", *extra, "-m"]


@pytest.mark.slow
@pytest.mark.parametrize("stagger", [False, True], ids=["together", "staggered"])
def test_two_sweeps_on_one_store_run_each_point_once(tmp_path, stagger):
    """Two copies of one command in one directory against one store (the full 20-point
    ``mem_util_grid``): every config hash has exactly one FINISHED run, the sweeps write to
    distinct sweep directories, and each table lists all 20 points."""
    requests = "workload.num_requests=300" if stagger else "workload.num_requests=40"
    cmd = _sweep_cmd(requests, "hydra.sweep.dir=multirun/twins")
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=sweep_env(), stdout=logs[0].open("w"),
                              stderr=subprocess.STDOUT)]
    if stagger:  # the second starts once the first has finished a few points
        deadline = time.monotonic() + 240
        while finished_points(tmp_path / "mlflow.db") < 3 and time.monotonic() < deadline:
            assert procs[0].poll() is None, logs[0].read_text()[-3000:]
            time.sleep(0.3)
    procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=sweep_env(), stdout=logs[1].open("w"),
                                  stderr=subprocess.STDOUT))
    for p, log in zip(procs, logs, strict=True):
        assert p.wait(timeout=600) == 0, log.read_text()[-3000:]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert sorted(counts(store).values()) == [1] * 20
    dirs = sorted(p.name for p in (tmp_path / "multirun").iterdir())
    assert dirs == ["twins", "twins-2"]
    tables = [table(tmp_path / "multirun" / d) for d in dirs]
    for t in tables:
        assert len(t) == 20 and (t["status"] == "finished").all() and t[HASH_KEY].is_unique
    # between them, each point ran once: the other sweep's row reuses that run
    ran = [set(t.loc[t["resumed_from"].isna(), HASH_KEY]) for t in tables]
    assert not (ran[0] & ran[1]) and len(ran[0] | ran[1]) == 20
    assert_nothing_running(store)


def _live(pids: dict[int, str]) -> list[int]:
    out = []
    for pid, name in pids.items():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                out.append(pid)
        except OSError:
            pass
    return out


@pytest.mark.slow
def test_losing_the_local_head_ends_with_our_message_and_the_table(tmp_path):
    from hydra_plugins.ray_actor_launcher.ray_cluster import ray_processes

    points = ("workload.num_requests=400", "workload.rate=1,2,3,4,5,6",
              "cluster.gpu_memory_utilization=0.9", "hydra.sweep.dir=multirun/lost")
    cmd = _sweep_cmd(*points)
    log = tmp_path / "driver.log"
    release = tmp_path / "release"  # never created: the raylet dies while job 2 is held
    held = _sweep_cmd(*points, *hold_overrides(release, 2))
    driver = subprocess.Popen(held, cwd=tmp_path, env=sweep_env(), stdout=log.open("w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    seen: dict = {}  # pid -> ray_cluster.RayProcess
    try:
        deadline = time.monotonic() + 240
        while ((finished_points(tmp_path / "mlflow.db") < 2 or 2 not in held_jobs(release))
               and time.monotonic() < deadline):
            assert driver.poll() is None, log.read_text()[-3000:]
            seen.update(ray_processes(driver.pid))
            time.sleep(0.3)
        seen.update(ray_processes(driver.pid))
        raylet = [pid for pid, proc in seen.items() if proc.name == "raylet"]
        assert raylet, seen
        os.kill(raylet[0], signal.SIGKILL)
        t0 = time.monotonic()
        driver.wait(timeout=120)
        ended_s = time.monotonic() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    out = log.read_text()
    print(f"driver ended {ended_s:.1f} s after its raylet was killed, exit {driver.returncode}")
    assert driver.returncode not in (0, None), out[-3000:]
    assert "the local Ray cluster is gone: its raylet" in out, out[-3000:]
    assert ended_s < 60, ended_s
    time.sleep(3)  # agents notice their raylet's death on their own poll
    assert _live(seen) == [], {p: seen[p] for p in _live(seen)}
    rows = table(tmp_path / "multirun" / "lost")
    assert (rows["status"] == "finished").sum() == 2
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert_nothing_running(store)
    rerun = subprocess.run(cmd, cwd=tmp_path, env=sweep_env(), capture_output=True, text=True,
                           timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert sorted(counts(store).values()) == [1] * 6
