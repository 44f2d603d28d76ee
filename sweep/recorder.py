"""Where sweep results go, in the driver: per-job files, MLflow runs, the results table.

``SweepRecorder`` is the ``ray_actor`` launcher's recorder hook (``hydra.launcher.recorder``)
and is also used by a single ``python -m sweep`` run. For a sweep it opens a parent MLflow
run, logs one child run per grid point as results arrive (flattened config as params, the
metrics, the per-second time series as step metrics, the per-request Parquet, the resolved
config and a plot as artifacts) and at the end writes ``results.parquet`` (one row per
point: config columns + metrics) into the sweep directory. Every point carries the content
hash of its config (``sweep.config_hash``) as an MLflow tag and param and a table column;
``previous_result`` finds a point's finished run by that hash, so the launcher can resume a
sweep, and a resumed point's row reuses that run (``resumed_from``) instead of logging a
new one. Job files are written at once;
MLflow calls go through one background writer thread (still one process, one writer), so
the launcher's dispatch loop never waits on the store.
"""

from __future__ import annotations

import json
import logging
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from sweep.config_hash import HASH_KEY, point_hash

log = logging.getLogger(__name__)

RESULTS_FILE = "results.parquet"
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
    """The resolved job config as plain containers, without ``hydra`` and bookkeeping."""
    keys = [k for k in cfg if k != "hydra"]
    data = OmegaConf.to_container(OmegaConf.masked_copy(cfg, keys), resolve=True)
    assert isinstance(data, dict)
    return data


