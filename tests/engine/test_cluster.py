"""Multi-instance behaviour: routing, P/D disaggregation, DP lock-step, pipeline depth."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine import EngineConfig, RequestSpec
from engine.batch import BatchShape
from engine.deployment import Deployment, InstanceSpec
from engine.memory import kv_capacity
from engine.simulate import simulate, simulate_cluster, simulate_deployment
from engine.specs import ConfigError, HardwareSpec
from profiles.catalog import load_model

MODEL = load_model("meta-llama/Llama-3.1-8B")
HW = HardwareSpec("card", 96.0, 1000.0, 100.0, 200.0)
CFG = EngineConfig(step_overhead_us=0.0)


class Flat:
    """1 ms + 10 us per token per step."""

    def iteration_ns(self, shape: BatchShape) -> int:
        return 1_000_000 + 10_000 * shape.total_tokens

    def stage_ns(self, shape: BatchShape) -> int:
        return self.iteration_ns(shape)


class Staged(Flat):
    def __init__(self, pp: int) -> None:
        self.pp = pp

    def stage_ns(self, shape: BatchShape) -> int:
        return self.iteration_ns(shape) // self.pp


def reqs(n: int, gap_ns: int = 1_000_000, plen: int = 40, olen: int = 8) -> list[RequestSpec]:
    return [RequestSpec(f"r{i}", i * gap_ns, tuple(range(1000 * i, 1000 * i + plen)), olen) for i in range(n)]


def inst(name: str, **kw) -> InstanceSpec:
    config = kw.pop("config", CFG)
    cap = kv_capacity(MODEL, HW, config)
    return InstanceSpec(name, MODEL, HW, config, kw.pop("latency", Flat()), cap, **kw)


def test_single_instance_cluster_equals_simulate() -> None:
    w = reqs(20)
    a = simulate(MODEL, HW, CFG, w, Flat())
    b = simulate_cluster([inst("solo")], w)
    assert a.requests.drop(columns=["instance"]).equals(b.requests.drop(columns=["instance"]))
    assert a.makespan_ns == b.makespan_ns


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", "random", "prefix_aware"])
def test_two_instances_share_the_load(policy: str) -> None:
    w = reqs(40, gap_ns=100_000, olen=30)
    res = simulate_cluster([inst("a"), inst("b")], w, router=policy, seed=3)
    counts = res.requests.instance.value_counts()
    assert set(counts.index) == {"a", "b"}
    assert (res.requests.output_len == 30).all()
    one = simulate_cluster([inst("a")], w)
    # Two instances finish the same work sooner than one.
    assert res.makespan_ns < one.makespan_ns
    if policy == "round_robin":
        assert list(res.requests.instance[:4]) == ["a", "b", "a", "b"]


def test_prefix_aware_router_follows_the_cached_prefix() -> None:
    shared = tuple(range(5000, 5064))
    w = [RequestSpec(f"r{i}", i * 50_000_000, shared + (i,) * 4, 2) for i in range(6)]
    res = simulate_cluster([inst("a"), inst("b")], w, router="prefix_aware")
    # After the first request, every later one finds its 64-token prefix on the same instance.
    assert res.requests.instance.nunique() == 1
    assert (res.requests.prefix_hit_tokens[1:] == 64).all()


def test_pd_disaggregation_hands_off_after_first_token() -> None:
    w = reqs(10, gap_ns=5_000_000, plen=200, olen=12)
    transfer = []

    def kv_ns(src: str, dst: str, tokens: int) -> int:
        transfer.append((src, dst, tokens))
        return 2_000_000

    res = simulate_cluster(
        [inst("p", role="prefill"), inst("d", role="decode")], w, kv_transfer_ns=kv_ns
    )
    df = res.requests
    assert (df.instance == "d").all()
    assert all(t == ("p", "d", 200) for t in transfer) and len(transfer) == 10
    for times in df.token_times_ns:
        assert len(times) == 12
        # The first decode token comes after the 2 ms KV transfer.
        assert times[1] - times[0] >= 2_000_000
    colocated = simulate_cluster([inst("c")], w)
    # TTFT on the prefill instance is not slowed by decodes.
    assert (df.first_token_ns - df.arrival_ns).mean() <= (
        colocated.requests.first_token_ns - colocated.requests.arrival_ns
    ).mean()


def test_pd_needs_a_transfer_model_and_a_decode_instance() -> None:
    with pytest.raises(ConfigError, match="KV transfer model"):
        simulate_cluster([inst("p", role="prefill"), inst("d", role="decode")], reqs(2))
    with pytest.raises(ConfigError, match="decode instance"):
        simulate_cluster([inst("p", role="prefill")], reqs(2), kv_transfer_ns=lambda *a: 0)


def test_dp_group_steps_in_lock_step() -> None:
    w = reqs(30, gap_ns=200_000, olen=20)
    seen: list[list[BatchShape | None]] = []

    def pad(shapes):
        seen.append(list(shapes))
        m = max(s.total_tokens for s in shapes if s is not None)
        dummy = BatchShape(m, 1, 0, 0, 1, 1, 1, 1)
        return [dummy if s is None else s._replace(total_tokens=m) for s in shapes]

    res = simulate_cluster(
        [inst("dp0", dp_group="A"), inst("dp1", dp_group="A")], w, router="round_robin", dp_pad=pad
    )
    assert set(res.requests.instance) == {"dp0", "dp1"}
    assert seen and all(len(s) == 2 for s in seen)
    # Lock-step: every launch priced both members together (idle ones as None).
    assert any(None in s for s in seen) or all(None not in s for s in seen)
    assert (res.requests.output_len == 20).all()


def test_dp_group_members_must_share_the_engine_config() -> None:
    other = replace(CFG, max_num_seqs=CFG.max_num_seqs // 2)
    with pytest.raises(ConfigError, match="dp_group 'A': members must agree.*max_num_seqs"):
        simulate_cluster([inst("dp0", dp_group="A"), inst("dp1", dp_group="A", config=other)],
                         reqs(2))


def test_pipeline_parallel_keeps_several_batches_in_flight() -> None:
    # A small token budget spreads the requests over several batches (vLLM V1 never puts a
    # request in two in-flight batches), which the pipeline then overlaps.
    w = reqs(16, gap_ns=0, olen=16)
    cfg = replace(CFG, async_scheduling=False, max_num_batched_tokens=64, max_num_seqs=16)
    pp1 = simulate_cluster([inst("a", latency=Staged(1), config=cfg)], w)
    pp4 = simulate_cluster(
        [inst("a", latency=Staged(4), config=replace(cfg, pipeline_parallel_size=4))], w
    )
    assert (pp4.requests.output_len == 16).all()
    # Same per-batch latency, but batches overlap in the pipeline.
    assert pp4.makespan_ns < pp1.makespan_ns


def test_instance_capacity_must_match_its_block_size() -> None:
    cap = kv_capacity(MODEL, HW, replace(CFG, block_size=32))
    with pytest.raises(ConfigError, match="blocks of 32 tokens but block_size=16"):
        InstanceSpec("a", MODEL, HW, CFG, Flat(), cap)
    with pytest.raises(ConfigError, match="role='standby'"):
        InstanceSpec("a", MODEL, HW, CFG, Flat(), kv_capacity(MODEL, HW, CFG), role="standby")


def test_the_engine_uses_the_capacity_it_is_handed() -> None:
    small = replace(kv_capacity(MODEL, HW, CFG), num_blocks=9)  # 8 usable blocks of 16 tokens
    w = reqs(6, gap_ns=0, plen=40, olen=30)
    res = simulate_cluster([InstanceSpec("a", MODEL, HW, CFG, Flat(), small)], w)
    assert res.kv_capacity is small
    assert res.num_preemptions > 0  # six 70-token requests cannot all stay in 128 tokens
    assert simulate_cluster([inst("a")], w).num_preemptions == 0


def test_simulate_deployment_runs_its_router_transfer_and_padding() -> None:
    w = reqs(8, gap_ns=100_000, olen=4)
    dep = Deployment([inst("a"), inst("b")], router="round_robin")
    res = simulate_deployment(dep, w)
    assert list(res.requests.instance[:4]) == ["a", "b", "a", "b"]
    pd = Deployment([inst("p", role="prefill"), inst("d", role="decode")],
                    kv_transfer_ns=lambda src, dst, n: 1_000_000)
    assert (simulate_deployment(pd, w).requests.instance == "d").all()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_queued_time_is_the_engine_loops_pickup(async_scheduling: bool) -> None:
    """vLLM stamps ``queued_ts`` when its busy loop drains the input queue, right before it
    schedules: the arrival itself for an idle engine, else the end of the running step."""
    cfg = replace(CFG, async_scheduling=async_scheduling, max_num_seqs=1)
    w = [RequestSpec("a", 0, tuple(range(40)), 4), RequestSpec("b", 500_000, tuple(range(50, 90)), 4)]
    res = simulate_cluster([inst("solo", config=cfg)], w).requests.set_index("request_id")
    step0 = 1_000_000 + 10_000 * 40  # a's prefill occupies the engine until 1.4 ms
    assert res.loc["a", "queued_ns"] == 0
    assert res.loc["b", "queued_ns"] == step0
    # picked up at once, admitted only when a's seat frees (max_num_seqs = 1)
    assert res.loc["b", "first_scheduled_ns"] >= res.loc["a", "finish_ns"] > step0
