"""Profiled latency model: one engine step priced from a measured bundle, as the reference does.

For one GPU (one TP rank; collectives are priced elsewhere) a step costs

    embedding(T) + L * [block dense rows(T) + attention(pc, kp, nd, kv) + moe(rank tokens)]
    + final_layernorm(T) + lm_head(S) + sampler(S) + host I/O

with T = total scheduled tokens and S = number of sequences. Every row is a table lookup:

- dense / per-sequence rows: 1-D lookup (clamp below, exact on a key, linear between keys,
  linear extrapolation through the last two keys above), truncated to int, at least 1 ns;
- attention: 4-D lookup over (prefill_chunk, kv_prefill, n_decode, kv_decode) with linear
  blending on every axis, ragged rows, and the skew correction
  ``t_mean + alpha * (t_max - t_mean)`` (see :meth:`ProfiledLatencyModel.attention_ns`);
- MoE: BALANCED expert routing of ``shape.moe_tokens`` (default: T) over ``ep`` ranks, then a
  lookup over (tokens per rank, activated experts per rank) in the ``tp1`` table;
- rows marked ``tp_invariant`` in the architecture file come from the ``tp1`` table.

The host I/O term reproduces the reference's load of the step's token ids from host memory:
``2*floor(T*2*fp_bytes/bw)`` ns with ``bw`` the host memory bandwidth in GB/s (read as
bytes/ns; 256 in every reference cluster config). The store of the sampled ids (4 bytes per
sequence) costs nothing in the reference: 1,250 pure-decode iterations of its Llama-3.1-8B run
with 1..128 sequences match only without it. Pass ``host_mem_bw_gbs=None`` to drop the term
(it is below 0.002 % of a step).

``reference_quirks=True`` (default) reproduces the reference numbers exactly, including its
quirk for attention corners that were never profiled: a (prefill_chunk, n_decode) corner absent
from the table is replaced by the nearest profiled pair by raw squared distance (ties go to the
first pair in (pc, nd) order; the reference's tie order is not observable in its outputs). For a
mixed batch with more than 128 decodes the missing (pc, 256) corner becomes the pure-decode
slice (0, 256) when pc < 128 (dropping the prefill part at that corner) and (pc, 128) when
pc >= 128 (flattening the n_decode axis above 128). With ``reference_quirks=False``
the n_decode axis is instead bracketed per prefill-chunk on the n_decode values that exist for
that chunk, so such a batch extrapolates linearly from that chunk's own n_decode = 64 / 128
rows.

Data-parallel padding (as the reference): give the padded ``total_tokens`` (dense rows, MoE)
and ``num_seqs`` (lm_head / sampler rows, including dummy decodes), but only the real decodes in
``num_decode`` and ``decode_kv_*`` (attention never sees padding).

The parts are memoised: the token-keyed part per total_tokens, the sequence-keyed part per
num_seqs, the MoE part per token count and each 4-D attention lookup (whole steps are not: a
step's decode KV sum changes every step, so such a memo never hits).
:meth:`ProfiledLatencyModel.decode_steps_ns` prices a run of pure-decode steps at once
(numpy over the steps), returning the same integers as one :meth:`iteration_ns` call per step.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence

import numpy as np

from engine.batch import BatchShape
from engine.memory import DTYPE_BYTES
from engine.specs import ConfigError, ModelSpec
from profiles.architecture import Architecture, load_architecture
from profiles.bundle import (
    AttentionTable,
    BundleError,
    Curve,
    MoeTable,
    ProfileBundle,
    SkewTpEntry,
)

log = logging.getLogger(__name__)

_MAX_CACHE = 1 << 20  # memo entries before the cache is reset


# ------------------------------------------------------------------------- interpolation primitives


def locate(xs: Sequence[int], q: float) -> tuple[int, int, float]:
    """Where ``q`` falls on the sorted keys ``xs`` (non-empty): ``(lo, hi, t)``.

    - one key, or ``q <= xs[0]``: ``(0, 0, 0.0)`` (clamp to the first sample);
    - ``q`` equal to a key ``xs[i]``: ``(i, i, 0.0)`` (that sample exactly);
    - between keys: the bracketing pair and ``t = (q - xs[lo]) / (xs[hi] - xs[lo])`` in (0, 1);
    - above the last key: ``(n-2, n-1, t > 1)`` (linear extrapolation through the top two).
    """
    n = len(xs)
    if n == 1 or q <= xs[0]:
        return 0, 0, 0.0
    i = bisect_right(xs, q) - 1  # xs[i] <= q
    if xs[i] == q:
        return i, i, 0.0
    if i >= n - 1:
        i = n - 2
    x0 = xs[i]
    return i, i + 1, (q - x0) / (xs[i + 1] - x0)


def interp1d(xs: Sequence[int], ys: Sequence[float], q: float) -> float:
    """1-D lookup: 0 for an empty table, else clamp below / exact / linear / extrapolate above.

    Same semantics as blending ``ys`` at :func:`locate`'s result (inlined: hot path).
    """
    n = len(xs)
    if n == 0:
        return 0.0
    if n == 1 or q <= xs[0]:
        return float(ys[0])
    i = bisect_right(xs, q) - 1
    if xs[i] == q:
        return float(ys[i])
    if i >= n - 1:
        i = n - 2
    x0 = xs[i]
    y0 = ys[i]
    return y0 + (q - x0) / (xs[i + 1] - x0) * (ys[i + 1] - y0)


def interp1d_many(xs: np.ndarray, ys: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Vectorised :func:`interp1d` over an array of queries (bit-identical results)."""
    q = np.asarray(q, dtype=np.float64)
    n = len(xs)
    if n == 0:
        return np.zeros(q.shape)
    ys = np.asarray(ys, dtype=np.float64)
    if n == 1:
        return np.full(q.shape, ys[0])
    raw = np.searchsorted(xs, q, side="right") - 1
    i = np.clip(raw, 0, n - 2)
    x0, y0 = xs[i].astype(np.float64), ys[i]
    out = y0 + (q - x0) / (xs[i + 1] - x0) * (ys[i + 1] - y0)
    rawc = np.clip(raw, 0, n - 1)
    out = np.where(xs[rawc] == q, ys[rawc], out)
    return np.where(q <= xs[0], ys[0], out)


