"""A thin MLflow client for the driver: one store, one experiment, batched logging.

Only the sweep driver imports this module (actors return plain results), so a sqlite
store is created and migrated by exactly one process before any job starts, and put in
WAL mode, which makes single-writer logging about three times faster.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# MLflow logs its schema migrations at INFO through alembic; keep the console quiet.
logging.getLogger("alembic").setLevel(logging.WARNING)
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

MAX_PARAMS = 100  # per log_batch call (MLflow's limit)
MAX_METRICS = 1000
MAX_PARAM_LEN = 6000


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative paths are cwd-relative)."""
    prefix = "sqlite:///"
    return Path(uri[len(prefix) :]) if uri.startswith(prefix) else None


class Tracker:
    """One MLflow experiment in one store; runs are created and logged by id."""

    def __init__(self, uri: str, experiment: str) -> None:
        self.uri = uri
        db = sqlite_path(uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(experiment)
        if db is not None:
            with sqlite3.connect(db) as con:
                con.execute("PRAGMA journal_mode=WAL")

    def create_run(self, name: str, tags: Mapping[str, str], parent_id: str | None = None) -> str:
        all_tags = dict(tags)
        if parent_id is not None:
            all_tags["mlflow.parentRunId"] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS):
            self.client.log_batch(run_id, params=items[i : i + MAX_PARAMS])

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        self._log_metric_list(run_id, [Metric(k, float(v), now, step) for k, v in metrics.items()])

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

    def _log_metric_list(self, run_id: str, items: list[Metric]) -> None:
        for i in range(0, len(items), MAX_METRICS):
            self.client.log_batch(run_id, metrics=items[i : i + MAX_METRICS])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, run_id: str, path: Path) -> None:
        self.client.log_artifact(run_id, str(path))

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, text, name)

    def finish(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)
