"""engine.cluster.PrefixDirectory: the prefix-aware router's picks from the directory the
caches keep, checked inside real runs against the rule read from the caches directly (every
candidate's prefix index looked up block by block), and the directory itself against the
pools' indexes at every pick."""

from __future__ import annotations

import sys
from array import array
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cluster import PrefixDirectory
from engine.frontend import FrontEndSpec
from engine.simulate import simulate_cluster
from tests.engine.test_cluster import CFG, inst
from tests.engine.test_load_board import CheckedRouter, scan_pick, workload

SIMULATE = sys.modules["engine.simulate"]


def lookup_pick(candidates, req, start: int, now_ns: int) -> int:
    """The prefix-aware rule read from the caches: each candidate's longest cached prefix of
    the request's blocks (all but the last token), the first lowest load among the longest;
    with no block cached anywhere, the least-loaded rule from ``start``."""
    hits = []
    for m in candidates:
        kv = m.scheduler.kv
        n = 0
        if kv.enable_caching:
            for h in req.block_hashes[: (req.num_tokens - 1) // kv.block_size]:
                if kv.pool.lookup(h) < 0:
                    break
                n += 1
        hits.append(n)
    top = max(hits)
    if top == 0:
        return scan_pick(candidates, start, now_ns)
    best = [i for i, h in enumerate(hits) if h == top]
    return min(best, key=lambda i: (candidates[i].load(now_ns), i))


def directory_of(candidates) -> dict[int, int]:
    """What a directory must hold, rebuilt from the pools' indexes."""
    out: dict[int, int] = {}
    for pos, m in enumerate(candidates):
        kv = m.scheduler.kv
        if kv.enable_caching:
            for h in kv.pool.indexed_hashes():
                out[h] = out.get(h, 0) | 1 << pos
    return out


class LookupCheckedRouter(CheckedRouter):
    """A router whose every prefix-aware pick is compared with :func:`lookup_pick`, and whose
    directory is compared with the pools' indexes."""

    rule = "the lookups"
    hits = 0  # picks that found a cached prefix somewhere

    def expect(self, side, candidates, req, now_ns, directory):  # type: ignore[no-untyped-def]
        n = len(candidates)
        if n == 1 or self.policy != "prefix_aware":
            return None
        assert directory is not None, "the loop gave no directory"
        assert directory.holders == directory_of(candidates), f"{side} directory stale"
        if any(directory.holders.get(h) for h in req.block_hashes[:1]):
            type(self).hits += 1
        return candidates[lookup_pick(candidates, req, self.counters.get(side, 0) % n, now_ns)]


@pytest.fixture
def checked_router(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(SIMULATE, "Router", LookupCheckedRouter)
    LookupCheckedRouter.checked = LookupCheckedRouter.hits = 0
    return LookupCheckedRouter


seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=seeds, replicas=st.integers(2, 5), num_blocks=st.integers(40, 400),
       caching=st.lists(st.booleans(), min_size=5, max_size=5))
def test_replicas_pick_as_the_lookups(checked_router, seed, replicas, num_blocks,
                                      caching) -> None:
    """Replicas with small caches (evictions take hashes out of the directory), some with
    prefix caching off."""
    checked_router.checked = 0  # (the fixture is shared by hypothesis' examples)
    if not any(caching[:replicas]):
        caching[0] = True
    specs = [inst(f"i{k}", config=replace(CFG, num_gpu_blocks_override=num_blocks,
                                          enable_prefix_caching=caching[k]))
             for k in range(replicas)]
    res = simulate_cluster(specs, workload(seed), router="prefix_aware")
    assert checked_router.checked == len(res.requests)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=seeds, api_servers=st.booleans())
