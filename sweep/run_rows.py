"""A run's params, tags, metrics and end written into MLflow's SQL store in one transaction.

MLflow's ``log_batch`` on a SQL store (``SqlAlchemyStore``) makes one ORM object per metric
and flushes them through SQLAlchemy's unit of work, about 150 µs a metric on the 2-core
machine: a sweep point's ~1,100 metrics (five time series of up to
``tracking.timeseries_steps`` steps, ~75 scalars) cost 0.16 CPU-s, more than simulating the
point (docs/sweep.md, "One batched MLflow write per point"). It also opens a store session
for itself and one for each of params, metrics and tags, and ``set_terminated`` another that
reads the whole run back: 8 sessions and about 40 CPU-ms a point, with the rows below.

``write_run`` writes the same rows into MLflow's own tables (the ``SqlParam``, ``SqlTag``,
``SqlMetric``, ``SqlLatestMetric`` and ``SqlRun`` models) in one session of MLflow's own
session maker (a read of what the run holds and one ``executemany`` insert per table, an
update where a stored value changes), and with MLflow's own checks and rules:

* the run exists and is active (``_get_run``, ``_check_run_is_active``);
* params, tags and metric keys and values are valid (``_validate_param``, ``_validate_tag``,
  which truncate long values as MLflow does, ``_validate_param_keys_unique``,
  ``_validate_metric`` once per key; metric values are checked to be numbers here);
* a param already logged with another value is refused with ``log_batch``'s error, one with
  the same value is skipped (``_log_params``);
* a tag replaces a stored one of its key, the last of one key wins (``_set_tags``), and
  ``mlflow.runName`` renames the run as well (``set_tag`` through ``update_run_info``);
* a metric value is stored as MLflow stores it (``sanitize_metric_value``: NaN as 0 with
  ``is_nan``, ±inf clipped), exact duplicates are dropped as ``log_batch`` drops them, and a
  key's latest value is the greatest by MLflow's order (step, then timestamp, then value),
  replacing a stored one only when greater (``_update_latest_metrics_if_necessary``);
* the end, when given, sets the run's status and end time as ``set_terminated`` does
  (``update_run_info``), in the same transaction: a run is ``FINISHED`` with all its data or
  not at all.

A run read back through ``MlflowClient`` is the same as after ``log_batch`` and
``set_terminated`` (checked in tests/sweep/test_run_rows.py). ``log_batch`` also links each
metric to an MLflow active model when one is set (``logged_model_metrics``); the rows do not,
so the tracker does not use them then (``sweep.tracking.Tracker._rows_store``).

A store that is not a SQL store has no rows to write (``sql_store`` returns None), and metric
rows the store already holds (a retried write whose first attempt did commit) make the
transaction roll back with ``AlreadyLogged``: the caller then logs through ``log_batch``, which
skips them.
"""

from __future__ import annotations

import numbers
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy
from mlflow.entities import LifecycleStage, Metric, Param, RunStatus, RunTag, SourceType
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.store.tracking.dbmodels.models import (
    SqlLatestMetric,
    SqlMetric,
    SqlParam,
    SqlRun,
    SqlTag,
)
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME, MLFLOW_USER
from mlflow.utils.name_utils import _generate_random_name
from mlflow.utils.uri import append_to_uri_path
from mlflow.utils.validation import (
    _validate_metric,
    _validate_param,
    _validate_param_keys_unique,
    _validate_run_id,
    _validate_tag,
)


class AlreadyLogged(RuntimeError):
    """Some of the rows are in the store already; nothing was written."""


