"""Engine invariants under stress: long randomized cluster simulations, checked on every poll.

Each example draws a topology (one instance, several behind a router, P/D disaggregation, a
data-parallel group, pipeline parallelism), the scheduler options (async / sync, full-ISL gate,
chunked prefill, long-prefill threshold, prefix caching, a CPU prefix-cache tier) and a tight
KV cache (a few blocks more than the largest request needs), and replays a few hundred bursty
requests with shared prefixes through ``engine.simulate.simulate_cluster`` with a synthetic
latency model. ``EngineUnit.poll`` and ``Scheduler.update_from_output`` are wrapped to assert,
while the simulation runs:

* block accounting: every pool's ``check_invariants`` against the live block tables (ref
  counts equal owners, free queue exact, prefix index consistent), every tier's invariants,
  ``max_num_seqs`` never exceeded;
* monotone clocks: a unit is never polled at an earlier time than before;
* every request finishes exactly once (on its final instance; P/D prefill hand-offs apart);

and afterwards: each request produced exactly its output length, its token times are
non-decreasing, the first token comes at or after arrival, it finishes at its last token,
the generated-token count of the step logs equals the sum of output lengths, and no block
leaked.
"""

from __future__ import annotations

import importlib
import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astra_bridge.memory import MemoryTier, TierKind
from engine import EngineConfig, RequestSpec
from engine.batch import BatchShape
from engine.deployment import InstanceSpec
from engine.instance import EngineUnit
from engine.kv_tiers import KVTierPool, chunk_tokens_for
from engine.memory import kv_capacity
from engine.scheduler import Scheduler
from engine.simulate import simulate_cluster
from engine.specs import HardwareSpec
from profiles.catalog import load_model
from profiles.parallel.dp_pad import VllmDpPad, pad_dp_group

simulate_mod = importlib.import_module("engine.simulate")  # `engine.simulate` is also a function

MODEL = load_model("meta-llama/Llama-3.1-8B")
HW = HardwareSpec("card", 96.0, 1000.0, 100.0, 200.0)
BS = 16
TOTALS = Counter()


class Flat:
    """1 ms + 10 us per token, with stage_ns for pipeline parallelism."""

    def __init__(self, pp: int = 1) -> None:
        self.pp = pp

    def iteration_ns(self, shape: BatchShape) -> int:
        return 1_000_000 + 10_000 * shape.total_tokens

    def stage_ns(self, shape: BatchShape) -> int:
        return self.iteration_ns(shape) // self.pp


def workload(rng: random.Random, n: int, max_len: int) -> list[RequestSpec]:
    prefixes = [tuple(range(10_000 * k, 10_000 * k + rng.randint(16, 300))) for k in range(4)]
    t = 0
    out = []
    for i in range(n):
        t += int(rng.expovariate(1.0) * rng.choice([50_000, 2_000_000, 20_000_000]))
        prefix = rng.choice([(), *prefixes])
        tail = tuple(range(1_000_000 + 1000 * i, 1_000_000 + 1000 * i + rng.randint(1, 200)))
        prompt = (prefix + tail)[: max_len - 2]
        olen = rng.randint(1, min(120, max_len - len(prompt)))
        out.append(RequestSpec(f"r{i}", t, prompt, olen))
    return out


@st.composite
def scenarios(draw):
    chunked = draw(st.booleans())
    caching = draw(st.booleans())
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)),
        topology=draw(st.sampled_from(["single", "router", "pd", "dp", "pp"])),
        router=draw(st.sampled_from(["round_robin", "least_loaded", "random", "prefix_aware"])),
        async_scheduling=draw(st.booleans()),
        reserve_full_isl=draw(st.booleans()),
        chunked=chunked,
        threshold=draw(st.sampled_from([0, 0, 32, 200])) if chunked else 0,
        caching=caching,
        cpu_tier=caching and draw(st.booleans()),
        max_num_seqs=draw(st.integers(1, 24)),
        budget=draw(st.sampled_from([32, 64, 256, 600])),
        slack_blocks=draw(st.integers(0, 40)),
        num_requests=draw(st.integers(150, 320)),
    )


class Watch:
    """Wraps the engine loop to check the invariants at every poll."""

    def __init__(self, tiers: list[KVTierPool]) -> None:
        self.tiers = tiers
        self.last_t: dict[int, int] = {}
        self.members: dict[int, object] = {}
        self.roles: dict[int, str] = {}
        self.finishes: Counter = Counter()
        self.polls = 0

    def install(self, monkeypatch) -> None:
        """Build the simulation's engine units and schedulers as checked subclasses (the
        compiled classes' methods cannot be patched in place; a Python subclass overrides
        them, the compiled code dispatching to it)."""
        watch = self

        class CheckedUnit(EngineUnit):
            def poll(self, t: int, horizon_ns: int | None = None, defer_ns: int | None = None):
                for m in self.members:
                    watch.members[id(m)] = m
                    watch.roles[id(m.scheduler)] = m.role
                prev = watch.last_t.get(id(self))
                assert prev is None or t >= prev, f"clock went back: {prev} -> {t}"
                watch.last_t[id(self)] = t
                out = super().poll(t, horizon_ns, defer_ns)
                assert out is None or out >= t
                watch.polls += 1
                for m in self.members:
                    kv = m.scheduler.kv
                    kv.pool.check_invariants(list(kv.block_tables().values()))
                    assert len(m.scheduler.running) <= m.scheduler.max_num_seqs
                for tier in watch.tiers:
                    tier.check_invariants()
                return out

        class CountedScheduler(Scheduler):
            def update_from_output(self, step, now_ns: int):
                done = super().update_from_output(step, now_ns)
                role = watch.roles.get(id(self), "colocated")
                for req in done:
                    watch.finishes[(req.index, role)] += 1
                return done

            def decode_span(self, span, times):  # requests also finish inside decode spans
                out = super().decode_span(span, times)
                role = watch.roles.get(id(self), "colocated")
                for _, req in out.finished:
                    watch.finishes[(req.index, role)] += 1
                return out

        monkeypatch.setattr(simulate_mod, "EngineUnit", CheckedUnit)
        monkeypatch.setattr(simulate_mod, "Scheduler", CountedScheduler)


