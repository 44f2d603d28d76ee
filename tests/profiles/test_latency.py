"""ProfiledLatencyModel: interpolation primitives, the 4-D attention blend, skew, MoE, rounding."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.batch import BatchShape
from engine.specs import ConfigError, ModelSpec
from profiles.architecture import ArchitectureError
from profiles.bundle import BundleError, Curve, clear_bundle_cache, load_bundle
from profiles.latency import (
    ProfiledLatencyModel,
    balanced_routing,
    bucket_label,
    curve_ns,
    curve_ns_many,
    interp1d,
    interp1d_many,
    locate,
)
from tests.profiles.test_bundle import DENSE_LAYERS, attn_us, dense_us, write_bundle

TINY = ModelSpec(name="test/tiny", model_type="llama", num_layers=2, hidden_size=64,
                 num_attention_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                 vocab_size=1000, max_position_embeddings=4096)
TINY_MOE = ModelSpec(name="test/tiny-moe", model_type="mixtral", num_layers=3, hidden_size=64,
                     num_attention_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                     vocab_size=1000, max_position_embeddings=4096, num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=64)
SKEW = {"enabled": True, "alpha_default": 0.5,
        "per_tp": {1: {"alpha_default": 0.25, "bucket_table": "tp1/skew_fit.csv"}}}
SKEW_ROW = "0,n<=2,sr<=70%,kvB<=1k,kp=0,0.75,3\n"


def ns(us: float) -> int:
    return max(round(us * 1000), 1)


def shape(prefills=(), decodes=()) -> BatchShape:
    pc = sum(q for q, _ in prefills)
    nd = len(decodes)
    return BatchShape(pc + nd, len(prefills) + nd, pc, sum(k for _, k in prefills), nd,
                      sum(decodes), min(decodes, default=0), max(decodes, default=0))


def make_model(tmp_path: Path, spec: ModelSpec = TINY, tp: int = 1, *, skew: dict | None = None,
               hardware: str = "TESTGPU", tps=(1, 2), **kw) -> ProfiledLatencyModel:
    clear_bundle_cache()
    vdir = write_bundle(tmp_path, hardware=hardware, tps=tps, skew=skew, moe=spec.is_moe)
    if skew is not None:
        (vdir / "tp1" / "skew_fit.csv").write_text(
            "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples\n" + SKEW_ROW)
    return ProfiledLatencyModel(load_bundle(vdir), spec, tp, **kw)


# ---------------------------------------------------------------------------------- primitives


@pytest.mark.parametrize(
    ("q", "expected"),
    [(-5, (0, 0, 0.0)), (0, (0, 0, 0.0)), (8, (0, 1, 0.5)), (16, (1, 1, 0.0)), (20, (1, 2, 0.25)),
     (32, (2, 2, 0.0)), (48, (1, 2, 2.0))],
)
def test_locate(q: float, expected: tuple) -> None:
    assert locate((0, 16, 32), q) == expected


def test_locate_single_key_always_clamps() -> None:
    assert locate((7,), 100) == (0, 0, 0.0)
    assert locate((7,), 1) == (0, 0, 0.0)


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0, 10.0), (1, 10.0), (2, 20.0), (3, 30.0), (4, 40.0), (8, 80.0), (5, 50.0)],
)
def test_interp1d_clamp_exact_linear_extrapolate(q: float, expected: float) -> None:
    assert interp1d((1, 2, 4), (10, 20, 40), q) == expected


def test_interp1d_edge_sizes() -> None:
    assert interp1d((), (), 3) == 0.0
    assert interp1d((5,), (9,), 100) == 9.0
    # extrapolation uses the top two points only, and can go below the first value
    assert interp1d((1, 2, 3), (50, 40, 10), 4) == -20.0


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.integers(0, 5000), min_size=1, max_size=30, unique=True),
    vals=st.lists(st.integers(1, 10**7), min_size=30, max_size=30),
    qs=st.lists(st.integers(-10, 7000), min_size=1, max_size=50),
)
def test_vectorised_lookup_matches_scalar(keys, vals, qs) -> None:
    c = Curve.build(keys, vals[: len(keys)])
    q = np.array(qs)
    many = interp1d_many(c.keys, c.values, q)
    assert many.tolist() == [interp1d(c.xs, c.ys, x) for x in qs]
    assert curve_ns_many(c, q).tolist() == [curve_ns(c, x) for x in qs]


def test_bucket_label_right_inclusive_and_overflow() -> None:
    bins, labels = (0, 2, 4), ("a", "b")
    assert [bucket_label(v, bins, labels) for v in (0, 2, 3, 4, 9)] == ["a", "a", "b", "b", "b"]


@pytest.mark.parametrize(
    ("t", "e", "k", "ep", "expected"),
    [(1, 128, 8, 2, (1, 4)), (2048, 128, 8, 1, (2048, 128)), (10, 8, 2, 2, (8, 4)),
     (3, 8, 2, 2, (2, 3)), (5, 4, 2, 8, (1, 1))],
)
def test_balanced_routing(t: int, e: int, k: int, ep: int, expected: tuple) -> None:
    assert balanced_routing(t, e, k, ep) == expected  # (10, ep2, k2): round(7.5) = 8 (half even)


# -------------------------------------------------------------------------- dense + whole step


def _block_dense_ns(tokens: int) -> int:
    per = {layer: ns(dense_us(layer, tokens)) for layer in DENSE_LAYERS}
    return (2 * per["layernorm"] + per["qkv_proj"] + per["rotary_emb"] + per["o_proj"]
            + per["gate_up_proj"] + per["act_fn"] + per["down_proj"])


def test_prefill_step_sums_rows(tmp_path: Path) -> None:
    m = make_model(tmp_path)
    s = shape([(8, 0)])
    # attention: pc 8 halfway between 0 and 16; the (0, 0) corner falls back to (0, 1) whose
    # kv query 0 clamps to kv 16; the (16, 0) corner is the kv 0 point.
    c0, c1 = ns(attn_us(0, 0, 1, 16)), ns(attn_us(16, 0, 0, 0))
    attn = int(c0 + 0.5 * (c1 - c0))
    expected = (ns(dense_us("embedding", 8)) + 2 * (_block_dense_ns(8) + attn)
                + ns(dense_us("final_layernorm", 8)) + ns(100 + 2) + ns(10 + 1))
    assert m.attention_ns(s) == attn
    assert m.iteration_ns(s) == expected
    bd = m.breakdown(s)
    assert sum(bd.values()) == expected
    assert bd["layernorm"] == 2 * 2 * ns(dense_us("layernorm", 8))  # twice per block, 2 layers
    assert bd["attention"] == 2 * attn and bd["host_io"] == 0


def test_dense_interpolates_and_extrapolates(tmp_path: Path) -> None:
    m = make_model(tmp_path, host_mem_bw_gbs=None)
    a, b = m.breakdown(shape([(6, 0)])), m.breakdown(shape([(32, 0)]))
    # dense grid 1, 2, 4, 8, 16: 6 is between keys, 32 above the top (linear extrapolation)
    assert a["qkv_proj"] == 2 * ns(dense_us("qkv_proj", 6))
    assert b["qkv_proj"] == 2 * int(ns(dense_us("qkv_proj", 8)) + 3 * (ns(dense_us("qkv_proj", 16))
                                                                        - ns(dense_us("qkv_proj", 8))))
    # per-sequence rows are keyed on the number of sequences, not tokens
    assert a["lm_head"] == ns(102) and a["sampler"] == ns(11)
    c = m.breakdown(shape(decodes=[16, 16, 16]))
    assert c["lm_head"] == int((ns(104) + ns(108)) / 2)


def test_host_io_term(tmp_path: Path) -> None:
    with_io = make_model(tmp_path / "a")
    no_io = make_model(tmp_path / "b", host_mem_bw_gbs=None)
    slow = make_model(tmp_path / "c", host_mem_bw_gbs=50.0)
    s = shape([(64, 0)])
    assert with_io.iteration_ns(s) - no_io.iteration_ns(s) == 2  # 2*floor(256/256)
    s = shape([(1024, 0)])
    assert slow.iteration_ns(s) - no_io.iteration_ns(s) == 2 * (4096 // 50)
    assert with_io.host_io_ns(shape(decodes=[16] * 127)) == 2  # sampled-id store is free


def test_memoisation(tmp_path: Path) -> None:
    m = make_model(tmp_path)
    mixed = shape([(8, 0)], [20])
    first = m.iteration_ns(mixed)
    memo = m._attention._memo  # pure-decode blends are memoised per n_decode, mixed ones not
    assert len(memo) == 0
    decode = shape(decodes=[20, 40])
    d = m.iteration_ns(decode)
    assert list(memo) == [2]
    assert m.iteration_ns(decode) == d and m.iteration_ns(mixed) == first and len(memo) == 1
    m.clear_cache()
    assert not memo and m.iteration_ns(decode) == d and m.iteration_ns(mixed) == first


def test_attention_blend_matches_the_direct_4d_formula(tmp_path: Path) -> None:
    """The blend tree evaluates the 4-D multilinear formula in its order of operations."""
    m = make_model(tmp_path)
    tab = m._tables.attention

    def direct(pc: int, kp: int, nd: int, kv: int) -> int:
        def corner(p: int, n: int) -> float:
            pair = (p, n) if (p, n) in tab.slices else m._attention._nearest_pair(p, n)
            if pair is None:
                return 0.0
            sl = tab.slices[pair]
            lo, hi, t = locate(sl.kp, kp)
            v0 = interp1d(sl.rows[lo].xs, sl.rows[lo].ys, kv)
            return v0 if lo == hi else v0 + t * (interp1d(sl.rows[hi].xs, sl.rows[hi].ys, kv) - v0)

        def at_pc(p: int) -> float:
            lo, hi, t = locate(tab.nd_axis, nd)
            c0 = corner(p, tab.nd_axis[lo])
            return c0 if lo == hi else c0 + t * (corner(p, tab.nd_axis[hi]) - c0)

        lo, hi, t = locate(tab.pc_axis, pc)
        v0 = at_pc(tab.pc_axis[lo])
        if lo != hi:
            v0 = v0 + t * (at_pc(tab.pc_axis[hi]) - v0)
        return max(int(v0), 1)

    for pc in (0, 5, 16, 24, 40, 300):
        for kp in (0, 32, 100, 5000):
            for nd in (0, 1, 2, 3, 7, 200):
                for kv in (0, 1, 17, 48, 64, 1000, 70000):
                    if pc == 0 and nd == 0:
                        continue
                    assert m._attention(pc, kp, nd, kv) == direct(pc, kp, nd, kv), (pc, kp, nd, kv)


# ---------------------------------------------------------------------------------- attention


def test_attention_interior_is_multilinear(tmp_path: Path) -> None:
    m = make_model(tmp_path)
    # pc 24 (between 16 and 32), kp 32 (between 0 and 64), nd 1, kv 48 (between 32 and 64)
    got = m.attention_ns(shape([(24, 32)], [48]))
    assert abs(got - attn_us(24, 32, 1, 48) * 1000) <= 2


def test_attention_kv_clamps_below_and_extrapolates_above(tmp_path: Path) -> None:
    m = make_model(tmp_path)
    assert m.attention_ns(shape(decodes=[3])) == ns(attn_us(0, 0, 1, 16))
    assert m.attention_ns(shape(decodes=[16])) == ns(attn_us(0, 0, 1, 16))
    assert abs(m.attention_ns(shape(decodes=[128])) - attn_us(0, 0, 1, 128) * 1000) <= 1


def test_attention_ragged_row(tmp_path: Path) -> None:
    m = make_model(tmp_path)
    # the kp = 96 row starts at kv 32: kv 16 clamps there, the kp = 64 row hits kv 16 exactly
    assert m.attention_ns(shape([(16, 96)], [16])) == ns(attn_us(16, 96, 1, 32))
    v0, v1 = ns(attn_us(16, 64, 1, 16)), ns(attn_us(16, 96, 1, 32))
    assert m.attention_ns(shape([(16, 80)], [16])) == int(v0 + 0.5 * (v1 - v0))


def test_attention_kp_above_grid_extrapolates(tmp_path: Path) -> None:
    m = make_model(tmp_path)
    v64, v96 = ns(attn_us(16, 64, 0, 0)), ns(attn_us(16, 96, 0, 0))
    assert m.attention_ns(shape([(16, 160)])) == int(v64 + 3.0 * (v96 - v64))


def test_missing_corner_reference_quirk_vs_fix(tmp_path: Path) -> None:
    quirk = make_model(tmp_path / "q")
    fixed = make_model(tmp_path / "f", reference_quirks=False)
    s = shape([(16, 0)], [32] * 34)  # nd 34: halfway between 4 and 64; (16, 64) never profiled
    c4 = ns(attn_us(16, 0, 4, 32))
    c64 = ns(attn_us(0, 0, 64, 32))  # nearest profiled pair by raw distance: pure decode (0, 64)
    assert quirk.attention_ns(s) == int(c4 + 0.5 * (c64 - c4))
    # fix: n_decode bracketed on pc 16's own nd values, extrapolating from nd 2 and 4
    assert abs(fixed.attention_ns(s) - attn_us(16, 0, 34, 32) * 1000) <= 2
    assert quirk.attention_ns(s) < fixed.attention_ns(s)
    # identical wherever all corners exist
    s2 = shape([(24, 32)], [48, 48])
    assert quirk.attention_ns(s2) == fixed.attention_ns(s2)


def test_no_attention_for_empty_batch(tmp_path: Path) -> None:
    m = make_model(tmp_path)
    assert m.attention_ns(BatchShape(0, 0, 0, 0, 0, 0, 0, 0)) == 0


# ------------------------------------------------------------------------------------- skew


def test_skew_alpha_from_bucket(tmp_path: Path) -> None:
    m = make_model(tmp_path, skew=SKEW)
    s = shape(decodes=[16, 64])  # mean 40, skew rate 0.5, kv_big 64, n 2, pc 0, kp 0
    assert m.skew_alpha(s) == 0.75
    t_mean, t_max = ns(attn_us(0, 0, 2, 40)), ns(attn_us(0, 0, 2, 64))
    assert abs(m.attention_ns(shape(decodes=[40, 40])) - t_mean) <= 1
    expected = round(m.attention_ns(shape(decodes=[40, 40]))
                     + 0.75 * (m.attention_ns(shape(decodes=[64, 64]))
                               - m.attention_ns(shape(decodes=[40, 40]))))
    assert m.attention_ns(s) == expected
    assert t_max > t_mean


def test_skew_alpha_fallbacks(tmp_path: Path) -> None:
    m = make_model(tmp_path / "a", skew=SKEW)
    assert m.skew_alpha(shape([(16, 0)], [16, 64])) == 0.25  # mixed batch: TP entry default
    assert m.skew_alpha(shape(decodes=[16, 17, 64])) == 0.25  # other bucket
    tp2 = make_model(tmp_path / "b", tp=2, skew=SKEW)
    assert tp2.skew_alpha(shape(decodes=[16, 64])) == 0.5  # no tp2 entry: block default
    off = make_model(tmp_path / "c", skew=None)
    assert off.skew_alpha(shape(decodes=[16, 64])) == 0.0
    s = shape(decodes=[16, 64])
    assert off.attention_ns(s) == off.attention_ns(shape(decodes=[40, 40]))


def test_skew_not_applied_to_uniform_or_single_decode(tmp_path: Path) -> None:
    m = make_model(tmp_path, skew=SKEW)
    plain = make_model(tmp_path / "p", skew=None)
    for s in (shape(decodes=[33]), shape(decodes=[50, 50, 50])):
        assert m.attention_ns(s) == plain.attention_ns(s)


def test_skew_mean_is_floored(tmp_path: Path) -> None:
    m = make_model(tmp_path, skew=None)
    assert m.attention_ns(shape(decodes=[16, 17])) == m.attention_ns(shape(decodes=[16, 16]))


# -------------------------------------------------------------------------------- TP, MoE


def test_tp_invariant_rows_come_from_tp1(tmp_path: Path) -> None:
    tp1 = make_model(tmp_path / "a", tp=1)
    tp2 = make_model(tmp_path / "b", tp=2)
    s = shape([(8, 0)], [20])
    b1, b2 = tp1.breakdown(s), tp2.breakdown(s)
    for name in ("layernorm", "final_layernorm", "sampler"):
        assert b1[name] == b2[name]
    assert b2["qkv_proj"] < b1["qkv_proj"] and b2["lm_head"] < b1["lm_head"]


def test_moe_rows(tmp_path: Path) -> None:
    m1 = make_model(tmp_path / "a", TINY_MOE)
    m2 = make_model(tmp_path / "b", TINY_MOE, ep=2)
    s = shape([(4, 0)])
    assert m1.moe_ns(s) == ns(20 + 4 + 5 * 4)  # 4 tokens, 4 experts activated
    assert m2.moe_ns(s) == ns(20 + 3 + 5 * 2)  # per rank: 3 tokens, 2 experts
    bd = m1.breakdown(s)
    assert bd["moe"] == 3 * m1.moe_ns(s) and "gate_up_proj" not in bd
    assert sum(bd.values()) == m1.iteration_ns(s)
    # one token activates k = 2 experts: the row for 2 activated experts (clamp, no blend)
    assert m1.moe_ns(shape(decodes=[16])) == ns(20 + 1 + 10)


def test_moe_rows_price_the_gathered_tokens(tmp_path: Path) -> None:
    """``moe_tokens`` (a DP group's all-gathered batch) replaces T for the experts only."""
    m = make_model(tmp_path, TINY_MOE, ep=2)
    s = shape([(4, 0)])
    g = s._replace(moe_tokens=8)
    assert m.moe_ns(g) == ns(20 + 6 + 5 * 2)  # 8 tokens routed: 6 reach this rank, 2 experts
    assert m.iteration_ns(g) - m.iteration_ns(s) == 3 * (m.moe_ns(g) - m.moe_ns(s))
    assert sum(m.breakdown(g).values()) == m.iteration_ns(g)
    bd_s, bd_g = m.breakdown(s), m.breakdown(g)
    assert {k: v for k, v in bd_g.items() if k != "moe"} == {
        k: v for k, v in bd_s.items() if k != "moe"}  # dense rows keep the rank's own T


def test_moe_model_needs_moe_table(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    with pytest.raises(BundleError, match=r"moe\.csv missing"):
        ProfiledLatencyModel(load_bundle(vdir), TINY_MOE, 1)


def test_missing_layer_is_skipped_with_warning(tmp_path: Path, caplog) -> None:
    qwen = replace(TINY, model_type="qwen3")
    with caplog.at_level(logging.WARNING, logger="profiles.latency"):
        m = make_model(tmp_path, qwen)
    assert "qk_norm" in caplog.text
    assert "qk_norm" not in m.breakdown(shape([(8, 0)]))


def test_bundle_reports_limits_beyond_profiled_range(tmp_path: Path) -> None:
    m = make_model(tmp_path)
    assert m.bundle.beyond_profiled_range(16, 4) == []
    msgs = m.bundle.beyond_profiled_range(2048, 4)
    assert len(msgs) == 1 and "max_num_batched_tokens 2048 > profiled" in msgs[0]
    assert "extrapolate" in msgs[0]


def test_rotary_skipped_on_tpu(tmp_path: Path) -> None:
    m = make_model(tmp_path, hardware="TESTTPU")
    assert "rotary_emb" not in m.breakdown(shape([(8, 0)]))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [({"tp": 0}, "tp = 0"), ({"ep": 0}, "ep = 0"), ({"host_mem_bw_gbs": 0.0}, "host_mem_bw_gbs")],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict, pattern: str) -> None:
    vdir = write_bundle(tmp_path)
    tp = kwargs.pop("tp", 1)
    with pytest.raises(ConfigError, match=pattern):
        ProfiledLatencyModel(load_bundle(vdir), TINY, tp, **kwargs)


def test_unprofiled_tp(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path, tps=(1,))
    with pytest.raises(BundleError, match="no tp4/"):
        ProfiledLatencyModel(load_bundle(vdir), TINY, 4)


def test_architecture_mismatch_and_unknown_family(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    with pytest.raises(ConfigError, match="architecture 'llama' is dense"):
        ProfiledLatencyModel(load_bundle(vdir), replace(TINY, num_experts=8, num_experts_per_tok=2), 1)
    with pytest.raises(ArchitectureError, match="no architecture file for model_type 'gpt9'"):
        ProfiledLatencyModel(load_bundle(vdir), replace(TINY, model_type="gpt9"), 1)
    with pytest.raises(ConfigError, match="dtype 'weird'"):
        ProfiledLatencyModel(load_bundle(vdir), replace(TINY, dtype="weird"), 1)


@settings(max_examples=150, deadline=None)
@given(
    pc=st.integers(0, 80), kp=st.integers(0, 300),
    decodes=st.lists(st.integers(1, 200), max_size=70),
)
def test_any_batch_prices_positive_and_consistent(tmp_path_factory, pc, kp, decodes) -> None:
    global _PROP_MODEL
    if _PROP_MODEL is None:
        _PROP_MODEL = make_model(tmp_path_factory.mktemp("prop"), skew=SKEW)
    m = _PROP_MODEL
    prefills = [(pc, kp)] if pc > 1 else []
    s = shape(prefills, decodes)
    if s.total_tokens == 0:
        return
    v = m.iteration_ns(s)
    assert isinstance(v, int) and v >= 1
    assert sum(m.breakdown(s).values()) == v
    m.clear_cache()  # the memoised parts agree with a fresh computation
    assert m.iteration_ns(s) == v


_PROP_MODEL: ProfiledLatencyModel | None = None


def test_skew_rate_of_uniform_batch_is_half(tmp_path: Path) -> None:
    m = make_model(tmp_path, skew=SKEW)
    # equal KVs: rate 0.5 -> the "sr<=70%" bucket (alpha 0.75), not "sr<=40%" (default 0.25)
    assert m.skew_alpha(shape(decodes=[64, 64])) == 0.75


def test_nearest_pair_ties_resolve_to_first_sorted_pair() -> None:
    from profiles.bundle import AttentionSlice, AttentionTable
    from profiles.latency import _AttentionLookup

    row = AttentionSlice(kp=(0,), rows=(Curve.build([16], [1000]),))
    other = AttentionSlice(kp=(0,), rows=(Curve.build([0], [3000]),))
    table = AttentionTable(pc_axis=(0, 2), nd_axis=(0, 2), slices={(0, 2): row, (2, 0): other},
                           pairs=((0, 2), (2, 0)), nd_by_pc={0: (2,), 2: (0,)})
    lookup = _AttentionLookup(table, ragged_nd=False)
    assert lookup._nearest_pair(0, 0) == (0, 2)  # both at squared distance 4
    assert lookup(0, 0, 0, 16) == 1000


def test_one_stage_holds_every_layer(tmp_path: Path) -> None:
    m = make_model(tmp_path, skew=SKEW)
    for s in (shape([(8, 0)]), shape([(24, 32)], [16, 64]), shape(decodes=[40] * 3)):
        assert m.stage_ns(s) == m.iteration_ns(s)


def test_models_over_one_table_share_its_attention_lookup(tmp_path: Path) -> None:
    import gc

    from profiles.latency import ProfiledLatencyModel, attention_lookup

    a = make_model(tmp_path, skew=SKEW)
    b = ProfiledLatencyModel(a.bundle, TINY, 1)  # another replica of the same bundle
    assert b._attention is a._attention
    # The quirk switch selects a different blend: its own lookup.
    c = ProfiledLatencyModel(a.bundle, TINY, 1, reference_quirks=False)
    assert c._attention is not a._attention and c._attention.ragged_nd
    for s in (shape([(24, 32)], [16, 64]), shape(decodes=[40, 72])):
        assert a.iteration_ns(s) == b.iteration_ns(s)
    assert a._attention._memo  # the pure-decode blend, built once for both
    # Held weakly: once no model uses it, the next model over the table builds a fresh one.
    table = a._tables.attention
    del a, b
    gc.collect()
    fresh = attention_lookup(table, False)
    assert fresh.table is table and fresh._memo == {}


@given(st.one_of(
    st.floats(min_value=-1e9, max_value=1e12, allow_nan=False),
    st.integers(-10**6, 10**9).map(lambda n: n + 0.5),  # ties: to even
    st.integers(-10**6, 10**9).map(float),
))
def test_round_even_is_python_round(x):
    from profiles.latency import round_even

    assert round_even(x) == round(x)
