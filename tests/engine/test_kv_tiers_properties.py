"""Property tests: two instances sharing a lower KV tier (plus a private one) keep every ledger
consistent, hit only real prefixes, charge exactly the recalls they report, and leak nothing."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astra_bridge.memory import MemoryTier, TierKind
from engine.kv_cache import KVCacheManager
from engine.kv_tiers import KVTierPool
from engine.request import Request
from engine.scheduler import Scheduler
from engine.workload import RequestSpec

BS = 16
BPT = 64
PREFIXES = [list(range(1000 * k, 1000 * k + 160)) for k in range(3)]
COUNTERS = ("queries", "query_tokens", "hit_tokens", "recall_bytes", "recall_ns", "write_through_bytes")


@st.composite
def scenarios(draw):
    n_req = draw(st.integers(1, 14))
    reqs = []
    for i in range(n_req):
        prefix = draw(st.sampled_from([[], *PREFIXES, PREFIXES[0]]))
        if draw(st.booleans()):  # half the time a cut prefix, else the whole shared one
            prefix = prefix[: draw(st.integers(0, len(prefix)))]
        tail = draw(st.integers(1, 60))
        prompt = prefix + list(range(100_000 + 1000 * i, 100_000 + 1000 * i + tail))
        reqs.append((i, draw(st.integers(0, 1)), prompt, draw(st.integers(1, 20)), draw(st.integers(0, 40))))
    return dict(
        reqs=reqs,
        num_blocks=[draw(st.integers(16, 28)), draw(st.integers(16, 28))],
        budget=draw(st.integers(16, 256)),
        max_num_seqs=draw(st.integers(1, 6)),
        threshold=draw(st.sampled_from([0, 0, 16, 48])),
        async_scheduling=draw(st.booleans()),
        shared_chunk=draw(st.sampled_from([32, 64])),
        shared_chunks=draw(st.integers(1, 12)),
        private_chunks=draw(st.integers(1, 16)),
        policy=draw(st.sampled_from(["lru", "fifo"])),
        requesters=draw(st.integers(1, 3)),
    )


def _tier(kind: TierKind, name: str, chunk: int, chunks: int, policy: str) -> KVTierPool:
    return KVTierPool(
        name,
        MemoryTier(kind, 100.0, 500.0),
        capacity_bytes=chunks * chunk * BPT,
        chunk_tokens=chunk,
        kv_bytes_per_token=BPT,
        policy=policy,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_shared_tier_invariants(sc) -> None:
    shared = _tier(TierKind.CXL, "cxl", sc["shared_chunk"], sc["shared_chunks"], sc["policy"])
    privates = [_tier(TierKind.HOST_DRAM, "cpu", 16, sc["private_chunks"], "lru") for _ in range(2)]
    kvs, scheds = [], []
    for i in range(2):
        kv = KVCacheManager(
            sc["num_blocks"][i],
            BS,
            10_000,
            True,
            tiers=[privates[i], shared],
            kv_bytes_per_token=BPT,
            recall_requesters=sc["requesters"],
        )
        kvs.append(kv)
        scheds.append(
            Scheduler(
                kv,
                max_num_seqs=sc["max_num_seqs"],
                max_num_batched_tokens=sc["budget"],
                max_model_len=10_000,
                long_prefill_token_threshold=sc["threshold"],
                async_scheduling=sc["async_scheduling"],
            )
        )
    depth = 2 if sc["async_scheduling"] else 1
    inflight: list[list] = [[], []]
    pending = sorted(sc["reqs"], key=lambda r: r[4])
    seen: list[Request] = []
    added = [0, 0]
    extra = [0, 0]
    for step_no in range(4000):
        while pending and pending[0][4] <= step_no:
            i, inst, prompt, out, _ = pending.pop(0)
            if -(-(len(prompt) + out) // BS) <= sc["num_blocks"][inst] - 1:
                r = Request(RequestSpec(f"r{i}", 0, tuple(prompt), out), i, BS, True)
                scheds[inst].add_request(r)
                seen.append(r)
                added[inst] += 1
        idle = True
        for inst in range(2):
            sched = scheds[inst]
            if not sched.has_requests() and not inflight[inst]:
                continue
            idle = False
            before = {id(r) for r in sched.running}
            step = sched.schedule(step_no)
            extra[inst] += step.extra_ns
            for r, n in zip(step.reqs, step.num_tokens, strict=True):
                assert n >= 1
                if id(r) in before:
                    continue
                # Admitted now: its skipped tokens are a real prefix of a request seen so
                # far (itself, if it was preempted), never the whole sequence.
                h = r.num_computed_tokens - n
                assert 0 <= h <= r.num_tokens - 1
                if h:
                    assert any(
                        o.token_ids(0, h) == r.token_ids(0, h)
                        for o in seen
                        if o is not r or r.num_preemptions
                    )
            inflight[inst].append(step)
            if len(inflight[inst]) >= depth:
                sched.update_from_output(inflight[inst].pop(0), step_no)
            kvs[inst].pool.check_invariants(list(kvs[inst].block_tables().values()))
            assert kvs[inst].tiers is not None and not kvs[inst].tiers._step_dirty
        for p in (shared, *privates):
            p.check_invariants()
        stats = [kv.tier_stats() for kv in kvs]
        for key in COUNTERS:
            assert stats[0]["cxl"][key] + stats[1]["cxl"][key] == stats[0]["cxl"][f"pool_{key}"]
            for inst in range(2):
                assert stats[inst]["cpu"][key] == stats[inst]["cpu"][f"pool_{key}"]
        for inst in range(2):
            assert extra[inst] == stats[inst]["cpu"]["recall_ns"] + stats[inst]["cxl"]["recall_ns"]
            for name in ("cpu", "cxl"):
                row = stats[inst][name]
                assert 0.0 <= row["hit_rate"] <= 1.0
                assert row["recall_bytes"] >= row["hit_tokens"] * BPT
                assert (row["recall_ns"] > 0) == (row["recall_bytes"] > 0)
        if idle and not pending:
            break
        if not pending and all(
            not s.running and s.waiting and not f for s, f in zip(scheds, inflight, strict=True)
        ):
            break  # nothing runnable: the instance reports that as an error
    # Every lower-tier key is the last fine hash of a full chunk of some request.
    for p, f in ((shared, sc["shared_chunk"] // BS), (privates[0], 1), (privates[1], 1)):
        valid = {r.block_hashes[j] for r in seen for j in range(f - 1, len(r.block_hashes), f)}
        assert set(p.keys()) <= valid
    for inst in range(2):
        sched, kv = scheds[inst], kvs[inst]
        if sched.num_finished == added[inst]:
            assert not kv.req_blocks
            assert kv.pool.num_free == kv.pool.num_blocks - 1  # no leaked NPU block
    total_hits = sum(kv.tier_stats()[n]["hit_tokens"] for kv in kvs for n in ("cpu", "cxl"))
    assert total_hits <= sum(r.prefix_hit_tokens for r in seen)
