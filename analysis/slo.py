"""Service-level objectives: one object, ``SloSpec``, for sweeps, the capacity search and the
capacity report, checked on one run's per-request latencies (``analysis.metrics.per_request``).

The config is the ``slo:`` node of ``conf/config.yaml`` (experiments override it)::

    slo:
      bounds:              # run level: <metric>_ms_<stat>: the run's statistic <= this (ms)
        ttft_ms_p99: 2000  # metric: ttft, tpot, itl, e2el; stat: mean, median, p<q>
        tpot_ms_p99: 100   # (p99, p50, p99_9 = 99.9); null drops a bound
      goodput:             # per request, as ``vllm bench serve --goodput ttft:2000 tpot:100``
        ttft_ms: 2000
        tpot_ms: 100
        e2el_ms: null
      goodput_fraction: null  # null, or the share of requests that must be good

Statistics are those of ``analysis.metrics`` (TTFT/TPOT/E2EL of the finished requests, TPOT
of multi-token ones, ITL pooled over every token gap; ``metrics.statistic``), so an observed
``ttft_ms_p99`` here is the run's ``ttft_ms_p99`` metric, bit for bit.

A request is **good** when it finished and its own TTFT, TPOT and E2E latency are within every
``goodput`` bound, compared as ``vllm bench serve`` compares them (``calculate_metrics`` in
``vllm/benchmarks/serve.py``: ``value <= bound``, the TPOT of a one-token request counting
as 0); without any ``goodput`` bound every finished request is good. A run **meets** the SLO
(``slo_met``) when every run-level bound holds, every request finished and, with a
``goodput_fraction``, at least that share of all requests is good. **Goodput**
(``goodput_rps``) is ``vllm bench serve``'s request goodput: good requests over the
benchmark duration (first arrival to last completion). Cost per token counts the output
tokens of the good requests (``analysis.cost``).

Bounds are logged as params under their own names (``SloSpec.params``:
``slo.ttft_ms_p99.bound``), the observed values as metrics under the metric names
(``SloReport.metrics``: ``ttft_ms_p99``), beside ``slo_met``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics import (
    LATENCY_METRICS,
    RequestMetrics,
    benchmark_duration_s,
    per_request,
    percentile_of,
    statistic,
)
from engine.specs import ConfigError

METRICS = LATENCY_METRICS
# The per-request bounds ``vllm bench serve --goodput`` accepts (ITL is not one of them).
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
CONFIG_KEYS = ("bounds", "goodput", "goodput_fraction")
_KEY = re.compile(r"^(ttft|tpot|itl|e2el)_ms_(mean|median|p(\d+)(?:_(\d+))?)$")
# Margins are log(observed / bound); ratios are clipped so that a run nobody served does
# not produce an infinite margin the search could not interpolate.
_RATIO_CLIP = (1e-3, 1e3)


@dataclass(frozen=True)
class Bound:
    """One run-level bound: the run's ``stat`` of ``metric`` must be <= ``max_ms``."""

    metric: str
    stat: str
    max_ms: float

    @property
    def key(self) -> str:
        """The metric name of the observed statistic (``ttft_ms_p99``)."""
        return f"{self.metric}_ms_{self.stat}"

    @property
    def param(self) -> str:
        """The param name of the bound itself (``slo.ttft_ms_p99.bound``)."""
        return f"slo.{self.key}.bound"

    @property
    def percentile(self) -> float:
        """The percentile of a ``median``/``p<q>`` bound (NaN for ``mean``)."""
        return percentile_of(self.stat)

    def observe(self, pm: RequestMetrics) -> float:
        """This bound's statistic of the run (NaN when no request gives a sample)."""
        return statistic(pm.sample(self.metric), self.stat)


