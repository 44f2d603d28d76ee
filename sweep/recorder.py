"""Where sweep results go, in the driver: per-job files, MLflow runs, the results table.

``SweepRecorder`` is the ``ray_actor`` launcher's recorder hook (``hydra.launcher.recorder``)
and is also used by a single ``python -m sweep`` run. For a sweep it opens a parent MLflow
run, claims each grid point in the store before it runs (``sweep.claims``: the point's own
run, ``RUNNING`` with a heartbeat, so two sweeps on one store run each point once between
them), logs into that run as the result arrives (flattened config as params, the metrics,
the time series as step metrics (per second, in at most ``tracking.timeseries_steps`` steps:
``sweep.tracking.chart_series``), the per-request Parquet, the resolved config and a plot
as artifacts) and at the end writes ``results.parquet`` (one row per point: config
columns + metrics) into the sweep directory. Every point carries the content hash of its
config (``sweep.config_hash``) as an MLflow tag and param and a table column; a point that
already has a ``FINISHED`` run is not run again, its row reuses that run (``resumed_from``).

Nothing reported as recorded is missing: files are written to a temporary name and renamed,
a point's run is set ``FINISHED`` only after its files and every MLflow write succeeded
(``KILLED`` with a ``servesweep.incomplete`` tag otherwise, so a rerun computes it again),
and ``close`` counts what could not be written (``missing`` column, parent tags, summary
line) and returns a message that makes the sweep exit non-zero. MLflow calls go through one
background writer thread (still one process, one writer), so the launcher's dispatch loop
never waits on the store.
"""

from __future__ import annotations

import json
import logging
import math
import os
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from enum import Enum
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.ray_actor_launcher.job_run import yaml_text
from sweep.claims import Claims, Decision, PointClaim
from sweep.config_hash import HASH_KEY, point_hash
from sweep.gc_policy import launch_ended, long_lived
from sweep.tracking import TrackingError, TrackingWriteError, chart_series, finite_metrics

log = logging.getLogger(__name__)

RESULTS_FILE = "results.parquet"
STUDY_PLOT = "study.svg"  # the study's key plot, beside the results table (sweep.svg_study)
METADATA_KEY = b"servesweep"
# Config subtrees that describe bookkeeping, not the simulated point.
NON_POINT_KEYS = ("tracking",)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts to ``{"a.b.c": leaf}``; lists become their string form."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(tree, list):
        return {prefix[:-1]: str(tree)}
    return {prefix[:-1]: tree}


