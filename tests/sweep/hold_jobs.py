"""A Hydra callback that holds sweep jobs until a test lets them go, so a fault-injection
test lands its fault while jobs are known to be in flight instead of racing the engine's
speed (a point that took seconds once now ends between two polls).

Added on the command line, it runs wherever Hydra starts a job (``on_job_start`` runs in the
Ray actor for the ``ray_actor`` launcher)::

    +hydra.callbacks.hold._target_=tests.sweep.hold_jobs.HoldJobs
    +hydra.callbacks.hold.release=/tmp/x/release +hydra.callbacks.hold.from_job=2

Job ``hydra.job.num >= from_job`` writes ``<release>.held.<num>`` and waits until the file
``release`` exists. The callback lives under ``hydra``, which the point's config hash leaves
out, so a rerun without it resumes the same points.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class HoldJobs(Callback):
    def __init__(self, release: str, from_job: int, timeout_s: float = 600.0) -> None:
        self.release = Path(release)
        self.from_job = int(from_job)
        self.timeout_s = float(timeout_s)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        num = int(config.hydra.job.num)
        if num < self.from_job:
            return
        held_marker(self.release, num).touch()
        deadline = time.monotonic() + self.timeout_s
        while not self.release.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {num} was held {self.timeout_s:.0f} s: {self.release} "
                                   "was never created")
            time.sleep(0.05)


def held_marker(release: Path, num: int) -> Path:
    return release.with_name(f"{release.name}.held.{num}")


def held_jobs(release: Path) -> set[int]:
    """The numbers of the jobs that have reached the hold (running or released since)."""
    return {int(p.name.rsplit(".", 1)[1]) for p in release.parent.glob(f"{release.name}.held.*")}


def hold_overrides(release: Path, from_job: int) -> list[str]:
    return ["+hydra.callbacks.hold._target_=tests.sweep.hold_jobs.HoldJobs",
            f"+hydra.callbacks.hold.release={release}",
            f"+hydra.callbacks.hold.from_job={from_job}"]
