"""``sweep.run_rows``: metrics written as rows into MLflow's SQL store read back exactly as
after MLflow's own ``log_batch``; a run logged twice, a deleted run and a bad key."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient

from sweep.run_rows import AlreadyLogged, sql_store, write_run
from sweep.tracking import Tracker

pytestmark = pytest.mark.filterwarnings(
    "ignore:The ``noload`` loader strategy:DeprecationWarning")


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def read_back(client: MlflowClient, run_id: str) -> tuple[dict, dict]:
    """A run's latest value per key and every key's full history, as the client reads them."""
    latest = client.get_run(run_id).data.metrics
    history = {key: sorted([(m.step, m.timestamp, "nan" if math.isnan(m.value) else m.value)
                            for m in client.get_metric_history(run_id, key)], key=repr)
               for key in latest}
    return latest, history


def assert_runs_equal(client: MlflowClient, ours: str, theirs: str) -> None:
    latest_a, history_a = read_back(client, ours)
    latest_b, history_b = read_back(client, theirs)
    assert latest_a.keys() == latest_b.keys()
    assert all(_same(latest_a[k], latest_b[k]) for k in latest_a), (latest_a, latest_b)
    assert history_a == history_b


@pytest.fixture
def client(store) -> MlflowClient:
    return MlflowClient(store)


@pytest.fixture
def experiment(client) -> str:
    return client.create_experiment("rows")


def new_run(client: MlflowClient, experiment: str) -> str:
    return client.create_run(experiment).info.run_id


def two_ways(client: MlflowClient, experiment: str, batches: list[list[Metric]]) -> None:
    """Each batch in turn into one run through ``write_run`` and into another through
    ``log_batch``; the two runs must read back the same."""
    store = sql_store(client)
    assert store is not None
    ours, theirs = new_run(client, experiment), new_run(client, experiment)
    for batch in batches:
        write_run(store, ours, metrics=batch)
        client.log_batch(theirs, metrics=batch)
    assert_runs_equal(client, ours, theirs)


def test_scalars_series_nan_inf_and_duplicates_read_back_as_after_log_batch(client, experiment):
    t = 1_700_000_000_000
    batch = [Metric("ttft_ms_p99", 12.5, t, 0), Metric("goodput", math.nan, t, 0),
             Metric("huge", math.inf, t, 0), Metric("tiny", -math.inf, t, 0),
             *[Metric("ts/running", float(s % 7), t, s) for s in range(50)],
             Metric("ts/running", 3.0, t, 10),  # an exact duplicate: dropped as MLflow does
             Metric("ts/kv", 1.0, t, 5), Metric("ts/kv", 2.0, t, 5),  # same step, two values
             Metric("ts/kv", math.nan, t, 9)]
    two_ways(client, experiment, [batch])


def test_a_later_write_replaces_the_latest_value_only_when_greater_in_mlflows_order(
        client, experiment):
    t = 1_700_000_000_000
    first = [Metric("a", 5.0, t, 10), Metric("b", 5.0, t, 10), Metric("c", 1.0, t, 3)]
    # a: lower step (kept); b: same step, later timestamp (replaced); c: same step and
    # timestamp, greater value (replaced); d: new key
    second = [Metric("a", 9.0, t + 5, 2), Metric("b", 0.0, t + 1, 10),
              Metric("c", 2.0, t, 3), Metric("d", 7.0, t, 0)]
    two_ways(client, experiment, [first, second])


def test_rows_already_in_the_store_write_nothing_and_the_tracker_logs_the_rest(
        client, experiment, store):
    sql = sql_store(client)
    assert sql is not None
    run = new_run(client, experiment)
    t = 1_700_000_000_000
    rows = [Metric("x", float(i), t, i) for i in range(5)]
    write_run(sql, run, metrics=rows[:3])
    with pytest.raises(AlreadyLogged):
        write_run(sql, run, metrics=rows)  # rows 0-2 are there: the whole write rolls back
    assert len(client.get_metric_history(run, "x")) == 3
    tracker = Tracker(store, "rows")
    tracker._log_metric_list(run, rows)  # falls back to log_batch, which skips the three
    history = client.get_metric_history(run, "x")
    assert sorted(m.step for m in history) == [0, 1, 2, 3, 4]
    assert client.get_run(run).data.metrics == {"x": 4.0}


def test_a_deleted_run_and_a_bad_key_are_refused_with_mlflows_errors(client, experiment):
    sql = sql_store(client)
    assert sql is not None
    run = new_run(client, experiment)
    with pytest.raises(MlflowException, match="Invalid value"):
        write_run(sql, run, metrics=[Metric("bad//key", 1.0, 0, 0)])
    with pytest.raises(MlflowException, match="valid double"):
        write_run(sql, run, metrics=[Metric("k", 1.0, 0, 0), Metric("k", "2", 0, 1)])  # type: ignore[arg-type]
    client.delete_run(run)
    with pytest.raises(MlflowException, match="must be in the 'active' state"):
        write_run(sql, run, metrics=[Metric("k", 1.0, 0, 0)])
    assert sql_store(MlflowClient("http://127.0.0.1:9")) is None  # an HTTP store: no rows


def test_a_tracker_on_a_sql_store_logs_a_point_as_log_batch_would(store):
    tracker = Tracker(store, "rows")
    assert tracker._sql_store is not None
    run = tracker.create_run("p", {})
    tracker.log_point(run, {"a.b": 1, "c": "x"}, {"ttft": 3.0, "inf": math.inf}, {"t": "v"},
                      {"running": [1.0, 2.0, math.nan]}, [0, 1, 2])
    data = tracker.client.get_run(run).data
    assert data.params == {"a.b": "1", "c": "x"}
    assert data.tags["t"] == "v" and data.tags["nonfinite_metrics"] == "inf=+inf"
    assert data.metrics["ttft"] == 3.0 and math.isnan(data.metrics["inf"])
    assert math.isnan(data.metrics["ts/running"])  # the latest step's value
    assert [m.value for m in sorted(tracker.client.get_metric_history(run, "ts/running"),
                                    key=lambda m: m.step)][:2] == [1.0, 2.0]


values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5))
metrics = st.lists(st.builds(Metric, st.sampled_from(["a", "b", "ts/c"]), values,
                             st.integers(0, 3), st.integers(0, 4)), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(metrics, min_size=1, max_size=3))
def test_any_batches_read_back_as_after_log_batch(client, experiment, batches):
    # a later batch may repeat a row of an earlier one (as MLflow stores it): such a write
    # goes through log_batch in the tracker; here only batches without such rows are compared
    seen: set = set()
    kept = []
    for batch in batches:
        ids = {(m.key, m.timestamp, m.step, *SqlAlchemyStore.sanitize_metric_value(None, m.value))
               for m in batch}
        if not ids & seen:
            seen |= ids
            kept.append(batch)
    two_ways(client, experiment, kept)


def test_with_an_active_model_the_tracker_logs_through_log_batch(store, monkeypatch):
    """``log_batch`` links metrics to MLflow's active model; the rows would not, so then the
    tracker does not write rows (and the metrics share the params' batch)."""
    import mlflow.tracking.fluent as fluent

    tracker = Tracker(store, "rows")
    assert tracker._rows_store() is not None
    model = tracker.client.create_logged_model(tracker.experiment_id, name="m")
    monkeypatch.setattr(fluent, "get_active_model_id", lambda: model.model_id)
    assert tracker._rows_store() is None
    calls = []
    monkeypatch.setattr("sweep.run_rows.write_run",
                        lambda *a, **k: calls.append((a, k)))  # must not be used
    run = tracker.create_run("p", {})
    batches = []
    real = tracker.client.log_batch
    monkeypatch.setattr(tracker.client, "log_batch",
                        lambda run_id, **kw: batches.append(kw) or real(run_id, **kw))
    tracker.log_point(run, {"a": 1}, {"ttft": 3.0}, {"t": "v"}, {"running": [1.0, 2.0]}, [0, 1])
    assert not calls and len(batches) == 1 and len(batches[0]["metrics"]) == 3
    assert tracker.client.get_run(run).data.metrics["ts/running"] == 2.0
    linked = tracker.client.get_logged_model(model.model_id).metrics
    assert sorted((m.key, m.step) for m in linked) == [("ts/running", 0), ("ts/running", 1),
                                                        ("ttft", 0)]


# ------------------------------------------------------------------ params, tags and the end
def read_run(client: MlflowClient, run_id: str) -> tuple:
    """What the client reads of a run besides its metrics."""
    run = client.get_run(run_id)
    return (run.data.params, run.data.tags, run.info.status, run.info.end_time,
            run.info.run_name)


def both_ways(client: MlflowClient, experiment: str, writes: list[dict]) -> tuple[str, str]:
    """Each write in turn into one run through ``write_run`` and into another through
    ``log_batch`` then ``set_terminated``; the same outcome (error or not) for each write,
    and the two runs read back the same."""
    store = sql_store(client)
    assert store is not None
    ours, theirs = new_run(client, experiment), new_run(client, experiment)
    for w in writes:
        errors = []
        for write in (
            lambda w=w: write_run(store, ours, params=w["params"], tags=w["tags"],
                                  metrics=w["metrics"], end=w["end"]),
            lambda w=w: (client.log_batch(theirs, metrics=w["metrics"], params=w["params"],
                                          tags=w["tags"]),
                         w["end"] and client.set_terminated(theirs, *w["end"])),
        ):
            try:
                write()
                errors.append(None)
            except MlflowException as err:
                errors.append(err.error_code)
        assert errors[0] == errors[1], (w, errors)
        if errors[0] is not None:  # log_batch may have committed a part: start over
            return both_ways(client, experiment, [x for x in writes if x is not w])
    data = read_run(client, ours), read_run(client, theirs)
    for run in data:  # a run's name is its name tag
        assert run[1].pop("mlflow.runName") == run[4]
    assert data[0][:4] == data[1][:4]
    if any(t.key == "mlflow.runName" and t.value for w in writes for t in w["tags"]):
        assert data[0][4] == data[1][4]
    assert_runs_equal(client, ours, theirs)
    return ours, theirs


def test_params_tags_metrics_and_end_in_one_write_read_back_as_mlflows_own_calls(
        client, experiment):
    t = 1_700_000_000_000
    first = {"params": [Param("a", "1"), Param("b.c", "x" * 7000)],  # truncated as MLflow does
             "tags": [RunTag("t", "1"), RunTag("t", "2"), RunTag("u", "v")],  # the last wins
             "metrics": [Metric("m", 1.0, t, 0), Metric("ts/s", math.inf, t, 3)],
             "end": None}
    second = {"params": [Param("a", "1"), Param("d", "")],  # a repeated param, same value
              "tags": [RunTag("u", "w"), RunTag("mlflow.runName", "renamed"),
                       RunTag("mlflow.runName", "")],  # an empty name changes nothing
              "metrics": [Metric("m", 2.0, t + 1, 0)],
              "end": ("FINISHED", t + 10)}
    ours, _ = both_ways(client, experiment, [first, second])
    run = client.get_run(ours)
    assert run.data.params["a"] == "1" and run.data.tags["u"] == "w"
    assert run.info.status == "FINISHED" and run.info.end_time == t + 10
    assert run.info.run_name == "renamed"


def test_a_changed_param_a_bad_status_and_a_write_that_fails_change_nothing(client, experiment):
    sql = sql_store(client)
    assert sql is not None
    run = new_run(client, experiment)
    t = 1_700_000_000_000
    write_run(sql, run, params=[Param("a", "1")], metrics=[Metric("m", 1.0, t, 0)])
    before = read_run(client, run)
    with pytest.raises(MlflowException, match="Changing param values is not allowed"):
        write_run(sql, run, params=[Param("a", "2")], tags=[RunTag("x", "y")],
                  end=("FINISHED", t))
    with pytest.raises(MlflowException, match="Could not get run status"):
        write_run(sql, run, tags=[RunTag("x", "y")], end=("DONE", t))
    with pytest.raises(MlflowException, match="Duplicate parameter keys"):
        write_run(sql, run, params=[Param("b", "1"), Param("b", "1")])
    with pytest.raises(AlreadyLogged):  # the metric row is there: params, tags, end roll back
        write_run(sql, run, params=[Param("c", "3")], tags=[RunTag("x", "y")],
                  metrics=[Metric("m", 1.0, t, 0)], end=("FINISHED", t))
    assert read_run(client, run) == before and before[2] == "RUNNING"


params_st = st.lists(st.builds(Param, st.sampled_from(["p", "q", "r.s"]),
                               st.sampled_from(["", "1", "2"])), max_size=4)
tags_st = st.lists(st.builds(RunTag, st.sampled_from(["t", "u", "mlflow.runName"]),
                             st.sampled_from(["a", "b", ""])), max_size=4)
ends = st.one_of(st.none(), st.tuples(st.sampled_from(["FINISHED", "FAILED", "KILLED",
                                                       "RUNNING"]),
                                      st.integers(1, 10**13)))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({"params": params_st, "tags": tags_st,
                                       "metrics": st.just([]), "end": ends}),
                min_size=1, max_size=3))
