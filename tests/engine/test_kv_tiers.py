"""Lower prefix-cache KV tiers: the pool (capacity, eviction, sharing) and the admission path
(lower-tier hits after NPU eviction, last-token rule, recall charged on ``extra_ns``)."""

from __future__ import annotations

import pytest

from astra_bridge.memory import MemoryTier, TierKind
from engine.kv_cache import KVCacheManager
from engine.kv_tiers import KVTierPool, SharedTierPools, chunk_tokens_for
from engine.request import Request
from engine.scheduler import ScheduledStep, Scheduler
from engine.specs import ConfigError
from engine.workload import RequestSpec
from tests.engine_harness import Harness, toks

BPT = 1024  # KV bytes per token of the toy instance
CPU = MemoryTier(TierKind.HOST_DRAM, 256.0, 1000.0)
CXL = MemoryTier(TierKind.CXL, 60.0, 250.0, 4)


def pool(
    chunks: int, *, name: str = "cpu", chunk_tokens: int = 256, policy: str = "lru", tier=CPU
) -> KVTierPool:
    return KVTierPool(
        name,
        tier,
        capacity_bytes=chunks * chunk_tokens * BPT,
        chunk_tokens=chunk_tokens,
        kv_bytes_per_token=BPT,
        policy=policy,
    )


class TierHarness(Harness):
    """The test harness with lower tiers behind its KV manager; steps return the schedule."""

    def __init__(self, num_blocks: int, tiers, *, budget: int = 2048, **kw) -> None:
        super().__init__(num_blocks, budget=budget, **kw)
        self.kv = KVCacheManager(
            num_blocks, self.block_size, 4096, True, tiers=tiers, kv_bytes_per_token=BPT
        )
        self.sched = Scheduler(
            self.kv, max_num_seqs=128, max_num_batched_tokens=budget, max_model_len=4096
        )

    def run_step(self) -> ScheduledStep:
        self.t += 1
        out = self.sched.schedule(self.t)
        self.sched.update_from_output(out, self.t)
        return out

    def drain(self, limit: int = 200) -> list[ScheduledStep]:
        steps = []
        for _ in range(limit):
            if not self.sched.has_requests():
                return steps
            steps.append(self.run_step())
            self.check()
        raise AssertionError("harness did not drain")


# -- geometry and validation ---------------------------------------------------------------
def test_chunk_size_is_lmcache_256_rounded_to_blocks() -> None:
    assert chunk_tokens_for(16) == 256
    assert chunk_tokens_for(7) == 252
    assert chunk_tokens_for(1) == 256
    assert chunk_tokens_for(300) == 300  # a block bigger than 256 tokens: one block per chunk
    with pytest.raises(ConfigError, match="block_size"):
        chunk_tokens_for(0)


def test_capacity_from_bytes_floors_to_whole_chunks() -> None:
    p = KVTierPool(
        "cpu", CPU, capacity_bytes=int(3.7 * 256 * BPT), chunk_tokens=256, kv_bytes_per_token=BPT
    )
    assert p.num_chunks == 3
    assert p.bytes_per_chunk == 256 * BPT
    assert p.capacity_bytes == 3 * 256 * BPT
    # Reference example (docs/reference-semantics.md §10): Llama-8B tp1, 512 GB CPU -> 16,384
    # chunks of 32 MiB.
    llama = KVTierPool(
        "cpu", CPU, capacity_bytes=512 * 2**30, chunk_tokens=256, kv_bytes_per_token=131_072
    )
    assert llama.bytes_per_chunk == 32 * 2**20
    assert llama.num_chunks == 16_384


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(capacity_bytes=256 * BPT - 1), "holds no 256-token chunk"),
        (dict(policy="arc"), "policy"),
        (dict(chunk_tokens=0), "chunk_tokens"),
        (dict(kv_bytes_per_token=0), "kv_bytes_per_token"),
        (dict(capacity_bytes=1.5e9), "capacity_bytes"),
    ],
)
def test_pool_rejects_bad_config(kwargs, match) -> None:
    args = dict(capacity_bytes=4 * 256 * BPT, chunk_tokens=256, kv_bytes_per_token=BPT)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        KVTierPool("cpu", CPU, **args)


def test_manager_rejects_inconsistent_tiers() -> None:
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        KVCacheManager(10, 16, 4096, False, tiers=[pool(2)])
    with pytest.raises(ConfigError, match="not a multiple of the instance's block_size=24"):
        KVCacheManager(10, 24, 4096, True, tiers=[pool(2)])
    with pytest.raises(ConfigError, match="same model and KV dtype"):
        KVCacheManager(10, 16, 4096, True, tiers=[pool(2)], kv_bytes_per_token=2 * BPT)
    with pytest.raises(ConfigError, match="repeat"):
        KVCacheManager(10, 16, 4096, True, tiers=[pool(2), pool(2)])
    with pytest.raises(ConfigError, match="recall_requesters"):
        KVCacheManager(10, 16, 4096, True, tiers=[pool(2)], recall_requesters=0)