def write_results_table(rows: list[dict[str, Any]], path: Path, meta: dict[str, Any]) -> Path:
    """Rows to Parquet with ``meta`` (JSON) in the schema metadata under ``servesweep``."""
    frame = pd.DataFrame(rows)
    for col in frame.columns:
        if frame[col].dtype == object:
            kinds = {type(v) for v in frame[col] if v is not None and v == v}
            if len(kinds) > 1:  # mixed types (e.g. an int or a name): keep them as text
                frame[col] = frame[col].map(lambda v: None if v is None else str(v))
    table = pa.Table.from_pandas(frame, preserve_index=False)
    merged = {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(meta).encode()}
    pq.write_table(table.replace_schema_metadata(merged), path)
    return path


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
        self.tracker: Any = None
        self.parent_id: str | None = None
        self._finished: Any = None  # sweep.resume.FinishedIndex, loaded on first lookup
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow")
        self._logging: list[tuple[dict[str, Any], Future[str]]] = []

    # --------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Open the MLflow store and, for a sweep, the parent run (before any job runs)."""
        if not self.tracking.get("uri"):
            if self.groundtruth:
                from sweep.groundtruth import groundtruth_metrics

                self.groundtruth_metrics = groundtruth_metrics(self.groundtruth, self.slo)[1]
            return
        from sweep.store_lock import open_tracker

        # several sweeps may open (and create) one sqlite store at the same time
        self.tracker = open_tracker(self.tracking["uri"], self.tracking["experiment"])
        if self.nested:
            self.parent_id = self.tracker.create_run(
                self.sweep_dir.name,
                tags={
                    "sweep_dir": str(self.sweep_dir),
                    "study": str(self.study["name"]),
                    "num_jobs": str(self.num_jobs),
                    "launcher": "ray_actor",
                    "kind": "sweep",
                    "mlflow.note.content": str(self.study.get("description") or ""),
                },
            )
            self.tracker.log_params(
                self.parent_id,
                {"study.name": self.study["name"], "sweep_overrides": " ".join(self.sweep_overrides)},
            )
        if self.groundtruth:
            self._log_groundtruth()

    def previous_result(self, cfg: DictConfig) -> dict[str, Any] | None:
        """The stored result of this point if a finished run with its config hash exists in
        the experiment (None without a tracking store); see ``sweep.resume``."""
        if self.tracker is None:
            return None
        if self._finished is None:
            from sweep.resume import FinishedIndex

            self._finished = FinishedIndex.load(self.tracker.client, self.tracker.experiment_id)
        found = self._finished.get(_point_hash(cfg))
        return found.result() if found is not None else None

    def job_done(self, idx: int, cfg: DictConfig, ret: JobReturn) -> None:
        """Write the job's files, log its MLflow run, and keep its results-table row.

        The result's bulky payloads (Parquet and PNG bytes) are replaced by the paths of
        the files written, so a long sweep does not hold them all in memory.
        """
        point = task_config(cfg)
        out_dir = self._job_dir(cfg, ret)
        out_dir.mkdir(parents=True, exist_ok=True)
        overrides = list(OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or [])
        params = flatten({k: v for k, v in point.items() if k not in NON_POINT_KEYS})
        value = ret._return_value
        ok = ret.status == JobStatus.COMPLETED and isinstance(value, dict) and "metrics" in value
        point_key = _point_hash(cfg)
        resumed = value.get("resumed_from") if ok else None
        row: dict[str, Any] = {
            "job": idx,
            "status": "finished" if ok else "failed",
            "error": None,
            "overrides": " ".join(overrides),
            "output_dir": str(out_dir),
            HASH_KEY: point_key,
            "resumed_from": resumed,
            **params,
        }
        (out_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(point)))
        if ok:
            files = self._write_outputs(out_dir, value)
            row.update(value["metrics"])
            # The bulky parts now live on disk; keep only their paths in memory.
            for key, name in (("requests_parquet", "requests.parquet"),
                              ("timeseries_png", "timeseries.png")):
                if value.pop(key, None) is not None and (out_dir / name).is_file():
                    value[key + "_file"] = str(out_dir / name)
        else:
            row["error"] = _error_text(value)
            (out_dir / "error.txt").write_text(row["error"])
            files = [out_dir / "error.txt"]
        files.append(out_dir / "config_resolved.yaml")
        if resumed is not None:  # its finished run is already in the store: log nothing
            row["mlflow_run_id"] = resumed
        elif self.tracker is not None:
            # One writer thread: the launcher goes back to dispatching jobs at once.
            tags = {HASH_KEY: point_key, "output_dir": str(out_dir)}
            future = self._writer.submit(
                self._log_run, idx, {**params, HASH_KEY: point_key}, overrides, value if ok else None,
                files, ok, tags,
            )
            self._logging.append((row, future))
        self.rows.append(row)

    def close(self, status: str) -> Path:
        """Write the results table (and the study plot); end the parent run with ``status``."""
        for row, future in self._logging:
            try:
                row["mlflow_run_id"] = future.result()
            except Exception:  # a tracking hiccup must not lose the other results
                log.exception(f"MLflow logging of job #{row['job']} failed; its row is kept")
        self._logging.clear()
        self._writer.shutdown()
        self.rows.sort(key=lambda r: r["job"])
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
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        path = write_results_table(self.rows, self.sweep_dir / RESULTS_FILE, meta)
        plot = self._study_plot()
        failed = sum(r["status"] != "finished" for r in self.rows)
        if self.tracker is not None and self.parent_id is not None:
            self.tracker.log_artifact(self.parent_id, path)
            if plot is not None:
                self.tracker.log_artifact(self.parent_id, plot)
            self.tracker.set_tags(
                self.parent_id,
                {"failed_jobs": str(failed), "finished_jobs": str(len(self.rows) - failed)},
            )
            self.tracker.finish(self.parent_id, status)
        log.info(
            f"results: {path} ({len(self.rows) - failed} finished, {failed} failed)"
            + (f"; MLflow {self.tracking['uri']} experiment {self.tracking['experiment']!r}"
               if self.tracker is not None else "")
        )
        return path

    # --------------------------------------------------------------------- helpers
    def _job_dir(self, cfg: DictConfig, ret: JobReturn) -> Path:
        runtime = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir") if ret.hydra_cfg else None
        if runtime:
            return Path(str(runtime))
        subdir = OmegaConf.select(cfg, "hydra.sweep.subdir") if "hydra" in cfg else None
        return self.sweep_dir / str(subdir) if subdir is not None else self.sweep_dir

    def _write_outputs(self, out_dir: Path, value: dict[str, Any]) -> list[Path]:
        files = []
        (out_dir / "metrics.json").write_text(json.dumps(value["metrics"], indent=1, sort_keys=True))
        files.append(out_dir / "metrics.json")
        if self.tracking.get("requests") and value.get("requests_parquet"):
            (out_dir / "requests.parquet").write_bytes(value["requests_parquet"])
            files.append(out_dir / "requests.parquet")
        series = value.get("timeseries") or {}
        if series:
            pd.DataFrame(series).to_parquet(out_dir / "timeseries.parquet", index=False)
            files.append(out_dir / "timeseries.parquet")
        if value.get("timeseries_png"):
            (out_dir / "timeseries.png").write_bytes(value["timeseries_png"])
            files.append(out_dir / "timeseries.png")
        return files

    def _log_run(self, idx: int, params: dict[str, Any], overrides: list[str],
                 value: dict[str, Any] | None, files: list[Path], ok: bool,
                 extra_tags: dict[str, str]) -> str:
        """One point's run; it is set FINISHED last, so a FINISHED run is complete."""
        tr = self.tracker
        name = f"job-{idx}" if self.nested else str(self.study["name"])
        tags = {"job_num": str(idx), "status": "finished" if ok else "failed", "source": "sim",
                "overrides": " ".join(overrides)[:5000], **extra_tags}
        run_id = tr.create_run(name, tags, parent_id=self.parent_id)
        tr.log_params(run_id, params)
        if value is not None:
            tr.log_metrics(run_id, value["metrics"])
            series = value.get("timeseries") or {}
            if self.tracking.get("timeseries") and series.get("t_s"):
                steps = [int(t) for t in series["t_s"]]
                tr.log_series(run_id, {k: v for k, v in series.items() if k != "t_s"}, steps)
        for path in files:
            tr.log_artifact(run_id, path)
        tr.finish(run_id, "FINISHED" if ok else "FAILED")
        return run_id

    def _study_plot(self) -> Path | None:
        plot = self.study.get("plot") or {}
        finished = [r for r in self.rows if r["status"] == "finished"]
        if not finished or not plot.get("x") or not plot.get("y"):
            return None
        from sweep.plots import study_plot

        try:
            return study_plot(
                pd.DataFrame(finished), plot["x"], plot["y"], plot.get("line"),
                self.sweep_dir / "study.png", str(self.study["name"]), bool(plot.get("logy")),
            )
        except (KeyError, TypeError, ValueError) as err:
            log.warning(f"study plot skipped: {err}")
            return None

    def _log_groundtruth(self) -> None:
        from sweep.groundtruth import log_groundtruth_run

        _, self.groundtruth_metrics = log_groundtruth_run(
            self.tracker, self.groundtruth, self.slo, self.parent_id
        )


def _point_hash(cfg: DictConfig) -> str:
    """``sweep.config_hash.point_hash`` of a job config; a relative trace path is taken from
    the directory the sweep started in."""
    cwd = OmegaConf.select(cfg, "hydra.runtime.cwd", default=None) if "hydra" in cfg else None
    return point_hash(task_config(cfg), Path(str(cwd)) if cwd else None)


def _error_text(value: Any) -> str:
    if isinstance(value, BaseException):
        text = str(value)
        if "Traceback" not in text:
            text = "".join(traceback.format_exception(value)) or text
        return text
    return f"job returned {type(value).__name__}, expected a result dict: {value!r}"[:2000]
