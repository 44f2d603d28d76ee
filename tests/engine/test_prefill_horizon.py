"""engine.cluster.PrefillHorizon: the P/D horizon's share of the prefill units, checked against
a scan of every prefill unit's wake and mark at each event, inside real runs (so a change the
engine loop forgets to report shows up as a different horizon), and on its own against random
sequences of marks and wakes."""

from __future__ import annotations

import random
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import RequestSpec
from engine.cluster import PrefillHorizon
from engine.frontend import FrontEndSpec
from engine.simulate import simulate_cluster
from tests.engine.test_cluster import inst

CLUSTER = sys.modules["engine.cluster"]
NO_EVENT = 1 << 62


def scan(units, wake, dirty, now_ns: int) -> int:
    """The horizon's prefill share read directly: the earliest of every prefill unit's instant
    (now when marked, else its wake)."""
    h = NO_EVENT
    for i in units:
        w = now_ns if dirty[i] else wake[i]
        if w is not None and w < h:
            h = w
    return h


class ScanCheckedHorizon(PrefillHorizon):
    """A PrefillHorizon whose every answer is compared with :func:`scan` of the loop's own
    ``wake`` and ``dirty`` lists."""

    checked = 0

    def __init__(self, units, wake, dirty):  # type: ignore[no-untyped-def]
        super().__init__(units, wake, dirty)
        self.units = list(units)

    def earliest(self, now_ns):  # type: ignore[no-untyped-def]
        got = super().earliest(now_ns)
        expect = scan(self.units, self.wake, self.dirty, now_ns)
        assert got == expect, f"at {now_ns}: heap says {got}, scan {expect}"
        type(self).checked += 1
        return got


@pytest.fixture
def checked_horizon(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(CLUSTER, "PrefillHorizon", ScanCheckedHorizon)
    ScanCheckedHorizon.checked = 0
    return ScanCheckedHorizon


def workload(seed: int) -> list[RequestSpec]:
    """Arrivals up to 4 ms apart, prompts of up to 400 tokens, outputs of up to 60."""
    rng = random.Random(seed)
    out, t = [], 0
    for i in range(rng.randint(4, 50)):
        t += rng.randint(0, 4_000_000)
        p = rng.randint(1, 400)
        out.append(RequestSpec(f"r{i}", t, tuple(range(1000 * i, 1000 * i + p)),
                               rng.randint(1, 60)))
    return out


seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=seeds, prefill=st.integers(1, 4), decode=st.integers(1, 3),
       policy=st.sampled_from(["least_loaded", "round_robin", "random"]),
       api_servers=st.booleans())
def test_runs_see_the_scans_horizon(checked_horizon, seed, prefill, decode, policy,
                                    api_servers) -> None:
    """P/D clusters of several prefill units: every horizon the loop reads is the scan's."""
    specs = ([inst(f"p{k}", role="prefill") for k in range(prefill)]
             + [inst(f"d{k}", role="decode") for k in range(decode)])
    res = simulate_cluster(
        specs, workload(seed), router=policy,
        kv_transfer_ns=lambda src, dst, n: 300_000 + 2_000 * n,
        frontend=FrontEndSpec(mode="api_server") if api_servers else None)
    assert len(res.requests) > 0
    assert checked_horizon.checked > 0


def test_a_loop_that_does_not_report_its_polls_is_caught(monkeypatch) -> None:
    """The check above can fail: a horizon told of no wakes disagrees with the scan."""

    class Deaf(ScanCheckedHorizon):
        def woke(self, i):  # type: ignore[no-untyped-def]
            pass

    monkeypatch.setattr(CLUSTER, "PrefillHorizon", Deaf)
    specs = [inst("p0", role="prefill"), inst("p1", role="prefill"), inst("d0", role="decode")]
    with pytest.raises(AssertionError, match="scan"):
        simulate_cluster(specs, workload(7), kv_transfer_ns=lambda src, dst, n: 300_000)


ops = st.lists(st.tuples(st.sampled_from(["mark", "poll", "idle", "advance"]),
                         st.integers(0, 5), st.integers(0, 50)), max_size=200)


@settings(max_examples=300, deadline=None)
@given(ops=ops, units=st.sets(st.integers(0, 5), min_size=1))
def test_random_marks_and_wakes_match_the_scan(ops, units) -> None:
    """Any order of marks, polls (a new wake, possibly earlier) and idling, as the loop keeps
    ``wake`` and ``dirty``: the answer is the scan's."""
    wake: list[int | None] = [None] * 6
    dirty = [False] * 6
    h = PrefillHorizon(sorted(units), wake, dirty)
    now = 0
    for op, i, dt in ops:
        if op == "advance":
            now += dt
        elif op == "mark":
            if not dirty[i]:
                dirty[i] = True
                h.dirtied(i)
        else:
            dirty[i] = False
            wake[i] = None if op == "idle" else now + dt
            h.woke(i)
        assert h.earliest(now) == scan(sorted(units), wake, dirty, now)