def test_any_params_tags_and_ends_read_back_as_after_mlflows_own_calls(client, experiment,
                                                                       writes):
    both_ways(client, experiment, writes)


def test_a_tracker_logs_a_finished_point_in_one_store_session(store, monkeypatch):
    tracker = Tracker(store, "rows")
    run = tracker.create_run("p", {"h": "1"})
    sessions = []
    maker = tracker._sql_store.ManagedSessionMaker

    def counting(*args, **kwargs):
        sessions.append(kwargs)
        return maker(*args, **kwargs)

    monkeypatch.setattr(tracker._sql_store, "ManagedSessionMaker", counting)
    tracker.log_point(run, {"a": 1}, {"ttft": 3.0}, {"h": "2", "t": "v"},
                      {"running": [1.0, 2.0]}, [0, 1], status="FINISHED")
    assert len(sessions) == 1
    got = tracker.client.get_run(run)
    assert got.info.status == "FINISHED" and got.info.end_time is not None
    assert got.data.params == {"a": "1"} and got.data.tags["h"] == "2"
    assert got.data.metrics == {"ttft": 3.0, "ts/running": 2.0}


# ------------------------------------------------------------------ runs created together
def run_view(client: MlflowClient, run_id: str) -> tuple:
    """A run as the client reads it, its id, name and times left out (they differ)."""
    run = client.get_run(run_id)
    info = run.info
    tags = {k: v for k, v in run.data.tags.items() if k != "mlflow.runName"}
    return (info.experiment_id, info.user_id, info.status, info.end_time,
            info.lifecycle_stage, info.artifact_uri.replace(run_id, "<id>"), tags,
            run.data.params, run.data.metrics, run.inputs.dataset_inputs)


