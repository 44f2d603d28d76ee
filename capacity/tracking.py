"""MLflow records of a capacity study, written by the driver only.

A parent run for the study; one run per configuration (its answer: max rate, goodput, GPUs,
$/hour, $/1M output tokens; the resolved config and the SLO bounds, ``slo.<key>.bound``, as
params; its latency-vs-load plot); each probe a child run of its configuration's run (rate,
``passed``, margin and every metric of the probe's run under the sweep's names: the observed
SLO statistics, ``slo_met``, throughput, cost); a ``fleet-sizing`` run with the cheapest
option's numbers and the option table. The study's tables, plots and HTML report go to the
parent run.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from analysis.slo import SloSpec
from capacity.plots import latency_file, latency_vs_load_png
from capacity.pool import SOURCE_KEYS
from capacity.study import Configuration
from sweep.recorder import flatten
from sweep.store_lock import open_tracker
from sweep.tracking import Tracker


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    """The finite numeric (and boolean, as 0/1) fields of ``row``."""
    return {k: float(v) for k, v in row.items()
            if isinstance(v, numbers.Real) and math.isfinite(float(v))}


class MlflowSink:
    """Receives probes and answers from ``CapacityStudy`` and logs them."""

    def __init__(self, tracker: Tracker, parent_id: str, out_dir: Path, spec: SloSpec) -> None:
        self.tracker = tracker
        self.parent_id = parent_id
        self.out_dir = out_dir
        self.spec = spec
        self.config_runs: dict[str, str] = {}

    @classmethod
    def open(cls, cfg: DictConfig, out_dir: Path, spec: SloSpec) -> MlflowSink:
        tracker = open_tracker(str(cfg.tracking.uri), str(cfg.tracking.experiment))
        parent = tracker.create_run(
            out_dir.name, {"kind": "capacity_search", "study": str(cfg.study.name),
                           "output_dir": str(out_dir)})
        cap = OmegaConf.to_container(cfg.capacity, resolve=True)
        assert isinstance(cap, dict)
        tracker.log_params(parent, {**flatten(cap, "capacity."), **spec.params(),
                                    "slo": spec.describe()})
        return cls(tracker, parent, out_dir, spec)

    def _config_run(self, cfg: Configuration) -> str:
        run_id = self.config_runs.get(cfg.label)
        if run_id is None:
            run_id = self.tracker.create_run(
                cfg.label, {"kind": "capacity_config", "config": cfg.label}, self.parent_id)
            point = {k: v for k, v in cfg.point.items() if k not in ("tracking", "study")}
            params = flatten(point)
            params.pop("workload.rate", None)  # each probe has its own
            params.update(self.spec.params())
            self.tracker.log_params(run_id, params)
            self.config_runs[cfg.label] = run_id
        return run_id

    def probe_done(self, cfg: Configuration, row: dict[str, Any]) -> None:
        parent = self._config_run(cfg)
        name = f"probe-{row['probe']} rate={row['rate']:.4g}"
        run_id = self.tracker.create_run(
            name, {"kind": "capacity_probe", "config": cfg.label,
                   "passed": str(row["passed"]), "cached": str(row["cached"])}, parent)
        self.tracker.log_params(run_id, {"workload.rate": row["rate"], "probe_kind": row["kind"]})
        self.tracker.log_metrics(run_id, _numbers(row))
        self.tracker.finish(run_id, "FINISHED")

    def config_done(self, cfg: Configuration, answer: dict[str, Any]) -> None:
        run_id = self._config_run(cfg)
        self.tracker.log_metrics(run_id, _numbers(answer))
        self.tracker.set_tags(run_id, {"status": answer["status"],
                                       **{k: str(answer.get(k) or "") for k in SOURCE_KEYS}})
        plots = self.out_dir / "plots"
        plots.mkdir(parents=True, exist_ok=True)
        bounds = {b.key: b.max_ms for b in self.spec.bounds}
        png = latency_vs_load_png(pd.DataFrame(cfg.probe_rows), bounds, answer["max_rate"],
                                  f"{cfg.label}: {self.spec.describe()}")
        path = plots / latency_file(cfg.label)
        path.write_bytes(png)
        self.tracker.log_artifact(run_id, path)
        if cfg.error:
            self.tracker.log_text(run_id, cfg.error, "error.txt")
        self.tracker.finish(run_id, "FAILED" if answer["status"] == "failed" else "FINISHED")

    def log_fleet(self, fleet: pd.DataFrame | None, target_rate: float | None) -> None:
        if fleet is None or target_rate is None:
            return
        run_id = self.tracker.create_run("fleet-sizing", {"kind": "fleet_sizing"}, self.parent_id)
        self.tracker.log_params(run_id, {"target_rate": target_rate})
        if len(fleet):
            best = fleet.iloc[0]
            self.tracker.log_params(run_id, {"best.config": best["config"],
                                             "best.replicas": int(best["replicas"])})
            self.tracker.log_metrics(run_id, {f"best.{k}": v for k, v in _numbers(
                best.to_dict()).items()})
        path = self.out_dir / "fleet.csv"  # written by capacity.run.write_outputs
        if path.is_file():
            self.tracker.log_artifact(run_id, path)
        self.tracker.finish(run_id, "FINISHED" if len(fleet) else "FAILED")

    def close(self, status: str, files: list[Path]) -> None:
        try:
            for path in files:
                if path.is_file():
                    self.tracker.log_artifact(self.parent_id, path)
            self.tracker.finish(self.parent_id, status)
        finally:
            self.tracker.close()  # the store's file holds every run now (``Tracker.close``)
