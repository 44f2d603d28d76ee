"""vLLM V1 block pool (``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py``).

One owner for the block ledger: ref counts, the LRU free-block queue and the prefix-cache
index (hash -> block). Blocks are plain integer ids; per-block state lives in parallel
``array`` columns (C ints when compiled, see ``block_pool.pxd``) so the hot path touches no
objects.

Faithful points (cited from vLLM 0.19):
- Block 0 is the null block: never on the free list, never allocated, excluded from usage.
- The free queue is a doubly linked list (``_next`` / ``_prev`` columns around a sentinel),
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


class BlockPoolError(RuntimeError):
    """An internal ledger invariant was broken (a bug, never a user error)."""


class BlockPool:
    __slots__ = (
        "num_blocks",
        "enable_caching",
        "ref_cnt",
        "block_hash",
        "_ref",
        "_next",
        "_prev",
        "num_free",
        "cached",
        "_dupes",
        "num_evictions",
    )

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        # Per block: references held (``_ref`` is the same array, typed as a C buffer when
        # compiled), and the chained hash it carries (None: none; the hash objects are the
        # requests' own, so the index below needs no new ints).
        self.ref_cnt = array("i", bytes(4 * num_blocks))
        self._ref = self.ref_cnt
        self.block_hash: list[int | None] = [None] * num_blocks
        # The free queue, head (next to allocate) first: vLLM's doubly linked
        # FreeKVCacheBlockQueue, as next/previous links with ``num_blocks`` as the sentinel
        # (its next is the head, its previous the tail); initially 1, 2, ..., N-1.
        sentinel = num_blocks
        self._next = array("i", range(1, num_blocks + 2))
        self._prev = array("i", range(-1, num_blocks))
        self._next[0] = self._prev[0] = -1  # the null block is never queued
        self._next[num_blocks - 1] = sentinel
        self._next[sentinel] = 1
        self._prev[1] = sentinel
        self._prev[sentinel] = num_blocks - 1
        self.num_free = num_blocks - 1
        # hash -> the first block inserted under it (returned on lookup); further blocks
        # carrying the same hash (cache_full_blocks does not de-duplicate) in ``_dupes``, in
        # insertion order.
        self.cached: dict[int, int] = {}
        self._dupes: dict[int, list[int]] = {}
        self.num_evictions = 0

    # -- free queue -------------------------------------------------------------------
    def free_block_ids(self) -> list[int]:
        """The free queue from head (next to allocate) to tail. For tests and debugging."""
        out = []
        nxt = self._next
        b = nxt[self.num_blocks]
        while b != self.num_blocks:
            out.append(b)
            b = nxt[b]
        return out

    def _unlink(self, b: int) -> None:
        nxt, prv = self._next, self._prev
        n, p = nxt[b], prv[b]
        nxt[p] = n
        prv[n] = p
        nxt[b] = prv[b] = -1

    def _append(self, b: int) -> None:
        nxt, prv = self._next, self._prev
        sentinel = self.num_blocks
        tail = prv[sentinel]
        nxt[tail] = b
        prv[b] = tail
        nxt[b] = sentinel
        prv[sentinel] = b

    # -- prefix-cache index -----------------------------------------------------------
    def get_cached_block(self, h: int) -> int | None:
        return self.cached.get(h)

    def blocks_with_hash(self, h: int) -> list[int]:
        """Every block carrying hash ``h``, the one lookups return first."""
        first = self.cached.get(h)
        if first is None:
            return []
        return [first, *self._dupes.get(h, ())]

    def cache_groups(self) -> list[list[int]]:
        """The prefix-cache index: per hash, its blocks in insertion order."""
        return [self.blocks_with_hash(h) for h in self.cached]

    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash (hit-able until evicted)."""
        return len(self.cached) + sum(len(v) for v in self._dupes.values())

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        if h is None:
            return
        more = self._dupes.get(h)
        if more is None:  # the only block under h
            del self.cached[h]
        else:
            if self.cached[h] == b:
                self.cached[h] = more.pop(0)
            else:
                more.remove(b)
            if not more:
                del self._dupes[h]
        self.block_hash[b] = None
        self.num_evictions += 1

    # -- allocation ---------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head of the free queue, evicting their cached hashes."""
        if n > self.num_free:
            raise BlockPoolError(f"asked for {n} blocks with only {self.num_free} free")
        ref, bh, nxt = self._ref, self.block_hash, self._next
        sentinel = self.num_blocks
        out = []
        for _ in range(n):
            b = nxt[sentinel]
            self._unlink(b)
            if bh[b] is not None:
                self._evict(b)
            ref[b] = 1
            out.append(b)
        self.num_free -= n
        return out

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on prefix-hit blocks; free ones leave the free queue."""
        ref = self._ref
        for b in blocks:
            if ref[b] == 0:
                self._unlink(b)
                self.num_free -= 1
            ref[b] += 1

    def free_blocks(self, ordered: list[int]) -> None:
        """Drop one reference on each block; blocks reaching 0 go to the tail in this order."""
        ref = self._ref
        for b in ordered:
            r = ref[b] - 1
            if r < 0:
                raise BlockPoolError(f"block {b} freed more often than it was referenced")
            ref[b] = r
            if r == 0:
                self._append(b)
                self.num_free += 1

    def cache_full_blocks(
        self, blocks: list[int], block_hashes: list[int], num_cached: int, num_full: int
    ) -> None:
        """Register blocks ``[num_cached, num_full)`` of a request under their chained hashes."""
        bh = self.block_hash
        cached = self.cached
        for i in range(num_cached, num_full):
            b = blocks[i]
            if bh[b] is not None:
                raise BlockPoolError(f"block {b} cached twice")
            h = block_hashes[i]
            bh[b] = h
            if cached.setdefault(h, b) != b:  # h already indexed: b joins its duplicates
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
        for b in range(1, self.num_blocks):
            if counts[b] != self.ref_cnt[b]:
                raise BlockPoolError(f"block {b}: ref_cnt {self.ref_cnt[b]} != owners {counts[b]}")
            if (b in free) != (self.ref_cnt[b] == 0):
                raise BlockPoolError(f"block {b}: free-queue membership disagrees with ref_cnt")
        for h in self.cached:
            for b in self.blocks_with_hash(h):
                if self.block_hash[b] != h:
                    raise BlockPoolError(f"block {b} indexed under a hash it does not carry")
        n_hashed = sum(1 for h in self.block_hash if h is not None)
        if n_hashed != self.num_cached_blocks():
            raise BlockPoolError("hashed blocks and the cache index disagree")
