"""``hydra/launcher=basic`` records through ``sweep.recording.RecordingCallback``: the same
MLflow parent/child runs and the same ``results.parquet`` as the Ray launcher, metrics
bit-identical; resume, infeasible points and the exit code work the same way."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from sweep.config_hash import HASH_KEY
from tests.sweep_helpers import run_sweep, runs_by_status, table

pytestmark = [
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]
GRID = ["+experiment=mem_util_grid", "workload.num_requests=60", "tracking.plots=false",
        "cluster.gpu_memory_utilization=0.5,0.9", "workload.rate=1,4"]
WALL_CLOCK = ("sim_wall_s", "job_wall_s")


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))


def point_runs(store: str) -> dict[str, dict]:
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("mem_util_grid").experiment_id
    runs = [r for r in client.search_runs([exp], max_results=100)
            if "mlflow.parentRunId" in r.data.tags]
    return {r.data.tags[HASH_KEY]: r for r in runs}


@pytest.mark.usefixtures("ray_session")
def test_basic_launcher_records_what_the_ray_launcher_records(tmp_path, mlflow_template):
    import shutil

    stores = {}
    for name, extra in (("ray", []), ("basic", ["hydra/launcher=basic"])):
        shutil.copy(mlflow_template, tmp_path / f"{name}.db")
        stores[name] = f"sqlite:///{tmp_path / f'{name}.db'}"
        run_sweep(tmp_path / name, [*GRID, f"tracking.uri={stores[name]}", *extra])
    a, b = table(tmp_path / "ray"), table(tmp_path / "basic")
    assert len(a) == len(b) == 4 and (a.status == "finished").all() and (b.status == "finished").all()
    a, b = a.set_index(HASH_KEY).sort_index(), b.set_index(HASH_KEY).sort_index()
    assert list(a.index) == list(b.index)
    metrics = [c for c in a.columns if pd.api.types.is_float_dtype(a[c]) and c not in WALL_CLOCK
               and not c.startswith(("cluster.", "workload.", "slo.", "hardware.", "model."))]
    assert len(metrics) > 30
    for key in a.index:
        diff = {m: (a.loc[key, m], b.loc[key, m]) for m in metrics
                if not same(a.loc[key, m], b.loc[key, m])}
        assert not diff, diff
    ra, rb = point_runs(stores["ray"]), point_runs(stores["basic"])
    assert set(ra) == set(rb) == set(a.index)
    for key in ra:
        assert ra[key].info.status == rb[key].info.status == "FINISHED"
        assert ra[key].info.run_name.split(" @")[0] == rb[key].info.run_name.split(" @")[0]
        assert ra[key].data.params == rb[key].data.params
        assert {m: v for m, v in ra[key].data.metrics.items() if m not in WALL_CLOCK} == {
            m: v for m, v in rb[key].data.metrics.items() if m not in WALL_CLOCK}
    for store in stores.values():
        parents = [r for r in runs_by_status(store, "mem_util_grid")["FINISHED"]
                   if r.data.tags.get("kind") == "sweep"]
        assert len(parents) == 1 and parents[0].data.tags["finished_jobs"] == "4"
    # rerun with the basic launcher: every point resumed, nothing simulated or logged again
    run_sweep(tmp_path / "basic2", [*GRID, f"tracking.uri={stores['basic']}",
                                    "hydra/launcher=basic"])
    again = table(tmp_path / "basic2")
    assert again["resumed_from"].notna().all()
    assert len(point_runs(stores["basic"])) == 4


def test_basic_launcher_records_infeasible_points(tmp_path, store):
    grid = ["workload.num_requests=40", "tracking.plots=false", "hydra/launcher=basic",
            "tracking.experiment=basic_infeasible", f"tracking.uri={store}"]
    run_sweep(tmp_path / "s", [*grid, "cluster.max_model_len=1024,32768"])
    rows = table(tmp_path / "s")
    assert list(rows["status"]) == ["infeasible", "finished"]
    assert "max_model_len=1024" in rows.loc[0, "infeasible_reason"]
    assert (tmp_path / "s" / "0" / "infeasible.txt").is_file()


def test_basic_launcher_exits_non_zero_when_a_point_fails(tmp_path, store, monkeypatch):
    import sweep.job as job

    real = job.run_point

    def fails_at_rate_4(cfg):
        if cfg.workload.rate == 4:
            raise RuntimeError("injected failure at rate 4")
        return real(cfg)

    monkeypatch.setattr(job, "run_point", fails_at_rate_4)
    with pytest.raises(SystemExit, match="1 of 2 jobs failed"):
        run_sweep(tmp_path / "s", ["workload.num_requests=40", "tracking.plots=false",
                                   "hydra/launcher=basic", "workload.rate=1,4",
                                   "tracking.experiment=basic_failing", f"tracking.uri={store}"])
    rows = table(tmp_path / "s")
    assert list(rows["status"]) == ["finished", "failed"]
    assert "injected failure at rate 4" in rows.loc[1, "error"]
    statuses = {s: len(r) for s, r in runs_by_status(store, "basic_failing").items()}
    assert statuses == {"FINISHED": 1, "FAILED": 2}  # the point and the parent


def test_an_objective_hands_the_sweeper_one_number(tmp_path, store):
    """``study.objective``: each job returns that metric (NaN when infeasible), as Hydra's
    search sweepers (Optuna's) expect; the table and MLflow still get everything."""
    returns = run_sweep(tmp_path / "s", [
        "workload.num_requests=40", "tracking.plots=false", "hydra/launcher=basic",
        "cluster.max_model_len=1024,32768", "study.objective=ttft_ms_p99",
        "tracking.experiment=objective", f"tracking.uri={store}"])
    values = [r.return_value for r in returns]
    rows = table(tmp_path / "s")
    assert math.isnan(values[0]) and values[1] == rows.loc[1, "ttft_ms_p99"] > 0


@pytest.mark.usefixtures("ray_session")
def test_the_store_file_alone_holds_the_runs(tmp_path, store):
    """Once a sweep ends its store's connections are closed: sqlite's write-ahead log is
    checkpointed into the database file and removed, so a copy of the file alone has every
    run (the driver's frozen heap would otherwise keep them open until the process ends)."""
    run_sweep(tmp_path / "s", ["workload.num_requests=40", "tracking.plots=false",
                               "hydra/launcher=basic", "tracking.experiment=whole_file",
                               f"tracking.uri={store}", "workload.rate=1,2"])
    db = Path(store.removeprefix("sqlite:///"))
    wal = Path(f"{db}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    with sqlite3.connect(f"file:{db}?immutable=1", uri=True) as con:
        (runs,) = con.execute(
            "SELECT COUNT(*) FROM runs JOIN experiments USING (experiment_id) "
            "WHERE experiments.name = 'whole_file' AND runs.status = 'FINISHED'").fetchone()
    assert runs == 3  # the parent and both points


def test_closing_a_tracker_whose_store_is_gone_warns_and_creates_nothing(tmp_path, store, caplog):
    """The checkpoint after the last write is best effort: a store deleted meanwhile is
    reported (naming the file), never re-created empty, and the close does not raise."""
    from sweep.tracking import Tracker

    tracker = Tracker(store, "gone")
    db = Path(store.removeprefix("sqlite:///"))
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        path.unlink(missing_ok=True)
    tracker.close()
    assert not db.exists()
    assert f"{db}: the write-ahead log was not checkpointed" in caplog.text


@pytest.mark.usefixtures("ray_session")
def test_mlflow_time_series_are_bounded_to_tracking_timeseries_steps(tmp_path, store):
    """``tracking.timeseries_steps``: each ``ts/`` metric of a point's run has at most that
    many steps, the last at the point's last simulated second; ``timeseries.parquet`` keeps
    every second."""
    run_sweep(tmp_path / "s", ["workload.num_requests=40", "tracking.plots=false",
                               "hydra/launcher=basic", "tracking.experiment=bounded",
                               "tracking.timeseries_steps=8", f"tracking.uri={store}"])
    row = table(tmp_path / "s").iloc[0]
    seconds = pd.read_parquet(Path(row["output_dir"]) / "timeseries.parquet")["t_s"]
    assert len(seconds) > 8
    history = MlflowClient(store).get_metric_history(row["mlflow_run_id"], "ts/running")
    steps = sorted(m.step for m in history)
    assert len(steps) == 8 and steps[-1] == seconds.iloc[-1]
