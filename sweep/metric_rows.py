"""A run's metrics written into MLflow's SQL store as rows: two statements, one transaction.

MLflow's ``log_batch`` on a SQL store (``SqlAlchemyStore``) makes one ORM object per metric
and flushes them through SQLAlchemy's unit of work, about 150 µs a metric on the 2-core
machine: a sweep point's ~1,100 metrics (five time series of up to
``tracking.timeseries_steps`` steps, ~75 scalars) cost 0.16 CPU-s, more than simulating the
point (docs/sweep.md, "One batched MLflow write per point"). ``insert_metrics`` writes the same rows
into MLflow's own tables (the ``SqlMetric`` and ``SqlLatestMetric`` models) with one
``executemany`` each, inside MLflow's own session maker and with MLflow's own checks: the run
exists and is active (``_get_run``, ``_check_run_is_active``), each key's name and each value
are valid (``_validate_metric``, once per key; the values are checked to be numbers here), a
value is stored as MLflow stores it (``sanitize_metric_value``: NaN as 0 with ``is_nan``,
±inf clipped), exact duplicates are dropped as ``log_batch`` drops them, and a key's latest
value is the greatest by MLflow's order (step, then timestamp, then value), replacing a stored
one only when greater (``_update_latest_metrics_if_necessary``). A run read back through
``MlflowClient`` is the same as after ``log_batch`` (checked in tests/sweep/test_metric_rows.py).
``log_batch`` also links each metric to an MLflow active model when one is set
(``logged_model_metrics``); the rows do not, so the tracker does not use them then
(``sweep.tracking.Tracker._rows_store``).

A store that is not a SQL store has no rows to write (``sql_store`` returns None), and rows the
store already holds (a retried write whose first attempt did commit) make the transaction roll
back with ``AlreadyLogged``: the caller then logs through ``log_batch``, which skips them.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import sqlalchemy
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.utils.validation import _validate_metric


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
              or not isinstance(metric.step, int) or not isinstance(metric.timestamp, int)):
            _validate_metric(key, value, metric.timestamp, metric.step)  # raises MLflow's error
        is_nan, stored = store.sanitize_metric_value(value)
        ident = (key, metric.timestamp, metric.step, stored, is_nan)
        if ident not in rows:
            rows[ident] = {"key": key, "value": stored, "timestamp": metric.timestamp,
                           "step": metric.step, "is_nan": is_nan, "run_uuid": run_id}
    return list(rows.values())


def insert_metrics(store: SqlAlchemyStore, run_id: str, metrics: Sequence[Metric]) -> None:
    """Write ``metrics`` to run ``run_id`` in one transaction (see the module's docstring).
    Raises MLflow's ``MlflowException`` for a missing or deleted run and an invalid metric,
    ``AlreadyLogged`` when the store holds one of the rows already (nothing written)."""
    rows = metric_rows(store, run_id, metrics)
    if not rows:
        return
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        best = latest.get(row["key"])
        if best is None or _order(row) > _order(best):
            latest[row["key"]] = row
    try:
        with store.ManagedSessionMaker(read_only=False) as session:
            _write(store, session, run_id, rows, latest)
    except MlflowException as err:  # the session maker wraps what went wrong in the session
        if isinstance(err.__cause__, sqlalchemy.exc.IntegrityError):
            raise AlreadyLogged(str(err.__cause__.orig)) from None
        raise


def _write(store: SqlAlchemyStore, session: Any, run_id: str, rows: list[dict[str, Any]],
           latest: dict[str, dict[str, Any]]) -> None:
    store._check_run_is_active(store._get_run(run_uuid=run_id, session=session))
    session.execute(sqlalchemy.insert(SqlMetric.__table__), rows)
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
