"""profiles.parallel: layout rules, DP padding, composition of compute and communication, the
P/D hand-off."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from astra_bridge import Network, NetworkModel
from engine.batch import BatchShape, decode_advanced
from engine.specs import ConfigError, ModelSpec
from profiles.architecture import load_architecture
from profiles.parallel.dp_pad import (
    VllmDpPad,
    cudagraph_max_tokens,
    dp_pad_for,
    dummy_batch,
    pad_dp_group,
)
from profiles.parallel.latency import ParallelLatencyModel
from profiles.parallel.layout import ParallelLayout, build_network, layout_for_instance
from profiles.parallel.pd_transfer import ClusterKvTransfer, KvHandoff, pd_handoff

DENSE = ModelSpec(name="dense", model_type="qwen3", num_layers=8, hidden_size=512,
                  num_attention_heads=8, num_kv_heads=2, head_dim=64, intermediate_size=1024,
                  vocab_size=1000, max_position_embeddings=4096)
MOE = ModelSpec(name="moe", model_type="qwen3_moe", num_layers=6, hidden_size=256,
                num_attention_heads=8, num_kv_heads=2, head_dim=32, intermediate_size=512,
                vocab_size=1000, max_position_embeddings=4096, num_experts=16,
                num_experts_per_tok=4, moe_intermediate_size=128)


class FakeCompute:
    """Per-rank compute with a per-row breakdown: every block row costs ``row`` ns per token,
    attention 10 ns per decode + 1 ns per prefill token, MoE 50 ns per token, lm_head 100 ns per
    sequence."""

    def __init__(self, model: ModelSpec, row: int = 3) -> None:
        self.model = model
        self.arch = load_architecture(model.model_type)
        self.row = row
        self.calls = 0

    def breakdown(self, s: BatchShape) -> dict[str, int]:
        L, T = self.model.num_layers, max(s.total_tokens, 1)
        out: dict[str, int] = {}
        for name in self.arch.block:
            if name == "attention":
                out[name] = L * (10 * s.num_decode + s.prefill_tokens + 1)
            elif name == "moe":
                out[name] = L * 50 * max(s.moe_tokens or s.total_tokens, 1)
            else:
                out[name] = out.get(name, 0) + L * self.row * T
        out["embedding"] = 7 * T
        out["final_layernorm"] = 5 * T
        out["lm_head"] = 100 * max(s.num_seqs, 1)
        out["sampler"] = 9
        return out

    def iteration_ns(self, s: BatchShape) -> int:
        self.calls += 1
        return sum(self.breakdown(s).values())


def net(layout: ParallelLayout) -> Network:
    return build_network(layout, 16, 20000, 1597)


def parallel(model: ModelSpec, layout: ParallelLayout, **kw) -> ParallelLatencyModel:
    return ParallelLatencyModel(FakeCompute(model), model, layout, net(layout), **kw)


def decode(n: int, kv: int = 100) -> BatchShape:
    return BatchShape(n, n, 0, 0, n, n * kv, kv, kv)


# ------------------------------------------------------------------------------------ layout


@pytest.mark.parametrize(
    ("layers", "pp", "expected"),
    [(32, 1, (32,)), (32, 2, (16, 16)), (32, 3, (11, 11, 10)), (64, 4, (16, 16, 16, 16)),
     (10, 4, (2, 3, 3, 2)), (7, 4, (2, 2, 2, 1)), (5, 5, (1, 1, 1, 1, 1)), (7, 1, (7,))],
)
def test_stage_split_follows_vllm(layers: int, pp: int, expected: tuple) -> None:
    # vLLM get_pp_indices: L // pp each, the remainder +1 to the stages before the last
    assert ParallelLayout(pp=pp).stage_layers(layers) == expected


@pytest.mark.parametrize(
    ("layout", "dims", "tp_flags", "ep_flags"),
    [
        (ParallelLayout(tp=2), (2,), (True,), (True,)),
        (ParallelLayout(pp=4), (4,), (True,), (True,)),
        (ParallelLayout(tp=2, pp=2), (2, 2), (True, False), (True, False)),
        (ParallelLayout(tp=1, ep=2, dp=2), (1, 2), (True, False), (False, True)),
        (ParallelLayout(tp=2, ep=2, dp=2), (2, 2), (True, False), (True, False)),
        (ParallelLayout(tp=2, ep=4, dp=2), (2, 2), (True, False), (True, True)),
        (ParallelLayout(tp=2, pp=2, ep=4, dp=2), (2, 2, 2), (True, False, False),
         (True, False, True)),
        (ParallelLayout(tp=1, pp=2, ep=2, dp=2), (1, 2, 2), (True, False, False),
         (False, False, True)),
    ],
)
def test_topology_and_collective_scopes_as_reference(layout, dims, tp_flags, ep_flags) -> None:
    assert layout.dim_sizes() == dims
    assert layout.tp_flags() == tp_flags
    assert layout.ep_flags() == ep_flags


@pytest.mark.parametrize(
    ("model", "layout", "field"),
    [
        (DENSE, ParallelLayout(ep=2), "ep = 2"),
        (DENSE, ParallelLayout(pp=9), "pp = 9"),
        (MOE, ParallelLayout(tp=2, ep=3), "ep = 3"),
        (MOE, ParallelLayout(tp=1, ep=4, dp=2), "ep = 4"),
    ],
)
def test_bad_layout_is_config_error_naming_field(model, layout, field) -> None:
    with pytest.raises(ConfigError, match=field):
        layout.check(model)


def test_bad_degree_and_mismatched_network_rejected() -> None:
    with pytest.raises(ConfigError, match="tp"):
        ParallelLayout(tp=0)
    with pytest.raises(ConfigError, match="network"):
        ParallelLatencyModel(FakeCompute(DENSE), DENSE, ParallelLayout(tp=2),
                             net(ParallelLayout(tp=4)))
    with pytest.raises(ConfigError, match="link_bw"):
        build_network(ParallelLayout(tp=2), [], 1, 1)


# ------------------------------------------------------------------------------------ DP padding


def test_pad_dp_group_pads_dense_rows_not_attention() -> None:
    a = BatchShape(40, 3, 38, 5, 2, 300, 100, 200)
    b = decode(4)
    pa, pb, pc = pad_dp_group([a, b, None])
    assert pa == a
    assert pb == b._replace(total_tokens=40, num_seqs=40)
    assert (pb.num_decode, pb.decode_kv_sum) == (4, 400)  # attention sees the real decodes only
    assert pc == dummy_batch()._replace(total_tokens=40, num_seqs=40)
    assert dummy_batch() == BatchShape(1, 1, 0, 0, 1, 1, 1, 1)


def test_pad_dp_group_idle_and_empty() -> None:
    assert pad_dp_group([None, None]) == []
    assert pad_dp_group([None, decode(1)]) == [dummy_batch(), decode(1)]
    with pytest.raises(ConfigError, match="pad_dp_group"):
        pad_dp_group([])


def test_cudagraph_max_tokens_is_vllm_default() -> None:
    assert cudagraph_max_tokens(128, 2048) == 256
    assert cudagraph_max_tokens(512, 8192) == 512
    assert cudagraph_max_tokens(128, 100) == 100


def test_vllm_dp_pad_pads_only_when_every_batch_is_a_cuda_graph() -> None:
    pad = VllmDpPad(256)
    a, b = decode(100), decode(30)
    pa, pb = pad([a, b])
    assert pa == a._replace(moe_tokens=200)
    # the pad runs through the layers but is never sampled: num_seqs stays the real count
    assert pb == b._replace(total_tokens=100, moe_tokens=200)
    assert (pb.num_decode, pb.decode_kv_sum) == (30, 3000)  # attention sees the real decodes
    big = BatchShape(2048, 1, 2048, 0, 0, 0, 0, 0)  # eager in vLLM: no DP padding at all
    pbig, pb = pad([big, b])
    assert pbig == big._replace(moe_tokens=2078)
    assert pb == b._replace(moe_tokens=2078)
    # an idle member runs vLLM's one-token dummy batch, then pads like any member
    assert pad([None, b]) == [dummy_batch()._replace(total_tokens=30, moe_tokens=60),
                              b._replace(moe_tokens=60)]


def test_vllm_dp_pad_idle_empty_and_bad_limit() -> None:
    pad = VllmDpPad(256)
    assert pad([None, None]) == []
    assert pad([decode(3)]) == [decode(3)]  # a group of one gathers nothing
    with pytest.raises(ConfigError, match="empty group"):
        pad([])
    with pytest.raises(ConfigError, match="cudagraph_max"):
        VllmDpPad(-1)
    assert VllmDpPad(0)([decode(3), decode(1)])[1] == decode(1)._replace(moe_tokens=4)


_batches = st.builds(
    lambda n, p, c0, spread: BatchShape(n + p, n + (p > 0), p, 3 * p, n, n * c0 + spread * (n > 1),
                                        c0, c0 + spread * (n > 1)),
    st.integers(1, 300), st.sampled_from([0, 0, 17, 900]), st.integers(1, 4000),
    st.integers(0, 50))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), _batches), min_size=1, max_size=4),
       st.integers(0, 200), st.sampled_from([0, 64, 256, 512]), st.booleans())
def test_dp_pads_commute_with_decode_advance(batches, k, graph_max, reference) -> None:
    """engine.deployment.DpPad's contract, on which the engine's DP spans rely: padding
    step k of a decode run is padding its step 0 and advancing each busy member's batch k
    tokens (the pad reads token and sequence counts only, never the decode fields)."""
    pad = pad_dp_group if reference else VllmDpPad(graph_max)
    later = [None if b is None else decode_advanced(b, k) for b in batches]
    expected = [p if b is None else decode_advanced(p, k)
                for b, p in zip(batches, pad(batches), strict=False)]
    assert pad(later) == expected


def test_gathered_moe_tokens_priced_only_when_ep_spans_the_group() -> None:
    s = decode(40)
    g = s._replace(moe_tokens=80)
    L = MOE.num_layers
    spans = parallel(MOE, ParallelLayout(tp=1, ep=2, dp=2))
    assert spans.iteration_ns(g) - spans.iteration_ns(s) == L * 50 * 40
    assert spans.breakdown(g)["moe"] == L * 50 * 80
    inside = parallel(MOE, ParallelLayout(tp=2, ep=2, dp=2))  # EP stays inside each instance
    assert inside.iteration_ns(g) == inside.iteration_ns(s)
    dense = parallel(DENSE, ParallelLayout(tp=2, dp=2))
    assert dense.iteration_ns(g) == dense.iteration_ns(s)
    # the EP-coupled member times see the gathered tokens too
    a, b = spans.dp_member_ns([g, g])
    assert a == b == spans.iteration_ns(g)


# ------------------------------------------------------------------------------------ composition


def test_tp1_is_compute_plus_host_io_only() -> None:
    m = parallel(DENSE, ParallelLayout())
    s = decode(100)
    io = 2 * (100 * 2 * 2 // 256)
    assert m.iteration_ns(s) == m.compute.iteration_ns(s) + io
    assert m.stage_ns(s) == m.iteration_ns(s)
    assert m.block_comm_ns(100) == 0


def test_tp2_dense_two_allreduces_per_block_of_full_output() -> None:
    layout = ParallelLayout(tp=2)
    m = parallel(DENSE, layout)
    s = decode(64)
    ar = net(layout).collective_ns("all-reduce", 64 * DENSE.hidden_size * 2, 2)
    assert m.tp_allreduce_ns(64) == ar
    io = 3 * (64 * 4 // 256)  # three host passes with two loading ranks
    assert m.iteration_ns(s) == m.compute.iteration_ns(s) + DENSE.num_layers * 2 * ar + io
    bd = m.breakdown(s)
    assert sum(bd.values()) == m.iteration_ns(s)
    assert bd["tp_allreduce"] == DENSE.num_layers * 2 * ar


def test_moe_one_allreduce_plus_ep_collectives() -> None:
    layout = ParallelLayout(tp=2, ep=2)
    m = parallel(MOE, layout)
    n = net(layout)
    T = 10
    ar = n.collective_ns("all-reduce", T * 256 * 2, 2)
    ag = n.collective_ns("all-gather", (T // 2) * (256 + 16) * 2, 2)
    rs = n.collective_ns("reduce-scatter", T * 256 * 2, 2)
    assert m.block_comm_ns(T) == ar + ag + rs
    # all-gather of at least one token
    assert m.ep_collectives_ns(1) == (n.collective_ns("all-gather", (256 + 16) * 2, 2)
                                      + n.collective_ns("reduce-scatter", 256 * 2, 2))


def test_pipeline_stages_sum_to_iteration_and_busiest_stage() -> None:
    layout = ParallelLayout(tp=2, pp=3)
    m = parallel(DENSE, layout)
    s = BatchShape(300, 5, 296, 0, 4, 400, 100, 100)
    st = m.stage_times(s)
    assert len(st) == 3
    assert sum(st) == m.iteration_ns(s)
    assert m.stage_ns(s) == max(st)
    send = net(layout).p2p_ns(300 * DENSE.hidden_size * 2, 0, 2)
    assert m.pp_send_ns(300) == send
    flat = parallel(DENSE, ParallelLayout(tp=2))
    assert m.iteration_ns(s) == flat.iteration_ns(s) + 2 * send
    # stage 0: 3 blocks + embedding + host I/O + send; last: 2 blocks + head
    bd = m.compute.breakdown(s)
    block = (m.compute.iteration_ns(s) - bd["embedding"] - bd["final_layernorm"]
             - bd["lm_head"] - bd["sampler"]) // DENSE.num_layers + 2 * m.tp_allreduce_ns(300)
    assert st[2] == 2 * block + bd["final_layernorm"] + bd["lm_head"] + bd["sampler"]
    assert st[0] == 3 * block + bd["embedding"] + m.host_io_ns(300) + send


def test_memoised_on_shape() -> None:
    m = parallel(DENSE, ParallelLayout(tp=2))
    s = decode(7)
    first = m.iteration_ns(s)
    calls = m.compute.calls
    assert m.iteration_ns(s) == first and m.compute.calls == calls
    assert m.cache_info() == 1
    m.clear_cache()
    assert m.cache_info() == 0


# ------------------------------------------------------------------------------------ DP groups


def test_dp_members_independent_without_cross_instance_ep() -> None:
    m = parallel(DENSE, ParallelLayout(tp=2, dp=2))
    shapes = pad_dp_group([decode(5), None])
    assert m.dp_member_ns(shapes) == [m.iteration_ns(s) for s in shapes]
    assert m.dp_group_ns(shapes) == max(m.iteration_ns(s) for s in shapes)


def test_dp_ep_group_synchronises_each_moe_block() -> None:
    layout = ParallelLayout(tp=1, ep=2, dp=2)
    m = parallel(MOE, layout)
    prefill = BatchShape(40, 1, 40, 0, 0, 0, 0, 0)  # attention 41 ns/layer, lm_head x1
    padded = decode(1)._replace(total_tokens=40, num_seqs=40)  # attention 11 ns/layer, x40
    a, b = m.dp_member_ns([prefill, padded])
    L = MOE.num_layers
    # the prefill's attention paces every block of both members; each runs its own head
    assert a == m.iteration_ns(prefill)
    assert b == m.iteration_ns(padded) + L * (41 - 11)
    assert m.dp_group_ns([prefill, padded]) == max(a, b) == b
    with pytest.raises(ConfigError, match="pad"):
        m.dp_member_ns([prefill, decode(1)])


# ------------------------------------------------------------------------------------ P/D


def _handoff(kv_dtype: str = "auto", tp: int = 1) -> KvHandoff:
    layout = ParallelLayout(tp=tp)
    lat = ParallelLatencyModel(FakeCompute(DENSE), DENSE, layout, net(layout))
    return pd_handoff(lat, 16, 20000, 1597, kv_cache_dtype=kv_dtype)


def test_pd_network_is_the_reference_shadow_npu() -> None:
    h = _handoff(tp=2)
    assert [d.npus for d in h.network.topology.dims] == [2, 2] and h.peer == 2
    same = NetworkModel.from_params(2, 2, intra_bandwidth_gbps=16, intra_latency_ns=20000,
                                    local_mem_bw_gbps=1597, inter_bandwidth_gbps=16,
                                    inter_latency_ns=20000, inter_kind="FullyConnected")
    assert h.network.p2p_ns(12345, 0, 2) == same.p2p_ns(12345, 0, 2)


def test_kv_transfer_bytes_dtype_and_tp_aware() -> None:
    m = _handoff()
    assert m.kv_bytes_per_layer(10) == 2 * 2 * 64 * 10 * 2
    assert _handoff("fp8").kv_bytes_per_layer(10) == m.kv_bytes_per_layer(10) // 2
    assert _handoff(tp=2).kv_bytes_per_layer(10) == m.kv_bytes_per_layer(10) // 2
    per_layer = m.network.p2p_ns(5120, 0, 1)
    assert m.kv_transfer_ns(10, streamed=True) == per_layer == 20000 + int(5120 / 17.179869184)
    assert m.kv_transfer_ns(10) == m.network.p2p_ns(DENSE.num_layers * 5120, 0, 1)
    assert m.kv_transfer_ns(10) > per_layer
    assert m.kv_transfer_ns(0) == 0
    with pytest.raises(ConfigError, match="num_tokens"):
        m.kv_transfer_ns(-1)


def test_pd_prefill_extra_output_send_or_exposed_kv() -> None:
    m = _handoff()
    s = BatchShape(10, 1, 10, 0, 0, 0, 0, 0)
    # the KV message is hidden by the rest of the step; the 40-byte output send is not
    assert m.pd_prefill_extra_ns(s) == m.network.p2p_ns(40, 0, 1) == 20002
    huge = 1_000_000
    tail = m._tail_after_qkv(s)
    assert m.pd_prefill_extra_ns(s, send_tokens=huge) == m.kv_transfer_ns(huge, streamed=True) - tail


# ------------------------------------------------------------------------------------ inference


def _inst(num_npus=None, tp_size=None, pp_size=None, ep_size=None, dp_group=None):
    from types import SimpleNamespace
    return SimpleNamespace(num_npus=num_npus, tp_size=tp_size, pp_size=pp_size, ep_size=ep_size,
                           dp_group=dp_group)


def test_layout_for_instance_reference_inference() -> None:
    assert layout_for_instance(_inst(), [], DENSE) == ParallelLayout()
    assert layout_for_instance(_inst(num_npus=4, tp_size=2), [], DENSE) == ParallelLayout(tp=2, pp=2)
    assert layout_for_instance(_inst(num_npus=4, pp_size=4), [], DENSE) == ParallelLayout(pp=4)
    assert layout_for_instance(_inst(tp_size=2), [], MOE) == ParallelLayout(tp=2, ep=2)
    group = [_inst(num_npus=1, ep_size=2, dp_group="A"), _inst(num_npus=1, ep_size=2, dp_group="A")]
    assert layout_for_instance(group[0], group, MOE) == ParallelLayout(ep=2, dp=2)
    with pytest.raises(ConfigError, match="pp_size"):
        layout_for_instance(_inst(num_npus=4, tp_size=2, pp_size=4), [], DENSE)
    with pytest.raises(ConfigError, match="ep_size"):
        layout_for_instance(_inst(tp_size=1, ep_size=2), [], MOE)


def test_compute_model_with_host_io_rejected() -> None:
    class WithIO(FakeCompute):
        def breakdown(self, s: BatchShape) -> dict[str, int]:
            return {**super().breakdown(s), "host_io": s.total_tokens}

    layout = ParallelLayout(tp=2)
    with pytest.raises(ConfigError, match="host_mem_bw_gbs=None"):
        ParallelLatencyModel(WithIO(DENSE), DENSE, layout, net(layout))


def test_cluster_kv_transfer_prices_by_the_prefill_instance() -> None:
    h = _handoff()
    fn = ClusterKvTransfer({"p": h})
    assert fn("p", "d", 10) == h.kv_transfer_ns(10)
    assert ClusterKvTransfer({"p": h}, streamed=True)("p", "d", 10) == \
        h.pd_prefill_extra_ns(BatchShape(10, 1, 10, 0, 0, 0, 0, 0)) == 20002
    with pytest.raises(ConfigError, match="'d' hands a request off but is not a prefill"):
        fn("d", "p", 10)


def test_dp_padding_rules() -> None:
    from engine import EngineConfig

    cfg = EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048)
    pad = dp_pad_for("vllm", cfg)
    assert isinstance(pad, VllmDpPad) and pad.cudagraph_max == cudagraph_max_tokens(64, 2048)
    assert dp_pad_for("reference", cfg) is pad_dp_group
    assert dp_pad_for("none", cfg) is None
    with pytest.raises(ConfigError, match="'vllm', 'reference' or 'none'"):
        dp_pad_for("lockstep", cfg)
