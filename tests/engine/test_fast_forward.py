"""Steady decode spans run in bulk (``EngineUnit.fast_forward``) give exactly the step-by-step
result.

Each example draws a topology and the scheduler options as the stress test does (one
instance, several behind a router, P/D, a DP group, pipeline parallelism; async or sync,
chunked prefill, prefix caching, a CPU tier, preemption-heavy tiny KV caches), a latency model
whose step time depends on the decode KV, and a host overhead, and runs the same workload
twice: with the shortcut off (every step scheduled, executed and processed) and on. Everything
must be equal: the per-request frame (token times to the nanosecond, preemptions, prefix
hits), the time series, every member's step log entry by entry, the token logs, the prefix
and tier statistics, and each block pool's final ledger (free-queue order, block hashes).
A second test does the same on the measured RTX PRO 6000 / Llama-3.1-8B bundle (whose
``decode_steps_ns`` prices the spans) and checks that spans did run.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import engine.instance as instance_mod
from engine import EngineConfig, RequestSpec
from engine.batch import BatchShape
from engine.deployment import InstanceSpec
from engine.frontend import FrontEndSpec
from engine.memory import kv_capacity
from engine.simulate import simulate_cluster
from tests.engine.test_stress import BS, HW, MODEL, build, scenarios, workload

# The module (``engine.simulate`` the attribute is the function of the same name).
simulate_mod = importlib.import_module("engine.simulate")


class KvLatency:
    """1 ms + 10 us per token + a decode-KV term (so a span's steps differ in length)."""

    def __init__(self, pp: int = 1) -> None:
        self.pp = pp

    def iteration_ns(self, shape: BatchShape) -> int:
        # The engine prices scheduled batches only (a span's never-scheduled tail included).
        assert shape.num_seqs > 0, f"an empty batch was priced: {shape}"
        kv = shape.decode_kv_sum // shape.num_decode if shape.num_decode else 0
        return 1_000_000 + 10_000 * shape.total_tokens + 37 * kv + 11 * shape.decode_kv_max

    def stage_ns(self, shape: BatchShape) -> int:
        return self.iteration_ns(shape) // self.pp


def _run(instances, reqs, kwargs, fast: bool, monkeypatch):
    """simulate_cluster with the shortcut on or off; also returns the engine units."""
    units = []
    real = simulate_mod.run_cluster

    def capture(us, *a, **kw):
        units.extend(us)
        return real(us, *a, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(instance_mod, "FAST_FORWARD", fast)  # each unit's default
        mp.setattr(simulate_mod, "run_cluster", capture)
        result = simulate_cluster(instances, reqs, **kwargs)
    return result, units


def _assert_same(a, b, ua, ub) -> None:
    fa, fb = a.requests, b.requests
    assert list(fa.columns) == list(fb.columns)
    for col in fa.columns:
        if col.endswith("token_times_ns"):
            for x, y, rid in zip(fa[col], fb[col], fa["request_id"], strict=True):
                assert np.array_equal(x, y), rid
        else:
            assert fa[col].equals(fb[col]), col
    assert a.timeseries.equals(b.timeseries)
    for field in ("num_preemptions", "prefix_hit_tokens", "prefix_cache_queries",
                  "prefix_cache_hits", "makespan_ns", "num_steps", "tier_stats"):
        assert getattr(a, field) == getattr(b, field), field
    for x, y in zip(ua, ub, strict=True):
        assert x.gpu_free_at == y.gpu_free_at
        for ma, mb in zip(x.members, y.members, strict=True):
            for name in ma.log.COLUMNS:
                assert getattr(ma.log, name) == getattr(mb.log, name), (ma.name, name)
            assert ma.num_steps == mb.num_steps
            sa, sb = ma.scheduler, mb.scheduler
            assert list(sa.token_log.times) == list(sb.token_log.times)
            pa, pb = sa.kv.pool, sb.kv.pool
            assert pa.free_block_ids() == pb.free_block_ids(), ma.name
            assert pa.block_hash == pb.block_hash and pa.ref_cnt == pb.ref_cnt
            assert pa.num_evictions == pb.num_evictions


SPANS = {"steps": 0, "with_queue": 0, "deferred": 0, "interrupted": 0, "dp_group": 0}


def _count_spans(units) -> None:
    for u in units:
        SPANS["deferred"] += u.num_deferred
        SPANS["interrupted"] += u.num_interrupted
        for m in u.members:
            SPANS["steps"] += m.scheduler.span_steps
            SPANS["with_queue"] += m.scheduler.span_steps_queued
            if len(u.members) > 1:
                SPANS["dp_group"] += m.scheduler.span_steps


@st.composite
def settings_(draw):
    sc = draw(scenarios())
    sc["overhead_us"] = draw(st.sampled_from([0.0, 0.0, 150.0]))
    sc["hidden_ms"] = draw(st.sampled_from([0.0, 1.5]))
    # Behind an API server (engine.frontend): the measured one, or one slow enough that
    # requests queue behind streaming work.
    sc["frontend"] = draw(st.sampled_from([None, FrontEndSpec(),
                                           FrontEndSpec(output_token_us=400.0, ipc_us=30.0)]))
    return sc


@st.composite
def replica_settings(draw):
    """Replicas behind a router that reads loads at most, no API server, no tier: where a
    unit holds its span past the sends that go to the others (EngineUnit.poll's defer_ns)."""
    sc = draw(settings_())
    sc.update(topology="router", frontend=None, cpu_tier=False,
              router=draw(st.sampled_from(["least_loaded", "round_robin", "random"])))
    return sc


# A DP group that spans, whatever the draws give (one run of five here drew none).
_DP_EXAMPLE = dict(seed=0, topology="dp", router="round_robin", async_scheduling=False,
                   reserve_full_isl=False, chunked=False, threshold=0, caching=False,
                   cpu_tier=False, max_num_seqs=24, budget=256, slack_blocks=40,
                   num_requests=300, overhead_us=0.0, hidden_ms=0.0, frontend=None)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(settings_())
@example(_DP_EXAMPLE)
def test_decode_spans_equal_step_by_step(monkeypatch, sc):
    _check_spans_equal(monkeypatch, sc)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(replica_settings())
def test_held_spans_equal_step_by_step(monkeypatch, sc):
    _check_spans_equal(monkeypatch, sc)


def _check_spans_equal(monkeypatch, sc) -> None:
    rng = random.Random(sc["seed"])
    max_len = rng.choice([512, 1024])
    reqs = workload(rng, sc["num_requests"] // 2, max_len)
    need = max(-(-(r.prompt_len + r.output_len) // BS) for r in reqs) + 1

    def deployment():  # built per run: tier pools are stateful
        instances, kwargs, _ = build(sc, max_len, need)
        instances = [
            replace(
                s,
                config=replace(s.config, step_overhead_us=sc["overhead_us"],
                               step_overhead_hidden_ms=sc["hidden_ms"]),
                latency=KvLatency(s.config.pipeline_parallel_size),
            )
            for s in instances
        ]
        if sc["frontend"] is not None:
            kwargs = {**kwargs, "frontend": sc["frontend"]}
        return instances, kwargs

    instances, kwargs = deployment()
    slow, us = _run(instances, reqs, kwargs, False, monkeypatch)
    instances, kwargs = deployment()
    fast, uf = _run(instances, reqs, kwargs, True, monkeypatch)
    _count_spans(uf)
    _assert_same(slow, fast, us, uf)


def test_decode_spans_ran_in_the_property_test():
    """Not vacuous: the examples above did run steps in bulk."""
    if not SPANS["steps"]:
        pytest.skip("runs only after the property test in the same session")
    assert SPANS["steps"] > 1000, SPANS
    # DP groups spanned too (the explicit DP example always runs; how many drawn examples
    # are DP groups is the draw's: test_dp_group_spans_equal_step_by_step bounds the share)
    assert SPANS["dp_group"] > 0, SPANS


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("max_num_seqs", [256, 8])  # 8: spans with requests waiting for a seat
@pytest.mark.parametrize("frontend", [None, FrontEndSpec()])
def test_measured_bundle_spans_equal_step_by_step(shared_data, monkeypatch, async_scheduling,
                                                  caching, max_num_seqs, frontend):
    from profiles.bundle import load_bundle
    from profiles.latency import ProfiledLatencyModel

    bundle = load_bundle(shared_data / "llmservingsim" / "profiles", "RTXPRO6000", MODEL.name)
    cfg = EngineConfig(async_scheduling=async_scheduling, enable_prefix_caching=caching,
                       num_gpu_blocks_override=2500, max_num_seqs=max_num_seqs)
    spec = InstanceSpec("a", MODEL, HW, cfg, ProfiledLatencyModel(bundle, MODEL, 1),
                        kv_capacity(MODEL, HW, cfg))
    rng = random.Random(7)
    shared = tuple(range(5_000, 5_000 + 700))
    reqs, t = [], 0
    for i in range(300):
        t += int(rng.expovariate(1.0) * 150_000_000)
        tail = tuple(range(100_000 * (i + 1), 100_000 * (i + 1) + rng.randint(20, 900)))
        prompt = (shared if i % 3 == 0 else ()) + tail
        reqs.append(RequestSpec(f"r{i}", t, prompt, rng.randint(1, 400)))
    kwargs = {"frontend": frontend} if frontend is not None else {}
    slow, us = _run([spec], reqs, kwargs, False, monkeypatch)
    SPANS["steps"] = SPANS["with_queue"] = 0
    fast, uf = _run([spec], reqs, kwargs, True, monkeypatch)
    _count_spans(uf)
    _assert_same(slow, fast, us, uf)
    assert SPANS["steps"] > slow.num_steps // 4, (SPANS, slow.num_steps)
    if max_num_seqs == 8:  # spans ran while requests waited for a seat
        assert SPANS["with_queue"] > 0, SPANS


def _poisson_requests(seed: int, n: int, mean_gap_ns: int, max_prompt: int) -> list[RequestSpec]:
    """``n`` requests with exponential gaps, distinct prompts of 20 to ``max_prompt`` tokens
    (no shared prefix) and 1 to 300 output tokens."""
    rng = random.Random(seed)
    reqs, t = [], 0
    for i in range(n):
        t += int(rng.expovariate(1.0) * mean_gap_ns)
        prompt = tuple(range(100_000 * (i + 1), 100_000 * (i + 1) + rng.randint(20, max_prompt)))
        reqs.append(RequestSpec(f"r{i}", t, prompt, rng.randint(1, 300)))
    return reqs


class SlowDummy(KvLatency):
    """A member whose every step, its dummy batches included, costs 4 ms more: an idle
    member's round can be the group's slowest."""

    def iteration_ns(self, shape: BatchShape) -> int:
        return super().iteration_ns(shape) + 4_000_000


@pytest.mark.parametrize("pad", ["vllm", "reference", "none"])
@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("latency", ["measured", "slow_member"])
def test_dp_group_spans_equal_step_by_step(shared_data, monkeypatch, pad, async_scheduling,
                                           latency):
    """A lock-step DP group of three, at a load that leaves members idle at times (their
    dummy batches): its rounds run in bulk with the step-by-step result, the finishes
    reported in the same order, however its batches are lined up."""
    from engine.results import RequestRecords
    from profiles.bundle import load_bundle
    from profiles.latency import ProfiledLatencyModel
    from profiles.parallel.dp_pad import dp_pad_for

    bundle = load_bundle(shared_data / "llmservingsim" / "profiles", "RTXPRO6000", MODEL.name)
    cfg = EngineConfig(async_scheduling=async_scheduling, num_gpu_blocks_override=2000,
                       max_num_seqs=64)
    models = ([ProfiledLatencyModel(bundle, MODEL, 1) for _ in range(3)]
              if latency == "measured" else [KvLatency(), KvLatency(), SlowDummy()])
    specs = [InstanceSpec(f"dp{k}", MODEL, HW, cfg, models[k], kv_capacity(MODEL, HW, cfg),
                          dp_group="g") for k in range(3)]
    reqs = _poisson_requests(seed=5, n=240, mean_gap_ns=60_000_000, max_prompt=800)
    kwargs = {"dp_pad": dp_pad_for(pad, cfg)}
    orders: list[list[str]] = []

    class Recording(RequestRecords):  # the records the run keeps, noting the order of finishes
        def add(self, req, *a, **kw):
            orders[-1].append(req.request_id)
            return super().add(req, *a, **kw)

    monkeypatch.setattr(importlib.import_module("engine.simulate"), "RequestRecords", Recording)
    orders.append([])
    slow, us = _run(specs, reqs, kwargs, False, monkeypatch)
    orders.append([])
    fast, uf = _run(specs, reqs, kwargs, True, monkeypatch)
    _assert_same(slow, fast, us, uf)
    assert orders[0] == orders[1]
    spanned = sum(m.scheduler.span_steps for u in uf for m in u.members)
    assert spanned > slow.num_steps // 4, (spanned, slow.num_steps)


@pytest.mark.parametrize("router", ["least_loaded", "round_robin", "random"])
def test_replicas_hold_spans_past_sends(shared_data, monkeypatch, router):
    """Eight replicas of the measured bundle behind a router: a unit plans its span past the
    sends the router gives to others and holds it unrun, priced further each time it reaches
    its wake untouched; a send that reaches it runs only the part before the send. The same
    result as step by step, and spans were held, extended and interrupted."""
    from profiles.bundle import load_bundle
    from profiles.latency import ProfiledLatencyModel

    bundle = load_bundle(shared_data / "llmservingsim" / "profiles", "RTXPRO6000", MODEL.name)
    cfg = EngineConfig(num_gpu_blocks_override=3000)
    specs = [InstanceSpec(f"i{k}", MODEL, HW, cfg, ProfiledLatencyModel(bundle, MODEL, 1),
                          kv_capacity(MODEL, HW, cfg)) for k in range(8)]
    reqs = _poisson_requests(seed=11, n=400, mean_gap_ns=20_000_000, max_prompt=700)
    kwargs = {"router": router}
    slow, us = _run(specs, reqs, kwargs, False, monkeypatch)
    fast, uf = _run(specs, reqs, kwargs, True, monkeypatch)
    _assert_same(slow, fast, us, uf)
    deferred = sum(u.num_deferred for u in uf)
    interrupted = sum(u.num_interrupted for u in uf)
    extended = sum(u.num_extended for u in uf)
    assert deferred > interrupted > 0, (deferred, interrupted)
    assert extended > 0, extended
