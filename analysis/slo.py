"""Service-level objectives as config, checked on one run's per-request results.

An SLO is a set of bounds, each ``<metric>_ms_<stat>: <max ms>`` with ``metric`` one of
``ttft``, ``tpot``, ``itl``, ``e2el`` and ``stat`` one of ``mean``, ``median`` or
``p<q>`` for any percentile ``q`` in (0, 100] (``p99``, ``p50``, ``p99_9`` = 99.9),
plus an optional goodput fraction: the share of requests that must meet every bound.
Example: ``{ttft_ms_p99: 2000, tpot_ms_p99: 100}`` with ``goodput_fraction: 0.95``.

A run **meets** the SLO when every bound holds for the run's statistic (computed as in
``analysis.metrics``: TTFT/TPOT/E2EL per request, ITL pooled over every token gap, linear
percentile interpolation) and, when a goodput fraction is set, at least that fraction of
requests are *good*. A request is good when its own TTFT, TPOT and E2EL are within their
bounds and, for an ITL bound, its own ITL statistic (the same ``stat`` over its gaps) is too;
a request that never finished is not good. **Goodput** is the good requests per second and
their output tokens per second over the benchmark duration (first arrival to last finish).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from engine.specs import ConfigError

METRICS = ("ttft", "tpot", "itl", "e2el")
_KEY = re.compile(r"^(ttft|tpot|itl|e2el)_ms_(mean|median|p(\d+)(?:_(\d+))?)$")
_NS_PER_MS = 1e6
# Margins are log(observed / bound); ratios are clipped so that a run nobody served does
# not produce an infinite margin the search could not interpolate.
_RATIO_CLIP = (1e-3, 1e3)


@dataclass(frozen=True)
class Bound:
    """One bound: the run's ``stat`` of ``metric`` must be <= ``max_ms``."""

    metric: str
    stat: str
    max_ms: float

    @property
    def key(self) -> str:
        return f"{self.metric}_ms_{self.stat}"

    def summarize(self, values: np.ndarray) -> float:
        """This bound's statistic of ``values`` (NaN when empty)."""
        if len(values) == 0:
            return math.nan
        if self.stat == "mean":
            return float(np.mean(values))
        return float(np.percentile(values, self.percentile))

    @property
    def percentile(self) -> float:
        """The percentile of a ``median``/``p<q>`` bound (NaN for ``mean``)."""
        if self.stat == "mean":
            return math.nan
        if self.stat == "median":
            return 50.0
        whole, _, frac = self.stat[1:].partition("_")
        return float(f"{whole}.{frac}" if frac else whole)


@dataclass(frozen=True)
class SloSpec:
    """The bounds of one SLO and the optional goodput fraction (``None``: not required)."""

    bounds: tuple[Bound, ...]
    goodput_fraction: float | None = None

    @classmethod
    def parse(
        cls,
        bounds: Mapping[str, Any],
        goodput_fraction: float | None = None,
        where: str = "capacity.slo",
    ) -> SloSpec:
        """Bounds from ``{"ttft_ms_p99": 2000, ...}``; ``where`` names the config key in errors."""
        parsed = []
        for key, value in bounds.items():
            if value is None:
                continue
            match = _KEY.match(str(key))
            if match is None:
                raise ConfigError(
                    f"{where}.{key} is not an SLO bound; allowed: <metric>_ms_<stat> with "
                    f"metric in {list(METRICS)} and stat mean, median or p<q> "
                    "(p99, p50, p99_9 for 99.9), e.g. ttft_ms_p99: 2000"
                )
            bound = Bound(match.group(1), match.group(2), _positive(f"{where}.{key}", value))
            if bound.stat != "mean" and not 0 < bound.percentile <= 100:
                raise ConfigError(f"{where}.{key}: percentile {bound.percentile:g} is not in (0, 100]")
            parsed.append(bound)
        if not parsed:
            raise ConfigError(
                f"{where} has no bound; give at least one, e.g. {where}.ttft_ms_p99=2000"
            )
        if goodput_fraction is not None and not 0 < goodput_fraction <= 1:
            raise ConfigError(
                f"capacity.goodput_fraction={goodput_fraction!r} is not allowed; "
                "allowed: null or 0 < value <= 1"
            )
        return cls(tuple(sorted(parsed, key=lambda b: b.key)), goodput_fraction)

    def as_dict(self) -> dict[str, Any]:
        """The spec as config-shaped plain data (``bounds`` and ``goodput_fraction``)."""
        return {
            "bounds": {b.key: b.max_ms for b in self.bounds},
            "goodput_fraction": self.goodput_fraction,
        }

    def describe(self) -> str:
        parts = [f"{b.metric.upper()} {b.stat} <= {b.max_ms:g} ms" for b in self.bounds]
        if self.goodput_fraction is not None:
            parts.append(f">= {100 * self.goodput_fraction:g} % of requests meeting every bound")
        return ", ".join(parts)


