"""Resume: which grid points already have a finished run in the tracking store.

A point's MLflow run is created when its result reaches the driver and is set ``FINISHED``
only after its params, metrics and artifacts are logged, so a ``FINISHED`` run tagged with a
``config_hash`` is a complete result. ``FinishedIndex.load`` reads every such run of one
experiment once (paged ``search_runs``); a resumed sweep looks each composed point up by
its hash and reuses the stored metrics instead of simulating the point again. Runs left
``RUNNING`` or ``FAILED`` (a killed driver, a failed point) are never taken as finished.
When several finished runs share a hash (sweeps rerun with resume off), the earliest one
is used, so the answer does not depend on search order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sweep.config_hash import HASH_KEY

SERIES_PREFIX = "ts/"  # stepped time-series metrics: not part of a point's summary row
PAGE = 1000


@dataclass(frozen=True, slots=True)
class FinishedPoint:
    """A finished run of one point: its id, summary metrics and where its files went."""

    run_id: str
    start_time: int
    metrics: dict[str, float]
    output_dir: str | None
    infeasible_reason: str | None = None

    def result(self) -> dict[str, Any]:
        """The point's result as ``run_point`` shapes it (or, for an infeasible point, as the
        launcher records it), marked with the run it came from."""
        if self.infeasible_reason is not None:
            return {"status": "infeasible", "reason": self.infeasible_reason,
                    "resumed_from": self.run_id, "resumed_output_dir": self.output_dir}
        return {"metrics": dict(self.metrics), "timeseries": {}, "resumed_from": self.run_id,
                "resumed_output_dir": self.output_dir}


def _finished_runs(client: Any, experiment_id: str) -> list[Any]:
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id], filter_string="attributes.status = 'FINISHED'",
            max_results=PAGE, page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


class FinishedIndex:
    """``config_hash -> FinishedPoint`` for the finished point runs of one experiment."""

    def __init__(self, points: dict[str, FinishedPoint]) -> None:
        self.points = points

    @classmethod
    def load(cls, client: Any, experiment_id: str) -> FinishedIndex:
        points: dict[str, FinishedPoint] = {}
        for run in _finished_runs(client, experiment_id):
            key = run.data.tags.get(HASH_KEY)
            if not key:
                continue
            point = FinishedPoint(
                run_id=run.info.run_id,
                start_time=int(run.info.start_time or 0),
                metrics={k: v for k, v in run.data.metrics.items()
                         if not k.startswith(SERIES_PREFIX)},
                output_dir=run.data.tags.get("output_dir"),
                infeasible_reason=(run.data.tags.get("infeasible_reason", "")
                                   if run.data.tags.get("status") == "infeasible" else None),
            )
            old = points.get(key)
            if old is None or (point.start_time, point.run_id) < (old.start_time, old.run_id):
                points[key] = point
        return cls(points)

    def get(self, config_hash: str) -> FinishedPoint | None:
        return self.points.get(config_hash)

    def __len__(self) -> int:
        return len(self.points)


def finished_counts(client: Any, experiment_id: str) -> Counter[str]:
    """How many ``FINISHED`` runs each config hash has (exactly-once checks: all 1)."""
    return Counter(
        run.data.tags[HASH_KEY]
        for run in _finished_runs(client, experiment_id)
        if run.data.tags.get(HASH_KEY)
    )