def sql_store(client: Any) -> SqlAlchemyStore | None:
    """The SQL store behind an ``MlflowClient``, or None (an HTTP or file store)."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    return store if isinstance(store, SqlAlchemyStore) else None


def _order(row: dict[str, Any]) -> tuple[int, int, float]:
    """MLflow's order of a key's values: the latest is the greatest (step, timestamp, value)."""
    return (row["step"], row["timestamp"], row["value"])


def metric_rows(store: SqlAlchemyStore, run_id: str,
                metrics: Sequence[Metric]) -> list[dict[str, Any]]:
    """The ``metrics`` table's rows for ``metrics``, validated and sanitised as MLflow does,
    exact duplicates dropped (first kept)."""
    rows: dict[tuple[str, int, int, float, bool], dict[str, Any]] = {}
    checked: set[str] = set()
    for metric in metrics:
        key, value = metric.key, metric.value
        if key not in checked:
            _validate_metric(key, value, metric.timestamp, metric.step)
            checked.add(key)
        elif (not isinstance(value, numbers.Number) or isinstance(value, bool)
              or not isinstance(metric.step, int) or not isinstance(metric.timestamp, int)
              or metric.timestamp < 0):
            _validate_metric(key, value, metric.timestamp, metric.step)  # raises MLflow's error
        is_nan, stored = store.sanitize_metric_value(value)
        ident = (key, metric.timestamp, metric.step, stored, is_nan)
        if ident not in rows:
            rows[ident] = {"key": key, "value": stored, "timestamp": metric.timestamp,
                           "step": metric.step, "is_nan": is_nan, "run_uuid": run_id}
    return list(rows.values())


def new_run_ids(count: int) -> list[str]:
    """Ids for ``create_runs``, made as MLflow's ``create_run`` makes one (a uuid4's hex)."""
    return [uuid.uuid4().hex for _ in range(count)]


def create_runs(store: SqlAlchemyStore, experiment_id: str,
                runs: Sequence[tuple[str, Mapping[str, str]]],
                start_time: int, run_ids: Sequence[str] | None = None,
                ) -> list[tuple[str, str]]:
    """Create one run per ``(name, tags)`` in experiment ``experiment_id``, all in one
    transaction, each as MLflow's ``create_run`` makes it (``SqlAlchemyStore.create_run``
    with ``MlflowClient.create_run``'s user): its id (``run_ids``, else ``new_run_ids``),
    the artifact location under the experiment's, the name from ``name`` or the
    ``mlflow.runName`` tag (refused if they differ) or a random one, which is also written
    as that tag, the user from the ``mlflow.user`` tag, ``RUNNING`` from ``start_time``
    (ms). Returns each run's id and artifact URI, in order. Given ids that the store holds
    already (a retried call whose first attempt did commit) create nothing again. Raises
    MLflow's errors for a missing or deleted experiment."""
    ids = list(run_ids) if run_ids is not None else new_run_ids(len(runs))
    if len(ids) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(ids)} run ids")
    experiment = store.get_experiment(experiment_id)
    store._check_experiment_is_active(experiment)
    made: list[tuple[str, str]] = []
    run_rows: list[dict[str, Any]] = []
    tag_rows: list[dict[str, Any]] = []
    for (name, given), run_id in zip(runs, ids, strict=True):
        tags = dict(given)
        tagged = tags.get(MLFLOW_RUN_NAME)
        if name and tagged and name != tagged:
            raise MlflowException(  # SqlAlchemyStore.create_run's own message
                "Both 'run_name' argument and 'mlflow.runName' tag are specified, but with "
                f"different values (run_name='{name}', mlflow.runName='{tagged}').",
                INVALID_PARAMETER_VALUE)
        run_name = name or tagged or _generate_random_name()
        tags.setdefault(MLFLOW_RUN_NAME, run_name)
        artifact_uri = append_to_uri_path(experiment.artifact_location, run_id,
                                          SqlAlchemyStore.ARTIFACTS_FOLDER_NAME)
        run_rows.append({
            "run_uuid": run_id, "name": run_name, "artifact_uri": artifact_uri,
            "experiment_id": int(experiment_id),
            "source_type": SourceType.to_string(SourceType.UNKNOWN), "source_name": "",
            "entry_point_name": "", "user_id": tags.get(MLFLOW_USER, "unknown"),
            "status": RunStatus.to_string(RunStatus.RUNNING), "start_time": start_time,
            "end_time": None, "deleted_time": None, "source_version": "",
            "lifecycle_stage": LifecycleStage.ACTIVE,
        })
        tag_rows += [{"key": k, "value": v, "run_uuid": run_id} for k, v in tags.items()]
        made.append((run_id, artifact_uri))
    if run_rows:
        table = SqlRun.__table__
        with store.ManagedSessionMaker(read_only=False) as session:
            stored = session.execute(sqlalchemy.select(table.c.run_uuid)
                                     .where(table.c.run_uuid.in_(ids))).first()
            if stored is None:  # else a committed earlier attempt created them
                session.execute(sqlalchemy.insert(table), run_rows)
                session.execute(sqlalchemy.insert(SqlTag.__table__), tag_rows)
    return made


