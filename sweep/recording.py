"""Recording for any launcher: a Hydra callback around ``sweep.recorder.SweepRecorder``.

The ``ray_actor`` launcher records through its own hook (``hydra.launcher.recorder``): it
claims points before it dispatches them and records each result in the driver as it
arrives. Any other launcher (``hydra/launcher=basic``, a plugin's) runs the jobs in this
process, one after another; ``RecordingCallback`` then does the same work around each job,
with the same recorder, so the MLflow runs and ``results.parquet`` are the same:

* ``on_job_start``: the point is checked (``sweep.preflight``: an invalid point ends the
  sweep with its message, an infeasible one is recorded with its reason and not simulated)
  and claimed in the store; a point that already has a finished run (resume) or that
  another live sweep runs is not simulated either: the task (``sweep.app.task``) picks up
  the stored result through ``take_result``;
* ``on_job_end``: the result is recorded;
* ``on_multirun_end``: the table is written and the parent run closed; a failed point or
  a result that could not be recorded makes the sweep exit non-zero.

The callback acts only in the driver (the process that started the multirun) and only when
the launcher does not record itself, so nothing is recorded twice.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

WAIT_POLL_S = 2.0
_RESULTS: dict[int, dict[str, Any]] = {}  # job -> stored result the task returns instead


def take_result() -> dict[str, Any] | None:
    """The result the callback found for the running job (resumed or infeasible), if any."""
    from hydra.core.hydra_config import HydraConfig

    if not _RESULTS or not HydraConfig.initialized():
        return None
    return _RESULTS.pop(int(HydraConfig.get().job.num), None)


class RecordingCallback(Callback):
    """See the module doc."""

    def __init__(self) -> None:
        self._driver: int | None = None
        self._master: DictConfig | None = None
        self._recorder: Any = None
        self._resume = True
        self._jobs = 0
        self._failed = 0

    def _active(self) -> bool:
        return self._driver == os.getpid()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        records_itself = OmegaConf.select(config, "hydra.launcher.recorder", default=None)
        self._driver = None if records_itself else os.getpid()
        self._master = config
        self._resume = bool(OmegaConf.select(config, "hydra.launcher.resume", default=True))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self._active():
            return
        from hydra_plugins.ray_actor_launcher.launcher import task_view
        from sweep.preflight import preflight

        idx = int(config.hydra.job.num)
        self._jobs += 1
        view = task_view(config)
        try:
            infeasible = preflight(view)
        except Exception as err:  # an invalid point: stop here, recording what ran
            self._finish("FAILED")
            raise SystemExit(f"Invalid config in job #{idx}; the sweep stops.\n{err}") from None
        if self._recorder is None:
            self._start(config)
        if infeasible is not None:
            _RESULTS[idx] = {"status": "infeasible", "reason": infeasible}
            return
        while True:
            kind, value = self._recorder.acquire([(idx, config)], self._resume)[idx]
            if kind == "done":
                _RESULTS[idx] = value
            if kind != "wait":
                return
            time.sleep(WAIT_POLL_S)  # another sweep runs this point: take its result

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not self._active() or self._recorder is None:
            return
        self._recorder.job_done(int(config.hydra.job.num), config, job_return)
        if job_return.status == JobStatus.FAILED:
            # Recorded; now go on with the other points as the ray_actor launcher does
            # (Hydra's basic sweeper would raise this job's error at once and leave the
            # sweep unrecorded): the failure makes the sweep exit non-zero at the end.
            self._failed += 1
            error = str(job_return._return_value)
            job_return.status = JobStatus.COMPLETED
            job_return.return_value = {"status": "failed", "error": error}

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self._active():
            return
        problem = self._finish("FAILED" if self._failed else "FINISHED")
        messages = []
        if self._failed:
            messages.append(f"{self._failed} of {self._jobs} jobs failed (their errors are in "
                            "the results table and each job's error.txt).")
        if problem:
            messages.append(problem)
        if messages:
            raise SystemExit(" ".join(messages))

    def _start(self, config: DictConfig) -> None:
        from sweep.recorder import SweepRecorder

        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()  # as the sweeper reserved it
        self._recorder = SweepRecorder(self._master or config, sweep_dir, num_jobs=0)
        self._recorder.start()

    def _finish(self, status: str) -> str | None:
        if self._recorder is None:
            return None
        self._recorder.num_jobs = self._jobs
        problem = self._recorder.close(status)
        self._recorder = None
        return problem
