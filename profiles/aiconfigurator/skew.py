"""Skew correction of a derived bundle: the attention cost of decodes with different KV lengths.

aiconfigurator measures decode attention with one KV length for the whole batch. The latency
model prices a batch whose decodes differ as ``t_mean + alpha * (t_max - t_mean)`` (uniform
table at the mean and at the longest KV; :meth:`profiles.latency.ProfiledLatencyModel.
attention_ns`), with alpha from the bundle's bucket table (``skew_fit`` in ``meta.yaml``,
``tp<N>/skew_fit.csv``). Here alpha is *derived* from what the kernel does, not fitted to
runs:

vLLM 0.19's FlashAttention backend (``vllm/v1/attention/backends/flash_attn.py``) runs every
step as one ``flash_attn_varlen_func`` call over a paged KV cache. In FlashAttention 2
(``csrc/flash_attn/flash_api.cpp``, ``mha_varlen_fwd``; the paged cache forces the split-KV
kernel, ``flash_fwd_launch_template.h``, tile ``kBlockM = 64`` queries x ``kBlockN`` keys,
``kBlockN = 256 / 128 / 64`` for head_dim <= 64 / 128 / larger):

* **pure decode** (``max_seqlen_q == 1``): the query heads of a KV group are packed into the
  M dimension (``seqlenq_ngroups_swapped``), so one CTA per (request, KV head, split); the
  split count comes from ``num_splits_heuristic`` on the *longest* KV of the batch (and
  ``2 x SMs`` slots); a split past a request's own length exits at once;
* **mixed** (a prefill chunk in the call): no packing and no split: one CTA per (request,
  query head, 64-query tile); a decode's only non-empty tile walks its whole KV, a prefill
  tile walks its causal prefix of history + chunk; the empty tiles of the decodes cost the
  same whether the decodes are skewed or not, so they drop out of alpha.

A CTA costs what it walks: KV tiles in a mixed call, keys in a memory-bound pure decode; CTAs are dispatched in ``blockIdx`` order to the
first free slot of ``SMs x (CTAs resident per SM)`` (list scheduling, simulated exactly;
memory-bound pure-decode CTAs stream faster while few run, :class:`CtaCost`). With
many waves the work balances (alpha near 0, the mean is right); with fewer CTAs than slots
the longest request is the critical path (alpha near 1). The tile costs come from the
system's own uniform tables (:class:`CtaCost`), the slot count from the GPU
(:data:`KERNEL_LIMITS`). alpha of one batch is ``(T(skewed) - T(all at the mean)) /
(T(all at the max) - T(all at the mean))`` in the model's own times (the uniform tables'
launch cost cancels; the derived attention table supplies t_mean and t_max); the bucket
table is the weighted least-squares alpha per bucket over a design of two-level batches (a
share of the requests at 4x the KV of the rest), the layout the measured bundles' skew
profiles use.

For the FA3 (Hopper) and FlashInfer (datacenter Blackwell) lanes the same CTA / wave model is
an assumption: their decode schedulers split KV as well and balance at least as evenly.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiles.bundle import DEFAULT_BUCKET_AXES
from profiles.latency import bucket_label

#: Per aiconfigurator system: (SM count, shared memory per SM in KiB), from NVIDIA's
#: datasheets / CUDA programming guide (compute capability tables). The system YAMLs carry
#: only ``sm_version``.
KERNEL_LIMITS: dict[str, tuple[int, int]] = {
    "rtx_pro_6000_server": (188, 100),  # GB202, CC 12.0: 100 KiB shared memory per SM
    "l40s": (142, 100),  # AD102, CC 8.9
    "a100_sxm": (108, 164),  # GA100, CC 8.0
    "h100_sxm": (132, 228),  # GH100, CC 9.0
    "h200_sxm": (132, 228),
    "b200_sxm": (148, 228),  # GB100, CC 10.0
    "gb200": (148, 228),
    "b300_sxm": (160, 228),  # Blackwell Ultra, CC 10.3: 160 SMs (NVIDIA's "Inside NVIDIA
    "gb300": (160, 228),  # Blackwell Ultra" developer blog, 2025)
}

# FlashAttention 2 forward: 4 warps (128 threads) per CTA; the kernel's register use caps it
# at 2 resident CTAs per SM (FA2's own split heuristic assumes "2 x SMs" for this reason).
_MAX_CTAS_PER_SM = 2
_BLOCK_M = 64
_MAX_SPLITS = 128
#: KV length ratio of the long requests to the short ones in the design batches (the
#: measured bundles' skew profiles use 4).
SKEW_FACTOR = 4


@dataclass(frozen=True, slots=True)
class KernelGrid:
    """How the decode / mixed attention kernel tiles one rank's work on one GPU."""

    sms: int
    slots: int  # CTAs resident at once
    heads: int
    kv_heads: int
    block_n: int

    @classmethod
    def of(cls, system: str, heads: int, kv_heads: int, head_dim: int) -> KernelGrid:
        sms, smem_kib = KERNEL_LIMITS[system]
        block_n = 256 if head_dim <= 64 else (128 if head_dim <= 128 else 64)
        smem = (_BLOCK_M * head_dim + 2 * block_n * head_dim) * 2  # Q + K + V tiles, 16-bit
        per_sm = max(1, min(_MAX_CTAS_PER_SM, smem_kib * 1024 // smem))
        return cls(sms=sms, slots=sms * per_sm, heads=heads, kv_heads=kv_heads, block_n=block_n)

    def tile_bytes(self, head_dim: int, kv_bytes: float) -> float:
        """K and V bytes of one KV tile of one KV head."""
        return 2 * self.block_n * head_dim * kv_bytes

    def tiles(self, kv: int) -> int:
        """KV tiles a decode with ``kv`` cached tokens walks (its key length is kv + 1)."""
        return -(-(kv + 1) // self.block_n)


def num_splits(batch_heads_mblocks: int, sms: int, n_blocks: int) -> int:
    """FlashAttention 2's ``num_splits_heuristic`` (flash_api.cpp), with ``2 x SMs`` slots."""
    slots = 2 * sms
    if batch_heads_mblocks >= 0.8 * slots:
        return 1
    max_splits = min(_MAX_SPLITS, slots, n_blocks)
    eff: list[float] = []
    for s in range(1, max_splits + 1):
        eligible = s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))
        if not eligible:
            eff.append(0.0)
            continue
        waves = batch_heads_mblocks * s / slots
        eff.append(waves / math.ceil(waves))
    best = max(eff) if eff else 0.0
    for s in range(1, max_splits + 1):
        if eff[s - 1] and eff[s - 1] >= 0.85 * best:
            return s
    return 1


def decode_cta_keys(g: KernelGrid, kvs: Sequence[int]) -> list[int]:
    """Keys each non-empty CTA of a pure-decode call streams, in dispatch (``blockIdx``)
    order: GQA packed, split-KV on the longest request. Memory bound, so a CTA costs its
    keys (a part-filled last tile loads only its rows)."""
    heads = g.kv_heads if g.heads > g.kv_heads else g.heads
    keys = [k + 1 for k in kvs]  # the new token's K/V is read too
    nmax = max(g.tiles(k) for k in kvs)
    s = num_splits(len(kvs) * heads, g.sms, nmax)
    if s == 1:  # grid (m, b, h): h outermost
        return [k for _ in range(heads) for k in keys]
    span = -(-nmax // s) * g.block_n  # grid (m, split, b * h): request, head, split
    out: list[int] = []
    for k in keys:
        row = [min(k, (i + 1) * span) - i * span for i in range(s)]
        out.extend([w for w in row if w > 0] * heads)
    return out


def mixed_cta_tiles(g: KernelGrid, kvs: Sequence[int], pc: int, kp: int = 0) -> list[int]:
    """KV tiles of every non-empty CTA of a mixed call (the decodes ``kvs`` in batch order,
    then one prefill chunk of ``pc`` tokens after ``kp`` cached ones), in dispatch order:
    one CTA per (request, query head, 64-query tile), heads outermost. Compute bound, so a
    part-filled tile costs a whole one."""
    per_head = [g.tiles(k) for k in kvs] + prefill_tiles(g, pc, kp)
    return per_head * g.heads


def makespan(tiles: Sequence[int], slots: int) -> int:
    """List scheduling in order on ``slots`` identical slots, in KV tiles: each CTA goes to
    the slot that frees first (integers, so ties break the same way on every machine)."""
    if len(tiles) <= slots:
        return max(tiles)
    free = [0] * slots
    for t in tiles:
        heapq.heapreplace(free, free[0] + t)
    return max(free)


def shared_makespan(tiles: Sequence[int], slots: int, rho: float) -> float:
    """Makespan in work units (keys) of memory-bound CTAs that share the DRAM bandwidth: while the
    queue holds CTAs every slot is busy (list scheduling, 1 per unit); once it drains, the k
    CTAs still running split the bandwidth k ways and each unit takes ``max(k / slots, rho)``
    (``rho``: a lone CTA's own floor, its compute)."""
    if len(tiles) <= slots:
        t0, left = 0.0, sorted(tiles)
    else:
        free = [0] * slots
        for t in tiles:
            heapq.heapreplace(free, free[0] + t)
        t0 = float(free[0])  # the last CTA has just been dispatched
        left = sorted(f - free[0] for f in free)
    out, done, k = t0, 0, len(left)
    for r in left:
        out += (r - done) * max(k / slots, rho)
        done, k = r, k - 1
    return out


@dataclass(frozen=True, slots=True)
class CtaCost:
    """Tile costs (µs) of one system's attention kernel, from its own uniform tables.

    A tile is 64 query rows x ``block_n`` keys. ``c_compute``: the time of one tile on one
    SM when compute bound, from the longest prefills of the context table (their CTAs fill
    every SM for many waves). ``c``: the time of one pure-decode tile while every slot is
    busy (memory bound: the GQA-packed tile has a few useful query rows), least squares over
    the generation table; ``rho = c_compute / c`` is how much faster a decode CTA streams
    once few are left. A mixed call (no GQA packing, no split) is list-scheduled at
    ``c_compute``; a pure decode by :func:`shared_makespan` at ``c``.
    """

    c: float
    c_compute: float
    rows: int  # uniform decode rows c was solved on

    @property
    def rho(self) -> float:
        return min(1.0, self.c_compute / self.c)


def prefill_tiles(g: KernelGrid, pc: int, kp: int = 0) -> list[int]:
    """KV tiles of the 64-query CTAs of one causal prefill chunk, per head."""
    m_blocks = -(-pc // _BLOCK_M)
    return [-(-min(kp + (j + 1) * _BLOCK_M, kp + pc) // g.block_n) for j in range(m_blocks)]


def cost_from_uniform(g: KernelGrid, prefill_us, decode_us, prefill_lengths: Sequence[int],
                      batches: Sequence[int], kv_lengths: Sequence[int],
                      dram_tile_us: float = 0.0) -> CtaCost:
    """:class:`CtaCost` of one system and shape from its uniform tables (µs callables).

    ``dram_tile_us``: the time of one decode tile when every slot streams its K/V from DRAM
    (slots x tile bytes / effective bandwidth); ``c`` is never below it, as the derived
    decode rows are never below DRAM streaming (the table's collector keeps KV in L2)."""
    comp = [float(prefill_us(np.array([s]))[0]) / makespan(prefill_tiles(g, s) * g.heads, g.slots)
            for s in prefill_lengths]
    c_compute = float(np.median(comp))
    rows = [(n, kv) for n in batches for kv in kv_lengths]
    t = np.array([float(decode_us(np.array([n]), np.array([kv]))[0]) for n, kv in rows])
    work = [decode_cta_keys(g, [int(kv)] * int(n)) for n, kv in rows]
    c = c_compute
    for _ in range(4):  # rho depends on c: a few fixed-point rounds settle it
        rho = min(1.0, c_compute / c)
        x = np.array([shared_makespan(w, g.slots, rho) for w in work]) / g.block_n
        a = np.stack([np.ones_like(t), x], axis=1) / t[:, None]
        from scipy.optimize import nnls  # only when a bundle is built (~0.5 s import)

        sol, _ = nnls(a, np.ones_like(t))
        c = max(float(sol[1]) if sol[1] > 0 else c, dram_tile_us)
    return CtaCost(c=c, c_compute=c_compute, rows=len(rows))


#: Uniform decode rows the tile cost is solved on: batches, and KV lengths up to this.
COST_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
COST_MAX_KV = 16384
#: Prefill lengths from which on the context table is compute bound (many waves of CTAs).
COMPUTE_MIN_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class SkewModel:
    """The kernel grid and tile costs of one (system, attention shape), and their inputs."""

    grid: KernelGrid
    cost: CtaCost
    prefill_lengths: tuple[int, ...]
    dram_tile_us: float


def model_for(system: str, effective_bw: float, tabs, heads: int, kv_heads: int,
              head_dim: int, kv_bytes: float) -> SkewModel:
    """:class:`SkewModel` of ``system`` from its uniform attention tables ``tabs``
    (``profiles.aiconfigurator.tables.AttentionTables``) and DRAM bandwidth (B/s)."""
    grid = KernelGrid.of(system, heads, kv_heads, head_dim)
    steps = [int(k) for k in tabs.decode_steps if k <= COST_MAX_KV]
    longest = tuple(int(k) for k in tabs.prefill.keys if k >= COMPUTE_MIN_TOKENS) or (
        int(tabs.prefill.keys[-1]),)
    dram_tile_us = grid.slots * grid.tile_bytes(head_dim, kv_bytes) / effective_bw * 1e6
    cost = cost_from_uniform(grid, tabs.prefill_us, tabs.decode_us, longest, COST_BATCHES,
                             steps, dram_tile_us)
    return SkewModel(grid, cost, longest, dram_tile_us)


def call_time(g: KernelGrid, cost: CtaCost, kvs: Sequence[int], pc: int = 0,
              kp: int = 0) -> float:
    """Model time (µs, without the fixed launch cost) of one call."""
    if pc == 0:
        return cost.c / g.block_n * shared_makespan(decode_cta_keys(g, kvs), g.slots, cost.rho)
    return cost.c_compute * makespan(mixed_cta_tiles(g, kvs, pc, kp), g.slots)


def batch_alpha_terms(g: KernelGrid, cost: CtaCost, kvs: Sequence[int], pc: int,
                      kp: int) -> tuple[float, float]:
    """(T(skewed) - T(mean), T(max) - T(mean)) of one batch in µs of the model."""
    n = len(kvs)
    mean, top = sum(kvs) // n, max(kvs)
    t_mean = call_time(g, cost, [mean] * n, pc, kp)
    return (call_time(g, cost, kvs, pc, kp) - t_mean,
            call_time(g, cost, [top] * n, pc, kp) - t_mean)


def _spread(n: int, nb: int) -> list[bool]:
    """Which of ``n`` batch positions hold the ``nb`` long requests: evenly spread (a serving
    batch's order is arrival order, unrelated to length)."""
    marks = [False] * n
    for i in range(nb):
        marks[(i * n) // nb] = True
    return marks


@dataclass(frozen=True, slots=True)
class SkewDesign:
    """The two-level batches alpha is derived on (the measured skew profiles' layout)."""

    n: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 256)
    ratio: tuple[float, ...] = (0.03125, 0.125, 0.25, 0.5, 0.75, 0.875)
    kv_short: tuple[int, ...] = (128, 256, 1024, 4096)  # long ones: 512 .. 16,384
    pc: tuple[int, ...] = (0, 16, 256, 2048)
    kp: tuple[int, ...] = (0, 4096)
    max_mixed_n: int = 128  # mixed calls: n + 1 <= max_num_seqs


def derive_skew_table(g: KernelGrid, cost: CtaCost, design: SkewDesign = SkewDesign()
                      ) -> tuple[pd.DataFrame, float, pd.DataFrame]:
    """(bucket table in ``skew_fit.csv`` columns, default alpha, per-batch samples).

    The default is the weighted least-squares alpha over the mixed batches: the latency model
    keys the table on the raw prefill chunk, so a serving step's mixed batch (its chunk is
    rarely a design value) takes the default, while pure decodes (pc = 0) hit the table."""
    ax = DEFAULT_BUCKET_AXES
    samples = []
    for pc in design.pc:
        for kp in (design.kp if pc else (0,)):
            for n in design.n:
                if pc and n > design.max_mixed_n:
                    continue
                for ratio in design.ratio:
                    nb = max(1, min(n - 1, round(ratio * n)))
                    for ks in design.kv_short:
                        kb = ks * SKEW_FACTOR
                        kvs = [kb if big else ks for big in _spread(n, nb)]
                        num, den = batch_alpha_terms(g, cost, kvs, pc, kp)
                        rate = (sum(kvs) / n - ks) / (kb - ks)
                        samples.append((pc, kp, n, nb, ks, kb, rate, num, den))
    s = pd.DataFrame(samples, columns=["pc", "kp", "n", "nb", "kv_short", "kv_big",
                                       "skew_rate", "num", "den"])
    s["n_label"] = [bucket_label(v, ax["n_bins"], ax["n_labels"]) for v in s["n"]]
    s["skew_rate_label"] = [bucket_label(v, ax["skew_rate_bins"], ax["skew_rate_labels"])
                            for v in s["skew_rate"]]
    s["kv_big_label"] = [bucket_label(v, ax["kv_big_bins"], ax["kv_big_labels"])
                         for v in s["kv_big"]]
    s["kp_label"] = [bucket_label(v, ax["kp_bins"], ax["kp_labels"]) for v in s["kp"]]
    keys = ["pc", "n_label", "skew_rate_label", "kv_big_label", "kp_label"]
    rows = []
    for key, grp in s.groupby(keys, sort=True):
        den2 = float((grp["den"] ** 2).sum())
        alpha = float((grp["num"] * grp["den"]).sum()) / den2 if den2 > 0 else 0.0
        rows.append((*key, round(min(max(alpha, -1.0), 1.0), 4), len(grp)))
    table = pd.DataFrame(rows, columns=[*keys, "alpha", "n_samples"])
    mixed = s[s["pc"] > 0] if (s["pc"] > 0).any() else s
    den2 = float((mixed["den"] ** 2).sum())
    pooled = float((mixed["num"] * mixed["den"]).sum()) / den2 if den2 > 0 else 0.0
    s["alpha"] = np.where(s["den"] > 0, s["num"] / s["den"].where(s["den"] > 0, 1.0), 0.0)
    return table, pooled, s