def test_runs_created_together_read_back_as_mlflows_create_run(client, experiment):
    from sweep.run_rows import create_runs

    sql = sql_store(client)
    assert sql is not None
    specs = [("a", {"x": "1", "mlflow.user": "ann"}), ("", {"mlflow.runName": "b"}),
             ("", {}), ("c", {"mlflow.runName": "c", "mlflow.parentRunId": "p"})]
    made = create_runs(sql, experiment, specs, 1_700_000_000_000)
    assert len({run_id for run_id, _ in made}) == 4
    for (name, tags), (run_id, uri) in zip(specs, made, strict=True):
        theirs = client.create_run(experiment, tags=tags, run_name=name or None).info.run_id
        assert run_view(client, run_id) == run_view(client, theirs)
        ours = client.get_run(run_id)
        assert ours.info.artifact_uri == uri
        assert ours.info.start_time == 1_700_000_000_000
        assert ours.info.run_name == ours.data.tags["mlflow.runName"]
        assert ours.info.run_name == (name or tags.get("mlflow.runName") or ours.info.run_name)
    with pytest.raises(MlflowException, match="Both 'run_name' argument and 'mlflow.runName'"):
        create_runs(sql, experiment, [("a", {}), ("x", {"mlflow.runName": "y"})], 0)
    assert len(client.search_runs([experiment])) == 8  # the refused batch wrote none
    client.delete_experiment(experiment)
    with pytest.raises(MlflowException, match="must be in the 'active' state"):
        create_runs(sql, experiment, [("a", {})], 0)