def curve_ns_many(curve: Curve, q: np.ndarray) -> np.ndarray:
    """Vectorised :func:`curve_ns`: truncated to int64, at least 1."""
    v = interp1d_many(curve.keys, curve.values, q)
    return np.maximum(np.trunc(v), 1).astype(np.int64)


def curve_ns(curve: Curve, q: float) -> int:
    """A dense / per-sequence / MoE row latency: the 1-D lookup truncated to int, at least 1."""
    return max(int(interp1d(curve.xs, curve.ys, q)), 1)


def bucket_label(value: float, bins: Sequence[float], labels: Sequence[str]) -> str:
    """First label i with ``value <= bins[i+1]`` (right-inclusive); beyond the last edge, the last."""
    for i, lab in enumerate(labels):
        if value <= bins[i + 1]:
            return lab
    return labels[-1]


def skew_bucket_key(entry: SkewTpEntry, pc: int, kp: int, nd: int, skew_rate: float,
                    kv_max: int) -> str:
    """Bucket key of the alpha table: ``pc=<raw pc>|<n>|<skew rate>|<kv_big>|<kp>`` labels."""
    b, lab = entry.axes.bins, entry.axes.labels
    return (
        f"pc={pc}|{bucket_label(nd, b['n'], lab['n'])}"
        f"|{bucket_label(skew_rate, b['skew_rate'], lab['skew_rate'])}"
        f"|{bucket_label(kv_max, b['kv_big'], lab['kv_big'])}"
        f"|{bucket_label(kp, b['kp'], lab['kp'])}"
    )


# ------------------------------------------------------------------------------ table lookups


def _slice_value(table: AttentionTable, pair: tuple[int, int], kp: int, kv: int) -> float:
    sl = table.slices[pair]
    lo, hi, t = locate(sl.kp, kp)
    row = sl.rows[lo]
    v0 = interp1d(row.xs, row.ys, kv)
    if lo == hi:
        return v0
    row = sl.rows[hi]
    return v0 + t * (interp1d(row.xs, row.ys, kv) - v0)


