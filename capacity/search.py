"""The max-rate search: the largest arrival rate at which a configuration meets its SLO.

Pure logic on plain numbers (no engine, Ray or MLflow), so it can be tested in isolation.

**Search** (``RateSearch``): the largest arrival rate at which a configuration meets its SLO,
assuming that meeting it is monotone in the rate. Each probe reports pass/fail and a margin
(``analysis.slo.SloReport.margin``: <= 0 iff pass, growing with load).

1. *Saturation probe* (when no ``initial_rate`` is given): all requests at t = 0. If even
   that meets the SLO the configuration is not SLO-bound (status ``unbounded``, answer the
   measured request throughput). Otherwise the measured throughput X is where the search
   starts: ``start_fraction`` x X.
2. *Bracketing*: multiply (pass) or divide (fail) the rate by ``growth`` until one passing
   and one failing rate enclose the answer; a pass at the ceiling ends with ``capped``, a
   fail at ``min_rate`` with ``infeasible`` (answer 0). The ceiling is ``max_rate`` and, after
   a saturation probe, ``1 + throughput_headroom`` times its throughput: no configuration
   sustains much more than it serves flat out, and a run that passes far above it is too
   short to build the queue a longer one would.
3. *Bisection* in log-rate until ``hi / lo <= 1 + tolerance`` (status ``converged``; the
   answer is ``lo``, a rate that was seen to pass). The split point is the regula-falsi
   root of the margins (Illinois variant; with per-bound margins, the first bound to cross), moved half a tolerance towards the end of the
   bracket that has not moved lately so that both ends close in on the root. The plain
   log-midpoint is used instead whenever the last two steps did not halve the bracket (so
   the worst case stays within twice that of plain bisection) and once the bracket is
   narrower than two tolerances.

Given the same probe outcomes the search asks for the same rates, so it is deterministic
whenever the simulations are (a fixed workload seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

STATUSES = ("converged", "capped", "infeasible", "unbounded", "max_probes", "failed")


@dataclass(frozen=True)
class SearchSettings:
    """Search knobs; see the module docstring. Rates are requests/s per configuration."""

    tolerance: float = 0.02
    initial_rate: float | None = None
    saturation_rate: float = math.inf
    start_fraction: float = 0.8
    growth: float = 2.0
    min_rate: float = 0.01
    max_rate: float = 10_000.0
    max_probes: int = 20
    throughput_headroom: float | None = 0.5

    def check(self) -> None:
        """Raise ``ValueError`` naming the ``capacity.*`` key of the first bad setting."""
        rules = (
            ("tolerance", 0 < self.tolerance < 1, "0 < value < 1 (relative, 0.02 = 2 %)"),
            ("growth", self.growth > 1, "a factor > 1"),
            ("start_fraction", 0 < self.start_fraction <= 1, "0 < value <= 1"),
            ("min_rate", self.min_rate > 0, "a rate > 0 (req/s)"),
            ("max_rate", self.max_rate > self.min_rate, "a rate > capacity.min_rate"),
            ("max_probes", self.max_probes >= 2, "an integer >= 2"),
            ("initial_rate", self.initial_rate is None or self.initial_rate > 0,
             "null (start from a saturation probe) or a rate > 0"),
            ("saturation_rate", self.saturation_rate > 0, "a rate > 0 or .inf"),
            ("throughput_headroom",
             self.throughput_headroom is None or self.throughput_headroom >= 0,
             "null (no ceiling) or a fraction >= 0"),
        )
        for key, ok, allowed in rules:
            if not ok:
                raise ValueError(f"capacity.{key}={getattr(self, key)!r} is not allowed; "
                                 f"allowed: {allowed}")


@dataclass
class ProbePoint:
    """One finished probe as the search sees it."""

    rate: float
    passed: bool
    margin: float
    kind: str
    throughput: float = math.nan
    margins: dict[str, float] | None = None


@dataclass
class SearchResult:
    """The answer: ``max_rate`` (req/s) meeting the SLO, the final bracket and probe count."""

    status: str
    max_rate: float
    lo: float | None
    hi: float | None
    probes: int

    @property
    def rel_gap(self) -> float:
        """``hi / lo - 1`` of the final bracket (NaN when not bracketed)."""
        if self.lo is None or self.hi is None or self.lo <= 0:
            return math.nan
        return self.hi / self.lo - 1.0


@dataclass
class RateSearch:
    """The search for one configuration, as a state machine driven by probe outcomes.

    Call ``next_rate()`` for the rate to probe (``None`` once done), then ``record`` the
    outcome of that rate. One probe is outstanding at a time.
    """

    settings: SearchSettings = field(default_factory=SearchSettings)
    probes: list[ProbePoint] = field(default_factory=list)
    result: SearchResult | None = None
    _pending: tuple[float, str] | None = None
    _lo: ProbePoint | None = None
    _hi: ProbePoint | None = None
    _stale_lo: int = 0
    _stale_hi: int = 0
    _widths: list[float] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.result is not None

    def next_rate(self) -> tuple[float, str] | None:
        """``(rate, kind)`` of the next probe, or ``None`` when the search has its answer."""
        if self.result is not None:
            return None
        if self._pending is None:
            self._pending = self._choose()
        return self._pending

    def fail(self, reason: str = "failed") -> None:
        """End the search without an answer (a probe could not be run)."""
        self.result = SearchResult(reason, math.nan, self._rate(self._lo), self._rate(self._hi),
                                   len(self.probes))

    def record(self, rate: float, passed: bool, margin: float, throughput: float = math.nan,
               margins: dict[str, float] | None = None) -> None:
        """The outcome of the pending probe at ``rate``: pass/fail, the overall margin, the
        measured request throughput and, optionally, each SLO bound's own margin."""
        if self._pending is None or not math.isclose(rate, self._pending[0], rel_tol=1e-12):
            raise ValueError(f"record({rate}) does not match the pending probe {self._pending}")
        kind = self._pending[1]
        self._pending = None
        point = ProbePoint(rate, passed, margin, kind, throughput, margins)
        self.probes.append(point)
        s = self.settings
        if kind == "saturation":
            if passed:
                answer = throughput if math.isfinite(throughput) else s.max_rate
                self._finish("unbounded", answer)
            return
        if passed:
            if self._lo is None or rate > self._lo.rate:
                self._lo = point
            self._stale_lo, self._stale_hi = 0, self._stale_hi + 1
        else:
            if self._hi is None or rate < self._hi.rate:
                self._hi = point
            self._stale_hi, self._stale_lo = 0, self._stale_lo + 1
        if self._lo is not None and self._hi is not None:
            self._widths.append(math.log(self._hi.rate / self._lo.rate))
        if passed and rate >= self._ceiling():
            self._finish("capped", rate)
        elif not passed and rate <= s.min_rate and self._lo is None:
            self._finish("infeasible", 0.0)
        elif self._converged():
            assert self._lo is not None
            self._finish("converged", self._lo.rate)
        elif len(self.probes) >= s.max_probes:
            self._finish("max_probes", self._lo.rate if self._lo else 0.0)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _rate(p: ProbePoint | None) -> float | None:
        return None if p is None else p.rate

    def _finish(self, status: str, answer: float) -> None:
        self.result = SearchResult(status, answer, self._rate(self._lo), self._rate(self._hi),
                                   len(self.probes))

    def _ceiling(self) -> float:
        """The highest rate worth probing: ``max_rate``, and at most ``1 + throughput_headroom``
        times the saturation throughput (a run that passes above it is too short to show
        the queue it would build)."""
        s = self.settings
        sat = self.probes[0].throughput if self.probes and self.probes[0].kind == "saturation" \
            else math.nan
        if s.throughput_headroom is None or not (math.isfinite(sat) and sat > 0):
            return s.max_rate
        return max(min(s.max_rate, sat * (1 + s.throughput_headroom)), s.min_rate)

    def _converged(self) -> bool:
        if self._lo is None or self._hi is None:
            return False
        return self._hi.rate / self._lo.rate <= 1.0 + self.settings.tolerance * (1 + 1e-9)

    def _choose(self) -> tuple[float, str]:
        s = self.settings
        if not self.probes:
            if s.initial_rate is None:
                return s.saturation_rate, "saturation"
            return _clamp(s.initial_rate, s), "bracket"
        if self._lo is None and self._hi is None:  # only the saturation probe so far
            sat = self.probes[0].throughput
            start = s.start_fraction * sat if math.isfinite(sat) and sat > 0 else s.min_rate
            return _clamp(start, s), "bracket"
        if self._hi is None:
            assert self._lo is not None
            return min(self._lo.rate * s.growth, self._ceiling()), "bracket"
        if self._lo is None:
            return max(self._hi.rate / s.growth, s.min_rate), "bracket"
        return math.exp(self._split()), "bisect"

    def _split(self) -> float:
        """The next log-rate inside the bracket (see the module docstring)."""
        assert self._lo is not None and self._hi is not None
        x_lo, x_hi = math.log(self._lo.rate), math.log(self._hi.rate)
        width = x_hi - x_lo
        tau = math.log1p(self.settings.tolerance)
        mid = 0.5 * (x_lo + x_hi)
        stalled = len(self._widths) >= 3 and self._widths[-1] > 0.5 * self._widths[-3]
        if stalled or width <= 2 * tau:
            return mid
        root = x_lo + width * self._crossing()
        if self._stale_hi >= self._stale_lo:
            root += 0.5 * tau
        else:
            root -= 0.5 * tau
        edge = min(0.5 * tau, 0.25 * width)
        return min(max(root, x_lo + edge), x_hi - edge)


    def _crossing(self) -> float:
        """Where in the bracket (0 = lo, 1 = hi) the margins interpolate to zero: the first
        bound to cross when per-bound margins are known, else the overall margin. Illinois:
        the margins of an end that stayed put for k steps count 2^-(k-1)."""
        assert self._lo is not None and self._hi is not None
        w_lo = 0.5 ** max(self._stale_lo - 1, 0)
        w_hi = 0.5 ** max(self._stale_hi - 1, 0)
        lo_m, hi_m = self._lo.margins, self._hi.margins
        if lo_m and hi_m:
            pairs = [(lo_m.get(k, 0.0), m) for k, m in hi_m.items() if m > 0]
        else:
            pairs = [(self._lo.margin, self._hi.margin)]
        best = 1.0
        for m_lo, m_hi in pairs:
            a = min(m_lo, 0.0) * w_lo
            b = max(m_hi, 1e-9) * w_hi
            best = min(best, -a / (b - a))
        return best


def _clamp(rate: float, s: SearchSettings) -> float:
    return min(max(rate, s.min_rate), s.max_rate)
