"""vLLM V1 block pool (``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py``).

One owner for the block ledger: ref counts, the LRU free-block queue and the prefix-cache
index (hash -> block). Blocks are plain integer ids; per-block state lives in parallel
lists so the hot path touches no objects.

Faithful points (cited from vLLM 0.19):
- Block 0 is the null block: never on the free list, never allocated, excluded from usage.
- The free queue is a doubly linked list (an ``OrderedDict`` here), initially
  ``[1, 2, ..., N-1]``; allocation pops from the head (least recently freed), frees append to the tail in the order given (callers pass
  a request's blocks tail-first).
- Freed blocks keep their hash and stay hit-able until reallocated; eviction happens only as
  a side effect of allocation (``get_new_blocks``).
- ``touch`` on a hit removes a free (ref 0) cached block from the middle of the queue.
- ``cache_full_blocks`` does not de-duplicate: two blocks may carry the same hash; a lookup
  returns the first one inserted.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockPoolError(RuntimeError):
    """An internal ledger invariant was broken (a bug, never a user error)."""


class BlockPool:
    __slots__ = (
        "num_blocks",
        "enable_caching",
        "ref_cnt",
        "block_hash",
        "_free",
        "num_free",
        "cached",
        "num_evictions",
    )

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # The free queue, head (next to allocate) first: an OrderedDict of block ids (values
        # unused) is vLLM's doubly linked FreeKVCacheBlockQueue with O(1) pop at the head,
        # append at the tail and removal from the middle, done in C.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.num_free = num_blocks - 1
        # hash -> block ids carrying it, in insertion order (first one is returned on lookup).
        self.cached: dict[int, list[int]] = {}
        self.num_evictions = 0

    # -- free queue -------------------------------------------------------------------
    def free_block_ids(self) -> list[int]:
        """The free queue from head (next to allocate) to tail. For tests and debugging."""
        return list(self._free)

    # -- prefix-cache index -----------------------------------------------------------
    def get_cached_block(self, h: int) -> int | None:
        ids = self.cached.get(h)
        return ids[0] if ids else None

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        if h is None:
            return
        ids = self.cached[h]
        if len(ids) == 1:
            del self.cached[h]
        else:
            ids.remove(b)
        self.block_hash[b] = None
        self.num_evictions += 1

    # -- allocation ---------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the head of the free queue, evicting their cached hashes."""
        if n > self.num_free:
            raise BlockPoolError(f"asked for {n} blocks with only {self.num_free} free")
        pop = self._free.popitem
        ref, bh = self.ref_cnt, self.block_hash
        out = [pop(False)[0] for _ in range(n)]
        for b in out:
            if bh[b] is not None:
                self._evict(b)
            ref[b] = 1
        self.num_free -= n
        return out

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on prefix-hit blocks; free ones leave the free queue."""
        ref = self.ref_cnt
        free = self._free
        for b in blocks:
            if ref[b] == 0:
                del free[b]
                self.num_free -= 1
            ref[b] += 1

    def free_blocks(self, ordered: list[int]) -> None:
        """Drop one reference on each block; blocks reaching 0 go to the tail in this order."""
        ref = self.ref_cnt
        free = self._free
        for b in ordered:
            r = ref[b] - 1
            if r < 0:
                raise BlockPoolError(f"block {b} freed more often than it was referenced")
            ref[b] = r
            if r == 0:
                free[b] = None
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
            ids = cached.get(h)
            if ids is None:
                cached[h] = [b]
            else:
                ids.append(b)

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
        free = set(self.free_block_ids())
        if len(free) != self.num_free:
            raise BlockPoolError(f"free counter {self.num_free} != queue length {len(free)}")
        if 0 in free:
            raise BlockPoolError("null block on the free queue")
        for b in range(1, self.num_blocks):
            if counts[b] != self.ref_cnt[b]:
                raise BlockPoolError(f"block {b}: ref_cnt {self.ref_cnt[b]} != owners {counts[b]}")
            if (b in free) != (self.ref_cnt[b] == 0):
                raise BlockPoolError(f"block {b}: free-queue membership disagrees with ref_cnt")
        for h, ids in self.cached.items():
            for b in ids:
                if self.block_hash[b] != h:
                    raise BlockPoolError(f"block {b} indexed under a hash it does not carry")
        n_hashed = sum(1 for h in self.block_hash if h is not None)
        if n_hashed != sum(len(v) for v in self.cached.values()):
            raise BlockPoolError("hashed blocks and the cache index disagree")