class _AttentionLookup:
    """The 4-D attention blend over one :class:`AttentionTable` (with memoised corner fallbacks)."""

    __slots__ = ("table", "ragged_nd", "_nearest", "_memo", "_decode_fns")

    def __init__(self, table: AttentionTable, ragged_nd: bool) -> None:
        self.table = table
        self.ragged_nd = ragged_nd
        self._nearest: dict[tuple[int, int], tuple[int, int] | None] = {}
        self._memo: dict[tuple[int, int, int, int], int] = {}
        self._decode_fns: dict[int, Callable[[int], int]] = {}

    def _nearest_pair(self, p: int, n: int) -> tuple[int, int] | None:
        key = (p, n)
        if key not in self._nearest:
            best, best_d = None, None
            for pp, nn in self.table.pairs:  # sorted: the first minimum wins ties
                d = (pp - p) ** 2 + (nn - n) ** 2
                if best_d is None or d < best_d:
                    best, best_d = (pp, nn), d
            self._nearest[key] = best
        return self._nearest[key]

    def _corner(self, p: int, n: int, kp: int, kv: int) -> float:
        if (p, n) in self.table.slices:
            return _slice_value(self.table, (p, n), kp, kv)
        pair = self._nearest_pair(p, n)
        return 0.0 if pair is None else _slice_value(self.table, pair, kp, kv)

    def _at_pc(self, p: int, nd: int, kp: int, kv: int, nd_axis: Sequence[int]) -> float:
        lo, hi, t = locate(nd_axis, nd)
        c0 = self._corner(p, nd_axis[lo], kp, kv)
        if lo == hi:
            return c0
        return c0 + t * (self._corner(p, nd_axis[hi], kp, kv) - c0)

    def __call__(self, pc: int, kp: int, nd: int, kv: int) -> int:
        """Blended attention time, truncated to int, at least 1 ns (memoised)."""
        key = (pc, kp, nd, kv)
        v = self._memo.get(key)
        if v is None:
            if len(self._memo) >= _MAX_CACHE:
                self._memo.clear()
            v = self._memo[key] = self._blend(pc, kp, nd, kv)
        return v

    def decode_kv_fn(self, nd: int) -> Callable[[int], int]:
        """``kv -> self(0, 0, nd, kv)`` for a pure-decode batch of ``nd`` decodes: the same
        blend in the same float operations, with every part that does not depend on the decode
        KV (the pc, nd and kp brackets, the corner slices) looked up once (memoised per nd)."""
        fn = self._decode_fns.get(nd)
        if fn is None:
            fn = self._decode_fns[nd] = self._decode_fn(nd)
        return fn

    def _decode_fn(self, nd: int) -> Callable[[int], int]:
        tab = self.table
        lo, hi, t = locate(tab.pc_axis, 0)
        f0 = self._at_pc_fn(tab.pc_axis[lo], nd)
        if lo == hi:
            return lambda kv: max(int(f0(kv)), 1)
        f1 = self._at_pc_fn(tab.pc_axis[hi], nd)

        def blend(kv: int) -> int:
            v0 = f0(kv)
            return max(int(v0 + t * (f1(kv) - v0)), 1)

        return blend

    def _at_pc_fn(self, p: int, nd: int) -> Callable[[int], float]:
        nd_axis = self.table.nd_by_pc[p] if self.ragged_nd else self.table.nd_axis
        lo, hi, t = locate(nd_axis, nd)
        c0 = self._corner_fn(p, nd_axis[lo])
        if lo == hi:
            return c0
        c1 = self._corner_fn(p, nd_axis[hi])

        def at_pc(kv: int) -> float:
            v0 = c0(kv)
            return v0 + t * (c1(kv) - v0)

        return at_pc

    def _corner_fn(self, p: int, n: int) -> Callable[[int], float]:
        pair: tuple[int, int] | None = (p, n)
        if pair not in self.table.slices:
            pair = self._nearest_pair(p, n)
            if pair is None:
                return lambda kv: 0.0
        sl = self.table.slices[pair]
        lo, hi, t = locate(sl.kp, 0)
        r0 = sl.rows[lo]
        x0, y0 = r0.xs, r0.ys
        if lo == hi:
            return lambda kv: interp1d(x0, y0, kv)
        r1 = sl.rows[hi]
        x1, y1 = r1.xs, r1.ys

        def slice_value(kv: int) -> float:
            v0 = interp1d(x0, y0, kv)
            return v0 + t * (interp1d(x1, y1, kv) - v0)

        return slice_value

    def _blend(self, pc: int, kp: int, nd: int, kv: int) -> int:
        tab = self.table
        lo, hi, t = locate(tab.pc_axis, pc)
        p0 = tab.pc_axis[lo]
        v0 = self._at_pc(p0, nd, kp, kv, tab.nd_by_pc[p0] if self.ragged_nd else tab.nd_axis)
        if lo != hi:
            p1 = tab.pc_axis[hi]
            v1 = self._at_pc(p1, nd, kp, kv, tab.nd_by_pc[p1] if self.ragged_nd else tab.nd_axis)
            v0 = v0 + t * (v1 - v0)
        return max(int(v0), 1)


