"""The Hydra application: ``python -m sweep`` (one point) or ``python -m sweep ... -m`` (a grid).

Every job calls ``task``: it simulates one point (``sweep.job.run_point``) and returns the
plain result. In a multirun the ``ray_actor`` launcher's recorder stores the results in the
driver; with any other launcher ``sweep.recording.RecordingCallback`` does (and may hand the
task a stored result instead: a resumed or infeasible point); in a single run this process
is the driver and records the one result itself.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import DictConfig

from engine.specs import ConfigError
from sweep.recording import take_result
from sweep.schema import register

log = logging.getLogger(__name__)
register()

SUMMARY_KEYS = (
    "completed",
    "request_throughput",
    "output_throughput",
    "goodput_rps",
    "ttft_ms_p99",
    "tpot_ms_p99",
    "e2el_ms_p99",
    "kv_usage_pct_max",
    "num_preemptions",
    "makespan_s",
    "sim_wall_s",
)


def task(cfg: DictConfig) -> dict[str, Any]:
    """Simulate the point described by ``cfg``; record it too when not in a multirun (the
    recorder, ``sweep.recorder.SweepRecorder.job_done``, draws its time-series plot). A
    single run checks the point first (``sweep.preflight``): an invalid or infeasible point
    exits non-zero with the reason and no traceback; the infeasible one is recorded as such. A single run logs the
    point's key metrics as soon as it is simulated, then plots and records it (MLflow is
    imported only then); it exits non-zero if the recording is incomplete."""
    from sweep.job import run_point

    hydra_cfg = HydraConfig.get()
    single = hydra_cfg.mode == RunMode.RUN
    infeasible = None
    if single:
        from sweep.preflight import preflight

        try:
            infeasible = preflight(cfg)
        except ConfigError as err:  # one clear message instead of a traceback
            raise SystemExit(f"Invalid config; nothing was run.\n{err}") from None
    stored = None if single else take_result()  # resumed / infeasible (basic launcher)
    if stored is not None:
        return stored
    if infeasible is not None:
        result: dict[str, Any] = {"status": "infeasible", "reason": infeasible}
    else:
        result = run_point(cfg)
        if single:  # the answer first; the plot, the files and MLflow follow
            metrics = result["metrics"]
            for key in SUMMARY_KEYS:
                log.info(f"{key:>20}: {metrics.get(key, float('nan')):.4g}")
    if single:
        from sweep.recorder import SweepRecorder

        out_dir = Path(hydra_cfg.runtime.output_dir)
        recorder = SweepRecorder(cfg, out_dir, num_jobs=1, nested=False)
        recorder.start()
        ret = JobReturn(status=JobStatus.COMPLETED, _return_value=result)
        recorder.job_done(0, cfg, ret)
        problem = recorder.close("FINISHED")
        if infeasible is not None:
            raise SystemExit(f"Infeasible: {infeasible} (recorded as infeasible in "
                             f"{out_dir}; nothing was simulated)")
        if problem:
            raise SystemExit(problem)
    return result


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    return task(cfg)
