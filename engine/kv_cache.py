"""Per-instance KV cache manager (vLLM ``kv_cache_manager.py`` + the full-attention
``single_type_kv_cache_manager.py``), one KV-cache group.

It alone decides allocation; the block pool alone owns the ledger. Block tables are
append-only while a request lives. Optional lower prefix-cache tiers (host DRAM, CXL;
:mod:`engine.kv_tiers`) continue the lookup below the NPU and receive write-through copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.block_pool import BlockPool
from engine.kv_tiers import KVTierPool, LowerTiers
from engine.request import Request
from engine.specs import ConfigError

# A token count no request reaches (the cache threshold without prefix caching).
_NEVER = 1 << 62
# A new block table's room past its prompt, in blocks (4,096 tokens at vLLM's default block
# size): enough for most outputs, small for a request that may run to max_model_len.
_TABLE_AHEAD = 256


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """vLLM's prefix-cache counters, in tokens, over a whole run (``PrefixCacheStats`` in
    ``vllm/v1/metrics/stats.py``, recorded by ``KVCacheManager.get_computed_blocks``).

    Every lookup adds the request's ``num_tokens`` to the queries and the hit tokens found to
    the hits; a request preempted before (``num_preemptions > 0``) goes to the
    ``preempted_*`` pair instead. vLLM's Prometheus counters ``vllm:prefix_cache_queries`` /
    ``vllm:prefix_cache_hits`` and the logged "Prefix cache hit rate" use ``queries`` and
    ``hits`` only, so ``hit_rate`` is what a vLLM dashboard shows. A lookup never hits its
    last token (hits <= num_tokens - 1), so the rate lies in [0, 1).
    """

    queries: int = 0
    hits: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / queries`` (0 when nothing was looked up, as vLLM's ``CachingMetrics``)."""
        return self.hits / self.queries if self.queries else 0.0

    def __add__(self, other: PrefixCacheStats) -> PrefixCacheStats:
        return PrefixCacheStats(
            self.queries + other.queries,
            self.hits + other.hits,
            self.preempted_queries + other.preempted_queries,
            self.preempted_hits + other.preempted_hits,
        )