def moe_lookup_ns(table: MoeTable, tokens: int, activated: int) -> int:
    """MoE block time for ``tokens`` on one rank with ``activated`` experts hit (trunc, >= 1)."""
    lo, hi, t = locate(table.activated, activated)
    row = table.rows[lo]
    v = interp1d(row.xs, row.ys, tokens)
    if lo != hi:
        row = table.rows[hi]
        v = v + t * (interp1d(row.xs, row.ys, tokens) - v)
    return max(int(v), 1)


def balanced_routing(total_tokens: int, num_experts: int, top_k: int, ep: int) -> tuple[int, int]:
    """(tokens, activated experts) on each EP rank under the reference's BALANCED closed form.

    experts per rank = max(1, E // ep); activated = min(round(T*k/ep), experts per rank);
    tokens = round(T * (1 - ((ep-1)/ep)**k)) (a token reaches a rank if any of its k experts
    lives there; = T when ep = 1). ``round`` is Python's (half to even).
    """
    per_rank = max(1, num_experts // ep)
    activated = min(round(total_tokens * top_k / ep), per_rank)
    tokens = round(total_tokens * (1 - ((ep - 1) / ep) ** top_k))
    return tokens, activated


# ------------------------------------------------------------------------------------ the model


class ProfiledLatencyModel:
    """Prices a :class:`BatchShape` for one GPU of a TP group from a measured bundle.

    Parameters: ``bundle`` (loaded with :func:`profiles.bundle.load_bundle`), ``model``
    (architecture facts), ``tp`` (tensor-parallel degree; the ``tp<N>`` tables hold per-rank
    times), ``ep`` (expert-parallel degree for MoE routing), ``host_mem_bw_gbs`` (host memory
    bandwidth for the I/O term, None to drop it), ``reference_quirks`` (see module docstring),
    ``architecture`` (defaults to the shipped file for ``model.model_type``). It prices one
    pipeline stage holding every layer; ``profiles.parallel.latency.ParallelLatencyModel`` cuts
    a step into stages and adds the collectives.
    """

    def __init__(self, bundle: ProfileBundle, model: ModelSpec, tp: int = 1, *, ep: int = 1,
                 host_mem_bw_gbs: float | None = 256.0, reference_quirks: bool = True,
                 architecture: Architecture | None = None) -> None:
        if tp < 1:
            raise ConfigError(f"tp = {tp}: tensor-parallel degree must be >= 1")
        if ep < 1:
            raise ConfigError(f"ep = {ep}: expert-parallel degree must be >= 1")
        if model.num_layers < 1:
            raise ConfigError(f"model {model.name}: num_layers = {model.num_layers} must be >= 1")
        if host_mem_bw_gbs is not None and not host_mem_bw_gbs > 0:
            raise ConfigError(f"host_mem_bw_gbs = {host_mem_bw_gbs}: must be > 0 (or None to drop host I/O)")
        self.bundle = bundle
        self.model = model
        self.tp = tp
        self.ep = ep
        self.reference_quirks = reference_quirks
        self.arch = architecture or load_architecture(model.model_type)
        if self.arch.is_moe != model.is_moe:
            raise ConfigError(
                f"model {model.name}: architecture '{self.arch.family}' is "
                f"{'MoE' if self.arch.is_moe else 'dense'} but num_experts = {model.num_experts}; "
                "fix the model config or the architecture file"
            )
        self._tables = bundle.tables(tp)
        self._tp1 = bundle.tps.get(1, self._tables)
        self._fp_bytes = DTYPE_BYTES.get(model.dtype.lower())
        if self._fp_bytes is None:
            raise ConfigError(f"model {model.name}: dtype '{model.dtype}' unknown; use one of {sorted(DTYPE_BYTES)}")
        self._bw = host_mem_bw_gbs
        skip_rotary = "TPU" in bundle.hardware
        self._prologue = self._dense_rows(self.arch.prologue, skip_rotary)
        self._block = self._dense_rows(self.arch.block, skip_rotary)
        self._head = self._dense_rows(self.arch.head, skip_rotary)
        self._attention = _AttentionLookup(self._tables.attention, ragged_nd=not reference_quirks)
        self._moe: MoeTable | None = None
        if model.is_moe:
            self._moe = self._tp1.moe
            if self._moe is None:
                raise BundleError(
                    f"{self._tp1.folder}: moe.csv missing but {model.name} is a MoE model; "
                    "profile the MoE block (tp1/moe.csv)"
                )
        self._skew_entry = bundle.skew_fit.per_tp.get(tp)
        self._alpha_fallback = 0.0
        if bundle.skew_fit.enabled and self._skew_entry is None:
            self._alpha_fallback = bundle.skew_fit.alpha_default or 0.0
        self._tok_groups = self._group_rows("dense")
        self._seq_groups = self._group_rows("per_sequence")
        self._tok_cache: dict[int, int] = {}
        self._moe_cache: dict[int, int] = {}
        self._seq_cache: dict[int, int] = {}

    # ------------------------------------------------------------------ construction helpers

    def _group_rows(self, kind: str) -> list[tuple[tuple[int, ...], list[tuple[tuple[int, ...], int]]]]:
        """Rows of one key kind over the whole step, grouped by identical key grids.

        Each group is (keys, [(values, weight)]) with weight = rows per step (x num_layers for
        block rows), so one bracket per grid prices every row on it.
        """
        groups: dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]] = {}
        L = self.model.num_layers
        for mult, section in ((1, self._prologue), (L, self._block), (1, self._head)):
            for _, k, c, n in section:
                if k == kind:
                    groups.setdefault(c.xs, []).append((c.ys, mult * n))
        return list(groups.items())

    @staticmethod
    def _price_groups(groups, q: int) -> int:
        total = 0
        for xs, entries in groups:
            lo, hi, t = locate(xs, q)
            if lo == hi:
                for ys, w in entries:
                    total += w * ys[lo]  # profile values are integer ns >= 1
            else:
                for ys, w in entries:
                    y0 = ys[lo]
                    total += w * max(int(y0 + t * (ys[hi] - y0)), 1)
        return total

    def _token_part(self, tokens: int) -> int:
        """All dense rows keyed on total tokens, whole step."""
        v = self._tok_cache.get(tokens)
        if v is None:
            v = self._price_groups(self._tok_groups, max(tokens, 1))
            if len(self._tok_cache) >= _MAX_CACHE:
                self._tok_cache.clear()
            self._tok_cache[tokens] = v
        return v

    def _seq_part(self, seqs: int) -> int:
        """All per-sequence rows (lm_head, sampler), whole step."""
        v = self._seq_cache.get(seqs)
        if v is None:
            v = self._price_groups(self._seq_groups, max(seqs, 1))
            if len(self._seq_cache) >= _MAX_CACHE:
                self._seq_cache.clear()
            self._seq_cache[seqs] = v
        return v

    def _dense_rows(self, names: Sequence[str], skip_rotary: bool) -> list[tuple[str, str, Curve, int]]:
        """(name, kind, curve, count) for the dense / per-sequence rows of one section."""
        rows: dict[str, tuple[str, str, Curve, int]] = {}
        for name in names:
            rule = self.arch.layers[name]
            if rule.table not in ("dense", "per_sequence") or (rule.rotary and skip_rotary):
                continue
            src = self._tp1 if rule.tp_invariant else self._tables
            curve = getattr(src, rule.table).get(name)
            if curve is None:
                log.warning("layer '%s' not in %s/%s.csv: it is skipped (costs 0 ns)",
                            name, src.folder, rule.table)
                continue
            _, kind, _, count = rows.get(name, (name, rule.table, curve, 0))
            rows[name] = (name, kind, curve, count + 1)
        return list(rows.values())

    # --------------------------------------------------------------------------- row prices

    def attention_ns(self, shape: BatchShape) -> int:
        """Attention row of one layer, with the skew correction for heterogeneous decodes.

        t_mean = 4-D lookup at the floored mean decode KV. If there are >= 2 decodes whose max
        KV exceeds the mean, alpha comes from the bundle's skew fit (bucket key on the raw
        prefill chunk, n_decode, skew rate (mean-min)/(max-min), max KV and prefill KV; else the
        TP entry's alpha_default; 0 without a fit) and the result is
        round(t_mean + alpha*(t_max - t_mean)) when t_max > t_mean, else t_mean.
        """
        pc, kp, nd = shape.prefill_tokens, shape.prefill_kv, shape.num_decode
        if pc == 0 and nd == 0:
            return 0
        kv_mean = shape.decode_kv_sum // nd if nd else 0
        t_mean = self._attention(pc, kp, nd, kv_mean)
        kv_max = shape.decode_kv_max
        if nd <= 1 or kv_max == kv_mean:
            return t_mean
        alpha = self.skew_alpha(shape)
        if alpha == 0:
            return t_mean
        t_max = self._attention(pc, kp, nd, kv_max)
        if t_max <= t_mean:
            return t_mean
        return max(round(t_mean + alpha * (t_max - t_mean)), 1)

    def skew_alpha(self, shape: BatchShape) -> float:
        """The alpha the skew correction uses for this batch (0 when the bundle has no fit)."""
        entry = self._skew_entry
        if entry is None:
            return self._alpha_fallback
        nd = shape.num_decode
        kv_mean = shape.decode_kv_sum // nd if nd else 0
        gap = shape.decode_kv_max - shape.decode_kv_min
        rate = (kv_mean - shape.decode_kv_min) / gap if gap else 0.5
        rate = min(max(rate, 0.0), 1.0)
        key = skew_bucket_key(entry, shape.prefill_tokens, shape.prefill_kv, nd, rate,
                              shape.decode_kv_max)
        return entry.table.get(key, entry.alpha_default)

    def moe_ns(self, shape: BatchShape) -> int:
        """MoE block of one layer on this GPU's EP rank (0 for dense models or no routed tokens),
        for the ``moe_tokens`` the experts see (``total_tokens`` unless set)."""
        if self._moe is None:
            return 0
        return self._moe_for_tokens(shape.moe_tokens or shape.total_tokens)

    def _moe_for_tokens(self, total_tokens: int) -> int:
        v = self._moe_cache.get(total_tokens)
        if v is None:
            tokens, activated = balanced_routing(total_tokens, self.model.num_experts,
                                                 self.model.num_experts_per_tok, self.ep)
            v = 0 if tokens <= 0 else moe_lookup_ns(self._moe, tokens, max(activated, 1))
            if len(self._moe_cache) >= _MAX_CACHE:
                self._moe_cache.clear()
            self._moe_cache[total_tokens] = v
        return v

    def host_io_ns(self, shape: BatchShape) -> int:
        """Host-memory load of the step's token ids (0 when disabled; see module docstring)."""
        bw = self._bw
        if bw is None:
            return 0
        return 2 * math.floor(shape.total_tokens * 2 * self._fp_bytes / bw)

    # ------------------------------------------------------------------------------ public API

    def iteration_ns(self, shape: BatchShape) -> int:
        """Wall time of one step of this batch on one GPU, integer ns."""
        return (self._token_part(shape.total_tokens) + self._seq_part(shape.num_seqs)
                + self.model.num_layers * (self.attention_ns(shape) + self.moe_ns(shape))
                + self.host_io_ns(shape))

    def decode_steps_ns(self, shape: BatchShape, k: int) -> list[int]:
        """:meth:`iteration_ns` of ``k`` consecutive steps of the same decodes: step ``i``
        (0-based) is ``shape`` with every decode ``i`` tokens further (``decode_kv_sum +
        i * num_decode``, ``decode_kv_min + i``, ``decode_kv_max + i``). The same integers as
        ``k`` scalar calls; what does not change along the run (the token, sequence, MoE and
        host parts, the attention brackets other than the decode KV, the skew rate) is looked
        up once. ``shape`` must have no prefill part."""
        if shape.prefill_tokens or shape.prefill_kv:
            raise ValueError("decode_steps_ns: the shape has a prefill part")
        nd = shape.num_decode
        L = self.model.num_layers
        fixed = (self._token_part(shape.total_tokens) + self._seq_part(shape.num_seqs)
                 + self.host_io_ns(shape) + L * self.moe_ns(shape))
        if nd == 0:
            return [fixed] * k
        attn = self._attention.decode_kv_fn(nd)
        kv_mean = shape.decode_kv_sum // nd  # (sum + i*nd) // nd == sum // nd + i
        kv_max = shape.decode_kv_max
        if nd <= 1 or kv_max == kv_mean:  # no skew correction anywhere along the run
            return [fixed + L * attn(kv_mean + i) for i in range(k)]
        alpha_of = self._span_alpha_fn(shape)
        out = []
        for i in range(k):
            t_mean = attn(kv_mean + i)
            a = alpha_of(i)
            v = t_mean
            if a != 0:
                t_max = attn(kv_max + i)
                if t_max > t_mean:
                    v = max(round(t_mean + a * (t_max - t_mean)), 1)
            out.append(fixed + L * v)
        return out

    def _span_alpha_fn(self, shape: BatchShape) -> Callable[[int], float]:
        """``i -> skew_alpha(step i of a decode run from shape)``: along the run the skew rate
        is constant and only the ``kv_big`` bucket of ``decode_kv_max + i`` moves."""
        entry = self._skew_entry
        if entry is None:
            fallback = self._alpha_fallback
            return lambda i: fallback
        bins, labels = entry.axes.bins["kv_big"], entry.axes.labels["kv_big"]
        by_label: dict[str, float] = {}

        def alpha(i: int) -> float:
            lab = bucket_label(shape.decode_kv_max + i, bins, labels)
            a = by_label.get(lab)
            if a is None:
                a = by_label[lab] = self.skew_alpha(self._advanced(shape, i))
            return a

        return alpha

    @staticmethod
    def _advanced(shape: BatchShape, i: int) -> BatchShape:
        """``shape`` with every decode ``i`` tokens further."""
        return shape._replace(decode_kv_sum=shape.decode_kv_sum + i * shape.num_decode,
                              decode_kv_min=shape.decode_kv_min + i,
                              decode_kv_max=shape.decode_kv_max + i)

    def breakdown(self, shape: BatchShape) -> dict[str, int]:
        """Nanoseconds per row name over the whole step (all layers), plus ``host_io``.

        The values sum to :meth:`iteration_ns`.
        """
        tok = max(shape.total_tokens, 1)
        seq = max(shape.num_seqs, 1)
        out: dict[str, int] = {}
        L = self.model.num_layers
        for mult, section in ((1, self._prologue), (L, self._block), (1, self._head)):
            for name, kind, c, n in section:
                q = seq if kind == "per_sequence" else tok
                out[name] = out.get(name, 0) + mult * n * curve_ns(c, q)
        out["attention"] = L * self.attention_ns(shape)
        if self._moe is not None:
            out["moe"] = L * self.moe_ns(shape)
        out["host_io"] = self.host_io_ns(shape)
        return out

    def stage_ns(self, shape: BatchShape) -> int:
        """When the next step may start: one stage holds every layer, so the whole step
        (``engine.batch.LatencyModel``)."""
        return self.iteration_ns(shape)

    def clear_cache(self) -> None:
        """Forget every memoised value (per-token / MoE / per-sequence parts, attention)."""
        self._tok_cache.clear()
        self._moe_cache.clear()
        self._seq_cache.clear()
        self._attention._memo.clear()
        self._attention._decode_fns.clear()