def test_a_tracker_creates_runs_together_as_one_by_one(store):
    tracker = Tracker(store, "rows")
    parent = tracker.create_run("parent", {})
    together = tracker.create_runs([("p1", {"h": "1"}, parent), ("p2", {"h": "2"}, None)])
    one_by_one = [tracker.create_run("p1", {"h": "1"}, parent),
                  tracker.create_run("p2", {"h": "2"}, None)]
    for ours, theirs in zip(together, one_by_one, strict=True):
        assert run_view(tracker.client, ours) == run_view(tracker.client, theirs)
        assert tracker._artifact_uris[ours] == tracker.client.get_run(ours).info.artifact_uri


def test_a_negative_timestamp_after_a_keys_first_value_is_refused_as_by_log_batch(
        client, experiment):
    sql = sql_store(client)
    assert sql is not None
    run = new_run(client, experiment)
    bad = [Metric("k", 1.0, 0, 0), Metric("k", 2.0, -5, 1)]
    with pytest.raises(MlflowException) as ours:
        write_run(sql, run, metrics=bad)
    with pytest.raises(MlflowException) as theirs:
        client.log_batch(run, metrics=bad)
    assert ours.value.error_code == theirs.value.error_code
    assert client.get_metric_history(run, "k") == []


def test_a_store_without_rows_gets_a_finished_point_through_mlflows_calls(store, monkeypatch):
    tracker = Tracker(store, "rows")
    monkeypatch.setattr(tracker, "_rows_store", lambda: None)
    run = tracker.create_run("p", {})
    tracker.log_point(run, {"a": 1}, {"ttft": 3.0}, {"t": "v"}, {"running": [1.0, 2.0]}, [0, 1],
                      status="FAILED")
    got = tracker.client.get_run(run)
    assert got.info.status == "FAILED" and got.info.end_time is not None
    assert got.data.params == {"a": "1"} and got.data.tags["t"] == "v"
    assert got.data.metrics == {"ttft": 3.0, "ts/running": 2.0}