# -- the pool ------------------------------------------------------------------------------
def test_full_pool_evicts_oldest_and_counts() -> None:
    p = pool(4)
    for k in range(5):
        assert p.store(k)
    assert 0 not in p and all(k in p for k in range(1, 5))  # first written goes first
    assert (p.stored_chunks, p.evicted_chunks, len(p)) == (5, 1, 4)
    assert not p.store(3)  # resident: not copied again
    assert p.stored_chunks == 5
    s = p.stats()
    assert s["bytes_used"] == 4 * 256 * BPT and s["usage"] == 1.0
    assert s["write_through_bytes"] == 5 * 256 * BPT
    p.check_invariants()


@pytest.mark.parametrize(("policy", "victim"), [("lru", "b"), ("fifo", "a")])
def test_lru_refreshes_on_touch_and_restore_fifo_does_not(policy: str, victim: str) -> None:
    keys = {"a": 11, "b": 12, "c": 13, "d": 14}
    p = pool(3, policy=policy)
    for name in "abc":
        p.store(keys[name])
    p.touch([keys["a"]])
    p.store(keys["c"])  # re-store: LRU refreshes c, FIFO leaves the order alone
    p.store(keys["d"])
    assert keys[victim] not in p
    assert len(p) == 3


def test_touch_puts_the_prefix_chunk_last_in_line() -> None:
    p = pool(3)
    for k in (1, 2, 3):
        p.store(k)
    p.touch([3, 2])  # chunks of one prefix: 3 is its first chunk, 2 its second
    assert p.keys() == [1, 2, 3]  # reversed touch: the prefix chunk ends most recent
    p.touch([2, 1])
    assert p.keys() == [3, 1, 2]


def test_load_time_is_memory_tier_access_times_requesters_when_serialised() -> None:
    p = pool(2)
    nbytes = 416 * BPT
    assert p.load_ns(nbytes) == CPU.access_ns(nbytes) == 1000 + int(nbytes / 256e9 * 1e9)
    assert p.load_ns(nbytes, 4) == 4 * CPU.access_ns(nbytes)
    hbm = pool(2, tier=MemoryTier(TierKind.NPU_HBM, 1597.0))
    assert hbm.load_ns(nbytes, 4) == hbm.tier.access_ns(nbytes)  # HBM does not queue
    assert p.load_ns(0) == 0


def test_shared_pools_by_scope_must_agree() -> None:
    reg = SharedTierPools()
    a = reg.get(("cpu", 0), CPU, capacity_bytes=8 * 256 * BPT, chunk_tokens=256, kv_bytes_per_token=BPT)
    b = reg.get(("cpu", 0), CPU, capacity_bytes=8 * 256 * BPT, chunk_tokens=256, kv_bytes_per_token=BPT)
    c = reg.get(("cpu", 1), CPU, capacity_bytes=8 * 256 * BPT, chunk_tokens=256, kv_bytes_per_token=BPT)
    assert a is b and a is not c
    assert (a.name, c.name) == ("cpu", "cpu")
    assert sorted(reg.stats()) == ["cpu:0", "cpu:1"]
    a.store(7)
    assert reg.stats()["cpu:0"]["used_chunks"] == 1 and reg.stats()["cpu:1"]["used_chunks"] == 0
    with pytest.raises(ConfigError, match="kv_bytes_per_token"):
        reg.get(("cpu", 0), CPU, capacity_bytes=8 * 256 * BPT, chunk_tokens=256, kv_bytes_per_token=2)


# -- write-through and lookup through the manager ------------------------------------------
def _req(index: int, prompt: list[int], out: int = 4) -> Request:
    return Request(RequestSpec(f"r{index}", 0, tuple(prompt), out), index, 16, True)


def test_write_through_keys_on_last_fine_hash_of_each_full_chunk() -> None:
    p = pool(8)
    kv = KVCacheManager(100, 16, 4096, True, tiers=[p], kv_bytes_per_token=BPT)
    r = _req(0, toks(0, 700))
    assert kv.allocate_slots(r, 700)
    # 700 tokens = 43 full blocks = 2 full chunks (a trailing partial chunk is not stored).
    assert p.keys() == [r.block_hashes[15], r.block_hashes[31]]
    assert kv.tier_stats()["cpu"]["write_through_bytes"] == 2 * 256 * BPT


