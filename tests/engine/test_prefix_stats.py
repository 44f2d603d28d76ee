"""Prefix-cache hit rate as vLLM defines it: hits over queried tokens (``PrefixCacheStats``).

vLLM records every ``get_computed_blocks`` lookup: ``num_tokens`` queried and the hit tokens
found, with lookups of previously preempted requests kept apart (``preempted_queries`` /
``preempted_hits``); its dashboards show ``hits / queries``. The old sweep figure divided the
hit tokens of every admission (re-admissions after preemption included) by the prompt tokens
and reached 1.79 under KV pressure.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EngineConfig, RequestSpec, simulate
from engine.batch import BatchShape
from engine.kv_cache import PrefixCacheStats
from engine.specs import HardwareSpec
from profiles.catalog import load_model

MODEL = load_model("meta-llama/Llama-3.1-8B")
HW = HardwareSpec("card", 96.0, 1000.0, 100.0, 200.0)


class Flat:
    """1 ms + 10 us per scheduled token."""

    def iteration_ns(self, shape: BatchShape) -> int:
        return 1_000_000 + 10_000 * shape.total_tokens


def _cfg(**kw) -> EngineConfig:
    return EngineConfig(step_overhead_us=0.0, **kw)


def test_counts_follow_vllm_lookups():
    """Two requests 100 ms apart sharing 64 prompt tokens (4 blocks): each is looked up once,
    on admission, with its whole prompt; the second finds the 4 shared blocks."""
    shared = tuple(range(1000, 1064))
    a = RequestSpec("a", 0, shared + tuple(range(5000, 5016)), 4)
    b = RequestSpec("b", 100_000_000, shared + tuple(range(6000, 6020)), 4)
    res = simulate(MODEL, HW, _cfg(), [a, b], Flat())
    assert (res.prefix_cache_queries, res.prefix_cache_hits) == (80 + 84, 64)
    assert res.prefix_hit_rate == 64 / 164
    npu = res.tier_stats["instance0"]["npu"]
    assert (npu["query_tokens"], npu["hit_tokens"], npu["hit_rate"]) == (164, 64, 64 / 164)
    assert (npu["preempted_query_tokens"], npu["preempted_hit_tokens"]) == (0, 0)
    off = simulate(MODEL, HW, _cfg(enable_prefix_caching=False), [a, b], Flat())
    assert (off.prefix_cache_queries, off.prefix_cache_hits, off.prefix_hit_rate) == (0, 0, 0.0)


def test_readmissions_after_preemption_are_kept_apart():
    """Under KV pressure preempted requests re-hit their own blocks: the old figure (all
    admission hits over prompt tokens) goes above 1, vLLM's stays below 1."""
    prompt = tuple(range(100, 356))  # 256 tokens, identical for all: 16 shared blocks
    reqs = [RequestSpec(f"r{i}", i * 1_000_000, prompt, 300) for i in range(24)]
    res = simulate(MODEL, HW, _cfg(num_gpu_blocks_override=200), reqs, Flat())
    assert res.num_preemptions > 0
    old = res.prefix_hit_tokens / float(res.requests.prompt_len.sum())
    assert old > 1.0  # the bug of issue 12, item 8
    npu = res.tier_stats["instance0"]["npu"]
    assert npu["preempted_query_tokens"] > 0 and npu["preempted_hit_tokens"] > 0
    assert 0.0 < res.prefix_hit_rate < 1.0
    # Every request is looked up with its prompt when first admitted (never preempted then).
    assert res.prefix_cache_queries >= 24 * 256


@st.composite
def runs(draw):
    n = draw(st.integers(1, 30))
    prefixes = [tuple(range(10_000 * k, 10_000 * k + draw(st.integers(0, 200)))) for k in range(3)]
    reqs, t = [], 0
    for i in range(n):
        t += draw(st.integers(0, 30_000_000))
        tail = tuple(range(1_000_000 + 1000 * i, 1_000_000 + 1000 * i + draw(st.integers(1, 120))))
        prompt = (draw(st.sampled_from(prefixes)) + tail)[:400]
        reqs.append(RequestSpec(f"r{i}", t, prompt, draw(st.integers(1, 80))))
    cfg = _cfg(
        num_gpu_blocks_override=draw(st.integers(32, 120)),
        enable_prefix_caching=draw(st.booleans()),
        async_scheduling=draw(st.booleans()),
        enable_chunked_prefill=draw(st.booleans()),
        reserve_full_isl=draw(st.booleans()),
        max_num_seqs=draw(st.sampled_from([1, 4, 16])),
        max_num_batched_tokens=draw(st.sampled_from([512, 2048])),
        max_model_len=512,
    )
    return reqs, cfg


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_hit_rate_is_a_fraction(case):
    reqs, cfg = case
    res = simulate(MODEL, HW, cfg, reqs, Flat())
    rate = res.prefix_hit_rate
    assert 0.0 <= rate <= 1.0, rate
    assert 0 <= res.prefix_cache_hits <= res.prefix_cache_queries
    stats = [inst["npu"] for inst in res.tier_stats.values()]
    assert res.prefix_cache_queries == sum(s["query_tokens"] for s in stats)
    assert res.prefix_cache_hits == sum(s["hit_tokens"] for s in stats)
    for s in stats:
        assert 0 <= s["preempted_hit_tokens"] <= s["preempted_query_tokens"]
        assert 0.0 <= s["hit_rate"] <= 1.0
    if not cfg.enable_prefix_caching:
        assert res.prefix_cache_queries == 0 and rate == 0.0
    else:
        # Each request's first lookup is with its prompt, before any preemption.
        assert res.prefix_cache_queries >= sum(r.prompt_len for r in reqs)
        if res.num_preemptions:
            assert sum(s["preempted_query_tokens"] for s in stats) > 0


def test_stats_add_and_rate():
    a = PrefixCacheStats(10, 4, 3, 2)
    assert a + PrefixCacheStats(5, 1) == PrefixCacheStats(15, 5, 3, 2)
    assert a.hit_rate == 0.4 and PrefixCacheStats().hit_rate == 0.0