class KVCacheManager:
    __slots__ = (
        "pool",
        "block_size",
        "max_model_len",
        "enable_caching",
        "req_blocks",
        "prefix_queries",
        "prefix_hits",
        "prefix_preempted_queries",
        "prefix_preempted_hits",
        "tiers",
        "kv_bytes_per_token",
    )

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_caching: bool,
        *,
        tiers: Sequence[KVTierPool] = (),
        kv_bytes_per_token: int | None = None,
        recall_requesters: int = 1,
    ) -> None:
        """``tiers``: lower prefix-cache pools in lookup order (may be shared with other
        managers); ``kv_bytes_per_token``: this instance's full KV bytes per token (all layers,
        all ranks), checked against the pools and used for byte stats; ``recall_requesters``:
        NPUs that each load a recall (the reference bills every NPU of the instance)."""
        if tiers and not enable_caching:
            raise ConfigError(
                "kv tiers need prefix caching (block hashes): set enable_prefix_caching=True "
                "or drop the lower tiers"
            )
        self.tiers: LowerTiers | None = (
            LowerTiers(tiers, block_size, kv_bytes_per_token, recall_requesters) if tiers else None
        )
        self.kv_bytes_per_token = kv_bytes_per_token
        self.pool = BlockPool(num_blocks, enable_caching)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        # Request index -> the request holding a block table here (append-only while it
        # lives). The table is on the request: its ids in an int32 array (``kv_table``, the
        # first ``kv_num_blocks`` slots) and its cached-block count (``kv_num_cached``): vLLM's
        # req_to_blocks / num_cached_block without a dict lookup or an int object per block
        # id on the hot path. ``block_tables`` lists them.
        self.req_blocks: dict[int, Request] = {}
        # vLLM PrefixCacheStats: recorded on every lookup (a request blocked across several
        # passes is counted on each, as vLLM does). prefix_queries / prefix_hits count every
        # lookup; the preempted pair, the part from previously preempted requests (vLLM keeps
        # those apart), see prefix_cache_stats().
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prefix_preempted_queries = 0
        self.prefix_preempted_hits = 0

    # -- lookup -----------------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Longest run of cached full blocks, capped at ``num_tokens - 1`` tokens so the
        last token is always recomputed (vLLM ``get_computed_blocks``). Touches nothing."""
        if not self.enable_caching:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits: list[int] = []
        pool = self.pool
        hashes = req.hash_view(max_blocks)
        for i in range(max_blocks):
            b = pool.lookup(hashes[i])
            if b < 0:
                break
            hits.append(b)
        n = len(hits) * self.block_size
        self.prefix_queries += req.num_tokens
        self.prefix_hits += n
        if req.num_preemptions:  # vLLM record(..., preempted=request.num_preemptions > 0)
            self.prefix_preempted_queries += req.num_tokens
            self.prefix_preempted_hits += n
        return hits, n

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """This manager's lookups split as vLLM splits them (see :class:`PrefixCacheStats`)."""
        return PrefixCacheStats(
            self.prefix_queries - self.prefix_preempted_queries,
            self.prefix_hits - self.prefix_preempted_hits,
            self.prefix_preempted_queries,
            self.prefix_preempted_hits,
        )

    def get_external_computed_tokens(self, req: Request, local_hit: int) -> int:
        """Tokens the lower tiers add beyond the NPU hit of ``local_hit`` tokens (0 without
        tiers); see :meth:`engine.kv_tiers.LowerTiers.lookup`. Call :meth:`admit_external` once
        the request is admitted in the same ``schedule()``."""
        if self.tiers is None:
            return 0
        return self.tiers.lookup(req, local_hit)

    def admit_external(self, req: Request) -> None:
        """Record an admitted request's lower-tier lookup and queue its recall for this step."""
        if self.tiers is not None:
            self.tiers.admit(req)

    def take_recall_ns(self) -> int:
        """Critical-path time of the recalls admitted since the last call (0 without tiers)."""
        return self.tiers.take_recall_ns() if self.tiers is not None else 0

    # -- allocation ---------------------------------------------------------------------
    def block_tables(self) -> dict[int, list[int]]:
        """Every live block table by request index (copies of the ids, in table order)."""
        return {i: req.block_ids() for i, req in self.req_blocks.items()}

    def _num_blocks_to_allocate(
        self, req: Request, need_slots: int, hit_blocks: list[int]
    ) -> int:
        held = req.kv_num_blocks  # -1: no table
        if held >= 0 and not hit_blocks:
            return max(_cdiv(need_slots, self.block_size) - held, 0)
        n_held = held if held > 0 else 0
        n = max(_cdiv(need_slots, self.block_size) - (len(hit_blocks) + n_held), 0)
        # Hit blocks sitting on the free list are taken off it by touch(): they use free
        # capacity too (vLLM get_num_blocks_to_allocate).
        pool = self.pool
        n += sum(1 for b in hit_blocks if pool.ref_of(b) == 0)
        return n

    def can_fit_full_sequence(self, req: Request, hit_blocks: list[int]) -> bool:
        """The ``scheduler_reserve_full_isl`` admission gate: blocks for the whole current
        sequence (prompt plus earlier outputs; future outputs not reserved) must be free."""
        need = min(req.num_tokens, self.max_model_len)
        return self._num_blocks_to_allocate(req, need, hit_blocks) <= self.pool.num_free

    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        hit_blocks: list[int] | None = None,
    ) -> bool:
        """Reserve slots for ``num_new_tokens`` more tokens; False (and no change) if the
        pool cannot supply them. Registers newly full blocks in the prefix cache at once
        (schedule time), as vLLM does.

        For a running request the call changes something only when
        ``num_computed_tokens + num_new_tokens`` exceeds its ``kv_slots`` or, capped at
        ``num_tokens``, reaches its ``kv_cache_at`` (both set here); otherwise it would
        return True and change nothing, so the scheduler skips it."""
        if not hit_blocks and not num_new_computed_tokens:
            held = req.kv_num_blocks
            if held >= 0:  # running request: no new hits possible
                need_slots = req.num_computed_tokens + num_new_tokens
                if need_slots > self.max_model_len:
                    need_slots = self.max_model_len
                k = -(-need_slots // self.block_size) - held
                if k > 0:
                    if k > self.pool.num_free:
                        return False
                    self._append_new(req, k)
                if self.enable_caching:
                    upto = need_slots if need_slots < req.num_tokens else req.num_tokens
                    if upto // self.block_size > req.kv_num_cached:
                        self.cache_blocks(req, upto)  # sets the thresholds
                        return True
                self._set_thresholds(req)
                return True
        hb = hit_blocks or []
        total_computed = min(req.num_computed_tokens + num_new_computed_tokens, self.max_model_len)
        need_slots = min(total_computed + num_new_tokens, self.max_model_len)
        n_alloc = self._num_blocks_to_allocate(req, need_slots, hb)
        pool = self.pool
        if n_alloc > pool.num_free:
            return False
        if req.kv_num_blocks < 0:
            req.open_block_table(self._table_capacity(req))
            self.req_blocks[req.index] = req
            req.kv_num_cached = 0
        if hb:
            pool.touch(hb)
            n = req.kv_num_blocks
            req.reserve_blocks(n + len(hb))
            table = req._table_view
            for i in range(len(hb)):
                table[n + i] = hb[i]
            n += len(hb)
            req.kv_num_blocks = n
            req.kv_num_cached = n
            if self.tiers is not None:
                # vLLM offers every full chunk to the offloading store, hits included
                # (resident ones are skipped / refreshed).
                self.tiers.write_down(req.hashes(len(hb)), 0, len(hb))
        k = _cdiv(need_slots, self.block_size) - req.kv_num_blocks
        if k > 0:
            self._append_new(req, k)
        if self.enable_caching:
            self.cache_blocks(req, min(total_computed + num_new_tokens, req.num_tokens))
        self._set_thresholds(req)
        return True

    def _table_capacity(self, req: Request) -> int:
        """Room a new block table starts with: every block the request can fill (its whole
        sequence, capped at ``max_model_len``; one more for a token in flight), at most
        ``_TABLE_AHEAD`` blocks past its prompt (a table grows when it needs more)."""
        most = req.finish_at + 1
        if most > self.max_model_len:
            most = self.max_model_len
        ahead = req.prompt_len // self.block_size + _TABLE_AHEAD
        blocks = -(-most // self.block_size)
        return blocks if blocks < ahead else ahead

    def _append_new(self, req: Request, k: int) -> None:
        """``k`` new blocks from the pool onto the request's table."""
        n = req.kv_num_blocks
        req.reserve_blocks(n + k)
        self.pool.append_new_to(req._table_view, n, k)
        req.kv_num_blocks = n + k

    def _set_thresholds(self, req: Request) -> None:
        """The request's ``kv_slots`` (slots its blocks hold), ``kv_cache_at`` (tokens that
        fill its first uncached block) and ``kv_check_at`` (the smaller of ``kv_slots + 1``
        and ``kv_cache_at``: below it :meth:`allocate_slots` changes nothing)."""
        bs = self.block_size
        slots = req.kv_num_blocks * bs
        req.kv_slots = slots
        if self.enable_caching:
            cache_at = (req.kv_num_cached + 1) * bs
            req.kv_cache_at = cache_at
            req.kv_check_at = cache_at if cache_at <= slots else slots + 1
        else:
            req.kv_cache_at = _NEVER
            req.kv_check_at = slots + 1

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Register the request's full blocks up to ``num_tokens`` in the prefix cache."""
        num_full = num_tokens // self.block_size
        done = req.kv_num_cached
        if done < 0 or num_full <= done:  # no block table, or nothing newly full
            return
        req.hashes(num_full)  # (computed once per request; checks that they reach num_full)
        # The typed views themselves, not a view returned by hash_view: that costs two atomic
        # reference-count updates, here once per newly full block.
        self.pool.cache_full_blocks(req._table_view, req._hash_view, done, num_full)
        req.kv_num_cached = num_full
        self._set_thresholds(req)
        if self.tiers is not None:
            self.tiers.write_down(req.hashes(num_full), done, num_full)

    def free(self, req: Request) -> None:
        """Release a request's blocks tail-first so its last block is evicted first."""
        self.req_blocks.pop(req.index, None)
        n = req.kv_num_blocks
        if n > 0:
            self.pool.free_table(req._table_view, n)
        req.close_block_table()
        req.kv_num_cached = -1
        req.kv_check_at = req.kv_slots = req.kv_cache_at = 0  # no table: every call must look

    def usage(self) -> float:
        return self.pool.usage()

    def tier_stats(self) -> dict[str, dict[str, float | int | str]]:
        """KV usage and prefix hit rates per tier, ``"npu"`` first, then each lower tier by
        name. NPU queries/hits are vLLM's ``PrefixCacheStats`` (every lookup of a request not
        preempted before; lookups of preempted ones in ``preempted_query_tokens`` /
        ``preempted_hit_tokens``), lower tiers count on admission; see
        :meth:`engine.kv_tiers.LowerTiers.stats`."""
        pool = self.pool
        usable = pool.num_blocks - 1
        used = usable - pool.num_free
        cached = pool.num_cached_blocks()
        stats = self.prefix_cache_stats()
        npu: dict[str, float | int | str] = {
            "tier": "npu",
            "query_tokens": stats.queries,
            "hit_tokens": stats.hits,
            "hit_rate": stats.hit_rate,
            "preempted_query_tokens": stats.preempted_queries,
            "preempted_hit_tokens": stats.preempted_hits,
            "capacity_blocks": usable,
            "used_blocks": used,
            "cached_blocks": cached,
            "usage": pool.usage(),
            "evicted_blocks": pool.num_evictions,
        }
        if self.kv_bytes_per_token is not None:
            per_block = self.kv_bytes_per_token * self.block_size
            npu["capacity_bytes"] = usable * per_block
            npu["bytes_used"] = used * per_block
        out = {"npu": npu}
        if self.tiers is not None:
            out.update(self.tiers.stats())
        return out