def test_lookup_follows_connector_rules() -> None:
    p = pool(8)
    kv = KVCacheManager(100, 16, 4096, True, tiers=[p], kv_bytes_per_token=BPT)
    src = _req(0, toks(0, 1024))
    for c in range(3):  # chunks 0..2 resident, chunk 3 not
        p.store(src.block_hashes[16 * c + 15])
    # NPU hit 0: three chunks.
    assert kv.get_external_computed_tokens(_req(1, toks(0, 1000)), 0) == 768
    # NPU hit of 5 blocks: the straddling chunk is reloaded from the NPU hit on.
    assert kv.get_external_computed_tokens(_req(2, toks(0, 1000)), 80) == 768 - 80
    # At least one whole chunk must be gained beyond the NPU hit, else nothing.
    assert kv.get_external_computed_tokens(_req(3, toks(0, 1000)), 496) == 272
    assert kv.get_external_computed_tokens(_req(4, toks(0, 1000)), 560) == 0
    # Prompt exactly 2 chunks, all resident: last token recomputed.
    assert kv.get_external_computed_tokens(_req(5, toks(0, 512)), 0) == 511
    # A prompt shorter than a chunk never hits.
    assert kv.get_external_computed_tokens(_req(6, toks(0, 255)), 0) == 0
    # Diverging after the first chunk: one chunk.
    assert kv.get_external_computed_tokens(_req(7, toks(0, 300) + toks(9000, 400)), 0) == 256


def test_admit_without_lookup_is_a_bug() -> None:
    kv = KVCacheManager(100, 16, 4096, True, tiers=[pool(2)], kv_bytes_per_token=BPT)
    r = _req(0, toks(0, 600))
    with pytest.raises(RuntimeError, match="without a matching lookup"):
        kv.admit_external(r)


# -- end to end through the scheduler ------------------------------------------------------
def test_evicted_prefix_comes_back_from_cpu_with_recall_charged() -> None:
    prompt = toks(0, 520)  # 32 full blocks + 8 tokens -> 2 chunks in the lower tier
    cpu = pool(16)
    h = TierHarness(40, [cpu])  # 39 usable blocks: room for one 33-block request at a time
    h.add("a", prompt, 2)
    first = h.drain()
    assert sum(s.extra_ns for s in first) == 0  # write-through is not charged
    assert len(cpu) == 2
    # An unrelated request of the same size reuses (evicts) most of a's NPU blocks.
    h.add("b", toks(50_000, 520), 2)
    h.drain()
    npu_left = 0
    while h.kv.pool.lookup(h.requests["a"].block_hashes[npu_left]) >= 0:
        npu_left += 1
    assert 0 < npu_left < 32
    # a's prompt again: NPU hit of npu_left blocks, the rest of both chunks from the CPU tier.
    c = h.add("c", prompt, 2)
    step = h.run_step()
    local = npu_left * 16
    ext = 512 - local
    assert step.reqs == [c] and step.num_tokens == [520 - 512]
    assert c.prefix_hit_tokens == 512 and c.num_cached_tokens == 512
    assert step.extra_ns == CPU.access_ns(ext * BPT) > 0
    stats = h.kv.tier_stats()
    assert stats["cpu"]["hit_tokens"] == ext
    assert stats["cpu"]["recall_bytes"] == ext * BPT
    assert stats["cpu"]["recall_ns"] == step.extra_ns
    assert stats["cpu"]["queries"] == 3 and stats["cpu"]["query_tokens"] == 3 * 520
    assert stats["npu"]["hit_tokens"] >= local
    h.drain()
    h.check()
    assert h.kv.pool.num_free == 39  # no leak


def test_without_tier_the_same_request_recomputes_the_prefix() -> None:
    prompt = toks(0, 520)
    h = Harness(40, budget=2048)
    h.add("a", prompt, 2)
    h.add("b", toks(50_000, 520), 2)
    for _ in range(10):
        h.step()
    npu_left = 0
    while h.kv.pool.lookup(h.requests["a"].block_hashes[npu_left]) >= 0:
        npu_left += 1
    assert npu_left < 32
    h.add("c", prompt, 2)
    sched, _ = h.step()
    assert sched["c"] == 520 - 16 * npu_left  # only the NPU's surviving blocks help