@dataclass(frozen=True)
class SloSpec:
    """Run-level bounds, per-request goodput bounds (``{metric: max ms}``, metric in
    ``GOODPUT_METRICS``) and the optional goodput fraction (``None``: not required)."""

    bounds: tuple[Bound, ...]
    goodput: tuple[tuple[str, float], ...] = ()
    goodput_fraction: float | None = None

    @classmethod
    def parse(
        cls,
        bounds: Mapping[str, Any],
        goodput: Mapping[str, Any] | None = None,
        goodput_fraction: float | None = None,
        where: str = "slo",
    ) -> SloSpec:
        """The spec from plain data; ``where`` names the config node in error messages."""
        parsed = []
        for key, value in (bounds or {}).items():
            if value is None:
                continue
            match = _KEY.match(str(key))
            if match is None:
                raise ConfigError(
                    f"{where}.bounds.{key}={value!r} is not an SLO bound; allowed: "
                    "<metric>_ms_<stat> "
                    f"with metric in {list(METRICS)} and stat mean, median or p<q> "
                    f"(p99, p50, p99_9 for 99.9), e.g. {where}.bounds.ttft_ms_p99=2000"
                )
            bound = Bound(match.group(1), match.group(2),
                          _positive(f"{where}.bounds.{key}", value))
            if bound.stat != "mean" and not 0 < bound.percentile <= 100:
                raise ConfigError(f"{where}.bounds.{key}={value!r}: percentile "
                                  f"{bound.percentile:g} is not in (0, 100]; allowed: "
                                  "p<q> with 0 < q <= 100")
            parsed.append(bound)
        if not parsed:
            raise ConfigError(
                f"{where}.bounds has no bound; give at least one, e.g. "
                f"{where}.bounds.ttft_ms_p99=2000"
            )
        per_request = []
        for key, value in (goodput or {}).items():
            metric = str(key).removesuffix("_ms")
            if metric not in GOODPUT_METRICS or not str(key).endswith("_ms"):
                raise ConfigError(
                    f"{where}.goodput.{key}={value!r} is not a per-request bound; allowed: "
                    f"{[f'{m}_ms' for m in GOODPUT_METRICS]} (vllm bench serve --goodput)"
                )
            if value is not None:
                per_request.append((metric, _positive(f"{where}.goodput.{key}", value)))
        if goodput_fraction is not None and not (
            isinstance(goodput_fraction, int | float) and 0 < goodput_fraction <= 1
        ):
            raise ConfigError(
                f"{where}.goodput_fraction={goodput_fraction!r} is not allowed; "
                "allowed: null or 0 < value <= 1"
            )
        return cls(tuple(sorted(parsed, key=lambda b: b.key)),
                   tuple(sorted(per_request, key=lambda m: GOODPUT_METRICS.index(m[0]))),
                   None if goodput_fraction is None else float(goodput_fraction))

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | Any, where: str = "slo") -> SloSpec:
        """The spec of an ``slo:`` config node (a ``DictConfig`` or the plain dict of
        ``as_dict``); unknown keys are refused by name."""
        from omegaconf import DictConfig, OmegaConf

        plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) \
            else dict(node or {})
        assert isinstance(plain, dict)
        unknown = sorted(set(plain) - set(CONFIG_KEYS))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}={plain[unknown[0]]!r} is not an SLO "
                              f"setting; allowed: {list(CONFIG_KEYS)}")
        return cls.parse(plain.get("bounds") or {}, plain.get("goodput") or {},
                         plain.get("goodput_fraction"), where)

    def as_dict(self) -> dict[str, Any]:
        """The spec as config-shaped plain data (``from_config`` reads it back)."""
        own = dict(self.goodput)
        return {
            "bounds": {b.key: b.max_ms for b in self.bounds},
            "goodput": {f"{m}_ms": own.get(m) for m in GOODPUT_METRICS},
            "goodput_fraction": self.goodput_fraction,
        }

    def params(self) -> dict[str, float]:
        """The bounds as MLflow params, named apart from the observed metrics:
        ``slo.ttft_ms_p99.bound``, ``slo.goodput.ttft_ms.bound``, ``slo.goodput_fraction.bound``."""
        out = {b.param: b.max_ms for b in self.bounds}
        out.update({f"slo.goodput.{m}_ms.bound": v for m, v in self.goodput})
        if self.goodput_fraction is not None:
            out["slo.goodput_fraction.bound"] = self.goodput_fraction
        return out

    def describe(self) -> str:
        parts = [f"{b.metric.upper()} {b.stat} <= {b.max_ms:g} ms" for b in self.bounds]
        if self.goodput:
            good = ", ".join(f"{m.upper()} <= {v:g} ms" for m, v in self.goodput)
            parts.append(f"good request: {good}")
        if self.goodput_fraction is not None:
            parts.append(f">= {100 * self.goodput_fraction:g} % of requests good")
        return "; ".join(parts)