def test_a_point_written_again_after_a_commit_ends_the_same(store, monkeypatch):
    """A retry whose first attempt did commit: the metric rows are there, so the write rolls
    back (``AlreadyLogged``) and the tracker logs through ``log_batch`` and
    ``set_terminated``, which skip what is stored."""
    import sweep.tracking as tracking

    t = 1_700_000_000_000
    monkeypatch.setattr(tracking.time, "time", lambda: t / 1000)  # the same timestamps
    tracker = Tracker(store, "rows")
    run = tracker.create_run("p", {})
    point = ({"a": 1}, {"ttft": 3.0}, {"u": "v"}, {"running": [1.0, 2.0]}, [0, 1])
    tracker.log_point(run, *point, status="FINISHED")
    first = read_run(tracker.client, run), read_back(tracker.client, run)
    assert not tracker._write_rows(run, [], [], [Metric("ttft", 3.0, t, 0)])  # rolled back
    tracker.log_point(run, *point, status="FINISHED")
    assert (read_run(tracker.client, run), read_back(tracker.client, run)) == first
    assert first[0][2] == "FINISHED" and first[0][1]["u"] == "v"


def test_runs_created_again_with_the_same_ids_are_not_created_twice(client, experiment):
    from sweep.run_rows import create_runs, new_run_ids

    sql = sql_store(client)
    assert sql is not None
    ids = new_run_ids(2)
    specs = [("a", {"k": "1"}), ("b", {})]
    first = create_runs(sql, experiment, specs, 5, ids)
    assert create_runs(sql, experiment, specs, 5, ids) == first  # a retry after a commit
    assert sorted(r.info.run_id for r in client.search_runs([experiment])) == sorted(ids)


def test_the_tables_written_have_the_columns_the_rows_fill():
    """The rows fill every column of MLflow's tables as MLflow 3.17-3.18 define them; a
    later MLflow that adds one makes this fail, so the rows are checked against its
    ``create_run`` / ``log_batch`` again before they are trusted."""
    from mlflow.store.tracking.dbmodels.models import (
        SqlLatestMetric,
        SqlMetric,
        SqlParam,
        SqlRun,
        SqlTag,
    )

    assert {t.name: set(t.columns.keys()) for t in (
        SqlRun.__table__, SqlParam.__table__, SqlTag.__table__, SqlMetric.__table__,
        SqlLatestMetric.__table__)} == {
        "runs": {"run_uuid", "name", "source_type", "source_name", "entry_point_name",
                 "user_id", "status", "start_time", "end_time", "deleted_time",
                 "source_version", "lifecycle_stage", "artifact_uri", "experiment_id"},
        "params": {"key", "value", "run_uuid"},
        "tags": {"key", "value", "run_uuid"},
        "metrics": {"key", "value", "timestamp", "run_uuid", "step", "is_nan"},
        "latest_metrics": {"key", "value", "timestamp", "step", "is_nan", "run_uuid"},
    }
