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
num_seqs, the MoE part per token count and the pure-decode attention blend per n_decode (whole
steps are not: a step's decode KV sum changes every step, so such a memo never hits; nor are
mixed batches' blends, whose (pc, kp, nd) almost never repeat).
:meth:`ProfiledLatencyModel.decode_steps_ns` prices a run of pure-decode steps at once
(numpy over the steps), returning the same integers as one :meth:`iteration_ns` call per step.
"""

from __future__ import annotations

import logging
import math
import weakref
from array import array
from bisect import bisect_right
from collections.abc import Sequence

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


def bucket_index(value: float, bins: Sequence[float], num_labels: int) -> int:
    """Index of the first label i with ``value <= bins[i+1]`` (right-inclusive); beyond the
    last edge, the last (``num_labels - 1``)."""
    for i in range(num_labels):
        if value <= bins[i + 1]:
            return i
    return num_labels - 1


def bucket_label(value: float, bins: Sequence[float], labels: Sequence[str]) -> str:
    """First label i with ``value <= bins[i+1]`` (right-inclusive); beyond the last edge, the last."""
    return labels[bucket_index(value, bins, len(labels))]


def _bucket_key_text(entry: SkewTpEntry, pc: int, i_n: int, i_rate: int, i_kv: int,
                     i_kp: int) -> str:
    """Bucket key of the alpha table, ``pc=<raw pc>|<n>|<skew rate>|<kv_big>|<kp>`` labels,
    from the bucket indices of :func:`bucket_index`."""
    lab = entry.axes.labels
    return (f"pc={pc}|{lab['n'][i_n]}|{lab['skew_rate'][i_rate]}|{lab['kv_big'][i_kv]}"
            f"|{lab['kp'][i_kp]}")


class _SkewAlphas:
    """One TP entry's alpha table read by bucket indices: the key string
    (:func:`_bucket_key_text`) is built once per distinct (pc, bucket indices) and its alpha
    remembered."""

    __slots__ = ("entry", "n_bins", "rate_bins", "kv_bins", "kp_bins", "n_n", "n_rate", "n_kv",
                 "n_kp", "_memo", "_last_key", "_last_alpha")

    def __init__(self, entry: SkewTpEntry) -> None:
        self.entry = entry
        b, lab = entry.axes.bins, entry.axes.labels
        self.n_bins, self.n_n = b["n"], len(lab["n"])
        self.rate_bins, self.n_rate = b["skew_rate"], len(lab["skew_rate"])
        self.kv_bins, self.n_kv = b["kv_big"], len(lab["kv_big"])
        self.kp_bins, self.n_kp = b["kp"], len(lab["kp"])
        self._memo: dict[int, float] = {}
        self._last_key = -1  # the last key asked for and its alpha
        self._last_alpha = 0.0

    def alpha(self, pc: int, kp: int, nd: int, rate: float, kv_max: int) -> float:
        """The table's alpha for this batch's bucket key, else the entry's alpha_default."""
        return self.alpha_at(pc, bucket_index(nd, self.n_bins, self.n_n),
                             bucket_index(rate, self.rate_bins, self.n_rate),
                             bucket_index(kv_max, self.kv_bins, self.n_kv),
                             bucket_index(kp, self.kp_bins, self.n_kp))

    def alpha_at(self, pc: int, i_n: int, i_rate: int, i_kv: int, i_kp: int) -> float:
        # One int per (pc, bucket indices): cheaper to build and hash than a tuple.
        key = (((pc * self.n_n + i_n) * self.n_rate + i_rate) * self.n_kv + i_kv) * self.n_kp + i_kp
        if key == self._last_key:  # a decode span's steps mostly share their bucket
            return self._last_alpha
        a = self._memo.get(key)
        if a is None:
            text = _bucket_key_text(self.entry, pc, i_n, i_rate, i_kv, i_kp)
            a = self._memo[key] = self.entry.table.get(text, self.entry.alpha_default)
        self._last_key = key
        self._last_alpha = a
        return a


# ------------------------------------------------------------------------------ table lookups
#
# The 4-D attention blend is built, for one (prefill chunk, prefill KV, n_decode), as a small
# tree of terms along the decode-KV axis: each leaf a profiled kv_decode row (:class:`_Row`),
# each inner node a linear blend of two terms (:class:`_Lerp`) on the kv_prefill, n_decode or
# prefill-chunk axis. Evaluating it at a decode KV performs the float operations of the blend
# in the blend's order, so every batch with those three values reuses the brackets and corner
# choices (a decode span: only the decode KV moves).


class _KvFn:
    """A term of the attention blend, as a function of the decode KV (this base: the zero
    term of an unprofiled corner with no pair to fall back on)."""

    __slots__ = ()

    def at(self, kv: float) -> float:
        return 0.0

    def run(self, kv0: int, k: int, out: array) -> None:
        """``out[i] = self.at(kv0 + i)`` for ``i < k``: the term along a decode span, where
        the decode KV moves by one token a step (the same floats as ``k`` calls of
        :meth:`at`, each term's lookups made once for the run)."""
        for i in range(k):
            out[i] = 0.0


class _Row(_KvFn):
    """One profiled kv_decode row: :func:`interp1d` over its keys, on C doubles when
    compiled (the keys and values are integers below 2**53, so the same results)."""

    __slots__ = ("xs", "ys", "n")  # set by _rows_of

    def at(self, kv: float) -> float:
        n = self.n
        if n == 0:
            return 0.0
        if n == 1:
            return self.ys[0]
        return self._on_bracket(self._bracket(kv), kv)

    def run(self, kv0: int, k: int, out: array) -> None:
        """:meth:`at` along a run: the bracket is found once and then moved up key by key as
        the KV passes them; each value is :meth:`_on_bracket`'s, as for :meth:`at`."""
        n = self.n
        if n <= 1:  # a row of no key or one has one value: at()'s
            first = self.at(kv0)
            for i in range(k):
                out[i] = first
            return
        j = self._bracket(kv0)
        for i in range(k):
            kv = kv0 + i
            while j + 1 < n and self.xs[j + 1] <= kv:
                j += 1
            out[i] = self._on_bracket(j, kv)

    def _bracket(self, kv: float) -> int:
        """The last key at or below ``kv`` (bisect_right - 1; 0 when ``kv <= xs[0]``)."""
        if kv <= self.xs[0]:
            return 0
        lo, hi = 1, self.n  # bisect_right: the first key above kv (xs[0] < kv)
        while lo < hi:
            mid = (lo + hi) // 2
            if kv < self.xs[mid]:
                hi = mid
            else:
                lo = mid + 1
        return lo - 1

    def _on_bracket(self, j: int, kv: float) -> float:
        """The row's value at ``kv`` (two keys at least), ``j`` its :meth:`_bracket`: the
        first value at or below the first key, a key's own value, else the line through the
        bracketing pair (the top two above the last key)."""
        if kv <= self.xs[0]:
            return self.ys[0]
        if self.xs[j] == kv:
            return self.ys[j]
        if j >= self.n - 1:
            j = self.n - 2
        x0 = self.xs[j]
        y0 = self.ys[j]
        return y0 + (kv - x0) / (self.xs[j + 1] - x0) * (self.ys[j + 1] - y0)


def _rows_of(curves: Sequence[Curve]) -> tuple[_Row, ...]:
    """The rows of one profiled slice. Compiled, their keys and values share one buffer of
    doubles viewed once, each row a slice of that view (taking a typed view of a new array
    costs more than filling it; ``array('d', ints)`` parses each item); interpreted, each row
    holds copies (array slices) of the same values."""
    total = 0
    for c in curves:
        total += len(c.xs)
    view = array("d", bytes(16 * total))  # the keys of every row, then their values
    built = []
    at = 0
    for c in curves:
        xs = c.xs
        ys = c.ys
        n = len(xs)
        for i in range(n):
            view[at + i] = xs[i]
            view[total + at + i] = ys[i]
        row = _Row.__new__(_Row)
        row.xs = view[at:at + n]
        row.ys = view[total + at:total + at + n]
        row.n = n
        built.append(row)
        at += n
    return tuple(built)


# Steps of a decode run that the model's buffers and each pure-decode blend's (its second
# term's values) hold; decode_steps_ns prices a longer run in pieces of this many, so a blend's
# run() is never asked for more. Runs are mostly a few to a few dozen steps; a blend is kept
# per n_decode (up to max_num_seqs of them), so buffers grown to the longest run would hold
# their memory. They are written by every call: a model and its blends are for one thread at
# a time (the engine is single-threaded).
_RUN_SCRATCH = 256


def _new_run_buffer() -> array:
    """A buffer for runs of up to ``_RUN_SCRATCH`` values."""
    return array("d", bytes(8 * _RUN_SCRATCH))


class _Lerp(_KvFn):
    """``a(kv) + t * (b(kv) - a(kv))``: the blend of two terms at weight ``t``."""

    __slots__ = ("a", "b", "t", "_other")

    def __init__(self, a: _KvFn, b: _KvFn, t: float) -> None:
        self.a = a
        self.b = b
        self.t = t
        self._other = None  # run()'s values of ``b`` (_new_run_buffer), made on first use

    def at(self, kv: float) -> float:
        v0 = self.a.at(kv)
        return v0 + self.t * (self.b.at(kv) - v0)

    def run(self, kv0: int, k: int, out: array) -> None:
        """(``k`` at most ``_RUN_SCRATCH``.)"""
        if self._other is None:
            self._other = _new_run_buffer()
        other = self._other
        self.a.run(kv0, k, out)
        self.b.run(kv0, k, other)
        t = self.t
        for i in range(k):
            v0 = out[i]
            out[i] = v0 + t * (other[i] - v0)


def attention_at(fn: _KvFn, kv: int) -> int:
    """The blend ``fn`` at decode KV ``kv``, truncated to int, at least 1 ns."""
    return attention_ns_of(fn.at(kv))


def attention_ns_of(value: float) -> int:
    """A value of the attention blend as :func:`attention_at` gives it: truncated to int, at
    least 1 ns."""
    v = int(value)
    return v if v > 1 else 1


class _AttentionLookup:
    """The 4-D attention blend over one :class:`AttentionTable` (with memoised corner
    fallbacks and blend terms)."""

    __slots__ = ("table", "ragged_nd", "_pc_axis", "_nd_axis", "_slices", "_nd_by_pc",
                 "_nearest", "_rows", "_memo", "_pc_memo", "__weakref__")

    def __init__(self, table: AttentionTable, ragged_nd: bool) -> None:
        self.table = table
        self.ragged_nd = ragged_nd
        self._pc_axis = table.pc_axis
        self._nd_axis = table.nd_axis
        self._slices = table.slices
        self._nd_by_pc = table.nd_by_pc
        self._nearest: dict[tuple[int, int], tuple[int, int] | None] = {}
        self._rows: dict[tuple[int, int], tuple[_Row, ...]] = {}
        # n_decode -> the pure-decode blend (pc = kp = 0) over the decode KV: a run has few
        # distinct ones, while its mixed batches almost never repeat (pc, kp, nd), so those
        # are built per call.
        self._memo: dict[int, _KvFn] = {}
        # (profiled prefill chunk, n_decode) -> that pc slice's blend without prefill KV: a
        # mixed batch's chunk is mostly a prompt's first (kp = 0), and the bracketing grid
        # chunks and n_decode repeat where (pc, kp, nd) does not.
        self._pc_memo: dict[int, _KvFn] = {}

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

    def __call__(self, pc: int, kp: int, nd: int, kv: int) -> int:
        """Blended attention time, truncated to int, at least 1 ns."""
        return attention_at(self.kv_fn(pc, kp, nd), kv)

    def kv_fn(self, pc: int, kp: int, nd: int) -> _KvFn:
        """The blend at (``pc``, ``kp``, ``nd``) as a function of the decode KV (memoised for
        pure decodes)."""
        if pc or kp:
            return self._blend(pc, kp, nd)
        fn = self._memo.get(nd)
        if fn is None:
            fn = self._memo[nd] = self._blend(0, 0, nd)
        return fn

    def _blend(self, pc: int, kp: int, nd: int) -> _KvFn:
        axis = self._pc_axis
        lo, hi, t = locate(axis, pc)
        f0 = self._at_pc_cached(axis[lo], nd, kp)
        if lo == hi:
            return f0
        return _Lerp(f0, self._at_pc_cached(axis[hi], nd, kp), t)

    def _at_pc_cached(self, p: int, nd: int, kp: int) -> _KvFn:
        """:meth:`_at_pc`, memoised when ``kp`` is 0 (and n_decode below 2**24, the key's
        field)."""
        if kp or nd >> 24:
            return self._at_pc(p, nd, kp)
        key = (p << 24) | nd
        fn = self._pc_memo.get(key)
        if fn is None:
            fn = self._pc_memo[key] = self._at_pc(p, nd, 0)
        return fn

    def _at_pc(self, p: int, nd: int, kp: int) -> _KvFn:
        nd_axis = self._nd_by_pc[p] if self.ragged_nd else self._nd_axis
        lo, hi, t = locate(nd_axis, nd)
        c0 = self._corner(p, nd_axis[lo], kp)
        if lo == hi:
            return c0
        return _Lerp(c0, self._corner(p, nd_axis[hi], kp), t)

    def _corner(self, p: int, n: int, kp: int) -> _KvFn:
        pair: tuple[int, int] | None = (p, n)
        sl = self._slices.get(pair)
        if sl is None:
            pair = self._nearest_pair(p, n)
            if pair is None:
                return _KvFn()
            sl = self._slices[pair]
        rows = self._rows.get(pair)
        if rows is None:
            rows = self._rows[pair] = _rows_of(sl.rows)
        lo, hi, t = locate(sl.kp, kp)
        if lo == hi:
            return rows[lo]
        return _Lerp(rows[lo], rows[hi], t)


# Every latency model over one attention table shares its lookup (see attention_lookup).
_LOOKUPS: weakref.WeakValueDictionary[tuple[int, bool], _AttentionLookup] = (
    weakref.WeakValueDictionary())


def attention_lookup(table: AttentionTable, ragged_nd: bool) -> _AttentionLookup:
    """The one :class:`_AttentionLookup` of ``table``: every latency model over the same table
    (the replicas of a deployment, the points of a sweep on one bundle) shares its corner,
    row and pure-decode memos, which are functions of the table alone, so each row is built
    once per process instead of once per instance. Held weakly: it lives as long as a model
    uses it (and it holds the table, so the id in its key stays the table's)."""
    key = (id(table), ragged_nd)
    lookup = _LOOKUPS.get(key)
    if lookup is None or lookup.table is not table:
        lookup = _AttentionLookup(table, ragged_nd)
        _LOOKUPS[key] = lookup
    return lookup


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


def _decode_run_ns(attn: _KvFn, skew: _SkewAlphas | None, fallback: float, fixed: int, L: int,
                   nd: int, kv_mean: int, kv_max: int, rate: float, k: int, means: array,
                   maxes: array, out: list[int]) -> None:
    """The body of :meth:`ProfiledLatencyModel.decode_steps_ns`: appends to ``out`` the
    prices of ``k`` (at most ``_RUN_SCRATCH``) steps of ``nd`` decodes from mean / max decode
    KV ``kv_mean`` / ``kv_max`` (each step one token further), ``attn`` the pure-decode blend,
    ``fixed`` the step's parts that do not move. ``means`` and ``maxes`` (the model's
    buffers) take the blend's values at ``kv_mean + i`` and ``kv_max + i``, evaluated along
    the run at once (:meth:`_KvFn.run`: what :func:`attention_at` reads, without a bracket
    search a step)."""
    attn.run(kv_mean, k, means)
    if nd <= 1 or kv_max == kv_mean:  # no skew correction anywhere along the run
        for i in range(k):
            out.append(fixed + L * attention_ns_of(means[i]))
        return
    have_maxes = False  # evaluated at the first step with a non-zero alpha
    # Along the run the skew rate is constant and only the kv_big bucket of kv_max + i moves:
    # alpha is read by bucket index, again only once kv_max + i passes the bucket's upper edge
    # (bucket_index returns the first bucket whose edge holds the value: until the value
    # passes that edge, the same one).
    a = fallback
    i_n = i_rate = i_kp = i_kv = 0
    edge = math.inf  # without a skew fit alpha stays the fallback
    if skew is not None:
        i_n = bucket_index(nd, skew.n_bins, skew.n_n)
        i_rate = bucket_index(rate, skew.rate_bins, skew.n_rate)
        i_kp = bucket_index(0, skew.kp_bins, skew.n_kp)
        edge = -math.inf  # the first step looks its bucket up
    for i in range(k):
        t_mean = attention_ns_of(means[i])
        if kv_max + i > edge:
            assert skew is not None
            i_kv = bucket_index(kv_max + i, skew.kv_bins, skew.n_kv)
            edge = skew.kv_bins[i_kv + 1] if i_kv < skew.n_kv - 1 else math.inf
            a = skew.alpha_at(0, i_n, i_rate, i_kv, i_kp)
        v = t_mean
        if a != 0:
            if not have_maxes:
                attn.run(kv_max, k, maxes)
                have_maxes = True
            t_max = attention_ns_of(maxes[i])
            if t_max > t_mean:
                v = round_even(t_mean + a * (t_max - t_mean))
                if v < 1:
                    v = 1
        out.append(fixed + L * v)


def round_even(x: float) -> int:
    """``round(x)`` of a finite float (ties to even) in integer arithmetic, so that it compiles
    to C (the builtin is a Python call per decode step): the floor, then one up when the
    fraction is above a half, or exactly a half on an odd floor. ``x - floor`` is exact for
    these magnitudes (nanoseconds, far below 2**52)."""
    f = int(x)
    if f > x:  # int() truncates: the floor of a negative non-integer is one lower
        f -= 1
    d = x - f
    if d > 0.5 or (d == 0.5 and f % 2 != 0):
        f += 1
    return f


def _skew_rate(shape: BatchShape) -> float:
    """The skew rate of a batch's decodes: (floored mean - min) / (max - min) in [0, 1]
    (0.5 when they are uniform)."""
    nd = shape.num_decode
    kv_mean = shape.decode_kv_sum // nd if nd else 0
    gap = shape.decode_kv_max - shape.decode_kv_min
    rate = (kv_mean - shape.decode_kv_min) / gap if gap else 0.5
    return min(max(rate, 0.0), 1.0)


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
        self._attention = attention_lookup(self._tables.attention, not reference_quirks)
        self._moe: MoeTable | None = None
        if model.is_moe:
            self._moe = self._tp1.moe
            if self._moe is None:
                raise BundleError(
                    f"{self._tp1.folder}: moe.csv missing but {model.name} is a MoE model; "
                    "profile the MoE block (tp1/moe.csv)"
                )
        self._skew_entry = bundle.skew_fit.per_tp.get(tp)
        self._skew = _SkewAlphas(self._skew_entry) if self._skew_entry is not None else None
        self._alpha_fallback = 0.0
        if bundle.skew_fit.enabled and self._skew_entry is None:
            self._alpha_fallback = bundle.skew_fit.alpha_default or 0.0
        self._tok_groups = self._group_rows("dense")
        self._seq_groups = self._group_rows("per_sequence")
        self._tok_cache: dict[int, int] = {}
        self._moe_cache: dict[int, int] = {}
        self._seq_cache: dict[int, int] = {}
        self._means = _new_run_buffer()  # decode_steps_ns's values of the blend
        self._maxes = _new_run_buffer()

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
        fn = self._attention.kv_fn(pc, kp, nd)
        t_mean = attention_at(fn, kv_mean)
        kv_max = shape.decode_kv_max
        if nd <= 1 or kv_max == kv_mean:
            return t_mean
        alpha = self.skew_alpha(shape)
        if alpha == 0:
            return t_mean
        t_max = attention_at(fn, kv_max)
        if t_max <= t_mean:
            return t_mean
        return max(round_even(t_mean + alpha * (t_max - t_mean)), 1)

    def skew_alpha(self, shape: BatchShape) -> float:
        """The alpha the skew correction uses for this batch (0 when the bundle has no fit)."""
        skew = self._skew
        if skew is None:
            return self._alpha_fallback
        nd = shape.num_decode
        return skew.alpha(shape.prefill_tokens, shape.prefill_kv, nd, _skew_rate(shape),
                          shape.decode_kv_max)

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
        kv_mean = shape.decode_kv_sum // nd  # (sum + i*nd) // nd == sum // nd + i
        kv_max = shape.decode_kv_max
        attn = self._attention.kv_fn(0, 0, nd)
        rate = _skew_rate(shape)
        out: list[int] = []
        piece = _RUN_SCRATCH  # the steps the buffers hold
        for first in range(0, k, piece):  # step ``first + i`` of the run: KVs + first + i
            _decode_run_ns(attn, self._skew, self._alpha_fallback, fixed, L, nd, kv_mean + first,
                           kv_max + first, rate, min(k - first, piece), self._means,
                           self._maxes, out)
        return out

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
        """Forget every memoised value (per-token / MoE / per-sequence parts, attention; the
        attention memos are shared by every model over the same table, see
        :func:`attention_lookup`, so theirs go too)."""
        self._tok_cache.clear()
        self._moe_cache.clear()
        self._seq_cache.clear()
        self._attention._memo.clear()
        self._attention._pc_memo.clear()