def build(sc: dict, max_len: int, need_blocks: int):
    cfg = EngineConfig(
        max_num_seqs=sc["max_num_seqs"],
        max_num_batched_tokens=max(sc["budget"], sc["max_num_seqs"], 0 if sc["chunked"] else max_len),
        block_size=BS,
        enable_prefix_caching=sc["caching"],
        reserve_full_isl=sc["reserve_full_isl"],
        long_prefill_token_threshold=sc["threshold"],
        enable_chunked_prefill=sc["chunked"],
        max_model_len=max_len,
        num_gpu_blocks_override=need_blocks + sc["slack_blocks"],
        async_scheduling=sc["async_scheduling"],
        step_overhead_us=0.0,
    )
    topo = sc["topology"]
    pp = 2 if topo == "pp" else 1
    cfg = replace(cfg, pipeline_parallel_size=pp)
    tiers: list[KVTierPool] = []
    cap = kv_capacity(MODEL, HW, cfg)
    if sc["cpu_tier"]:
        bpt = cap.kv_bytes_per_token
        chunk = chunk_tokens_for(BS, 64)
        tiers.append(KVTierPool("cpu", MemoryTier(TierKind.HOST_DRAM, 256.0, 1000.0),
                                capacity_bytes=40 * chunk * bpt, chunk_tokens=chunk,
                                kv_bytes_per_token=bpt))

    def inst(name: str, **kw) -> InstanceSpec:
        return InstanceSpec(name, MODEL, HW, cfg, Flat(pp), cap, tiers=tiers, **kw)

    kwargs: dict = {"router": sc["router"], "seed": sc["seed"]}
    if topo in ("single", "pp"):
        instances = [inst("a")]
    elif topo == "router":
        instances = [inst(n) for n in ("a", "b", "c")]
    elif topo == "pd":
        instances = [inst("p0", role="prefill"), inst("p1", role="prefill"),
                     inst("d0", role="decode"), inst("d1", role="decode")]
        kwargs["kv_transfer_ns"] = lambda src, dst, tokens: 100_000 + 50 * tokens
    else:
        instances = [inst("dp0", dp_group="g"), inst("dp1", dp_group="g")]
        # the reference's rounds, or vLLM's with a CUDA-graph limit of 0, 64 or 128 tokens
        graph_max = sc["seed"] % 3 * 64
        kwargs["dp_pad"] = pad_dp_group if sc["seed"] % 2 else VllmDpPad(graph_max)
    return instances, kwargs, tiers


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(scenarios())
def test_long_random_simulations_keep_every_invariant(monkeypatch, sc):
    rng = random.Random(sc["seed"])
    max_len = rng.choice([512, 1024])
    reqs = workload(rng, sc["num_requests"], max_len)
    need = max(-(-(r.prompt_len + r.output_len) // BS) for r in reqs) + 1
    instances, kwargs, tiers = build(sc, max_len, need)
    watch = Watch(tiers)
    with monkeypatch.context() as mp:
        watch.install(mp)
        result = simulate_cluster(instances, reqs, **kwargs)

    frame = result.requests
    assert len(frame) == len(reqs) and frame.request_id.is_unique
    by_id = {r.request_id: r for r in reqs}
    for row in frame.itertuples(index=False):
        spec = by_id[row.request_id]
        times = list(row.token_times_ns)
        assert row.output_len == spec.output_len == len(times), row.request_id
        assert all(a <= b for a, b in zip(times, times[1:], strict=False)), row.request_id
        assert row.first_token_ns == times[0] >= row.arrival_ns == spec.arrival_ns
        assert row.first_scheduled_ns >= row.queued_ns >= row.arrival_ns  # picked up, then run
        assert row.finish_ns == times[-1]
        assert row.prefix_hit_tokens >= 0 and row.cached_tokens <= spec.prompt_len
    # exactly once: one final finish per request (a P/D prefill finish is a hand-off)
    final = Counter()
    for (idx, role), k in watch.finishes.items():
        if role != "prefill" or reqs[idx].output_len == 1:
            final[idx] += k
    assert final == Counter(range(len(reqs))), "some request finished zero or several times"
    # token accounting: tokens sampled in the step logs == tokens the requests produced
    gen = sum(sum(m.log.gen_tokens) for m in watch.members.values())
    assert gen == sum(r.output_len for r in reqs)
    # nothing leaked
    for m in watch.members.values():
        kv = m.scheduler.kv
        assert not kv.req_blocks and kv.pool.num_free == kv.pool.num_blocks - 1
    assert result.makespan_ns >= 0
    assert result.timeseries["kv_usage_pct"].between(0, 100).all()
    TOTALS["simulations"] += 1
    TOTALS["requests"] += len(reqs)
    TOTALS["polls_checked"] += watch.polls
    TOTALS["preemptions"] += result.num_preemptions


def test_stress_reached_preemption_and_many_checks():
    """Not vacuous: the tight KV caches did preempt, and invariants were checked often."""
    if not TOTALS["simulations"]:
        pytest.skip("runs only after the stress test in the same session")
    assert TOTALS["preemptions"] > 0 and TOTALS["polls_checked"] > 10_000, TOTALS
