"""Request state in vLLM V1 terms (``vllm/v1/request.py``).

The engine knows every token id of a replayed request in advance: the prompt ids from the
workload, the output ids from the workload or generated (:func:`synthetic_output_ids`). It
keeps no copy of them: the request refers to its spec's prompt ids and its output ids (a
``range`` when generated), and ``num_tokens`` says how much of the sequence has been
*reached* (prompt plus the outputs accepted so far).

Block hashes are vLLM's chained block hashes (``kv_cache_utils.hash_block_tokens``: each
full block hashed with its parent's hash) and, as vLLM's request block hasher does, only
full blocks of the tokens reached so far get one (``Request.block_hashes``). They are
computed on demand, the first time the KV manager, a tier or the router needs one: every
full block of the whole sequence at once, since its ids are known (a hash depends on the
block's tokens and its parent alone, so when it is computed does not change its value; the
KV manager then asks once per block boundary crossed, and each ask only reads them), kept as
one uint64 array (8 bytes a hash, no int object per block), and dropped when the request
finishes.

Output token times are kept as runs of steps: each scheduler logs the time of every step
it applies (:class:`TokenLog`), and a request records which contiguous runs of that log
gave it a token; :attr:`Request.token_times_ns` reads them back.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence
from enum import IntEnum

import numpy as np

from engine.workload import RequestSpec

# The parent hash of block 0 (vLLM's NONE_HASH). Any fixed value works: hashes only need
# to be equal for equal prefixes within one simulation.
NONE_HASH = 0x5E7E5EED


class RequestStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


# The same states as plain module constants: hot loops compare against these (an enum
# member lookup costs several times an int compare).
WAITING = RequestStatus.WAITING
RUNNING = RequestStatus.RUNNING
PREEMPTED = RequestStatus.PREEMPTED
FINISHED = RequestStatus.FINISHED


def _fill_range(out: array, start: int, step: int) -> None:
    """``out[i] = start + i * step`` for every slot (a C loop when compiled)."""
    for i in range(len(out)):
        out[i] = start + i * step


def _int64_array(ids: Sequence[int]) -> array:
    """``ids`` as a new ``array('q')`` of int64 (ids are range-checked to int64 by the readers;
    a ``range``, the generated and placeholder ids, is filled without a numpy round trip, and
    an ``array('q')``, the ids the readers load, is copied whole)."""
    if isinstance(ids, range):
        out = array("q", [0]) * len(ids)
        _fill_range(out, ids.start, ids.step)
        return out
    if isinstance(ids, array) and ids.typecode == "q":  # the readers' ids: one copy
        return ids[:]
    out = array("q")
    out.frombytes(np.asarray(ids, dtype=np.int64).tobytes())
    return out


# The block hash: 64-bit unsigned arithmetic (every Python step is masked to 64 bits, so the
# interpreted and the compiled module, where the same lines run on C integers, agree).
_M64 = 0xFFFFFFFFFFFFFFFF
_MUL = 0x9E3779B97F4A7C15  # 2^64 / golden ratio (Fibonacci hashing)
_FMIX1 = 0xFF51AFD7ED558CCD  # MurmurHash3's 64-bit finaliser constants
_FMIX2 = 0xC4CEB9FE1A85EC53


def _mix(h: int, token: int) -> int:
    """One id folded into a block's running hash: xor-ed in, multiplied by an odd constant
    and folded."""
    h = ((h ^ (token & _M64)) * _MUL) & _M64
    return h ^ (h >> 29)


def _finalise(h: int) -> int:
    """MurmurHash3's 64-bit finaliser: a block's hash once its last id is folded in."""
    h ^= h >> 33
    h = (h * _FMIX1) & _M64
    h ^= h >> 33
    h = (h * _FMIX2) & _M64
    return h ^ (h >> 33)


def _hash_block(parent: int, ids: array, start: int, n: int) -> int:
    """The chained hash of the block ``ids[start : start + n]`` under ``parent``
    (:func:`_mix` per id, then :func:`_finalise`). Equal for equal (parent, block) pairs."""
    h = parent
    for i in range(start, start + n):
        h = _mix(h, ids[i])
    return _finalise(h)


def _hash_blocks(parent: int, ids: array, first: int, end: int, block_size: int,
                 out: array) -> None:
    """Write the chained hash of blocks ``first .. end - 1`` of ``ids`` to ``out[first ..
    end - 1]`` (a uint64 array of at least ``end`` entries).

    vLLM's ``hash_block_tokens`` hashes ``(parent_block_hash, tuple(block_token_ids),
    extra_keys)`` with sha256 or Python's hash; here :func:`_hash_block`, a 64-bit hash of the
    parent and the block's int64 ids, which is equal for equal blocks, deterministic across
    processes (simulations are reproducible) and runs in C when compiled.
    """
    for k in range(first, end):
        parent = _hash_block(parent, ids, k * block_size, block_size)
        out[k] = parent


def _hash_range_blocks(parent: int, first: int, end: int, block_size: int, prompt_len: int,
                       p_start: int, p_step: int, o_start: int, o_step: int,
                       out: array) -> None:
    """:func:`_hash_blocks` of a sequence whose prompt and outputs are both ``range``s
    (``prompt_len`` ids from ``p_start`` by ``p_step``, then outputs from ``o_start`` by
    ``o_step``: placeholder prompts and generated outputs), each id computed where it is
    folded in, so the sequence is never laid out as an array. The same hashes."""
    for k in range(first, end):
        h = parent
        pos = k * block_size
        stop = pos + block_size
        split = prompt_len if prompt_len < stop else stop  # the block's prompt ids: pos .. split
        tok = p_start + pos * p_step
        while pos < split:
            h = _mix(h, tok)
            tok += p_step
            pos += 1
        tok = o_start + (pos - prompt_len) * o_step
        while pos < stop:
            h = _mix(h, tok)
            tok += o_step
            pos += 1
        parent = _finalise(h)
        out[k] = parent


def chained_block_hashes(token_ids: Sequence[int], block_size: int) -> array:
    """The chained hash of every full block of ``token_ids``: ``h_i = H(h_{i-1}, block_i)``
    (the hashes a request with these ids carries once they are all reached), a uint64 array."""
    n = len(token_ids) // block_size
    hashes = array("Q", bytes(8 * n))
    _hash_blocks(NONE_HASH, _int64_array(token_ids), 0, n, block_size, hashes)
    return hashes


def _synthetic_output_range(index: int, length: int) -> range:
    base = -(index + 1) * 1_000_003
    return range(base, base - length, -1)


def synthetic_output_ids(index: int, length: int) -> tuple[int, ...]:
    """Output ids for a request whose workload gives none: unique per request, negative so
    they never collide with real vocabulary ids (and so never produce false prefix hits)."""
    return tuple(_synthetic_output_range(index, length))


# Each scheduler's token log gets a distinct base for its step numbers, so a step number
# names one step of one scheduler and a request's run test is a single int compare.
_LOG_BASES = itertools.count(1)
_LOG_SPAN = 1 << 40


class TokenLog:
    """The time of every step one scheduler applied, in order (``array('q')``)."""

    __slots__ = ("times", "base")

    def __init__(self) -> None:
        self.times = array("q")
        self.base = next(_LOG_BASES) * _LOG_SPAN  # step k of this log is number base + k


class Request:
    """Mutable per-request simulation state. All timestamps are integer ns."""

    __slots__ = (
        "request_id",
        "index",
        "arrival_ns",
        "prompt_len",
        "_max_tokens",
        "finish_at",
        "prompt_ids",
        "output_ids",
        "block_size",
        "_block_hashes",
        "_hash_view",
        "num_tokens",
        "num_computed_tokens",
        "num_output_placeholders",
        "num_cached_tokens",
        "num_preemptions",
        "status",
        "queued_ns",
        "first_scheduled_ns",
        "first_token_ns",
        "finish_ns",
        "prefix_hit_tokens",
        "recomputed_tokens",
        "kv_check_at",
        "kv_slots",
        "kv_cache_at",
        "kv_table",
        "_table_view",
        "kv_num_blocks",
        "kv_num_cached",
        "tok_next",
        "tok_open",
        "tok_runs",
    )

    def __init__(self, spec: RequestSpec, index: int, block_size: int, hash_blocks: bool) -> None:
        """``hash_blocks``: kept for the callers' signature; hashes are computed on demand,
        only by the prefix cache, the tiers and the router, which need them."""
        del hash_blocks
        self.request_id = spec.request_id
        self.index = index
        self.arrival_ns = int(spec.arrival_ns)
        self.prompt_len = spec.prompt_len
        self._max_tokens = int(spec.output_len)
        self.finish_at = self.prompt_len + self._max_tokens  # num_tokens at max_tokens
        self.prompt_ids = spec.prompt_ids  # the spec's own sequence, never copied
        out = spec.output_ids
        if out is None or len(out) < spec.output_len:
            out = _synthetic_output_range(index, spec.output_len)
        elif len(out) > spec.output_len:
            out = out[: spec.output_len]
        self.output_ids: Sequence[int] = out
        self.block_size = block_size
        # The block hashes once asked for (a uint64 array) and, compiled, a typed view over
        # that same array for the KV manager (interpreted: the array itself).
        self._block_hashes: array | None = None
        self._hash_view = None
        self.num_tokens = self.prompt_len  # prompt + outputs accepted so far
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0  # async scheduling: scheduled, not yet returned
        self.num_cached_tokens = -1  # set once, on first admission (vLLM semantics)
        self.num_preemptions = 0
        self.status = WAITING
        # When the engine loop picked the request up (vLLM stamps EngineCoreEventType.QUEUED
        # in Scheduler.add_request, called from the busy loop's input-queue drain, i.e. at a
        # step boundary, not at network arrival); -1 until then.
        self.queued_ns = -1
        self.first_scheduled_ns = -1
        self.first_token_ns = -1
        self.finish_ns = -1
        self.prefix_hit_tokens = 0  # summed over every admission (first and resumed)
        self.recomputed_tokens = 0  # tokens recomputed after preemption
        # Owned by the KV manager (engine.kv_cache, _set_thresholds): the slots the block
        # table holds and the token count that fills the first uncached block; the scheduler
        # calls allocate_slots only past them (kv_check_at: the smaller bound), the async
        # output path caches once kv_cache_at is reached. vLLM keeps this state in the
        # manager's per-request dicts (single_type_kv_cache_manager.py: req_to_blocks,
        # num_cached_block); on the request it costs the hot loop no dict lookup.
        self.kv_check_at = 0
        self.kv_slots = 0
        self.kv_cache_at = 0
        # The block table the KV manager holds for this request: the block ids in the first
        # ``kv_num_blocks`` slots of an int32 array (-1 and None without a table; compiled, a
        # typed view over the same array, as for the hashes), and how many are cached.
        self.kv_table: array | None = None
        self._table_view = None
        self.kv_num_blocks = -1
        self.kv_num_cached = -1
        # Token runs: the step number the next token continues the open run at, the open
        # run (log, first step index) and the closed runs (log, first, end) in order.
        self.tok_next = -1
        self.tok_open: tuple[TokenLog, int, int] | None = None
        self.tok_runs: list[tuple[TokenLog, int, int]] | None = None

    @property
    def max_tokens(self) -> int:
        """vLLM ``SamplingParams.max_tokens``: outputs after which the request finishes."""
        return self._max_tokens

    @max_tokens.setter
    def max_tokens(self, value: int) -> None:
        self._max_tokens = value
        self.finish_at = self.prompt_len + value

    # -- tokens and block hashes --------------------------------------------------------
    def token_ids(self, start: int, end: int) -> tuple[int, ...]:
        """Ids of positions ``[start, end)`` of the full sequence (prompt, then outputs)."""
        p = self.prompt_len
        if end <= p:
            return tuple(self.prompt_ids[start:end])
        if start >= p:
            return tuple(self.output_ids[start - p : end - p])
        return tuple(self.prompt_ids[start:]) + tuple(self.output_ids[: end - p])

    def hashes(self, num_blocks: int) -> array:
        """The chained hashes of (at least) the first ``num_blocks`` full blocks, a uint64
        array; callers ask only for blocks the tokens reached so far fill (vLLM hashes a
        block once it is full: ``Request.update_block_hashes``). The first call hashes every
        full block of the prompt and all the outputs (see the module docstring)."""
        h = self._block_hashes
        if h is None:
            h = self._sequence_hashes()
            self._hash_view = h
            self._block_hashes = h
        if len(h) < num_blocks:  # (callers index the hashes unchecked when compiled)
            raise ValueError(f"request {self.request_id!r}: {num_blocks} full blocks asked for, "
                             f"its whole sequence has {len(h)}")
        return h

    def hash_view(self, num_blocks: int) -> Sequence[int]:
        """:meth:`hashes` as the compiled KV manager reads them: a typed view over the same
        array (interpreted, the array)."""
        self.hashes(num_blocks)
        return self._hash_view

    def _sequence_hashes(self) -> array:
        """The chained hash of every full block of the prompt followed by every output (two
        ranges are hashed without laying the ids out)."""
        p, o = self.prompt_ids, self.output_ids
        bs = self.block_size
        total = (self.prompt_len + len(o)) // bs
        h = array("Q", bytes(8 * total))
        if type(p) is range and type(o) is range:
            _hash_range_blocks(NONE_HASH, 0, total, bs, self.prompt_len,
                               p.start, p.step, o.start, o.step, h)
        else:
            ids = _int64_array(p)
            ids.extend(_int64_array(o))
            _hash_blocks(NONE_HASH, ids, 0, total, bs, h)
        return h

    @property
    def block_hashes(self) -> array:
        """vLLM ``Request.block_hashes``: one hash per full block of the tokens reached (a
        uint64 array)."""
        n = self.num_tokens // self.block_size
        h = self.hashes(n)
        return h if len(h) == n else h[:n]

    # -- block table (owned by the KV manager: engine.kv_cache) ---------------------------
    def open_block_table(self, capacity: int) -> None:
        """Start an empty block table with room for ``capacity`` block ids."""
        table = _ZERO_ID * capacity
        self.kv_table = table
        self._table_view = table
        self.kv_num_blocks = 0

    def reserve_blocks(self, n: int) -> None:
        """Room for ``n`` block ids in the table: a larger copy (twice the size at least) when
        it is full, so the KV manager writes ids in place through ``_table_view``."""
        if n <= len(self._table_view):
            return
        old = self.kv_table
        table = _ZERO_ID * max(n, 2 * len(old))
        table[: self.kv_num_blocks] = old[: self.kv_num_blocks]
        self.kv_table = table
        self._table_view = table

    def view_block_table(self) -> None:
        """Point the KV manager's view at ``kv_table`` (a request rebuilt from its fields)."""
        self._table_view = self.kv_table

    def close_block_table(self) -> None:
        """Drop the block table (its blocks freed by the KV manager first)."""
        self.kv_table = None
        self._table_view = None
        self.kv_num_blocks = -1

    def block_ids(self) -> list[int]:
        """The block table's ids in order (a copy; empty without a table)."""
        n = self.kv_num_blocks
        return self.kv_table[:n].tolist() if n > 0 else []

    def __reduce__(self) -> tuple:
        """Pickled by its fields without its block hashes, which are recomputed when next
        asked for (a hash depends on the ids alone), and without the compiled class's typed
        views (they cannot be pickled; the block table's is made again over the table)."""
        return (_unpickled_request, (type(self), {k: getattr(self, k) for k in _PICKLED}))

    def release(self) -> None:
        """Drop what only a live request needs (its block hashes); they are recomputed if
        asked for again."""
        self._block_hashes = None
        self._hash_view = None

    # -- output token times ---------------------------------------------------------------
    def open_run(self, log: TokenLog, step: int) -> None:
        """This request's next token comes at ``step`` of ``log``, not right after its last."""
        o = self.tok_open
        if o is not None:
            closed = (o[0], o[1], o[1] + self.tok_next - o[2])
            if self.tok_runs is None:
                self.tok_runs = [closed]
            else:
                self.tok_runs.append(closed)
        self.tok_open = (log, step, log.base + step)

    def token_runs(self) -> list[tuple[TokenLog, int, int]]:
        """Every run of steps that gave this request a token: (log, first, end)."""
        runs = list(self.tok_runs or ())
        o = self.tok_open
        if o is not None:
            runs.append((o[0], o[1], o[1] + self.tok_next - o[2]))
        return runs

    @property
    def token_times_ns(self) -> list[int]:
        """The time of every output token accepted, the first included."""
        out: list[int] = []
        for log, a, b in self.token_runs():
            out.extend(log.times[a:b])
        return out

    # -- derived state ------------------------------------------------------------------
    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.prompt_len

    @property
    def is_finished(self) -> bool:
        return self.status == FINISHED

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={RequestStatus(self.status).name})"
        )


# A block table's slots are int32 ids, laid out by repeating this one (a C copy).
_ZERO_ID = array("i", [0])

# What a pickled Request carries: every field but the block hashes and the typed views (of the
# hashes and of the block table; the table itself is carried).
_PICKLED = tuple(f for f in Request.__slots__
                 if f not in ("_block_hashes", "_hash_view", "_table_view"))


def _unpickled_request(cls: type[Request], fields: dict) -> Request:
    """A :class:`Request` (or subclass) rebuilt from :meth:`Request.__reduce__`'s fields."""
    r = cls.__new__(cls)
    for k, v in fields.items():
        setattr(r, k, v)
    r.release()  # no hashes yet: computed when first asked for
    r.view_block_table()
    return r
