"""A thin MLflow client for the driver: one store, one experiment, batched logging.

Only the sweep driver imports this module (actors return plain results), so a sqlite
store is created and migrated by exactly one process before any job starts, and put in
WAL mode, which makes single-writer logging about three times faster.

Every write is retried with exponential backoff (``RetryPolicy``): a store that is locked
for a while, or a server that restarts, costs time, not results. A write that still fails
raises ``TrackingWriteError``; the caller counts what it could not record. Once a write
has used its whole budget the store is taken as down and later writes are tried once each
(no backoff) until one succeeds again, so an outage delays a sweep by one budget, not one
per write. ``check_store`` finds an unreachable server or an unwritable sqlite path before
anything runs: MLflow's own HTTP client would retry for minutes and then raise a chain of
tracebacks, so its retries are cut to one short attempt here and ours take over.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

# MLflow logs its schema migrations at INFO through alembic; keep the console quiet.
logging.getLogger("alembic").setLevel(logging.WARNING)
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
# MLflow's HTTP client retries 7 times with backoff (minutes); ours retry instead.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

from sweep.gc_policy import long_lived  # noqa: E402

# MLflow's modules are about 270,000 objects that the driver keeps to its end: created
# outside the collector's walks (sweep.gc_policy)
with long_lived():
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.tracking import MlflowClient
    from mlflow.utils.uri import add_databricks_profile_info_to_artifact_uri

from sweep.store_check import TrackingError, check_store, sqlite_path  # noqa: E402

__all__ = ["TrackingError", "TrackingWriteError", "Tracker", "RetryPolicy", "check_store",
           "chart_series", "finite_metrics", "sqlite_path"]

MAX_PARAMS = 100  # per log_batch call (MLflow's limits: 100 params, 100 tags,
MAX_TAGS = 100  # 1000 metrics, 1000 entities in all)
MAX_METRICS = 1000
MAX_ENTITIES = 1000
MAX_PARAM_LEN = 6000


log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_RETRY_BUDGET_S = 20.0  # per write: a store locked or restarting for this long is waited out


class TrackingWriteError(RuntimeError):
    """A write to the tracking store failed after every retry."""


@dataclass
class RetryPolicy:
    """Backoff for store writes: ``first_s``, doubled each time, ``budget_s`` in total."""

    first_s: float = 0.25
    budget_s: float = DEFAULT_RETRY_BUDGET_S
    down: bool = False  # a write used its whole budget: try once until one succeeds

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried until ``budget_s`` of wall time (attempts included: a locked
        sqlite store makes each attempt wait MLflow's own 20 s busy timeout) has passed."""
        delay, start = self.first_s, time.monotonic()
        while True:
            try:
                value = fn()
            except Exception as err:  # store errors come as several types (sqlalchemy, http)
                waited = time.monotonic() - start
                if _not_retriable(err) or self.down or waited + delay > self.budget_s:
                    if not _not_retriable(err) and not self.down:
                        self.down = True
                        log.warning(f"MLflow store down: {what} failed for {waited:.1f} s; "
                                    "later writes are tried once each until one succeeds")
                    raise TrackingWriteError(f"{what}: {type(err).__name__}: {err}") from err
                time.sleep(delay)
                delay *= 2
            else:
                if self.down:
                    log.warning("MLflow store writable again")
                    self.down = False
                return value


