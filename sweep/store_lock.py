"""Open an MLflow store safely when several processes may create it at the same time.

MLflow creates and migrates a sqlite store on first use without any lock across processes:
two sweeps started together on a fresh ``mlflow.db`` crash (``duplicate column``, alembic
``Online migration expected to match one row``), and two drivers creating the same
experiment at once collide on its unique name. ``open_tracker`` holds an exclusive
``flock`` on ``<db>.lock`` beside the database while ``sweep.tracking.Tracker`` migrates
the schema and looks up or creates the experiment; other URIs (an MLflow server) are opened
directly, the server serialises its own writes. A sqlite file that does not exist yet is
made, under the same lock, as a copy of a store MLflow created once (``sweep.store_template``).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager

from sweep.tracking import RetryPolicy, Tracker, sqlite_path


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive inter-process lock for a ``sqlite:///`` store (no-op for other URIs)."""
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def open_tracker(uri: str, experiment: str, retry_budget_s: float | None = None) -> Tracker:
    """``Tracker(uri, experiment)`` with store creation and experiment lookup serialised;
    writes retried for ``retry_budget_s`` (default ``sweep.tracking.DEFAULT_RETRY_BUDGET_S``)."""
    retry = RetryPolicy(budget_s=retry_budget_s) if retry_budget_s is not None else None
    with store_lock(uri):
        db = sqlite_path(uri)
        if db is not None and not db.exists():
            from sweep.store_template import seed_store

            seed_store(db)
        return Tracker(uri, experiment, retry)