def write_run(store: SqlAlchemyStore, run_id: str, *, params: Sequence[Param] = (),
              tags: Sequence[RunTag] = (), metrics: Sequence[Metric] = (),
              end: tuple[str, int] | None = None) -> None:
    """Write ``params``, ``tags``, ``metrics`` and the run's ``end`` (status name, end time
    in ms) to run ``run_id`` in one transaction (see the module's docstring). Raises MLflow's
    ``MlflowException`` for a missing or deleted run, an invalid key or value, a param logged
    before with another value and an unknown status, ``AlreadyLogged`` when the store holds
    one of the metric rows already (nothing written)."""
    _validate_run_id(run_id)
    checked_params = [_validate_param(p.key, p.value, path=f"params[{i}]")
                      for i, p in enumerate(params)]
    _validate_param_keys_unique(checked_params)
    checked_tags = [_validate_tag(t.key, t.value, path=f"tags[{i}]")
                    for i, t in enumerate(tags)]
    last_tags = {t.key: t.value for t in checked_tags if t.key != MLFLOW_RUN_NAME}
    # ``log_batch`` applies each ``mlflow.runName`` tag in turn through ``update_run_info``,
    # where an empty name changes nothing (the tag included): the last non-empty one wins
    run_name = next((t.value for t in reversed(checked_tags)
                     if t.key == MLFLOW_RUN_NAME and t.value), None)
    status = None if end is None else _status(end[0])
    rows = metric_rows(store, run_id, metrics)
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        best = latest.get(row["key"])
        if best is None or _order(row) > _order(best):
            latest[row["key"]] = row
    run_values: dict[str, Any] = {}
    if run_name is not None:
        run_values["name"] = last_tags[MLFLOW_RUN_NAME] = run_name
    if end is not None:
        run_values.update(status=status, end_time=end[1])
    try:
        with store.ManagedSessionMaker(read_only=False) as session:
            store._check_run_is_active(store._get_run(run_uuid=run_id, session=session))
            _write_params(session, run_id, checked_params)
            _write_tags(session, run_id, last_tags)
            _write_metrics(session, run_id, rows, latest)
            if run_values:
                table = SqlRun.__table__
                session.execute(table.update().where(table.c.run_uuid == run_id)
                                .values(**run_values))
    except MlflowException as err:  # the session maker wraps what went wrong in the session
        if isinstance(err.__cause__, AlreadyLogged):
            raise err.__cause__ from None
        raise


def _status(name: str) -> str:
    """``name`` as MLflow stores a run status; MLflow's error, as an invalid value, if it is
    not one (``RunStatus.from_string`` raises a bare ``Exception``)."""
    try:
        return RunStatus.to_string(RunStatus.from_string(name))
    except Exception as err:
        raise MlflowException(str(err), INVALID_PARAMETER_VALUE) from None


def _write_params(session: Any, run_id: str, params: list[Param]) -> None:
    if not params:
        return
    table = SqlParam.__table__
    stored = dict(session.execute(sqlalchemy.select(table.c.key, table.c.value)
                                  .where(table.c.run_uuid == run_id)).all())
    changed = [{"key": p.key, "old_value": stored[p.key], "new_value": p.value}
               for p in params if p.key in stored and stored[p.key] != p.value]
    if changed:
        raise MlflowException(  # log_batch's own message (SqlAlchemyStore._log_params)
            "Changing param values is not allowed. Params were already"
            f" logged='{changed}' for run ID='{run_id}'.", INVALID_PARAMETER_VALUE)
    new = [{"key": p.key, "value": p.value, "run_uuid": run_id}
           for p in params if p.key not in stored]
    if new:
        session.execute(sqlalchemy.insert(table), new)


def _write_tags(session: Any, run_id: str, tags: dict[str, str]) -> None:
    if not tags:
        return
    table = SqlTag.__table__
    stored = dict(session.execute(sqlalchemy.select(table.c.key, table.c.value).where(
        table.c.run_uuid == run_id, table.c.key.in_(sorted(tags)))).all())
    changed = [{"k": k, "v": v} for k, v in tags.items() if k in stored and stored[k] != v]
    if changed:
        session.execute(table.update().where(table.c.run_uuid == run_id,
                                             table.c.key == sqlalchemy.bindparam("k"))
                        .values(value=sqlalchemy.bindparam("v")), changed)
    new = [{"key": k, "value": v, "run_uuid": run_id} for k, v in tags.items()
           if k not in stored]
    if new:
        session.execute(sqlalchemy.insert(table), new)


def _write_metrics(session: Any, run_id: str, rows: list[dict[str, Any]],
                   latest: dict[str, dict[str, Any]]) -> None:
    if not rows:
        return
    try:
        session.execute(sqlalchemy.insert(SqlMetric.__table__), rows)
    except sqlalchemy.exc.IntegrityError as err:  # a row stored by an earlier attempt
        raise AlreadyLogged(str(err.orig)) from None
    table = SqlLatestMetric.__table__
    stored = {r.key: r._asdict() for r in session.execute(
        sqlalchemy.select(table).where(table.c.run_uuid == run_id,
                                       table.c.key.in_(sorted(latest))))}
    new = [row for key, row in latest.items() if key not in stored]
    if new:
        session.execute(sqlalchemy.insert(table), new)
    for key, row in latest.items():
        if key in stored and _order(row) > _order(stored[key]):
            session.execute(
                table.update().where(table.c.run_uuid == run_id, table.c.key == key)
                .values(value=row["value"], timestamp=row["timestamp"], step=row["step"],
                        is_nan=row["is_nan"]))
