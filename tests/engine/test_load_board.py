"""engine.instance.LoadBoard: the least-loaded router's picks, checked against a scan of every
candidate's load at each pick, inside real runs (so a change the engine loop forgets to report
to the board shows up as a wrong pick)."""

from __future__ import annotations

import random
import sys
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import RequestSpec
from engine.cluster import Router
from engine.frontend import FrontEndSpec
from engine.simulate import simulate_cluster
from tests.engine.test_cluster import CFG, inst

SIMULATE = sys.modules["engine.simulate"]  # (the package's attribute is the function)


def scan_pick(candidates, start: int, now_ns: int) -> int:
    """The least-loaded rule read directly: the first candidate from ``start`` (cyclically)
    with the lowest ``Member.load`` at ``now_ns``."""
    n = len(candidates)
    loads = [m.load(now_ns) for m in candidates]
    low = min(loads)
    return next((start + k) % n for k in range(n) if loads[(start + k) % n] == low)


class CheckedRouter(Router):
    """A router whose every pick is compared with what :meth:`expect` reads directly (None:
    not checked); ``checked`` counts the picks compared."""

    checked = 0
    rule = "the oracle"

    def expect(self, side, candidates, req, now_ns, directory):  # type: ignore[no-untyped-def]
        return None

    def pick(self, side, candidates, req, now_ns=-1, board=None,  # type: ignore[no-untyped-def]
             directory=None):
        expect = self.expect(side, candidates, req, now_ns, directory)
        got = super().pick(side, candidates, req, now_ns, board, directory)
        if expect is not None:
            assert got is expect, f"{side} pick at {now_ns}: chose {got}, {self.rule} {expect}"
            type(self).checked += 1
        return got


class ScanCheckedRouter(CheckedRouter):
    """A router whose every least-loaded pick is compared with :func:`scan_pick`."""

    rule = "the scan"

    def expect(self, side, candidates, req, now_ns, directory):  # type: ignore[no-untyped-def]
        n = len(candidates)
        if n > 1 and self.policy == "least_loaded":
            return candidates[scan_pick(candidates, self.counters.get(side, 0) % n, now_ns)]
        return None


@pytest.fixture
def checked_router(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(SIMULATE, "Router", ScanCheckedRouter)
    return ScanCheckedRouter


def workload(seed: int, n_min: int = 20, n_max: int = 80) -> list[RequestSpec]:
    """A random load (hypothesis draws the seed: its own integer lists favour the small values
    that rarely make loads cross): arrivals up to 3 ms apart, prompts of up to 300 tokens,
    outputs of up to 200; ids repeat among every third request (shared prefixes)."""
    rng = random.Random(seed)
    out, t = [], 0
    for i in range(rng.randint(n_min, n_max)):
        t += rng.randint(0, 3_000_000)
        p = rng.randint(1, 300)
        out.append(RequestSpec(f"r{i}", t, tuple(range(1000 * (i % 3), 1000 * (i % 3) + p)),
                               rng.randint(1, 200)))
    return out


seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=seeds, replicas=st.integers(2, 6), async_scheduling=st.booleans(),
       max_num_seqs=st.integers(2, 16))
def test_replicas_with_deferred_spans_pick_as_the_scan(checked_router, seed, replicas,
                                                       async_scheduling, max_num_seqs) -> None:
    """Several replicas, no API servers: units hold deferred spans past sends, and the board
    reads their loads again once a span's next finisher completes (a board that missed those
    picked differently in 12 of 30 such runs)."""
    checked_router.checked = 0  # (the fixture is shared by hypothesis' examples)
    cfg = replace(CFG, async_scheduling=async_scheduling, max_num_seqs=max_num_seqs)
    res = simulate_cluster([inst(f"i{k}", config=cfg) for k in range(replicas)],
                           workload(seed))
    assert checked_router.checked == len(res.requests)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=seeds)
def test_prefill_and_decode_sides_pick_as_the_scan(checked_router, seed) -> None:
    """P/D: two prefill and two decode instances; the decode side's board is told of the KV
    hand-offs arriving."""
    checked_router.checked = 0
    w = workload(seed, 4, 40)
    res = simulate_cluster(
        [inst("p0", role="prefill"), inst("p1", role="prefill"),
         inst("d0", role="decode"), inst("d1", role="decode")],
        w, kv_transfer_ns=lambda src, dst, n: 500_000 + 1_000 * n)
    multi = sum(1 for r in w if r.output_len > 1)  # one-token requests end on prefill
    assert checked_router.checked == len(res.requests) + multi


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=seeds)
def test_replicas_behind_api_servers_pick_as_the_scan(checked_router, seed) -> None:
    """With API servers the requests reach the engines later than they are routed."""
    checked_router.checked = 0
    res = simulate_cluster([inst(f"i{k}") for k in range(3)], workload(seed, 4, 40),
                           frontend=FrontEndSpec(mode="api_server"))
    assert checked_router.checked == len(res.requests)