def task_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved job config as plain containers, without ``hydra``, in the config's key
    order (enums as their names, as ``OmegaConf.to_yaml`` writes them). Each top-level
    subtree is converted in place; the ``hydra`` node, most of a job config's nodes, is
    neither copied nor converted. A missing top-level value stays ``???``."""
    data: dict[str, Any] = {}
    for key in cfg:
        if key == "hydra":
            continue
        if OmegaConf.is_missing(cfg, key):
            data[str(key)] = "???"
            continue
        value = cfg[key]
        data[str(key)] = (OmegaConf.to_container(value, resolve=True, enum_to_str=True)
                          if OmegaConf.is_config(value)
                          else value.name if isinstance(value, Enum) else value)
    return data


def config_yaml(point: dict[str, Any]) -> str:
    """``point`` (a ``task_config``) as YAML, the text ``OmegaConf.to_yaml`` gives for it
    but for the forms of some text (``job_run.yaml_text``: OmegaConf's representer and
    options, emitted by libyaml; it also writes each job's ``.hydra`` files), without
    building a config from the dict."""
    return yaml_text(point)


def atomic_write(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename,
    so a reader (or a full disk) never sees a truncated file; the temporary is removed on
    failure."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_results_table(rows: list[dict[str, Any]], path: Path, meta: dict[str, Any]) -> Path:
    """Rows to Parquet with ``meta`` (JSON) in the schema metadata under ``servesweep``
    (written atomically)."""
    frame = pd.DataFrame(rows)
    for col in frame.columns:
        if frame[col].dtype == object:
            kinds = {type(v) for v in frame[col] if v is not None and v == v}
            if len(kinds) > 1:  # mixed types (e.g. an int or a name): keep them as text
                frame[col] = frame[col].map(lambda v: None if v is None else str(v))
    table = pa.Table.from_pandas(frame, preserve_index=False)
    merged = {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(meta).encode()}
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(merged), sink)
    return atomic_write(path, sink.getvalue().to_pybytes())


def read_results_table(path: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The results table and its ``servesweep`` metadata."""
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(METADATA_KEY, b"{}")
    return table.to_pandas(), json.loads(raw)


class SweepRecorder:
    """Records every job of one sweep (``nested=True``) or one single run (``nested=False``)."""

    def __init__(self, config: DictConfig, sweep_dir: Path, num_jobs: int, nested: bool = True):
        self.sweep_dir = Path(sweep_dir)
        self.num_jobs = num_jobs
        self.nested = nested
        self.rows: list[dict[str, Any]] = []
        self.study = OmegaConf.to_container(config.study, resolve=True)
        tracking = OmegaConf.to_container(config.tracking, resolve=True)
        assert isinstance(tracking, dict)
        self.tracking = tracking
        self.groundtruth = config.groundtruth.dir
        self.slo = config.slo
        self.groundtruth_metrics: dict[str, float] | None = None
        self.sweep_overrides = (
            list(OmegaConf.select(config, "hydra.overrides.task", default=[]) or [])
        )
        self.swept = swept_keys(config)
        self.objective = self.study.get("objective")
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        self.launcher = target.rsplit(".", 1)[-1] or "none"
        self.tracker: Any = None
        self.claims: Claims | None = None
        self.parent_id: str | None = None
        self._claimed: dict[int, str] = {}  # job -> its claimed run
        self._names: dict[int, str] = {}
        # job -> its ``task_config``, made once when the job is acquired, used by ``job_done``
        self._points: dict[int, dict[str, Any]] = {}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow")
        self._logging: list[tuple[dict[str, Any], Future[str]]] = []

    # --------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Open the MLflow store, close runs that dead drivers left ``RUNNING`` and, for a
        sweep, open the parent run (before any job runs). MLflow, SQLAlchemy and the open
        store stay loaded for the rest of the process: they are created outside the
        collector's walks (``sweep.gc_policy.long_lived``)."""
        if not self.tracking.get("uri"):
            if self.groundtruth:
                from sweep.groundtruth import groundtruth_metrics

                self.groundtruth_metrics = groundtruth_metrics(self.groundtruth, self.slo)[1]
            return
        with long_lived():
            self._open_tracker()

    def _open_tracker(self) -> None:
        from sweep.store_lock import open_tracker

        try:
            # several sweeps may open (and create) one sqlite store at the same time
            self.tracker = open_tracker(self.tracking["uri"], self.tracking["experiment"],
                                        self.tracking.get("retry_budget_s"))
        except TrackingError as err:
            raise SystemExit(f"{err}\nNothing was run.") from None
        self.claims = Claims(self.tracker)
        try:
            self._open_parent()
        except TrackingWriteError as err:
            self.claims.stop()
            raise SystemExit(f"tracking.uri={self.tracking['uri']}: the MLflow store refused "
                             f"writes ({err}); nothing was run") from None

    def _open_parent(self) -> None:
        assert self.tracker is not None and self.claims is not None
        self.tracker.describe_experiment(str(self.study.get("description") or ""))
        if self.nested:
            closed = self.claims.close_stale()
            if closed:
                log.info(f"closed {closed} run(s) left RUNNING by sweeps that no longer run")
            self.parent_id = self.tracker.create_run(
                self.sweep_dir.name,
                tags={
                    "sweep_dir": str(self.sweep_dir),
                    "study": str(self.study["name"]),
                    "num_jobs": str(self.num_jobs),
                    "launcher": self.launcher,
                    "kind": "sweep",
                    "mlflow.note.content": str(self.study.get("description") or ""),
                    **self.claims.owner_tags(),
                },
            )
            self.claims.hold(self.parent_id)
            self.tracker.log_params(
                self.parent_id,
                {"study.name": self.study["name"], "sweep_overrides": " ".join(self.sweep_overrides)},
            )
        if self.groundtruth:
            self._log_groundtruth()

    def acquire(self, jobs: list[tuple[int, DictConfig]], reuse_finished: bool = True,
                ) -> dict[int, tuple[str, Any]]:
        """What to do with each job: ``("run", None)`` (claimed for this sweep),
        ``("done", result)`` (a finished run of the point exists) or ``("wait", None)``
        (another live sweep runs it now; ask again later). Without a store every job runs."""
        if self.claims is None or not self.nested:
            return {idx: ("run", None) for idx, _ in jobs}
        points = []
        for idx, cfg in jobs:
            self._names.setdefault(idx, self._run_name(idx, cfg))
            overrides = list(OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or [])
            tags = {"job_num": str(idx), "source": "sim", "kind": "point",
                    "overrides": " ".join(overrides)[:5000],
                    "output_dir": str(self._job_dir(cfg, None)),
                    "mlflow.parentRunId": str(self.parent_id)}
            point = self._points.get(idx)
            if point is None:
                point = self._points[idx] = task_config(cfg)
            points.append(PointClaim(idx, _point_hash(cfg, point), self._names[idx], tags))
        try:
            decisions: dict[int, Decision] = self.claims.decide(points, reuse_finished)
        except TrackingWriteError as err:  # store down: run unclaimed, count what is not logged
            log.error(f"points not claimed in the MLflow store ({err}); running them anyway")
            return {idx: ("run", None) for idx, _ in jobs}
        out: dict[int, tuple[str, Any]] = {}
        for idx, d in decisions.items():
            if d.kind == "run":
                assert d.run_id is not None
                self._claimed[idx] = d.run_id
                out[idx] = ("run", None)
            elif d.kind == "finished":
                assert d.finished is not None
                out[idx] = ("done", d.finished.result())
            else:
                out[idx] = ("wait", None)
        return out

    def job_done(self, idx: int, cfg: DictConfig, ret: JobReturn) -> None:
        """Write the job's files, log its MLflow run, and keep its results-table row.

        The result's bulky payloads (Parquet and SVG bytes) are replaced by the paths of
        the files written, so a long sweep does not hold them all in memory. A file that
        cannot be written (full disk) is counted in the row's ``missing`` and keeps the
        point's run from being set ``FINISHED``.
        """
        point = self._points.pop(idx, None)
        if point is None:  # not acquired (a single run, no store)
            point = task_config(cfg)
        out_dir = self._job_dir(cfg, ret)
        overrides = list(OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or [])
        params = flatten({k: v for k, v in point.items() if k not in NON_POINT_KEYS})
        value = ret._return_value
        ok = ret.status == JobStatus.COMPLETED and isinstance(value, dict) and "metrics" in value
        infeasible = (ret.status == JobStatus.COMPLETED and isinstance(value, dict)
                      and value.get("status") == "infeasible")
        point_key = _point_hash(cfg, point)
        if self.nested:
            self._names.setdefault(idx, self._run_name(idx, cfg))
        resumed = value.get("resumed_from") if ok or infeasible else None
        if ok and resumed is None:
            try:
                self._plot(value, overrides)
            except Exception as err:  # the point's outputs are incomplete: a failed job
                ok, value = False, RuntimeError(
                    f"job #{idx}: time-series plot failed: {type(err).__name__}: {err}")
        row: dict[str, Any] = {
            "job": idx,
            "status": "finished" if ok else "infeasible" if infeasible else "failed",
            "error": None,
            "infeasible_reason": value["reason"] if infeasible else None,
            "missing": "",
            "overrides": " ".join(overrides),
            "output_dir": str(out_dir),
            HASH_KEY: point_key,
            "resumed_from": resumed,
            **params,
        }
        nonfinite: dict[str, str] = {}
        if ok:
            metrics, nonfinite = finite_metrics(value["metrics"])
            value["metrics"] = metrics
            row.update(metrics)
            # The job's own params (SLO bounds, the bundle source): in the row and the run.
            job_params = {str(k): v for k, v in (value.get("params") or {}).items()}
            params.update(job_params)
            row.update(job_params)
        elif not infeasible:
            row["error"] = _error_text(value)
        files, disk_error = self._write_job_files(out_dir, point, value if ok else None, row)
        if disk_error is not None:
            row["missing"] = "disk"
            log.error(f"job #{idx}: outputs not written to {out_dir}: {disk_error}")
        if resumed is not None:  # its finished run is already in the store: log nothing
            row["mlflow_run_id"] = resumed
        elif self.tracker is not None:
            # One writer thread: the launcher goes back to dispatching jobs at once.
            tags = {HASH_KEY: point_key, "output_dir": str(out_dir)}
            if nonfinite:
                tags["nonfinite_metrics"] = ",".join(f"{k}={v}" for k, v in sorted(nonfinite.items()))
            if disk_error is not None:
                tags["servesweep.incomplete"] = f"outputs not written: {disk_error}"[:5000]
            if infeasible:
                tags["infeasible_reason"] = str(value["reason"])[:5000]
            future = self._writer.submit(
                self._log_run, idx, {**params, HASH_KEY: point_key}, overrides,
                value if ok else None, files, row["status"], tags, disk_error is None,
            )
            self._logging.append((row, future))
        self.rows.append(row)
        if self.objective and (ok or infeasible):  # the sweeper gets the one number
            ret.return_value = float(row.get(self.objective, math.nan)) if ok else math.nan

    def close(self, status: str) -> str | None:
        """Write the results table (and the study plot); end the parent run with ``status``;
        close every claim still open. Returns None when every point is recorded in full, else
        a message saying what is missing (the sweep should then exit non-zero)."""
        for row, future in self._logging:
            try:
                row["mlflow_run_id"] = future.result()
            except Exception as err:  # the others are still recorded; this one is counted
                row["missing"] = ",".join(filter(None, [row["missing"], "mlflow"]))
                log.error(f"MLflow logging of job #{row['job']} failed: {err}")
                self._abandon(row["job"])
        self._logging.clear()
        self._writer.shutdown()
        self.rows.sort(key=lambda r: r["job"])
        failed = sum(r["status"] == "failed" for r in self.rows)
        infeasible = sum(r["status"] == "infeasible" for r in self.rows)
        missing_mlflow = sum("mlflow" in r["missing"] for r in self.rows)
        missing_disk = sum("disk" in r["missing"] for r in self.rows)
        not_run = self.num_jobs - len(self.rows)
        meta = {
            "study": self.study,
            "sweep_dir": str(self.sweep_dir),
            "status": status,
            "num_jobs": self.num_jobs,
            "mlflow_uri": self.tracking.get("uri"),
            "mlflow_experiment": self.tracking.get("experiment"),
            "parent_run_id": self.parent_id,
            "groundtruth_dir": self.groundtruth,
            "groundtruth_metrics": self.groundtruth_metrics,
        }
        path: Path | None = self.sweep_dir / RESULTS_FILE
        try:
            self.sweep_dir.mkdir(parents=True, exist_ok=True)
            write_results_table(self.rows, path, meta)
        except OSError as err:
            log.error(f"results table not written to {path}: {err}")
            path = None
        plot = self._study_plot() if path is not None else None
        grid = self._grid_listing() if self.nested else None
        parent_ok = self._close_runs(status, [path, plot, grid], {"num_jobs": self.num_jobs,
            "failed_jobs": failed, "infeasible_jobs": infeasible,
            "finished_jobs": len(self.rows) - failed - infeasible, "not_run_jobs": not_run,
            "missing_mlflow": missing_mlflow, "missing_disk": missing_disk})
        log.info(
            f"results: {path or 'NOT WRITTEN'} ({len(self.rows) - failed - infeasible} finished, "
            f"{infeasible} infeasible, {failed} failed, {not_run} not run; missing from MLflow "
            f"{missing_mlflow}, from disk {missing_disk})"
            + (f"; MLflow {self.tracking['uri']} experiment {self.tracking['experiment']!r}"
               if self.tracker is not None else "")
        )
        problems = []
        if missing_mlflow or not parent_ok:
            problems.append(f"{missing_mlflow} point(s) missing from MLflow"
                            + ("" if parent_ok else " (the sweep's parent run not closed)"))
        if missing_disk:
            problems.append(f"{missing_disk} point(s) missing from {self.sweep_dir}")
        if path is None:
            problems.append(f"the results table {self.sweep_dir / RESULTS_FILE} was not written")
        launch_ended()  # what this launch made may be garbage now (sweep.gc_policy)
        if not problems:
            return None
        return ("; ".join(problems) + ". The finished results that were recorded are kept; "
                "fix the cause and rerun the same command to fill in the rest.")

    def _abandon(self, idx: int) -> None:
        """Set job ``idx``'s claimed run ``KILLED`` (its result is not fully in MLflow, so a
        rerun must compute it again); if even that fails, the claim goes stale and the next
        sweep closes it."""
        run_id = self._claimed.get(idx)
        if run_id is None or self.tracker is None:
            return
        try:
            self.tracker.finish(run_id, "KILLED")
        except TrackingWriteError as err:
            log.error(f"claim of job #{idx} not closed (the next sweep will): {err}")
        if self.claims is not None:
            self.claims.release(run_id)

    def _grid_listing(self) -> Path | None:
        """``grid.json``: every point of this sweep with its MLflow run (its own, or the
        finished run it reused), so the parent run lists the whole grid."""
        keys = ("job", "status", "overrides", HASH_KEY, "mlflow_run_id", "resumed_from",
                "missing", "infeasible_reason")
        listing = [{k: r.get(k) for k in keys} for r in self.rows]
        try:
            return atomic_write(self.sweep_dir / "grid.json", json.dumps(listing, indent=1))
        except OSError as err:
            log.error(f"grid listing not written: {err}")
            return None

    def _close_runs(self, status: str, artifacts: list[Path | None],
                    counts: dict[str, int]) -> bool:
        """Finish the parent and set the claims of jobs that never reported ``KILLED``;
        whether the parent could be closed."""
        if self.tracker is None or self.claims is None:
            return True
        assert self.claims is not None
        reported = {r["job"] for r in self.rows}
        for idx in self._claimed:
            if idx not in reported:
                self._abandon(idx)
        ok = True
        try:
            if self.parent_id is not None:
                try:
                    for path in artifacts:
                        if path is not None:
                            self.tracker.log_artifact(self.parent_id, path)
                    self.tracker.set_tags(self.parent_id,
                                          {k: str(v) for k, v in counts.items()})
                    self.tracker.finish(self.parent_id, status)
                except TrackingWriteError as err:
                    log.error(f"the sweep's parent run was not closed: {err}")
                    ok = False
                self.claims.release(self.parent_id)
            self.claims.stop()
        finally:
            self.tracker.close()  # every write is done: the store's file now holds them all
        return ok

    # --------------------------------------------------------------------- helpers
    def _job_dir(self, cfg: DictConfig, ret: JobReturn | None) -> Path:
        runtime = (OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir")
                   if ret is not None and ret.hydra_cfg else None)
        if runtime:
            return Path(str(runtime))
        subdir = OmegaConf.select(cfg, "hydra.sweep.subdir") if "hydra" in cfg else None
        return self.sweep_dir / str(subdir) if subdir is not None else self.sweep_dir

    def _plot(self, value: dict[str, Any], overrides: list[str]) -> None:
        """Draw the point's time-series chart into ``value["timeseries_svg"]`` when
        ``tracking.plots`` (``sweep.svg_series``); titled with the job's overrides, else the
        study's name."""
        series = value.get("timeseries") or {}
        if not self.tracking.get("plots") or value.get("timeseries_svg") or not series.get("t_s"):
            return
        from sweep.svg_series import series_svg

        value["timeseries_svg"] = series_svg(series, " ".join(overrides)
                                             or str(self.study["name"]))

    def _write_job_files(self, out_dir: Path, point: dict[str, Any],
                         value: dict[str, Any] | None, row: dict[str, Any],
                         ) -> tuple[list[Path], str | None]:
        """The job's files (atomically), the list of those written and the first error."""
        files: list[Path] = []
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            if value is not None:
                files += self._write_outputs(out_dir, value)
            elif row["infeasible_reason"] is not None:
                files.append(atomic_write(out_dir / "infeasible.txt", row["infeasible_reason"]))
            else:
                files.append(atomic_write(out_dir / "error.txt", row["error"]))
            files.append(atomic_write(out_dir / "config_resolved.yaml", config_yaml(point)))
        except OSError as err:
            return files, f"{type(err).__name__}: {err}"
        if value is not None:  # the bulky parts now live on disk; keep only their paths
            for key, name in (("requests_parquet", "requests.parquet"),
                              ("timeseries_svg", "timeseries.svg")):
                if value.pop(key, None) is not None and (out_dir / name).is_file():
                    value[key + "_file"] = str(out_dir / name)
        return files, None

    def _write_outputs(self, out_dir: Path, value: dict[str, Any]) -> list[Path]:
        files = [atomic_write(out_dir / "metrics.json",
                              json.dumps(value["metrics"], indent=1, sort_keys=True))]
        if self.tracking.get("requests") and value.get("requests_parquet"):
            files.append(atomic_write(out_dir / "requests.parquet", value["requests_parquet"]))
        series = value.get("timeseries") or {}
        if series:
            sink = pa.BufferOutputStream()
            pq.write_table(pa.table(series), sink)  # columns of numbers: no pandas frame
            files.append(atomic_write(out_dir / "timeseries.parquet",
                                      sink.getvalue().to_pybytes()))
        if value.get("timeseries_svg"):
            files.append(atomic_write(out_dir / "timeseries.svg", value["timeseries_svg"]))
        return files

    def _run_name(self, idx: int, cfg: DictConfig) -> str:
        """``gpu_memory_utilization=0.7,rate=4 @<sweep dir>``: the swept values of the job,
        then the sweep directory's name, so names are unique across sweeps."""
        values = {}
        for item in OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or []:
            key, sep, val = str(item).lstrip("+~").partition("=")
            if sep:
                values[key] = val
        label = ",".join(f"{k.rsplit('.', 1)[-1]}={values.get(k)}" for k in self.swept)
        return f"{label or f'job-{idx}'} @{self.sweep_dir.name}"

    def _log_run(self, idx: int, params: dict[str, Any], overrides: list[str],
                 value: dict[str, Any] | None, files: list[Path], status: str,
                 extra_tags: dict[str, str], complete: bool) -> str:
        """One point's run (the claimed one, or a new one for a single run): its artifacts
        first, then its params, tags, metrics and end in one write, so a ``FINISHED`` run is
        complete (an infeasible point's run is ``FINISHED`` too, tagged
        ``status=infeasible``: that is its answer). A point whose files could not be written
        (``complete`` False) ends ``KILLED``: a rerun computes it again."""
        tr = self.tracker
        tags = {"job_num": str(idx), "status": status, "source": "sim",
                "overrides": " ".join(overrides)[:5000], **extra_tags}
        run_id = self._claimed.get(idx)
        if run_id is None:
            name = self._names.get(idx) or str(self.study["name"])
            run_id = tr.create_run(name, tags, parent_id=self.parent_id)
            tags = {}
        for path in files:
            tr.log_artifact(run_id, path)
        # params, tags, metrics, the time series and the end: one write (``Tracker.log_point``)
        series = (value.get("timeseries") or {}) if value is not None else {}
        charted, steps = (
            chart_series({k: v for k, v in series.items() if k != "t_s"}, series["t_s"],
                         self.tracking.get("timeseries_steps"))
            if self.tracking.get("timeseries") and series.get("t_s") else (None, None))
        end = ("FAILED" if status == "failed" else "FINISHED") if complete else "KILLED"
        tr.log_point(run_id, params, value["metrics"] if value is not None else {}, tags,
                     charted, steps, status=end)
        if self.claims is not None:
            self.claims.release(run_id)
        if not complete:
            raise TrackingWriteError(f"run {run_id} set KILLED: its files were not written")
        return run_id

    def _study_plot(self) -> Path | None:
        plot = self.study.get("plot") or {}
        finished = [r for r in self.rows if r["status"] == "finished"]
        if not finished or not plot.get("x") or not plot.get("y"):
            return None
        from sweep.svg_study import study_plot

        try:
            return study_plot(
                pd.DataFrame(finished), plot["x"], plot["y"], plot.get("line"),
                self.sweep_dir / STUDY_PLOT, str(self.study["name"]), bool(plot.get("logy")),
            )
        except (KeyError, TypeError, ValueError, OSError) as err:
            log.warning(f"study plot skipped: {err}")
            return None

    def _log_groundtruth(self) -> None:
        from sweep.groundtruth import log_groundtruth_run

        _, self.groundtruth_metrics = log_groundtruth_run(
            self.tracker, self.groundtruth, self.slo, self.parent_id,
            max_steps=self.tracking.get("timeseries_steps"),
        )


def swept_keys(config: DictConfig) -> list[str]:
    """The config keys a multirun sweeps over: task overrides and sweeper ``params`` whose
    value is a sweep (``a=1,2``, ``range(..)``, ``choice(..)``, ``glob(..)``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    items = [str(o) for o in OmegaConf.select(config, "hydra.overrides.task", default=[]) or []]
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None)
    if params:
        items += [f"{k}={v}" for k, v in params.items()]
    try:
        parsed = OverridesParser.create().parse_overrides(items)
    except Exception:  # not Hydra override syntax (a test config): nothing is swept
        return []
    return sorted({o.key_or_group for o in parsed if o.is_sweep_override()})


def _point_hash(cfg: DictConfig, point: dict[str, Any]) -> str:
    """``sweep.config_hash.point_hash`` of a job's ``task_config`` ``point``; a relative trace
    path is taken from the directory the sweep of ``cfg`` started in."""
    cwd = OmegaConf.select(cfg, "hydra.runtime.cwd", default=None) if "hydra" in cfg else None
    return point_hash(point, Path(str(cwd)) if cwd else None)


def _error_text(value: Any) -> str:
    if isinstance(value, BaseException):
        text = str(value)
        if "Traceback" not in text:
            text = "".join(traceback.format_exception(value)) or text
        return text
    return f"job returned {type(value).__name__}, expected a result dict: {value!r}"[:2000]
