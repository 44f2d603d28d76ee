"""Run the capacity searches of many configurations concurrently; cache and record probes.

``CapacityStudy.run`` keeps one ``capacity.search.RateSearch`` per configuration and one
probe in flight per unfinished search, so the probes of different configurations run side by
side on the pool. A probe whose resolved config (model, hardware, cluster, workload with its
rate, the study's ``slo``) and simulator source hash to a file in the probe cache is not
simulated again. Each finished probe
goes to ``ProbeSink.probe_done`` and each answer to ``ProbeSink.config_done`` (MLflow in the
CLI); the study returns the answers (one row per configuration) and the probes.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from analysis.slo import SloSpec
from capacity.pool import SOURCE_KEYS
from capacity.search import RateSearch, SearchSettings

log = logging.getLogger(__name__)

# Bumped when a probe's result format or meaning changes: old cache files are then ignored.
CACHE_FORMAT = 4
POINT_KEYS = ("hardware", "model", "cluster", "workload", "slo")


# The code a probe's outcome depends on: its source is part of the cache key, so a changed
# simulator never answers from probes of the old one.
FINGERPRINT_PACKAGES = ("engine", "profiles", "astra_bridge", "workloads")
FINGERPRINT_MODULES = ("analysis.metrics", "analysis.slo", "analysis.cost", "analysis.answers",
                       "sweep.job", "sweep.cluster", "sweep.validate", "capacity.pool")


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 of the simulator's source (``.py``/``.yaml`` of the packages and modules
    above), read once per process."""
    files: list[Path] = []
    for name in FINGERPRINT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            root = Path(spec.origin).parent
            files += [f for f in root.rglob("*") if f.suffix in (".py", ".yaml")]
    for name in FINGERPRINT_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            files.append(Path(spec.origin))
    digest = hashlib.sha256()
    for path in sorted(set(files)):
        digest.update(f"{path.parent.name}/{path.name}".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def probe_key(point: dict[str, Any]) -> str:
    """SHA-256 of what decides a probe's outcome: the simulated point (its SLO included) and
    the code."""
    payload = {
        "format": CACHE_FORMAT,
        "code": code_fingerprint(),
        "point": {k: point[k] for k in POINT_KEYS},
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class ProbeCache:
    """One JSON file per finished probe under ``root`` (``None``: no caching)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> dict[str, Any] | None:
        if self.root is None:
            return None
        path = self.root / f"{key}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, value: dict[str, Any]) -> None:
        if self.root is None:
            return
        tmp = self.root / f".{key}.{os.getpid()}.tmp"  # concurrent studies may share a cache
        tmp.write_text(json.dumps(value))
        tmp.replace(self.root / f"{key}.json")


@dataclass
class Configuration:
    """One grid point of the study: a label, its grid overrides and the resolved config."""

    label: str
    overrides: dict[str, str]
    point: dict[str, Any]
    search: RateSearch = field(default_factory=RateSearch)
    probe_rows: list[dict[str, Any]] = field(default_factory=list)
    cached: int = 0
    error: str | None = None


class ProbeSink(Protocol):
    def probe_done(self, cfg: Configuration, row: dict[str, Any]) -> None: ...

    def config_done(self, cfg: Configuration, answer: dict[str, Any]) -> None: ...


class Pool(Protocol):
    size: int

    def submit(self, key: Any, *args: Any) -> None: ...

    def next_done(self) -> Any: ...


def _probe_point(point: dict[str, Any], rate: float) -> dict[str, Any]:
    probe = copy.deepcopy(point)
    probe["workload"]["rate"] = rate
    return probe


def probe_row(cfg: Configuration, index: int, rate: float, kind: str, value: dict[str, Any],
              cached: bool) -> dict[str, Any]:
    """The flat probe record kept in ``probes.parquet`` and logged to MLflow: the verdict and
    every metric of the probe's run (``sweep.job.run_point``), under the sweep's names."""
    row = {
        "config": cfg.label, "probe": index, "rate": rate, "kind": kind, "cached": cached,
        "passed": bool(value["passed"]), "margin": float(value["margin"]),
        "probe_wall_s": value.get("probe_wall_s", math.nan),
    }
    row.update(value["metrics"])
    row.update(value.get("sources", {}))  # bundle_source, comm_source (strings)
    return row


# Figures of the answer probe copied into a configuration's answer, under the same names:
# the cost is the probe's own number, so MLflow, probes.parquet, capacity.parquet and the
# report (and a sweep of the same point) agree.
ANSWER_METRICS = (
    "num_gpus", "usd_per_hour", "goodput_rps", "slo_attainment_pct", "good_output_tok_s",
    "usd_per_m_output_tokens", "raw_usd_per_m_output_tokens", "window_s",
)


def answer_row(cfg: Configuration, bound_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """One configuration's answer: max rate, goodput, GPUs, $/hour, $/1M output tokens, and the
    observed statistic of each SLO bound (``bound_keys``) at the answer rate. Without a
    passing probe the figures are NaN (the SLO is unattainable)."""
    res = cfg.search.result
    assert res is not None
    best = _answer_probe(cfg) or {}
    row: dict[str, Any] = {
        "config": cfg.label,
        **{f"grid.{k}": v for k, v in cfg.overrides.items()},
        "hardware": cfg.point["hardware"]["name"],
        "model": cfg.point["model"]["name"],
        "tensor_parallel_size": cfg.point["cluster"]["tensor_parallel_size"],
        "status": res.status,
        "error": cfg.error,
        "max_rate": res.max_rate,
        "bracket_lo": res.lo,
        "bracket_hi": res.hi,
        "rel_gap": res.rel_gap,
        "probes": res.probes,
        "cached_probes": cfg.cached,
        **{k: float(best.get(k, math.nan)) for k in ANSWER_METRICS},
        "tok_s_per_gpu": float(best.get("good_output_tok_s_per_gpu", math.nan)),
        "tok_s_per_user": 1000.0 / best["tpot_ms_median"]
        if best.get("tpot_ms_median", 0) > 0 else math.nan,
    }
    row.update({k: float(best.get(k, math.nan)) for k in bound_keys})
    for key in SOURCE_KEYS:  # the answer probe's, else any probe's (cached ones may lack it)
        row[key] = best.get(key) or next((r[key] for r in cfg.probe_rows if r.get(key)), "")
    return row


def _answer_probe(cfg: Configuration) -> dict[str, Any] | None:
    """The probe at the answer rate (the highest passing one), if any."""
    res = cfg.search.result
    passing = [r for r in cfg.probe_rows if r["passed"]]
    if res is None or not passing or not res.max_rate > 0:
        return None
    return max(passing, key=lambda r: (r["rate"] if r["kind"] != "saturation" else math.inf))


class CapacityStudy:
    """The searches of ``configs`` under ``spec``, run on ``pool`` with ``cache``."""

    def __init__(self, configs: list[Configuration], spec: SloSpec, settings: SearchSettings,
                 pool: Pool, cache: ProbeCache, sink: ProbeSink | None = None) -> None:
        settings.check()
        self.configs = configs
        self.spec = spec
        self.bound_keys = tuple(b.key for b in spec.bounds)
        self.settings = settings
        self.pool = pool
        self.cache = cache
        self.sink = sink
        for cfg in configs:
            cfg.search = RateSearch(settings)
        # Sink calls wait until the next probes are submitted, so actors never idle on MLflow.
        self._events: list[tuple[str, Configuration, dict[str, Any]]] = []
        self.simulated = 0
        self.wall_s = 0.0

    def run(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Run every search to its answer; return ``(answers, probes)`` tables."""
        t0 = time.perf_counter()
        in_flight: dict[int, tuple[float, str, str]] = {}
        while True:
            for i, cfg in enumerate(self.configs):
                self._advance(i, cfg, in_flight)
            self._flush()
            if not in_flight:
                break
            done = self.pool.next_done()
            rate, kind, key = in_flight.pop(done.key)
            cfg = self.configs[done.key]
            if done.error is not None:
                cfg.error = done.error
                cfg.search.fail()
                log.warning(f"{cfg.label}: probe at {rate:.4g} req/s failed: {done.error}")
                self._finish(cfg)
                continue
            self.simulated += 1
            self.cache.put(key, done.value)
            self._record(cfg, rate, kind, done.value, cached=False)
        self.wall_s = time.perf_counter() - t0
        answers = pd.DataFrame([answer_row(c, self.bound_keys) for c in self.configs])
        probes = pd.DataFrame([r for c in self.configs for r in c.probe_rows])
        return answers, probes

    def _advance(self, i: int, cfg: Configuration, in_flight: dict[int, tuple[float, str, str]]) -> None:
        """Submit this configuration's next probe, answering from the cache while it can."""
        while i not in in_flight:
            step = cfg.search.next_rate()
            if step is None:
                return
            rate, kind = step
            point = _probe_point(cfg.point, rate)
            key = probe_key(point)
            cached = self.cache.get(key)
            if cached is not None:
                cfg.cached += 1
                self._record(cfg, rate, kind, cached, cached=True)
                continue
            in_flight[i] = (rate, kind, key)
            self.pool.submit(i, point)

    def _record(self, cfg: Configuration, rate: float, kind: str, value: dict[str, Any],
                cached: bool) -> None:
        row = probe_row(cfg, len(cfg.probe_rows), rate, kind, value, cached)
        cfg.probe_rows.append(row)
        throughput = float(value["metrics"].get("request_throughput", math.nan))
        cfg.search.record(rate, bool(value["passed"]), float(value["margin"]), throughput,
                          value.get("margins"))
        self._events.append(("probe_done", cfg, row))
        if cfg.search.done:
            self._finish(cfg)

    def _finish(self, cfg: Configuration) -> None:
        res = cfg.search.result
        assert res is not None
        log.info(f"{cfg.label}: {res.max_rate:.4g} req/s ({res.status}, {res.probes} probes, "
                 f"{cfg.cached} from cache)")
        if res.status == "capped":
            log.warning(f"{cfg.label}: still meets the SLO at the search's ceiling "
                        f"({res.max_rate:.4g} req/s): raise capacity.max_rate, or, when the "
                        "ceiling is the saturation throughput, workload.num_requests (the run "
                        "is too short to reach a steady state)")
        self._events.append(("config_done", cfg, answer_row(cfg, self.bound_keys)))

    def _flush(self) -> None:
        events, self._events = self._events, []
        if self.sink is not None:
            for method, cfg, row in events:
                getattr(self.sink, method)(cfg, row)
