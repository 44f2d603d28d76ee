"""When requests arrive: Poisson, gamma or constant gaps, at one rate or in stages.

A :class:`Load` is the arrival half of a generated workload; the generators
(:mod:`workloads.synthetic`, :mod:`workloads.inference_perf`, :mod:`workloads.vllm_datasets`)
fill its arrivals with prompts. It has one of three sizes:

- ``num_requests`` at ``rate`` req/s (``rate = inf``: every arrival at t = 0, vLLM's default
  burst);
- every arrival within ``duration_s`` at ``rate``;
- ``stages``: consecutive ``(rate, duration_s)`` stages, as inference-perf's load stages
  (``load.stages: [{rate, duration}]``). Stage ``k`` covers ``(T_k, T_k + duration_k]``,
  ``T_k`` the sum of the earlier durations; a stage of rate 0 is an idle gap;
- ``times_ns``: given arrival times (non-decreasing int ns), e.g. the send times a
  ``vllm bench serve`` result recorded, so a generator rebuilds that run's prompts.

Gaps follow ``vllm bench serve``: Gamma(shape = burstiness, scale = 1 / (rate * burstiness)),
burstiness = 1 / cv**2, so ``poisson`` (burstiness 1) has exponential gaps and ``gamma`` a
coefficient of variation ``cv``; every gap is truncated to integer ns before accumulating and
the first arrival comes one gap after the start (of the run, or of its stage). Poisson and
gamma gaps come from one numpy legacy ``RandomState(seed)`` drawn through the stages in
order, so a one-stage load gives exactly the arrivals of the same ``rate`` and ``duration_s``
without stages. ``constant`` (burstiness -> inf) puts arrival ``j`` (1-based) of a stage at
``T_k + floor(j * 1e9 / rate)`` ns: ``floor(rate * duration_k)`` arrivals per stage, no drift.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np

from workloads.errors import WorkloadError
from workloads.limits import MAX_ARRIVAL_NS

NS_PER_S = 1_000_000_000
ARRIVALS = ("poisson", "gamma", "constant")
# The longest load: arrivals must stay far inside int64 ns (limits.MAX_ARRIVAL_NS).
MAX_DURATION_S = MAX_ARRIVAL_NS / NS_PER_S


def burstiness_of(arrival: str, cv: float) -> float:
    """vLLM's ``--burstiness`` for an arrival process: 1 (Poisson), 1 / cv**2 (gamma), inf
    (constant)."""
    if arrival == "poisson":
        return 1.0
    if arrival == "gamma":
        return 1.0 / cv**2
    if arrival == "constant":
        return math.inf
    raise WorkloadError(f"arrival '{arrival}': use one of {list(ARRIVALS)}")


def gap_arrivals(
    rs: np.random.RandomState,
    rate: float,
    burstiness: float,
    num_requests: int | None,
    duration_s: float | None,
) -> np.ndarray:
    """Integer-ns arrivals from t = 0 with gamma gaps drawn from ``rs`` (see the module
    docstring): ``num_requests`` of them, or all within ``duration_s``."""
    cap = MAX_ARRIVAL_NS if duration_s is None else int(duration_s * NS_PER_S) + 1

    def gaps(n: int) -> np.ndarray:
        if burstiness == 1.0:
            g = rs.exponential(1.0 / rate, n)
        else:
            g = rs.gamma(burstiness, 1.0 / (rate * burstiness), n)
        g_ns = g * NS_PER_S
        if num_requests is not None and float(g_ns.sum()) > MAX_ARRIVAL_NS:
            raise WorkloadError(
                f"rate={rate!r} req/s spreads {num_requests} arrivals beyond "
                f"{MAX_ARRIVAL_NS} ns (31.7 years); raise the rate"
            )
        # truncate each gap, like the reference; a gap past the horizon is capped (it ends
        # the draw either way), never cast from a float beyond int64
        return np.minimum(g_ns, cap).astype(np.int64)

    if num_requests is not None:
        return np.cumsum(gaps(num_requests))
    assert duration_s is not None
    horizon = cap - 1

    def after(base: int, g: np.ndarray) -> np.ndarray:
        if base + float(g.sum()) > 4e18:  # int64 would overflow: keep what can matter
            g = g[: int(np.searchsorted(np.cumsum(g, dtype=np.float64), 2e18, "right")) + 1]
        return base + np.cumsum(g)

    chunk = max(64, int(rate * duration_s * 1.2) + 16)
    out = after(0, gaps(chunk))
    while out[-1] <= horizon:
        out = np.concatenate([out, after(int(out[-1]), gaps(chunk))])
    return out[out <= horizon]


def _constant(rate: float, count: int) -> np.ndarray:
    j = np.arange(1, count + 1, dtype=np.float64)
    return np.floor(j * (NS_PER_S / rate)).astype(np.int64)


def _constant_count(rate: float, duration_s: float) -> int:
    """How many of ``_constant``'s arrivals fall within the stage's integer-ns horizon:
    floor(rate * duration), exact at the edge (0.1 req/s x 30 s gives 3, not 2)."""
    horizon = int(duration_s * NS_PER_S)
    step = NS_PER_S / rate
    n = int(horizon / step)
    while n > 0 and math.floor(n * step) > horizon:
        n -= 1
    while math.floor((n + 1) * step) <= horizon:
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class Stage:
    """One load stage: ``rate`` req/s (>= 0) for ``duration_s`` seconds (> 0)."""

    rate: float
    duration_s: float


def _number(who: str, name: str, value: Any, *, minimum: float, strict: bool,
            allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value):
        raise WorkloadError(f"{who}: {name} must be a number, got {value!r}")
    too_small = value <= minimum if strict else value < minimum
    if too_small or (math.isinf(value) and not allow_inf):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        what = f"{bound} (inf: every arrival at t = 0)" if allow_inf else f"finite and {bound}"
        raise WorkloadError(f"{who}: {name} must be {what}, got {value!r}")
    return float(value)


def parse_stages(stages: Iterable[Any], who: str = "stages") -> tuple[Stage, ...]:
    """Stages from ``Stage`` objects or mappings ``{rate, duration_s}`` (a Hydra list);
    errors name ``who[i]``."""
    out: list[Stage] = []
    for i, item in enumerate(stages):
        where = f"{who}[{i}]"
        if isinstance(item, Stage):
            rate, duration = item.rate, item.duration_s
        elif isinstance(item, Mapping):
            unknown = sorted(set(map(str, item)) - {"rate", "duration_s"})
            if unknown or "rate" not in item or "duration_s" not in item:
                raise WorkloadError(
                    f"{where}: a stage is {{rate: <req/s >= 0>, duration_s: <s > 0>}}, got "
                    f"{dict(item)!r}"
                )
            rate, duration = item["rate"], item["duration_s"]
        else:
            raise WorkloadError(f"{where}: expected {{rate, duration_s}}, got {item!r}")
        out.append(Stage(
            _number(where, "rate (req/s)", rate, minimum=0.0, strict=False),
            _number(where, "duration_s", duration, minimum=0.0, strict=True),
        ))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Load:
    """The arrival process of a generated workload (see the module docstring).

    Exactly one of ``num_requests``, ``duration_s``, ``stages`` or ``times_ns`` is set;
    ``rate`` (req/s) goes with the first two. ``arrival``: ``poisson``, ``gamma`` (with
    ``cv``) or ``constant``. Every value is checked when the load is built; ``who`` names the
    caller in messages.
    """

    rate: float | None = None
    arrival: str = "poisson"
    cv: float = 1.0
    num_requests: int | None = None
    duration_s: float | None = None
    stages: tuple[Stage, ...] = ()
    times_ns: tuple[int, ...] = ()
    who: str = "load"

    def __post_init__(self) -> None:
        who = self.who
        object.__setattr__(self, "stages", parse_stages(self.stages, f"{who}: stages"))
        object.__setattr__(self, "times_ns", tuple(self.times_ns))
        sizes = [self.num_requests is not None, self.duration_s is not None, bool(self.stages),
                 bool(self.times_ns)]
        if sum(sizes) != 1:
            raise WorkloadError(
                f"{who}: give exactly one of num_requests, duration_s, stages or times_ns"
            )
        if self.times_ns:
            self._check_times()
            return
        if self.arrival not in ARRIVALS:
            raise WorkloadError(f"{who}: arrival '{self.arrival}': use one of {list(ARRIVALS)}")
        if self.arrival == "gamma":
            _number(who, "cv", self.cv, minimum=0.0, strict=True)
        if self.stages:
            if self.rate is not None:
                raise WorkloadError(
                    f"{who}: rate={self.rate!r} with stages: each stage has its own rate; "
                    "drop rate"
                )
            total = sum(s.duration_s for s in self.stages)
            if total > MAX_DURATION_S:
                raise WorkloadError(
                    f"{who}: the stages last {total:.4g} s, above {MAX_DURATION_S:.4g} s; "
                    "shorten them"
                )
            if not any(s.rate > 0 for s in self.stages):
                raise WorkloadError(f"{who}: every stage has rate 0; give one a rate > 0")
            return
        rate = _number(who, "rate (req/s)", self.rate, minimum=0.0, strict=True, allow_inf=True)
        object.__setattr__(self, "rate", rate)
        if self.duration_s is not None:
            if math.isinf(rate):
                raise WorkloadError(f"{who}: rate=inf needs num_requests (a duration makes no "
                                    "sense)")
            d = _number(who, "duration_s", self.duration_s, minimum=0.0, strict=True)
            if d > MAX_DURATION_S:
                raise WorkloadError(f"{who}: duration_s={d:.4g} is above {MAX_DURATION_S:.4g} s")
            object.__setattr__(self, "duration_s", d)
        else:
            n = self.num_requests
            if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
                raise WorkloadError(f"{who}: num_requests must be an int >= 1, got {n!r}")
            object.__setattr__(self, "num_requests", int(n))

    def _check_times(self) -> None:
        who, previous = self.who, 0
        if self.rate is not None:
            raise WorkloadError(f"{who}: rate={self.rate!r} with times_ns: drop rate")
        for i, t in enumerate(self.times_ns):
            if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t <= MAX_ARRIVAL_NS:
                raise WorkloadError(f"{who}: times_ns[{i}] must be an int in [0, "
                                    f"{MAX_ARRIVAL_NS}], got {t!r}")
            if t < previous:
                raise WorkloadError(f"{who}: times_ns[{i}]={t} is earlier than times_ns[{i - 1}]"
                                    f"={previous}; give the times in send order")
            previous = t

    @property
    def burstiness(self) -> float:
        return burstiness_of(self.arrival, self.cv)

    def expected_requests(self) -> float:
        """The mean number of arrivals (exact for ``num_requests`` and ``constant``)."""
        if self.num_requests is not None:
            return float(self.num_requests)
        if self.times_ns:
            return float(len(self.times_ns))
        if self.duration_s is not None:
            assert self.rate is not None
            return self.rate * self.duration_s
        return sum(s.rate * s.duration_s for s in self.stages)

    def times(self, seed: int) -> np.ndarray:
        """Integer-ns arrival times, non-decreasing (see the module docstring)."""
        if self.times_ns:
            return np.asarray(self.times_ns, dtype=np.int64)
        b = self.burstiness
        rs = np.random.RandomState(seed)
        if not self.stages:
            rate = self.rate
            assert rate is not None
            if math.isinf(rate):
                assert self.num_requests is not None
                return np.zeros(self.num_requests, dtype=np.int64)
            if math.isinf(b):
                n = self.num_requests
                if n is None:
                    assert self.duration_s is not None
                    n = _constant_count(rate, self.duration_s)
                return _constant(rate, n)
            return gap_arrivals(rs, rate, b, self.num_requests, self.duration_s)
        parts: list[np.ndarray] = []
        start = 0
        for s in self.stages:
            if s.rate > 0:
                if math.isinf(b):
                    part = _constant(s.rate, _constant_count(s.rate, s.duration_s))
                else:
                    part = gap_arrivals(rs, s.rate, b, None, s.duration_s)
                parts.append(start + part)
            start += int(s.duration_s * NS_PER_S)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