def _not_retriable(err: Exception) -> bool:
    """A request the store refused on its merits (bad value, duplicate): retrying won't help."""
    code = getattr(err, "error_code", None)
    return code in ("INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "BAD_REQUEST")


def finite_metrics(metrics: Mapping[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """``metrics`` with ±inf replaced by NaN (MLflow would store ±1.797e308, so a resumed
    value would differ from a fresh one), and ``{name: "+inf"|"-inf"}`` of those replaced."""
    out, replaced = {}, {}
    for key, value in metrics.items():
        v = float(value)
        if math.isinf(v):
            replaced[key] = "+inf" if v > 0 else "-inf"
            v = math.nan
        out[key] = v
    return out, replaced


def chart_series(series: Mapping[str, Sequence[float]], steps: Sequence[int],
                 max_steps: int | None) -> tuple[dict[str, list[float]], list[int]]:
    """``series`` (columns aligned with ``steps``, strictly increasing) in at most
    ``max_steps`` steps, for MLflow.

    Unchanged when it has no more samples (or ``max_steps`` is ``None``). Otherwise the
    samples are cut into ``max_steps`` runs of consecutive samples as equal as whole samples
    allow (the first ``n % max_steps`` runs one sample longer): each column's value is the
    mean of the run's samples (NaN samples left out; NaN only when all are), its step the
    run's last step, so a per-second throughput stays a rate and the x axis stays in the
    series' own steps. The full series is the point's ``timeseries.parquet``."""
    n = len(steps)
    for name, col in series.items():
        if len(col) != n:
            raise ValueError(f"series {name!r} has {len(col)} values for {n} steps")
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError("steps must be strictly increasing")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps={max_steps}: must be >= 1")
    if max_steps is None or n <= max_steps:
        return {k: [float(v) for v in col] for k, col in series.items()}, [int(t) for t in steps]
    width, longer = divmod(n, max_steps)
    starts = np.arange(max_steps) * width + np.minimum(np.arange(max_steps), longer)
    ends = np.append(starts[1:], n)
    binned = {}
    for name, col in series.items():
        values = np.asarray(col, dtype=float)
        present = ~np.isnan(values)
        sums = np.add.reduceat(np.where(present, values, 0.0), starts)
        counts = np.add.reduceat(present.astype(np.int64), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            binned[name] = [float(v) for v in sums / counts]
    return binned, [int(steps[e - 1]) for e in ends]


def _context_tags() -> dict[str, str]:
    """MLflow's standard run tags for this process (source, user, git commit), as
    ``resolve_tags`` gives them. In a process that has not loaded IPython no IPython shell
    runs, so MLflow's notebook probes (Jupyter, Databricks) can only answer "not in a
    notebook"; each would first import IPython to learn it (``resolve_tags`` 0.28–0.34 CPU-s
    against 0.04–0.05 without, where IPython is installed). There the import is made to fail for the duration, which every probe takes
    for the same answer (they catch ``ImportError`` as "no shell")."""
    from mlflow.tracking.context.registry import resolve_tags

    if "IPython" in sys.modules:
        return {k: str(v) for k, v in resolve_tags().items()}
    sys.modules["IPython"] = None  # type: ignore[assignment]  # import IPython -> ImportError
    try:
        tags = resolve_tags()
    finally:
        if sys.modules.get("IPython", 0) is None:
            del sys.modules["IPython"]
    return {k: str(v) for k, v in tags.items()}


class Tracker:
    """One MLflow experiment in one store; runs are created and logged by id. Every write
    goes through ``self.retry``."""

    def __init__(self, uri: str, experiment: str, retry: RetryPolicy | None = None) -> None:
        self.uri = uri
        self.retry = retry or RetryPolicy(budget_s=DEFAULT_RETRY_BUDGET_S)
        check_store(uri)
        db = sqlite_path(uri)
        self.client = MlflowClient(tracking_uri=uri)
        self._sql_store: Any = None  # set once the experiment is found (the store is made then)
        # The artifact URI of each run created here, until it is finished: MLflow's client
        # reads the whole run back (``get_run``, its params and metrics) for the URI the first
        # time a run logs an artifact; the URI is known from ``create_run``'s answer.
        self._artifact_uris: dict[str, str] = {}
        try:
            exp = self.client.get_experiment_by_name(experiment)
            self.experiment_id = (exp.experiment_id if exp
                                  else self.client.create_experiment(experiment))
            if db is not None:
                with contextlib.closing(sqlite3.connect(db)) as con:
                    con.execute("PRAGMA journal_mode=WAL")
            self._context_tags = _context_tags()
            if "mlflow.store.tracking.sqlalchemy_store" in sys.modules:  # maybe a SQL store
                with long_lived():
                    from sweep.run_rows import sql_store
                self._sql_store = sql_store(self.client)
        except Exception as err:  # first contact: one message, not MLflow's traceback chain
            raise TrackingError(
                f"tracking.uri={uri}: cannot open experiment {experiment!r}: "
                f"{type(err).__name__}: {str(err)[:500]}; check the store, or set "
                "tracking.uri=null to run without MLflow"
            ) from None

    def create_run(self, name: str, tags: Mapping[str, str], parent_id: str | None = None) -> str:
        """A run with ``tags`` plus MLflow's standard ones (``mlflow.source.name``,
        ``mlflow.source.type``, ``mlflow.user``, ``mlflow.source.git.commit``, as MLflow's
        own context providers resolve them for this process)."""
        all_tags = self._run_tags(tags, parent_id)
        run = self.retry.call(f"create run {name}", lambda: self.client.create_run(
            self.experiment_id, run_name=name, tags=all_tags))
        self._artifact_uris[run.info.run_id] = run.info.artifact_uri
        return run.info.run_id

    def _run_tags(self, tags: Mapping[str, str], parent_id: str | None) -> dict[str, str]:
        """A new run's tags: MLflow's context tags, ``tags``, and its parent's id."""
        all_tags = {**self._context_tags, **tags}
        if parent_id is not None:
            all_tags["mlflow.parentRunId"] = parent_id
        return all_tags

    def create_runs(self, runs: Sequence[tuple[str, Mapping[str, str], str | None]]
                    ) -> list[str]:
        """One run per ``(name, tags, parent_id)``, as ``create_run`` makes each; into a SQL
        store all in one transaction (``sweep.run_rows.create_runs``), retried as a whole."""
        if self._sql_store is None:
            return [self.create_run(name, tags, parent_id) for name, tags, parent_id in runs]
        from sweep.run_rows import create_runs, new_run_ids

        specs = [(name, self._run_tags(tags, parent_id)) for name, tags, parent_id in runs]
        start = int(time.time() * 1000)
        ids = new_run_ids(len(specs))  # fixed across retries: a retry never makes twins
        made = self.retry.call(f"create {len(specs)} runs", lambda: create_runs(
            self._sql_store, self.experiment_id, specs, start, ids))
        self._artifact_uris.update(made)
        return [run_id for run_id, _ in made]

    def describe_experiment(self, text: str) -> None:
        """Set the experiment's description (shown by the MLflow UI)."""
        if text:
            self.retry.call("set experiment description", lambda: self.client.set_experiment_tag(
                self.experiment_id, "mlflow.note.content", text))

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS):
            self._batch(run_id, params=items[i : i + MAX_PARAMS])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        """Log ``metrics``; ±inf goes in as NaN and the run gets a ``nonfinite_metrics`` tag
        naming each (``name=+inf``), so the store never holds a clipped 1.797e308."""
        now = int(time.time() * 1000)
        values, replaced = finite_metrics(metrics)
        self._log_metric_list(run_id, [Metric(k, v, now, step) for k, v in values.items()])
        if replaced:
            self.set_tags(run_id, {"nonfinite_metrics": ",".join(
                f"{k}={v}" for k, v in sorted(replaced.items()))})

    def log_series(self, run_id: str, series: Mapping[str, Iterable[float]], steps: list[int],
                   prefix: str = "ts/") -> None:
        """Each column of ``series`` as a stepped metric ``<prefix><column>``."""
        now = int(time.time() * 1000)
        items = [
            Metric(f"{prefix}{name}", float(v), now, step)
            for name, values in series.items()
            for step, v in zip(steps, values, strict=True)
        ]
        self._log_metric_list(run_id, items)

    def log_point(self, run_id: str, params: Mapping[str, Any], metrics: Mapping[str, float],
                  tags: Mapping[str, str] | None = None,
                  series: Mapping[str, Iterable[float]] | None = None,
                  steps: list[int] | None = None, prefix: str = "ts/",
                  status: str | None = None) -> None:
        """One point's params, tags, metrics and stepped series (``log_series``), and with
        ``status`` its end (as ``finish``). Into a SQL store, all of it is one transaction
        (``sweep.run_rows.write_run``), retried as a whole: a run is ``FINISHED`` with all
        its data or not at all. Into another store, params and tags go in as few
        ``log_batch`` calls as MLflow's batch limits allow, the metrics filling the batches'
        room, then ``set_terminated``; each call is one store transaction retried on its own,
        so a retry never logs a value twice. ±inf metrics go in as NaN with a
        ``nonfinite_metrics`` tag, as in ``log_metrics``."""
        now = int(time.time() * 1000)
        values, replaced = finite_metrics(metrics)
        all_tags = dict(tags or {})
        if replaced:
            all_tags["nonfinite_metrics"] = ",".join(f"{k}={v}" for k, v in sorted(replaced.items()))
        param_items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in params.items()]
        tag_items = [RunTag(k, str(v)) for k, v in all_tags.items()]
        metric_items = [Metric(k, v, now, 0) for k, v in values.items()]
        if series is not None and steps is not None:
            metric_items += [
                Metric(f"{prefix}{name}", float(v), now, step)
                for name, column in series.items()
                for step, v in zip(steps, column, strict=True)
            ]
        if self._write_rows(run_id, param_items, tag_items, metric_items, status):
            if status is not None:
                self._artifact_uris.pop(run_id, None)
            return
        while param_items or tag_items or metric_items:
            batch_params, param_items = param_items[:MAX_PARAMS], param_items[MAX_PARAMS:]
            batch_tags, tag_items = tag_items[:MAX_TAGS], tag_items[MAX_TAGS:]
            room = min(MAX_METRICS, MAX_ENTITIES - len(batch_params) - len(batch_tags))
            batch_metrics, metric_items = metric_items[:room], metric_items[room:]
            self._batch(run_id, params=batch_params, tags=batch_tags, metrics=batch_metrics)
        if status is not None:
            self.finish(run_id, status)

    def _rows_store(self) -> Any:
        """The SQL store a run's rows go into (``sweep.run_rows``), or None: a store that is
        not SQL, or an MLflow active model, whose metrics ``log_batch`` also links to the
        model (the rows would not)."""
        if self._sql_store is None:
            return None
        from mlflow.tracking.fluent import get_active_model_id

        return None if get_active_model_id() else self._sql_store

    def _write_rows(self, run_id: str, params: list[Param], tags: list[RunTag],
                    metrics: list[Metric], status: str | None = None) -> bool:
        """Everything into run ``run_id`` as rows in one transaction (``_rows_store``), and
        whether that was done: not for a store that takes no rows, nor when a committed
        earlier attempt left some of the metric rows in the store (``log_batch`` then skips
        those)."""
        if not (params or tags or metrics or status):
            return True
        store = self._rows_store()
        if store is None:
            return False
        from sweep.run_rows import AlreadyLogged, write_run

        end = None if status is None else (status, int(time.time() * 1000))

        def write() -> bool:
            try:
                write_run(store, run_id, params=params, tags=tags, metrics=metrics, end=end)
            except AlreadyLogged:
                return False
            return True

        return self.retry.call(f"log {len(params)} params, {len(tags)} tags, "
                               f"{len(metrics)} metrics to run {run_id}", write)

    def _log_metric_list(self, run_id: str, items: list[Metric]) -> None:
        """``items`` into run ``run_id``: as rows in one transaction (``_write_rows``), else
        through ``log_batch`` in batches of MLflow's limit."""
        if self._write_rows(run_id, [], [], items):
            return
        for i in range(0, len(items), MAX_METRICS):
            self._batch(run_id, metrics=items[i : i + MAX_METRICS])

    def _batch(self, run_id: str, **items: Any) -> None:
        self.retry.call(f"log_batch to run {run_id}",
                        lambda: self.client.log_batch(run_id, **items))

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, run_id: str, path: Path) -> None:
        """The file ``path`` into the run's artifacts: through the artifact repository of the
        URI ``create_run`` answered (as ``MlflowClient.log_artifact`` finds it), or, for a
        run created elsewhere, through the client."""
        uri = self._artifact_uris.get(run_id)
        if uri is None:
            def write() -> None:
                self.client.log_artifact(run_id, str(path))
        else:
            repo = get_artifact_repository(
                add_databricks_profile_info_to_artifact_uri(uri, self.uri), tracking_uri=self.uri)

            def write() -> None:
                repo.log_artifact(str(path))
        self.retry.call(f"log_artifact {path.name} to run {run_id}", write)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.retry.call(f"log_text {name} to run {run_id}",
                        lambda: self.client.log_text(run_id, text, name))

    def close(self) -> None:
        """Close the store's pooled connections once the last write is done and, for a
        sqlite store, checkpoint its write-ahead log (``journal_mode=WAL``, set above) into
        the database file and empty it (``wal_checkpoint(TRUNCATE)``), so the file alone
        holds every run: until then the runs are in ``<db>-wal``, which a copy of the file
        alone would miss, and sqlite checkpoints by itself only when its last connection
        closes cleanly (the driver's heap is frozen, ``sweep.gc_policy``, so nothing closes
        the ones outside the pool before the process ends). The tracker may be used again
        after: the engine opens new connections on demand."""
        from sweep.store_template import dispose_client

        dispose_client(self.client)
        db = sqlite_path(self.uri)
        if db is None:
            return
        try:  # (mode=rw: a store that is gone is not created again, empty)
            with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=rw",
                                                    uri=True)) as con:
                busy, _, _ = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as err:
            log.warning(f"{db}: the write-ahead log was not checkpointed ({err}); the runs "
                        "written stay in the log beside it")
            return
        if busy:
            log.warning(f"{db}: the write-ahead log could not be checkpointed (the store is in "
                        "use by another connection); its runs stay in the log until it can be")

    def finish(self, run_id: str, status: str) -> None:
        self.retry.call(f"set run {run_id} {status}",
                        lambda: self.client.set_terminated(run_id, status=status))
        self._artifact_uris.pop(run_id, None)
