"""vLLM V1 block pool (``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py``).

One owner for the block ledger: ref counts, the LRU free-block queue and the prefix-cache
index (hash -> block). Blocks are plain integer ids; per-block state lives in ``array``s (C
ints when compiled, see ``block_pool.pxd``) so the hot path touches no objects: one record of
four int32 per block (its free-queue links, references and prefix-index slot, 16 bytes: the
fields an allocation, an eviction or a free reads and writes share one cache line) and the
chained hash it carries in a column of its own (read only to compare or report a hash).

Faithful points (cited from vLLM 0.19):
- Block 0 is the null block: never on the free list, never allocated, excluded from usage.
- The free queue is a doubly linked list (next / previous links around a sentinel),
  initially ``[1, 2, ..., N-1]``; allocation pops from the head (least recently freed), frees
  append to the tail in the order given (callers pass a request's blocks tail-first).
- Freed blocks keep their hash and stay hit-able until reallocated; eviction happens only as
  a side effect of allocation (``get_new_blocks``).
- ``touch`` on a hit removes a free (ref 0) cached block from the middle of the queue.
- ``cache_full_blocks`` does not de-duplicate: two blocks may carry the same hash; a lookup
  returns the first one inserted.
"""

from __future__ import annotations

from array import array

_EMPTY = 0  # a prefix-index slot's value when it holds no entry (block 0 is never cached)
_LOW32 = 0xFFFFFFFF  # a slot's block id; its upper half, the hash's lower 32 bits
# A block's record: _rec[4 * b + field] (the sentinel's, at b = num_blocks, holds its links).
_NEXT = 0  # the free queue's next block (-1: not queued)
_PREV = 1  # the free queue's previous block (-1: not queued)
_REF = 2  # references held
_SLOT = 3  # the prefix-index slot holding the block, or one of the two values below
_UNHASHED = -2  # the block carries no hash
_DUPLICATE = -1  # it carries a hash another block is indexed under (one of ``_dupes``)
# Blocks a pool may hold, at most (block 0 included): a prefix-index slot keeps the block id
# and its home slot's bits in 32 (at most 2**31 slots). EngineConfig checks
# num_gpu_blocks_override against it.
MAX_BLOCKS = (1 << 30) - 1


class BlockPoolError(RuntimeError):
    """An internal ledger invariant was broken (a bug, never a user error)."""