def test_prefill_and_decode_sides_pick_as_the_lookups(checked_router, seed,
                                                      api_servers) -> None:
    """P/D: each side keeps its own directory; the decode side's caches fill from hand-offs."""
    checked_router.checked = 0
    w = workload(seed, 4, 40)
    res = simulate_cluster(
        [inst("p0", role="prefill"), inst("p1", role="prefill"),
         inst("d0", role="decode"), inst("d1", role="decode")],
        w, router="prefix_aware", kv_transfer_ns=lambda src, dst, n: 500_000 + 1_000 * n,
        frontend=FrontEndSpec(mode="api_server") if api_servers else None)
    multi = sum(1 for r in w if r.output_len > 1)
    assert checked_router.checked == len(res.requests) + multi


def test_shared_prefixes_are_found(checked_router) -> None:
    """The runs above do route by cached prefixes (the check is not only of misses)."""
    simulate_cluster([inst(f"i{k}") for k in range(3)], workload(1, 60, 60),
                     router="prefix_aware")
    assert checked_router.hits > 10


def test_a_pool_reports_to_one_directory() -> None:
    """A cache reports to one directory at a time (a later one takes it over, with what it
    holds already); closing detaches it."""
    a, b = (SIMULATE._member(inst(name))[0] for name in ("a", "b"))
    pool = a.scheduler.kv.pool
    first = PrefixDirectory([a, b])
    assert pool.index_listener is not None
    first.close()
    assert pool.index_listener is None
    blocks = pool.get_new_blocks(2)
    table = array("i", blocks)
    pool.cache_full_blocks(table, array("Q", [11, 12]), 0, 2)
    second = PrefixDirectory([b, a])
    assert second.holders == {11: 0b10, 12: 0b10}
    third = PrefixDirectory([a])
    pool.free_table(table, 2)
    pool.get_new_blocks(pool.num_free)  # evicts both
    assert third.holders == {}
    third.close()


def test_a_directory_that_misses_evictions_is_caught(monkeypatch) -> None:
    """The stale-directory check can fail: a directory told of no evictions disagrees with the
    pools' indexes once a small cache evicts."""
    from engine import cluster

    monkeypatch.setattr(cluster._HeldBy, "unindexed", lambda self, h: None)
    monkeypatch.setattr(SIMULATE, "Router", LookupCheckedRouter)
    specs = [inst(f"i{k}", config=replace(CFG, num_gpu_blocks_override=40)) for k in range(2)]
    with pytest.raises(AssertionError, match="stale"):
        simulate_cluster(specs, workload(3, 60, 60), router="prefix_aware")


class _Chain:
    """A request as the walk reads it: its token count and its blocks' hashes."""

    def __init__(self, hashes: list[int], block_size: int, extra: int) -> None:
        self._hashes = hashes
        self.num_tokens = len(hashes) * block_size + extra

    def hashes(self, n: int) -> list[int]:
        assert n <= len(self._hashes)
        return self._hashes


@settings(max_examples=300, deadline=None)
@given(chain=st.lists(st.integers(0, 9), max_size=8, unique=True),
       held=st.lists(st.sets(st.integers(0, 9)), min_size=1, max_size=5),
       extra=st.integers(0, 3))
def test_the_walk_is_every_candidates_longest_prefix(chain, held, extra) -> None:
    """Any holdings, also with holes (a later block cached where an earlier one was evicted):
    the walk's depth is the longest prefix any candidate holds, its mask exactly those that
    hold that many. vLLM leaves a request's last token to compute: a block ending on it does
    not count."""
    from engine.cluster import _longest_prefix

    holders: dict[int, int] = {}
    for pos, hs in enumerate(held):
        for h in hs:
            holders[h] = holders.get(h, 0) | 1 << pos
    req = _Chain(chain, 4, extra)
    usable = (req.num_tokens - 1) // 4

    def prefix(hs: set[int]) -> int:
        n = 0
        while n < usable and chain[n] in hs:
            n += 1
        return n

    hits = [prefix(hs) for hs in held]
    depth, mask = _longest_prefix(holders, req, 4, (1 << len(held)) - 1)
    assert depth == max(hits)
    if depth:
        assert mask == sum(1 << i for i, h in enumerate(hits) if h == depth)
