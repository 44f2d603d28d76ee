"""The derived skew model (profiles.aiconfigurator.skew): FlashAttention's split heuristic,
list scheduling of CTAs over SMs, and the alpha it implies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles.aiconfigurator.skew import (
    CtaCost,
    KernelGrid,
    SkewDesign,
    batch_alpha_terms,
    decode_cta_keys,
    derive_skew_table,
    makespan,
    mixed_cta_tiles,
    num_splits,
    shared_makespan,
)

GRID = KernelGrid.of("rtx_pro_6000_server", heads=32, kv_heads=8, head_dim=128)
COST = CtaCost(c=8.0, c_compute=2.5, rows=1)


def test_kernel_grid_of_the_rtx_pro_6000():
    # 80 KiB of Q/K/V tiles per CTA in 100 KiB of shared memory: one CTA per SM.
    assert (GRID.sms, GRID.slots, GRID.block_n) == (188, 188, 128)
    # A100: 164 KiB per SM holds two.
    assert KernelGrid.of("a100_sxm", 32, 8, 128).slots == 216
    assert GRID.tiles(127) == 1 and GRID.tiles(128) == 2


def test_num_splits_is_flash_attention_2s_heuristic():
    assert num_splits(512, 188, 64) == 1  # enough CTAs to fill 0.8 x 2 x SMs
    assert num_splits(8, 188, 128) > 1  # one request: split its KV
    s = num_splits(16, 188, 32)
    assert 1 < s <= 32


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=600), st.integers(1, 200))
def test_makespan_bounds(tiles, slots):
    t = makespan(tiles, slots)
    assert t >= max(tiles) and t * slots >= sum(tiles)
    assert t <= sum(tiles) / slots + max(tiles)
    # Sharing the bandwidth: never slower than list scheduling, never faster than the fluid
    # bound or a lone CTA at its floor.
    for rho in (0.1, 0.5, 1.0):
        s = shared_makespan(tiles, slots, rho)
        assert s <= t + 1e-9
        assert s >= max(sum(tiles) / slots, rho * max(tiles)) - 1e-9


def test_uniform_batch_has_no_skew_and_one_wave_follows_the_longest():
    num, den = batch_alpha_terms(GRID, COST, [1000] * 8, 256, 0)
    assert num == 0 and den == 0
    # Two decodes and a short chunk fit one wave: the long request is the critical path.
    num, den = batch_alpha_terms(GRID, COST, [4096, 1024], 16, 0)
    assert den > 0 and num == pytest.approx(den)
    # Many waves of mixed CTAs balance: the mean is (nearly) right.
    kvs = [4096 if i % 2 else 1024 for i in range(128)]
    num, den = batch_alpha_terms(GRID, COST, kvs, 2048, 0)
    assert 0 <= num / den < 0.15


def test_mixed_ctas_are_per_query_head_and_tile():
    tiles = mixed_cta_tiles(GRID, [300, 10], pc=128, kp=0)
    # per head: 2 decodes (3 and 1 tiles) + 2 prefill tiles of 64 queries (1 tile each)
    assert tiles == [3, 1, 1, 1] * 32


def test_pure_decode_ctas_are_per_kv_head_and_split():
    many = decode_cta_keys(GRID, [1000] * 64)  # 512 CTAs fill the GPU: no split
    assert many == [1001] * 512
    two = decode_cta_keys(GRID, [4095, 100])  # 16 CTAs: split the longest's 32 tiles
    assert sum(two) == 8 * (4096 + 101) and len(two) > 16 and max(two) < 4096


def test_derived_table_layout():
    design = SkewDesign(n=(2, 64), ratio=(0.5,), kv_short=(256,), pc=(0, 256), kp=(0,))
    table, default, samples = derive_skew_table(GRID, COST, design)
    assert list(table.columns) == ["pc", "n_label", "skew_rate_label", "kv_big_label",
                                   "kp_label", "alpha", "n_samples"]
    assert set(table.pc) == {0, 256} and len(samples) == 4
    assert table.alpha.between(-1, 1).all() and -1 <= default <= 1
