"""Sample grids of the LLMServingSim profiler, reproduced so generated bundles interpolate alike.

A generated (roofline) bundle must carry its samples at the same keys as a measured one:
the simulator interpolates linearly between samples and clamps or extrapolates outside
them, so the same grid makes a roofline bundle behave like a measured bundle under lookup.

The rules below reproduce the measured RTX PRO 6000 bundles exactly at the defaults
(``max_num_batched_tokens`` 2048, ``max_num_seqs`` 256, ``max_kv`` 16384):

- dense: every token count 1-15, 16-60 step 4, 64-MNBT step 16 (152 points);
- per_sequence: 1-15, 16-64 step 4, 80-MSQ step 16 (40 points);
- attention: the union of a doubling grid and a 1.5x grid (see :func:`attention_keys`);
- moe: tokens in powers of two up to MNBT, activated experts in powers of two (plus ``k``
  and ``E`` themselves) with ``k <= activated <= min(E, tokens * k)``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from engine.specs import ConfigError


@dataclass(frozen=True, slots=True)
class GridSpec:
    """Engine limits the profile grids are built for (the measured bundles' values by default)."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_kv: int = 16384

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 16:
            raise ConfigError("GridSpec.max_num_batched_tokens must be >= 16")
        if self.max_num_seqs < 1:
            raise ConfigError("GridSpec.max_num_seqs must be >= 1")
        if self.max_kv < 16:
            raise ConfigError("GridSpec.max_kv must be >= 16")


def _geometric(start: float, factor: float, below: int) -> list[int]:
    """``round(start * factor**i)`` for every i with the unrounded value strictly below ``below``."""
    out: list[int] = []
    x = float(start)
    while x < below:
        out.append(int(round(x)))
        x *= factor
    return out


def dense_tokens(grid: GridSpec) -> np.ndarray:
    """Token counts of dense.csv: 1-15, 16-60 step 4, 64..MNBT step 16 (MNBT always included)."""
    top = grid.max_num_batched_tokens
    pts = set(range(1, min(15, top) + 1))
    pts |= set(range(16, min(60, top) + 1, 4))
    pts |= set(range(64, top + 1, 16))
    pts.add(top)
    return np.array(sorted(pts), dtype=np.int64)


def per_sequence_counts(grid: GridSpec) -> np.ndarray:
    """Sequence counts of per_sequence.csv: 1-15, 16-64 step 4, 80..MSQ step 16 (MSQ included)."""
    top = grid.max_num_seqs
    pts = set(range(1, min(15, top) + 1))
    pts |= set(range(16, min(64, top) + 1, 4))
    pts |= set(range(80, top + 1, 16))
    pts.add(top)
    return np.array(sorted(pts), dtype=np.int64)


def _attention_subgrid(
    chunks: list[int], kvs: list[int], n_decodes: list[int], grid: GridSpec
) -> set[tuple[int, int, int, int]]:
    out: set[tuple[int, int, int, int]] = set()
    limit = grid.max_num_batched_tokens + grid.max_num_seqs
    for pc, kp, nd, kv in itertools.product(chunks, kvs, n_decodes, kvs):
        if pc == 0 and kp != 0:
            continue  # no prefill, no prefill history
        if (nd == 0) != (kv == 0):
            continue  # decodes always have history, and only decodes carry kv_decode
        if pc == 0 and nd == 0:
            continue  # empty batch
        if pc + nd > limit or nd + (pc > 0) > grid.max_num_seqs:
            continue
        out.add((pc, kp, nd, kv))
    return out


def attention_keys(grid: GridSpec) -> np.ndarray:
    """(prefill_chunk, kv_prefill, n_decode, kv_decode) rows of attention.csv, sorted.

    Doubling grid: chunks {0, 16, 32, ..., MNBT}, kv {0, 16, ..., max_kv}, decodes
    {0, 1, 2, 4, ..., MSQ}. Secondary 1.5x grid: chunks {0} and round(16 * 1.5**i) below MNBT,
    kv {0} and round(512 * 1.5**i) below max_kv plus max_kv, same decodes. Both grids are
    filtered as the profiler does (no history without a prefill, kv_decode > 0 exactly when
    there are decodes, no empty batch, at most MNBT + MSQ tokens and MSQ requests).
    The 1.5x kv values also appear at chunk = MNBT for prefill-only rows.
    The ragged result is why a kv_prefill row of the 1.5x grid has no kv_decode below 512.
    """
    mnbt, msq, max_kv = grid.max_num_batched_tokens, grid.max_num_seqs, grid.max_kv
    n_decodes = sorted({0, *_geometric(1, 2.0, msq), msq})
    chunks_a = sorted({0, *_geometric(16, 2.0, mnbt), mnbt})
    kvs_a = sorted({0, *_geometric(16, 2.0, max_kv), max_kv})
    chunks_b = sorted({0, *_geometric(16, 1.5, mnbt)})
    kvs_b = sorted({0, *_geometric(512, 1.5, max_kv), max_kv})
    keys = _attention_subgrid(chunks_a, kvs_a, n_decodes, grid)
    keys |= _attention_subgrid(chunks_b, kvs_b, n_decodes, grid)
    # The measured bundles also hold the 1.5x kv_prefill values at chunk = MNBT, but only
    # without decodes (that secondary sweep stopped there); mirrored for identical lookups.
    keys |= _attention_subgrid([mnbt], kvs_b, [0], grid)
    return np.array(sorted(keys), dtype=np.int64).reshape(-1, 4)


def moe_keys(num_experts: int, top_k: int, grid: GridSpec) -> np.ndarray:
    """(tokens, activated_experts) rows of moe.csv, sorted by tokens then activated."""
    if num_experts <= 0 or top_k <= 0 or top_k > num_experts:
        raise ConfigError(
            f"MoE grid needs 0 < num_experts_per_tok <= num_experts, got k={top_k}, E={num_experts}"
        )
    tokens = _geometric(1, 2.0, grid.max_num_batched_tokens + 1)
    activated = sorted({*_geometric(1, 2.0, num_experts + 1), top_k, num_experts})
    rows = [
        (t, a)
        for t in tokens
        for a in activated
        if top_k <= a <= min(num_experts, t * top_k)
    ]
    return np.array(rows, dtype=np.int64).reshape(-1, 2)