def _positive(key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number > 0 or math.isinf(number):
        raise ConfigError(f"{key}={value!r} is not allowed; allowed: a finite number of ms > 0")
    return number


@dataclass(frozen=True)
class SloReport:
    """One run checked against an SLO.

    ``observed`` maps each bound's key to the run's value; ``margin`` is the largest
    ``log(observed / allowed)`` over the bounds (and the goodput fraction): <= 0 iff the run
    meets the SLO, and growing with load. ``margins`` holds each bound's own log ratio (and
    ``goodput_fraction``'s), which the capacity search interpolates one by one.
    """

    passed: bool
    margin: float
    margins: dict[str, float]
    observed: dict[str, float]
    good_fraction: float
    goodput_rps: float
    goodput_tok_s: float


def _request_values(df: pd.DataFrame) -> dict[str, Any]:
    first = pd.to_numeric(df["first_token_ns"], errors="coerce").to_numpy(dtype=np.float64)
    finish = pd.to_numeric(df["finish_ns"], errors="coerce").to_numpy(dtype=np.float64)
    arrival = df["arrival_ns"].to_numpy(dtype=np.float64)
    out_len = df["output_len"].to_numpy(dtype=np.int64)
    done = (first >= 0) & (finish >= 0)
    ttft = (first - arrival) / _NS_PER_MS
    e2el = (finish - arrival) / _NS_PER_MS
    steps = np.maximum(out_len - 1, 1)
    tpot = np.where(out_len > 1, (e2el - ttft) / steps, 0.0)
    if "token_times_ns" in df.columns:
        gaps = [
            np.diff(np.asarray(t, dtype=np.int64)) / _NS_PER_MS
            if t is not None and not isinstance(t, float) and len(t) > 1
            else np.empty(0)
            for t in df["token_times_ns"]
        ]
    else:
        gaps = [np.empty(0)] * len(df)
    return {"done": done, "ttft": ttft, "tpot": tpot, "e2el": e2el, "itl": gaps,
            "multi": out_len > 1, "out_len": out_len, "arrival": arrival, "finish": finish}


def _ratio(observed: float, allowed: float) -> float:
    if math.isnan(observed):
        return _RATIO_CLIP[1]
    return min(max(observed / allowed, _RATIO_CLIP[0]), _RATIO_CLIP[1])


def evaluate(requests: pd.DataFrame, spec: SloSpec) -> SloReport:
    """Check one run's per-request frame (``engine`` ``requests_frame`` columns) against ``spec``."""
    v = _request_values(requests)
    done = v["done"]
    good = done.copy()
    observed: dict[str, float] = {}
    ratios: dict[str, float] = {}
    for b in spec.bounds:
        if b.metric == "itl":
            pooled = [g for g, ok in zip(v["itl"], done, strict=True) if ok and len(g)]
            value = b.summarize(np.concatenate(pooled) if pooled else np.empty(0))
            own = np.array([b.summarize(g) if len(g) else 0.0 for g in v["itl"]])
        else:
            mask = done & v["multi"] if b.metric == "tpot" else done
            value = b.summarize(v[b.metric][mask])
            own = v[b.metric]
        observed[b.key] = value
        ratios[b.key] = _ratio(value, b.max_ms)
        good &= np.nan_to_num(own, nan=math.inf) <= b.max_ms
    n = len(requests)
    fraction = float(good.sum()) / n if n else 0.0
    passed = all(r <= 1.0 for r in ratios.values()) and bool(done.all())
    if spec.goodput_fraction is not None:
        need_bad = 1.0 - spec.goodput_fraction
        ratios["goodput_fraction"] = (
            _ratio(1.0 - fraction, need_bad) if need_bad > 0
            else (_RATIO_CLIP[0] if fraction >= 1.0 else _RATIO_CLIP[1]))
        passed = passed and fraction >= spec.goodput_fraction
    if done.any():
        duration_s = (float(v["finish"][done].max()) - float(v["arrival"].min())) / 1e9
    else:
        duration_s = 0.0
    good_rps = float(good.sum()) / duration_s if duration_s > 0 else 0.0
    good_tok = float(v["out_len"][good].sum()) / duration_s if duration_s > 0 else 0.0
    margins = {k: math.log(r) for k, r in ratios.items()}
    margin = max(margins.values())
    if not passed and margin <= 0:  # unfinished requests: a failure the bounds do not show
        margin = math.log(_RATIO_CLIP[1])
    return SloReport(passed, margin, margins, observed, fraction, good_rps, good_tok)
