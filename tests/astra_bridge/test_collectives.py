"""Analytical collective model: hand-worked values, error cases, groups, memoisation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from astra_bridge import NetworkModel, SystemConfig, Topology, UnsupportedCollective
from astra_bridge.collectives import (
    collective_time,
    p2p_ns,
    parse_collective,
    phase_ns,
    plan_phases,
    reduction_ns,
    route,
    split_chunks,
    time_on,
)
from astra_bridge.topology import Dimension, DimKind
from engine.specs import ConfigError, HardwareSpec

SYS768 = SystemConfig(local_mem_bw_gbps=768)


def topo(kind: str, n: int, bw: float = 50, lat: float = 500) -> Topology:
    return Topology((Dimension(DimKind.parse(kind), n, bw, lat),))


def beta(bw: float) -> float:
    return bw * 2**30 / 1e9


def test_ring_all_reduce_two_npus_by_hand() -> None:
    # D(1, 512) = floor(500 + 512/beta(50)) = 509; 2*509 + 3*E + P(512) with P = 3*floor(0.67) = 0
    d = math.floor(500 + 512 / beta(50))
    assert d == 509
    assert collective_time("all-reduce", 1024, topo("Ring", 2), SYS768).ns == 2 * d + 30


def test_reference_tp2_all_reduce_of_one_token() -> None:
    # docs/reference-semantics.md §8: Qwen3-32B TP=2, FullyConnected [2], 16 GB/s, 20 us,
    # local-mem-bw 1597: 40,635 ns per all-reduce of 10,240 B.
    nm = NetworkModel.from_params(
        2, intra_bandwidth_gbps=16, intra_latency_ns=20000, local_mem_bw_gbps=1597
    )
    assert nm.collective_ns("ALLREDUCE", 10240) == 40635
    # the two large points are averages over 128 all-reduces: within a nanosecond
    assert abs(nm.collective_ns("ALLREDUCE", 14_755_840) - 912_789.3) < 1
    assert abs(nm.collective_ns("ALLREDUCE", 20_971_520) - 1_280_427.5) < 1


def test_two_dimensional_all_reduce_phases_match_the_documented_example() -> None:
    t = Topology.from_lists(["Switch", "Switch"], [4, 2], [400, 50], [100, 500])
    phases = plan_phases("all-reduce", 16 * 2**20, t, SYS768, [0, 1])
    assert [(p.dim, p.op, p.nbytes, p.ns) for p in phases] == [
        (0, "reduce-scatter", 16 * 2**20, 79_084),
        (1, "all-reduce", 4 * 2**20, 88_344),
        (0, "all-gather", 4 * 2**20, 29_935),
    ]
    assert collective_time("all-reduce", 16 * 2**20, t, SYS768).ns == 197_363


def test_baseline_all_reduce_runs_full_size_on_every_dimension() -> None:
    t = Topology.from_lists(["Switch", "Switch"], [4, 2], [400, 50], [100, 500])
    base = SystemConfig(local_mem_bw_gbps=768, collective_optimization="baseline")
    expected = sum(phase_ns("all-reduce", "ring", d, 2**20, base) for d in t.dims)
    assert collective_time("all-reduce", 2**20, t, base).ns == expected


def test_all_gather_runs_dimensions_last_first_and_grows() -> None:
    t = Topology.from_lists(["Switch", "Switch"], [4, 2], [400, 50], [100, 500])
    phases = plan_phases("all-gather", 1000, t, SYS768, [0, 1])
    assert [(p.dim, p.nbytes) for p in phases] == [(1, 1000), (0, 2000)]


def test_reduction_charge_is_three_truncated_passes() -> None:
    assert reduction_ns(768_000, 768) == 3000
    assert reduction_ns(1000, 768) == 3  # floor(1.30) = 1 per pass


def test_chunk_rule_minimum_and_count() -> None:
    assert split_chunks("all-reduce", 2**20, 8, 3) == (2**20 // 3, 4)
    assert split_chunks("all-reduce", 8, 16, 3) == (16, 3)  # bumped to one byte per NPU
    assert split_chunks("all-gather", 8, 16, 3) == (2, 4)  # all-gather is never bumped
    with pytest.raises(UnsupportedCollective, match="dataset-splits"):
        split_chunks("all-gather", 2, 16, 3)


@settings(max_examples=60, deadline=None)
@given(
    nbytes=st.integers(64, 1 << 26),
    splits=st.sampled_from([1, 2, 3, 4, 8]),
    active=st.sampled_from([1, 2, 4, 8]),
    algo=st.sampled_from(["ring", "direct", "halvingDoubling"]),
)
def test_single_dimension_chunks_run_in_rounds_of_active(
    nbytes: int, splits: int, active: int, algo: str
) -> None:
    t = topo("Switch", 8)
    system = SystemConfig(
        local_mem_bw_gbps=768, active_chunks=active, dataset_splits=splits
    ).with_algorithms(algo)
    chunk, n_chunks = split_chunks("reduce-scatter", nbytes, 8, splits)
    t1 = phase_ns("reduce-scatter", algo, t.dims[0], chunk, system)
    got = collective_time("reduce-scatter", nbytes, t, system).ns
    assert got == -(-n_chunks // active) * t1


@settings(max_examples=60, deadline=None)
@given(
    a=st.integers(1, 1 << 28),
    b=st.integers(1, 1 << 28),
    op=st.sampled_from(["all-reduce", "all-gather", "reduce-scatter", "all-to-all"]),
    kind=st.sampled_from(["Ring", "Switch", "FullyConnected"]),
)
def test_one_chunk_time_never_decreases_with_size(a: int, b: int, op: str, kind: str) -> None:
    lo, hi = sorted((a, b))
    t = topo(kind, 8)
    assert collective_time(op, lo, t, SYS768).ns <= collective_time(op, hi, t, SYS768).ns


def test_double_binary_tree_ignores_the_collective_type() -> None:
    system = SYS768.with_algorithms("doubleBinaryTree")
    t = topo("Ring", 8)
    times = {
        op: collective_time(op, 2**20, t, system)
        for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
    }
    assert len(set(times.values())) == 1
    ct = times["all-reduce"]
    assert ct.min_ns < ct.ns  # the root finishes before the leaves


def test_halving_doubling_rejections_say_why() -> None:
    hd = SYS768.with_algorithms("halvingDoubling")
    with pytest.raises(UnsupportedCollective, match="no all-to-all"):
        collective_time("all-to-all", 2**20, topo("Switch", 8), hd)
    with pytest.raises(UnsupportedCollective, match="at least 32 bytes"):
        collective_time("all-reduce", 24, topo("Switch", 16), hd)
    with pytest.raises(UnsupportedCollective, match="power-of-two"):
        collective_time("all-reduce", 2**20, topo("Switch", 6), hd)
    with pytest.raises(UnsupportedCollective, match="power-of-two"):
        collective_time(
            "all-reduce", 2**20, topo("Switch", 6), SYS768.with_algorithms("doubleBinaryTree")
        )
    assert issubclass(UnsupportedCollective, ConfigError)


def test_ring_and_direct_work_on_non_power_of_two() -> None:
    for algo in ("ring", "direct"):
        assert (
            collective_time("all-reduce", 2**20, topo("Ring", 6), SYS768.with_algorithms(algo)).ns
            > 0
        )


def test_trivial_collectives_cost_nothing() -> None:
    assert collective_time("all-reduce", 0, topo("Switch", 8), SYS768).ns == 0
    assert collective_time("all-reduce", 2**20, topo("Switch", 1), SYS768).ns == 0
    with pytest.raises(ConfigError, match="non-negative"):
        collective_time("all-reduce", -1, topo("Switch", 8), SYS768)


def test_collective_names() -> None:
    assert parse_collective("ALLREDUCE") == "all-reduce"
    assert parse_collective("reduce_scatter") == "reduce-scatter"
    assert parse_collective("AllToAll") == "all-to-all"
    with pytest.raises(ConfigError, match="unknown"):
        parse_collective("broadcast")


def test_p2p_is_charged_on_the_lowest_differing_dimension() -> None:
    t = Topology.from_lists(["Ring", "Switch"], [4, 4], [400, 50], [100, 500])
    # 0 -> 1: dim 0, 1 hop; 0 -> 2: dim 0, 2 hops; 0 -> 4: dim 1 (2 hops on the switch);
    # 0 -> 15 differs in both: charged on dim 0 only (distance 3 on a 4-ring = 1 hop)
    m = 2**20
    assert p2p_ns(m, 0, 1, t) == math.floor(100 + m / beta(400))
    assert p2p_ns(m, 0, 2, t) == math.floor(200 + m / beta(400))
    assert p2p_ns(m, 0, 4, t) == math.floor(1000 + m / beta(50))
    assert p2p_ns(m, 0, 15, t) == p2p_ns(m, 0, 1, t)
    assert p2p_ns(m, 3, 3, t) == 0
    with pytest.raises(ConfigError, match="outside"):
        p2p_ns(m, 0, 16, t)


def test_groups_select_whole_dimensions() -> None:
    nm = NetworkModel.from_params(
        4,
        2,
        intra_bandwidth_gbps=400,
        intra_latency_ns=100,
        inter_bandwidth_gbps=50,
        inter_latency_ns=500,
        intra_kind="Switch",
        local_mem_bw_gbps=768,
    )
    single = NetworkModel.from_params(
        4,
        intra_bandwidth_gbps=400,
        intra_latency_ns=100,
        intra_kind="Switch",
        local_mem_bw_gbps=768,
    )
    assert nm.involved_dims(4) == (True, False)
    assert nm.involved_dims([0, 1, 2, 3]) == (True, False)
    assert nm.involved_dims([1, 5]) == (False, True)
    assert nm.involved_dims(None) == nm.involved_dims(8) == (True, True)
    assert nm.collective_ns("all-reduce", 2**20, 4) == single.collective_ns("all-reduce", 2**20)
    assert nm.collective_ns("all-reduce", 2**20, involved_dims=[True, False]) == (
        single.collective_ns("all-reduce", 2**20)
    )
    inter = NetworkModel(topo("Switch", 2, 50, 500), SYS768)
    assert nm.collective_ns("all-reduce", 2**20, [0, 4]) == inter.collective_ns("all-reduce", 2**20)
    with pytest.raises(UnsupportedCollective, match="sub-grid"):
        nm.collective_ns("all-reduce", 2**20, [0, 1, 4])
    with pytest.raises(UnsupportedCollective, match="leading dimension"):
        nm.collective_ns("all-reduce", 2**20, 2)
    with pytest.raises(ConfigError, match="either"):
        nm.collective_ns("all-reduce", 2**20, 4, involved_dims=[True, False])


def test_algorithm_override_equals_configured_algorithm() -> None:
    nm = NetworkModel(topo("Ring", 8), SYS768)
    direct = NetworkModel(topo("Ring", 8), SYS768.with_algorithms("direct"))
    assert nm.collective_ns("all-reduce", 2**20, algorithm="direct") == direct.collective_ns(
        "all-reduce", 2**20
    )
    assert nm.collective_ns("all-reduce", 2**20, algorithm="direct") != nm.collective_ns(
        "all-reduce", 2**20
    )


def test_results_are_memoised_by_shape() -> None:
    t = topo("Switch", 16, 123, 45)
    time_on.cache_clear()
    before = time_on.cache_info()
    first = collective_time("all-gather", 777_777, t, SYS768)
    again = collective_time(
        "all-gather", 777_777, Topology(t.dims), SystemConfig(local_mem_bw_gbps=768)
    )
    # A network model over equal inputs shares the memo (the same route object).
    model = NetworkModel(Topology(t.dims), SystemConfig(local_mem_bw_gbps=768))
    third = model.collective_time("ALLGATHER", 777_777)
    after = time_on.cache_info()
    assert first == again == third
    assert after.misses == before.misses + 1
    assert after.hits == before.hits + 2
    assert route("all-gather", t, SYS768, (True,)) is route(
        "all-gather", Topology(t.dims), SystemConfig(local_mem_bw_gbps=768), (True,))


_CALL = st.tuples(
    st.sampled_from(["all-reduce", "ALLGATHER", "reduce_scatter", "all-to-all"]),
    st.integers(0, 2**26),
    st.sampled_from([(True, True), (True, False), (False, True), (False, False)]),
    st.sampled_from([None, "ring", "direct", ("ring", "direct"), ["direct", "ring"]]),
)


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(_CALL, min_size=1, max_size=12), chunks=st.integers(1, 3),
       splits=st.sampled_from([1, 2, 5]))
def test_network_model_prices_as_the_module(
    calls: list[tuple[str, int, tuple[bool, bool], object]], chunks: int, splits: int,
) -> None:
    # One model takes every call: its route cache must tell apart collectives, flags and
    # algorithms (a key that drops one returns another call's time).
    t = Topology((Dimension(DimKind.RING, 4, 50.0, 500.0),
                  Dimension(DimKind.SWITCH, 2, 25.0, 700.0)))
    base = SystemConfig(local_mem_bw_gbps=768, active_chunks=chunks, dataset_splits=splits)
    model = NetworkModel(t, base)
    for op, nbytes, flags, algorithm in calls:
        system = base if algorithm is None else base.with_algorithms(algorithm)
        try:
            want = collective_time(op, nbytes, t, system, flags)
        except UnsupportedCollective as exc:
            with pytest.raises(UnsupportedCollective, match=str(exc)[:40]):
                model.collective_time(op, nbytes, involved_dims=list(flags),
                                      algorithm=algorithm)
            continue
        assert model.collective_time(op, nbytes, involved_dims=list(flags),
                                     algorithm=algorithm) == want
        assert model.collective_time(op, nbytes, involved_dims=flags,
                                     algorithm=algorithm) == want


def test_network_model_checks_in_the_module_order() -> None:
    model = NetworkModel(topo("Ring", 4), SYS768)
    with pytest.raises(ConfigError, match="unknown 'broadcast'"):
        model.collective_ns("broadcast", -1, involved_dims=(True, True))
    with pytest.raises(ConfigError, match="collective bytes"):
        model.collective_ns("all-reduce", -1, involved_dims=(True, True))
    with pytest.raises(ConfigError, match="2 flags for a 1-dimension"):
        model.collective_ns("all-reduce", 8, involved_dims=(True, True))
    with pytest.raises(ConfigError, match="unknown collective algorithm 'nope'"):
        model.collective_ns("broadcast", -1, algorithm="nope")  # the algorithm first
    assert model.collective_ns("all-reduce", 1024) > 0
    # An algorithm list given as an iterator is read once.
    assert model.collective_ns("all-reduce", 4096, algorithm=iter(["direct"])) == \
        model.collective_ns("all-reduce", 4096, algorithm="direct")
    # A route already resolved still checks the bytes of every call.
    with pytest.raises(ConfigError, match="collective bytes"):
        model.collective_ns("all-reduce", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="collective bytes"):
        model.collective_ns("all-reduce", True)  # type: ignore[arg-type]


def test_for_hardware_uses_interconnect_and_hbm() -> None:
    hw = HardwareSpec(
        "X", 80, 1597, 100, 200, interconnect_bw_gbs=16, interconnect_latency_ns=20000
    )
    nm = NetworkModel.for_hardware(hw, 2)
    assert nm.collective_ns("all-reduce", 10240) == 40635
    with pytest.raises(ConfigError, match="interconnect_bw_gbs"):
        NetworkModel.for_hardware(HardwareSpec("Y", 80, 1597, 100, 200), 2)