class BlockPool:
    __slots__ = (
        "num_blocks",
        "enable_caching",
        "_rec",
        "_bhash",
        "num_free",
        "_itab",
        "_imask",
        "_ilive",
        "_dupes",
        "num_evictions",
        "index_listener",
    )

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        if num_blocks > MAX_BLOCKS:
            raise ValueError(f"num_blocks must be at most {MAX_BLOCKS}, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        # Per block, one record (``_NEXT``, ``_PREV``, ``_REF``, ``_SLOT``; read the references
        # as :attr:`ref_cnt` or :meth:`ref_of`): the free queue, head (next to allocate) first,
        # as vLLM's doubly linked FreeKVCacheBlockQueue with ``num_blocks`` as the sentinel (its
        # next is the head, its previous the tail; initially 1, 2, ..., N-1); the references
        # held; the index slot holding the block, so an eviction needs no probe (or
        # _UNHASHED, _DUPLICATE). Behind 64 replicas a pool's blocks are read cold (63 other
        # pools ran since), and one record per block is one cache line where a column per
        # field was one each. The chained hash a block carries: ``_bhash`` (valid unless
        # _UNHASHED; read them as :attr:`block_hash`).
        self._rec = array("i", [0, 0, 0, _UNHASHED]) * (num_blocks + 1)
        self._bhash = array("Q", bytes(8 * num_blocks))
        sentinel = num_blocks
        self._link_in_order()
        self._rec[_NEXT] = self._rec[_PREV] = -1  # the null block is never queued
        self._rec[4 * (num_blocks - 1) + _NEXT] = sentinel
        self._rec[4 * sentinel + _NEXT] = 1
        self._rec[4 + _PREV] = sentinel
        self._rec[4 * sentinel + _PREV] = num_blocks - 1
        self.num_free = num_blocks - 1
        # The prefix-cache index, hash -> the first block inserted under it (returned on lookup): an
        # open-addressing table with linear probing over a power-of-two number of slots, at least
        # 1.5 times the blocks (each cached block indexes at most one hash), so the load stays under
        # two thirds (at most 2**31 slots). Slot i is one 64-bit word, ``_itab[i]``: the hash's
        # lower 32 bits (which give its home slot) above the block id (_EMPTY: none); a probe whose
        # lower bits match compares the block's full hash (``_bhash``). Eight bytes a slot: behind
        # 64 replicas the tables outgrow the L3 cache, and a probe's cache misses were the pool's
        # largest (callgrind's cache model: half of the L3 read misses of 64 replicas x 32,000
        # requests with 16-byte slots). A deleted entry is filled by shifting its probe run back (no
        # tombstones, no rehash: probes stay as short as the load allows). Further blocks carrying
        # the same hash (cache_full_blocks does not de-duplicate) in ``_dupes``, in insertion order.
        # Which slot holds which hash is the table's own affair: nothing reads the slots in order
        # but ``cache_groups`` and ``indexed_hashes``, whose callers do not depend on it.
        cap = 1 << (3 * num_blocks // 2).bit_length()
        self._itab = array("Q", [0]) * cap
        self._imask = cap - 1
        self._ilive = 0  # slots holding a block
        self._dupes: dict[int, list[int]] = {}
        self.num_evictions = 0
        # Told of every hash that enters or leaves the prefix index (``indexed(h)``,
        # ``unindexed(h)``), when set: a cluster's prefix directory
        # (``engine.cluster.PrefixDirectory``) keeps which instances hold each hash by it.
        self.index_listener: object | None = None

    @property
    def block_hash(self) -> list[int | None]:
        """The chained hash each block carries (None: none), by block id."""
        return [self._bhash[b] if self._rec[4 * b + _SLOT] != _UNHASHED else None
                for b in range(self.num_blocks)]

    @property
    def ref_cnt(self) -> list[int]:
        """The references held on each block, by block id (a copy)."""
        return [self._rec[4 * b + _REF] for b in range(self.num_blocks)]

    def ref_of(self, b: int) -> int:
        """The references held on block ``b``."""
        return self._rec[4 * b + _REF]

    # -- free queue -------------------------------------------------------------------
    def _link_in_order(self) -> None:
        """Link every block's record, and the sentinel's, to its neighbours by id (a C loop
        when compiled: a pool may hold 10^5 blocks and a cluster many pools)."""
        for b in range(self.num_blocks + 1):
            self._rec[4 * b + _NEXT] = b + 1
            self._rec[4 * b + _PREV] = b - 1

    def free_block_ids(self) -> list[int]:
        """The free queue from head (next to allocate) to tail. For tests and debugging."""
        out = []
        rec = self._rec
        b = rec[4 * self.num_blocks + _NEXT]
        while b != self.num_blocks:
            out.append(b)
            b = rec[4 * b + _NEXT]
        return out

    # The arrays are read through ``self`` rather than local names: a compiled local
    # memoryview would take and drop a reference to its buffer on every call.
    def _unlink(self, b: int) -> None:
        n, p = self._rec[4 * b + _NEXT], self._rec[4 * b + _PREV]
        self._rec[4 * p + _NEXT] = n
        self._rec[4 * n + _PREV] = p
        self._rec[4 * b + _NEXT] = self._rec[4 * b + _PREV] = -1

    def _append(self, b: int) -> None:
        sentinel = self.num_blocks
        tail = self._rec[4 * sentinel + _PREV]
        self._rec[4 * tail + _NEXT] = b
        self._rec[4 * b + _PREV] = tail
        self._rec[4 * b + _NEXT] = sentinel
        self._rec[4 * sentinel + _PREV] = b

    # -- prefix-cache index -----------------------------------------------------------
    def _find(self, h: int) -> int:
        """The slot holding hash ``h``, or -1."""
        mask = self._imask
        lo = h & _LOW32
        i = h & mask
        while True:
            v = self._itab[i]
            if v == _EMPTY:
                return -1
            if v >> 32 == lo and self._bhash[v & _LOW32] == h:
                return i
            i = (i + 1) & mask

    def lookup(self, h: int) -> int:
        """The block a prefix lookup of hash ``h`` finds (the first cached under it), or -1."""
        i = self._find(h)
        if i < 0:
            return -1
        return self._itab[i] & _LOW32

    def _index(self, h: int, b: int) -> int:
        """Index block ``b`` under ``h`` unless ``h`` is indexed already; the block now
        indexed under ``h`` (``b``, or the earlier one)."""
        mask = self._imask
        lo = h & _LOW32
        i = h & mask
        while True:
            v = self._itab[i]
            if v == _EMPTY:
                break
            if v >> 32 == lo and self._bhash[v & _LOW32] == h:
                return v & _LOW32
            i = (i + 1) & mask
        self._itab[i] = lo << 32 | b
        self._rec[4 * b + _SLOT] = i
        self._ilive += 1
        if self.index_listener is not None:
            self.index_listener.indexed(h)
        return b

    def _unindex(self, i: int) -> None:
        """Empty slot ``i`` and shift back the entries of its probe run that may move into
        it (an entry stays where it is when its home slot lies cyclically in (hole, its
        slot]), so every remaining hash is found by a probe from its home slot."""
        mask = self._imask
        j = i
        while True:
            j = (j + 1) & mask
            v = self._itab[j]
            if v == _EMPTY:
                break
            home = (v >> 32) & mask
            if (i < home <= j) if i <= j else (home > i or home <= j):
                continue
            self._itab[i] = v
            self._rec[4 * (v & _LOW32) + _SLOT] = i
            i = j
        self._itab[i] = _EMPTY
        self._ilive -= 1

    def blocks_with_hash(self, h: int) -> list[int]:
        """Every block carrying hash ``h``, the one lookups return first."""
        first = self.lookup(h)
        if first < 0:
            return []
        return [first, *self._dupes.get(h, ())]

    def indexed_hashes(self) -> list[int]:
        """Every hash a prefix lookup finds (in no particular order)."""
        tab = self._itab
        return [self._bhash[tab[i] & _LOW32] for i in range(self._imask + 1) if tab[i] != _EMPTY]

    def cache_groups(self) -> list[list[int]]:
        """The prefix-cache index: per hash, its blocks (the one lookups return first)."""
        tab = self._itab
        return [self.blocks_with_hash(self._bhash[tab[i] & _LOW32])
                for i in range(self._imask + 1) if tab[i] != _EMPTY]

    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash (hit-able until evicted)."""
        return self._ilive + sum(len(v) for v in self._dupes.values())

    def _evict(self, b: int) -> None:
        i = self._rec[4 * b + _SLOT]
        if i == _UNHASHED:
            return
        # The hash is read only where it is needed: without duplicates (a duplicate has an
        # entry in _dupes) and without a listener, b is the only block under it.
        more = None
        if self._dupes:
            h = self._bhash[b]
            more = self._dupes.get(h)
        if more is None:  # the only block under its hash
            self._unindex(i)
            if self.index_listener is not None:
                self.index_listener.unindexed(self._bhash[b])
        else:
            if i >= 0:  # b is the one lookups return: the next duplicate takes its slot
                nxt = more.pop(0)
                self._itab[i] = (h & _LOW32) << 32 | nxt
                self._rec[4 * nxt + _SLOT] = i
            else:
                more.remove(b)
            if not more:
                del self._dupes[h]
        self._rec[4 * b + _SLOT] = _UNHASHED
        self.num_evictions += 1

    # -- allocation ---------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head of the free queue, evicting their cached hashes."""
        out = array("i", bytes(4 * n))
        self.append_new_to(out, 0, n)
        return out.tolist()

    def append_new_to(self, table: array, start: int, n: int) -> None:
        """:meth:`get_new_blocks` written into ``table[start:start + n]`` (a request's int32
        block table, with room for them) directly."""
        if n > self.num_free:
            raise BlockPoolError(f"asked for {n} blocks with only {self.num_free} free")
        sentinel = self.num_blocks
        for i in range(start, start + n):
            b = self._rec[4 * sentinel + _NEXT]
            self._unlink(b)
            if self._rec[4 * b + _SLOT] != _UNHASHED:
                self._evict(b)
            self._rec[4 * b + _REF] = 1
            table[i] = b
        self.num_free -= n

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on prefix-hit blocks; free ones leave the free queue."""
        for b in blocks:
            if self._rec[4 * b + _REF] == 0:
                self._unlink(b)
                self.num_free -= 1
            self._rec[4 * b + _REF] += 1

    def free_blocks(self, ordered: list[int]) -> None:
        """Drop one reference on each block; blocks reaching 0 go to the tail in this order."""
        table = array("i", ordered)
        table.reverse()
        self.free_table(table, len(table))

    def free_table(self, table: array, n: int) -> None:
        """Drop one reference on each of ``table[:n]`` (a request's block table), last first,
        so its last block is evicted first (vLLM frees a request's blocks tail-first); blocks
        reaching 0 go to the free queue's tail in that order."""
        for i in range(n - 1, -1, -1):
            b = table[i]
            r = self._rec[4 * b + _REF] - 1
            if r < 0:
                raise BlockPoolError(f"block {b} freed more often than it was referenced")
            self._rec[4 * b + _REF] = r
            if r == 0:
                self._append(b)
                self.num_free += 1

    def cache_full_blocks(
        self, blocks: array, block_hashes: array, num_cached: int, num_full: int
    ) -> None:
        """Register blocks ``[num_cached, num_full)`` of a request's block table (int32)
        under their chained hashes."""
        for i in range(num_cached, num_full):
            b = blocks[i]
            if self._rec[4 * b + _SLOT] != _UNHASHED:
                raise BlockPoolError(f"block {b} cached twice")
            h = block_hashes[i]
            self._bhash[b] = h
            if self._index(h, b) != b:  # h already indexed: b joins its duplicates
                self._rec[4 * b + _SLOT] = _DUPLICATE
                more = self._dupes.get(h)
                if more is None:
                    self._dupes[h] = [b]
                else:
                    more.append(b)

    # -- stats --------------------------------------------------------------------------
    def usage(self) -> float:
        """vLLM ``get_usage``: ``1 - free / (num_blocks - 1)`` (null block excluded)."""
        return 1.0 - self.num_free / (self.num_blocks - 1)

    def check_invariants(self, tables: list[list[int]]) -> None:
        """Assert vLLM's ledger invariants against the given live block tables."""
        counts = [0] * self.num_blocks
        for table in tables:
            for b in table:
                counts[b] += 1
        queue = self.free_block_ids()
        free = set(queue)
        if len(free) != self.num_free or len(queue) != self.num_free:
            raise BlockPoolError(f"free counter {self.num_free} != queue length {len(queue)}")
        if 0 in free:
            raise BlockPoolError("null block on the free queue")
        ref_cnt = self.ref_cnt
        for b in range(1, self.num_blocks):
            if counts[b] != ref_cnt[b]:
                raise BlockPoolError(f"block {b}: ref_cnt {ref_cnt[b]} != owners {counts[b]}")
            if (b in free) != (ref_cnt[b] == 0):
                raise BlockPoolError(f"block {b}: free-queue membership disagrees with ref_cnt")
        hashes = self.block_hash
        for group in self.cache_groups():
            h = hashes[group[0]]
            for b in group:
                if h is None or hashes[b] != h or self.lookup(h) != group[0]:
                    raise BlockPoolError(f"block {b} indexed under a hash it does not carry")
            if (self._rec[4 * group[0] + _SLOT] != self._find(h)
                    or any(self._rec[4 * b + _SLOT] != _DUPLICATE for b in group[1:])):
                raise BlockPoolError(f"hash of block {group[0]}: slot field disagrees with the index")
        n_hashed = 0
        for b in range(self.num_blocks):
            n_hashed += self._rec[4 * b + _SLOT] != _UNHASHED
        if n_hashed != self.num_cached_blocks():
            raise BlockPoolError("hashed blocks and the cache index disagree")