def test_full_prompt_in_tier_recomputes_one_token_and_loads_every_block() -> None:
    prompt = toks(0, 512)
    cpu = pool(16)
    h = TierHarness(36, [cpu])  # 35 usable blocks
    h.add("a", prompt, 1)
    h.drain()
    h.add("b", toks(50_000, 560), 1)  # 35 blocks: evicts all of a's NPU blocks
    h.drain()
    assert h.kv.pool.lookup(h.requests["a"].block_hashes[0]) < 0
    c = h.add("c", prompt, 1)
    step = h.run_step()
    assert step.num_tokens == [1] and c.prefix_hit_tokens == 511
    assert step.extra_ns == CPU.access_ns(512 * BPT)  # the last block is loaded whole


def test_recalls_of_one_step_are_one_access_and_requesters_multiply() -> None:
    cpu = pool(16)
    prompt = toks(0, 600)
    kv = KVCacheManager(200, 16, 4096, True, tiers=[cpu], kv_bytes_per_token=BPT, recall_requesters=2)
    for c in range(2):
        cpu.store(_req(0, prompt).block_hashes[16 * c + 15])
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=4096)
    sched.add_request(_req(1, prompt))
    sched.add_request(_req(2, toks(0, 300) + toks(7000, 300)))
    step = sched.schedule(0)
    # Request 1 hits two chunks from the tier. Request 2 hits its first block run on the NPU
    # (same-step sharing with request 1): 18 full blocks, past its only resident chunk.
    assert [r.index for r in step.reqs] == [1, 2]
    assert step.num_tokens == [600 - 512, 600 - 288]
    assert step.extra_ns == 2 * CPU.access_ns(512 * BPT)


def test_second_tier_serves_when_first_misses() -> None:
    cpu, cxl = pool(4), pool(4, name="cxl", tier=CXL)
    prompt = toks(0, 600)
    kv = KVCacheManager(200, 16, 4096, True, tiers=[cpu, cxl], kv_bytes_per_token=BPT)
    src = _req(0, prompt)
    cxl.store(src.block_hashes[15])
    cxl.store(src.block_hashes[31])
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=4096)
    r = _req(1, prompt)
    sched.add_request(r)
    step = sched.schedule(0)
    assert step.num_tokens == [88]
    assert step.extra_ns == CXL.access_ns(512 * BPT)
    stats = kv.tier_stats()
    assert stats["cpu"]["queries"] == 1 and stats["cpu"]["hit_tokens"] == 0
    assert stats["cxl"]["queries"] == 1 and stats["cxl"]["hit_tokens"] == 512
    # The admission wrote its chunks through to the CPU tier too.
    assert len(cpu) == 2


def test_two_instances_share_one_pool() -> None:
    shared = pool(16, name="cxl", tier=CXL)
    h1, h2 = TierHarness(60, [shared]), TierHarness(60, [shared])
    prompt = toks(0, 700)
    h1.add("a", prompt, 3)
    h1.drain()
    b = h2.add("b", prompt, 3)
    step = h2.run_step()
    assert b.prefix_hit_tokens == 512 and step.num_tokens == [700 - 512]
    assert step.extra_ns == CXL.access_ns(512 * BPT)
    s1, s2 = h1.kv.tier_stats()["cxl"], h2.kv.tier_stats()["cxl"]
    assert (s1["hit_tokens"], s2["hit_tokens"]) == (0, 512)
    assert s1["pool_hit_tokens"] == s2["pool_hit_tokens"] == 512
    assert s1["pool_queries"] == 2 and s1["queries"] == 1
    assert s1["write_through_bytes"] == 2 * 256 * BPT and s2["write_through_bytes"] == 0
    h2.drain()
    shared.check_invariants()


def test_tiers_off_manager_reports_npu_only() -> None:
    kv = KVCacheManager(10, 16, 4096, True)
    assert kv.tiers is None
    assert list(kv.tier_stats()) == ["npu"]
    assert kv.take_recall_ns() == 0
    assert kv.get_external_computed_tokens(_req(0, toks(0, 600)), 0) == 0


def test_block_sized_chunks_load_the_block_the_npu_cap_excluded() -> None:
    """docs/reference-semantics.md §18 with offloaded block = NPU block: a full-prompt hit loads
    the last block the NPU's ``num_tokens - 1`` cap left out, then recomputes one token."""
    cpu = pool(64, chunk_tokens=16)
    h = TierHarness(100, [cpu])
    h.add("a", toks(0, 512), 1)
    h.drain()
    c = h.add("c", toks(0, 512), 1)
    step = h.run_step()
    assert step.num_tokens == [1] and c.prefix_hit_tokens == 511
    assert h.kv.tier_stats()["cpu"]["hit_tokens"] == 15  # 496 from the NPU, 15 from the tier
    assert step.extra_ns == CPU.access_ns(16 * BPT)