def _positive(key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number > 0 or math.isinf(number):
        raise ConfigError(f"{key}={value!r} is not allowed; allowed: a finite number of ms > 0 "
                          "(null: no bound)")
    return number


@dataclass(frozen=True)
class SloReport:
    """One run checked against an SLO.

    ``observed`` maps each bound's key to the run's value; ``margin`` is the largest
    ``log(observed / allowed)`` over the bounds (and the goodput fraction): <= 0 iff the run
    meets the SLO, and growing with load. ``margins`` holds each bound's own log ratio (and
    ``goodput_fraction``'s), which the capacity search interpolates one by one. ``good``
    marks the good requests, row for row.
    """

    passed: bool
    margin: float
    margins: dict[str, float]
    observed: dict[str, float]
    good_fraction: float
    goodput_rps: float
    good: np.ndarray = field(repr=False, compare=False, default_factory=lambda: np.empty(0, bool))

    def metrics(self) -> dict[str, float]:
        """The verdict as metrics: ``slo_met`` (1/0), ``slo_margin``, ``slo_attainment_pct``
        (% of requests good), ``goodput_rps`` and the observed statistics by metric name."""
        return {
            "slo_met": 1.0 if self.passed else 0.0,
            "slo_margin": self.margin,
            "slo_attainment_pct": 100.0 * self.good_fraction,
            "goodput_rps": self.goodput_rps,
            **self.observed,
        }


def _ratio(observed: float, allowed: float) -> float:
    if math.isnan(observed):
        return _RATIO_CLIP[1]
    return min(max(observed / allowed, _RATIO_CLIP[0]), _RATIO_CLIP[1])


def good_requests(pm: RequestMetrics, spec: SloSpec) -> np.ndarray:
    """The good requests (finished, within every per-request ``goodput`` bound)."""
    good = pm.finished.copy()
    for metric, max_ms in spec.goodput:
        good &= np.nan_to_num(pm.goodput_value(metric), nan=math.inf) <= max_ms
    return good


def evaluate(requests: pd.DataFrame | RequestMetrics, spec: SloSpec) -> SloReport:
    """Check one run (its per-request frame, or ``per_request`` of it) against ``spec``."""
    pm = requests if isinstance(requests, RequestMetrics) else per_request(requests)
    observed: dict[str, float] = {}
    ratios: dict[str, float] = {}
    for b in spec.bounds:
        observed[b.key] = b.observe(pm)
        ratios[b.key] = _ratio(observed[b.key], b.max_ms)
    good = good_requests(pm, spec)
    n = len(pm)
    fraction = float(good.sum()) / n if n else 0.0
    passed = all(r <= 1.0 for r in ratios.values()) and bool(pm.finished.all())
    if spec.goodput_fraction is not None:
        need_bad = 1.0 - spec.goodput_fraction
        ratios["goodput_fraction"] = (
            _ratio(1.0 - fraction, need_bad) if need_bad > 0
            else (_RATIO_CLIP[0] if fraction >= 1.0 else _RATIO_CLIP[1]))
        passed = passed and fraction >= spec.goodput_fraction
    duration_s = benchmark_duration_s(pm)
    goodput_rps = float(good.sum()) / duration_s if duration_s > 0 else 0.0
    margins = {k: math.log(r) for k, r in ratios.items()}
    margin = max(margins.values())
    if not passed and margin <= 0:  # unfinished requests: a failure the bounds do not show
        margin = math.log(_RATIO_CLIP[1])
    return SloReport(passed, margin, margins, observed, fraction, goodput_rps, good)
