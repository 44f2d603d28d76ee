"""Prefix-cache KV tiers below the NPU: host DRAM (one pool per node) and CXL (one per cluster).

A lower tier stores KV in coarse *chunks* of ``C = max(B, floor(256/B)*B)`` tokens (LMCache's
256-token chunk; a multiple of the NPU block size ``B``). Chunk ``c`` of a request is keyed on the
fine-grained chained hash of the *last* NPU block inside it, ``block_hashes[f*c + f - 1]`` with
``f = C/B``, as vLLM's OffloadingConnector does: the hashes chain, so that one key names the whole
prefix up to the end of the chunk. A trailing partial chunk is never stored.

What happens when (vLLM ``OffloadingConnector`` scheduler side,
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``, see
docs/reference-semantics.md §18; with the load done synchronously inside the admitting step as
LMCache's adapter does):

* **Write-through.** Whenever the NPU registers full blocks in its prefix cache, every newly
  completed chunk is stored in every tier (prompt and decode-produced chunks alike). Chunks
  already resident are not copied again. The copies are off the critical path: their bytes are
  counted (``write_through_bytes``), never charged as time.
* **Lookup.** On admission of a waiting request, after the NPU hit of ``local`` tokens:
  ``nb = num_tokens // C``; the tier is skipped if ``nb*C - local < C``; from
  ``start = local // C`` count consecutive resident chunks ``hits``; ``ext = C*(start+hits) - local``
  must be ``>= C``. If ``local + ext`` reaches ``num_tokens`` the last token is recomputed
  (``ext -= 1``, vLLM's cap after the load). Tiers are tried in order; the first that yields a hit
  serves it.
* **Recall.** The ``ext`` tokens get fresh NPU blocks; the bytes of the NPU blocks loaded (``ext``
  before the last-token cap, times the full-instance KV bytes per token) are charged on the
  admitting step's critical path: per tier and step, one access of the step's summed bytes on the
  tier's :class:`astra_bridge.memory.MemoryTier` (``latency + bytes/bandwidth``), times the number
  of NPUs loading it when the device serialises (host DRAM, CXL; :meth:`KVTierPool.load_ns`).
* **Eviction.** Capacity is ``floor(capacity_bytes / bytes_per_chunk)`` chunks. Policy ``"lru"``
  (vLLM's default): every lookup touches the request's resident chunk keys, last chunk first so
  the prefix chunk ends most recent, and storing a resident key touches it; a full tier evicts the
  least recently used chunk. Policy ``"fifo"`` is the reference simulator's (LLMServingSim) lower
  pool: no recency refresh on lookup or re-store, the oldest written chunk goes first.

Statistics are kept both per pool (summed over every instance sharing it) and per instance
(:class:`LowerTiers`). ``queries``/``query_tokens`` count admissions whose lookup reached the tier
and their ``num_tokens``; ``hit_tokens`` the tokens it served (after the last-token cap).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from engine.specs import ConfigError

if TYPE_CHECKING:
    from engine.request import Request

LMCACHE_CHUNK_TOKENS = 256
POLICIES = ("lru", "fifo")


class TierTiming(Protocol):
    """What a pool needs of a memory tier (``astra_bridge.memory.MemoryTier`` fits)."""

    def access_ns(self, nbytes: int) -> int: ...

    @property
    def serialised(self) -> bool: ...


def chunk_tokens_for(block_size: int, target: int = LMCACHE_CHUNK_TOKENS) -> int:
    """Lower-tier chunk size: ``max(B, floor(target/B)*B)`` tokens (256 for ``B = 16``)."""
    if block_size < 1:
        raise ConfigError(f"block_size: {block_size} must be >= 1")
    return max(block_size, (target // block_size) * block_size)


def _positive_int(value: object, field: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{field}: {value!r} must be a positive integer; {fix}")
    return value


class KVTierPool:
    """One lower-tier prefix cache (a node's host DRAM or a CXL pool), shareable by instances.

    ``kv_bytes_per_token`` is the full-instance KV size of one token (all layers, all ranks'
    shards); every instance sharing the pool must have the same one and a block size dividing
    ``chunk_tokens``.
    """

    __slots__ = (
        "name",
        "pool_id",
        "tier",
        "chunk_tokens",
        "kv_bytes_per_token",
        "bytes_per_chunk",
        "num_chunks",
        "policy",
        "_lru",
        "_chunks",
        "queries",
        "query_tokens",
        "hit_tokens",
        "stored_chunks",
        "evicted_chunks",
        "recall_bytes",
        "recall_ns",
        "write_through_bytes",
    )

    def __init__(
        self,
        name: str,
        tier: TierTiming,
        *,
        capacity_bytes: int,
        chunk_tokens: int,
        kv_bytes_per_token: int,
        policy: str = "lru",
        pool_id: str | None = None,
    ) -> None:
        self.name = name
        self.pool_id = pool_id or name
        self.tier = tier
        self.chunk_tokens = _positive_int(
            chunk_tokens, f"kv tier {name}: chunk_tokens", "use chunk_tokens_for(block_size)"
        )
        self.kv_bytes_per_token = _positive_int(
            kv_bytes_per_token,
            f"kv tier {name}: kv_bytes_per_token",
            "pass the instance's full KV bytes per token (all layers, all ranks)",
        )
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int):
            raise ConfigError(
                f"kv tier {name}: capacity_bytes {capacity_bytes!r} must be an integer byte count"
            )
        if policy not in POLICIES:
            raise ConfigError(f"kv tier {name}: policy {policy!r} unknown; use one of {POLICIES}")
        self.bytes_per_chunk = self.chunk_tokens * self.kv_bytes_per_token
        self.num_chunks = capacity_bytes // self.bytes_per_chunk
        if self.num_chunks < 1:
            raise ConfigError(
                f"kv tier {name}: capacity {capacity_bytes} bytes holds no {self.chunk_tokens}-token "
                f"chunk of {self.bytes_per_chunk} bytes; raise the tier's mem_size"
            )
        self.policy = policy
        self._lru = policy == "lru"
        # key -> None, oldest first (the eviction victim is the first entry).
        self._chunks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0
        self.query_tokens = 0
        self.hit_tokens = 0
        self.stored_chunks = 0
        self.evicted_chunks = 0
        self.recall_bytes = 0
        self.recall_ns = 0
        self.write_through_bytes = 0

    # -- index ---------------------------------------------------------------------------
    def __contains__(self, key: int) -> bool:
        return key in self._chunks

    def __len__(self) -> int:
        return len(self._chunks)

    def keys(self) -> list[int]:
        """Resident chunk keys, next eviction victim first."""
        return list(self._chunks)

    def touch(self, keys: Sequence[int]) -> None:
        """LRU only: move resident ``keys`` (prefix order) to the MRU end, last key first, so
        the first chunk of a prefix ends most recent and is evicted last. FIFO: no-op."""
        if not self._lru:
            return
        chunks = self._chunks
        for k in reversed(keys):
            if k in chunks:
                chunks.move_to_end(k)

    def count_hits(self, keys: Sequence[int], start: int) -> int:
        """Number of consecutive resident keys from ``keys[start]`` on (no side effects)."""
        chunks = self._chunks
        n = 0
        for k in keys[start:]:
            if k not in chunks:
                break
            n += 1
        return n

    def store(self, key: int) -> bool:
        """Write one chunk. A resident key is not copied again (LRU refreshes it); a full pool
        evicts its oldest (FIFO) or least recently used (LRU) chunk first. True if copied."""
        chunks = self._chunks
        if key in chunks:
            if self._lru:
                chunks.move_to_end(key)
            return False
        if len(chunks) >= self.num_chunks:
            chunks.popitem(last=False)
            self.evicted_chunks += 1
        chunks[key] = None
        self.stored_chunks += 1
        self.write_through_bytes += self.bytes_per_chunk
        return True

    # -- timing --------------------------------------------------------------------------
    def load_ns(self, nbytes: int, requesters: int = 1) -> int:
        """Finish time of ``requesters`` NPUs each loading ``nbytes`` from this tier at once:
        one access each, queued when the device serialises (host DRAM, CXL)."""
        if nbytes <= 0:
            return 0
        one = self.tier.access_ns(nbytes)
        return one * requesters if self.tier.serialised else one

    # -- stats ---------------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        return self.num_chunks * self.bytes_per_chunk

    @property
    def bytes_used(self) -> int:
        return len(self._chunks) * self.bytes_per_chunk

    def stats(self) -> dict[str, float | int | str]:
        """Pool-wide counters (summed over every instance sharing it) and occupancy."""
        return {
            "tier": self.name,
            "pool_id": self.pool_id,
            "policy": self.policy,
            "chunk_tokens": self.chunk_tokens,
            "capacity_chunks": self.num_chunks,
            "used_chunks": len(self._chunks),
            "capacity_bytes": self.capacity_bytes,
            "bytes_used": self.bytes_used,
            "usage": len(self._chunks) / self.num_chunks,
            "queries": self.queries,
            "query_tokens": self.query_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
            "stored_chunks": self.stored_chunks,
            "evicted_chunks": self.evicted_chunks,
            "recall_bytes": self.recall_bytes,
            "recall_ns": self.recall_ns,
            "write_through_bytes": self.write_through_bytes,
        }

    def check_invariants(self) -> None:
        """Occupancy within capacity and the counters consistent with it."""
        n = len(self._chunks)
        if n > self.num_chunks:
            raise AssertionError(f"kv tier {self.name}: {n} chunks > capacity {self.num_chunks}")
        if self.stored_chunks - self.evicted_chunks != n:
            raise AssertionError(
                f"kv tier {self.name}: stored {self.stored_chunks} - evicted "
                f"{self.evicted_chunks} != resident {n}"
            )
        if self.write_through_bytes != self.stored_chunks * self.bytes_per_chunk:
            raise AssertionError(f"kv tier {self.name}: write-through bytes disagree with stores")
        if self.hit_tokens > self.query_tokens:
            raise AssertionError(f"kv tier {self.name}: more hit tokens than queried tokens")


class SharedTierPools:
    """Pools shared by scope: e.g. ``("cpu", node_id)`` for a node's DRAM, ``("cxl", 0)`` for the
    cluster's CXL pool. The first request for a scope creates its pool (named ``scope[0]``, with
    ``pool_id`` ``"kind:index"``); later ones must agree on its geometry and size."""

    def __init__(self) -> None:
        self.pools: dict[tuple[str, int], KVTierPool] = {}

    def get(
        self,
        scope: tuple[str, int],
        tier: TierTiming,
        *,
        capacity_bytes: int,
        chunk_tokens: int,
        kv_bytes_per_token: int,
        policy: str = "lru",
    ) -> KVTierPool:
        pool = self.pools.get(scope)
        if pool is None:
            pool = KVTierPool(
                scope[0],
                tier,
                capacity_bytes=capacity_bytes,
                chunk_tokens=chunk_tokens,
                kv_bytes_per_token=kv_bytes_per_token,
                policy=policy,
                pool_id=f"{scope[0]}:{scope[1]}",
            )
            self.pools[scope] = pool
            return pool
        want = {
            "chunk_tokens": chunk_tokens,
            "kv_bytes_per_token": kv_bytes_per_token,
            "policy": policy,
            "capacity_chunks": capacity_bytes // pool.bytes_per_chunk,
        }
        have = {
            "chunk_tokens": pool.chunk_tokens,
            "kv_bytes_per_token": pool.kv_bytes_per_token,
            "policy": pool.policy,
            "capacity_chunks": pool.num_chunks,
        }
        for key, value in want.items():
            if have[key] != value:
                raise ConfigError(
                    f"shared kv tier {scope}: {key}={value!r} differs from {have[key]!r} of the "
                    "instances already sharing it; instances sharing a pool need the same model, "
                    "KV dtype, block size and tier size"
                )
        return pool

    def stats(self) -> dict[str, dict[str, float | int | str]]:
        """Pool-wide stats of every shared pool, by ``pool_id``."""
        return {p.pool_id: p.stats() for p in self.pools.values()}


class LowerTiers:
    """One instance's view of its lower tiers (in lookup order): lookup, recall, write-through,
    and the per-instance counters. Owned by a :class:`engine.kv_cache.KVCacheManager`."""

    __slots__ = (
        "pools",
        "factors",
        "requesters",
        "_pending",
        "_step_bytes",
        "_step_dirty",
        "queries",
        "query_tokens",
        "hit_tokens",
        "recall_bytes",
        "recall_ns",
        "write_through_bytes",
    )

    def __init__(
        self,
        pools: Sequence[KVTierPool],
        block_size: int,
        kv_bytes_per_token: int | None = None,
        recall_requesters: int = 1,
    ) -> None:
        names = [p.name for p in pools]
        if len(set(names)) != len(names):
            raise ConfigError(f"kv tiers: names {names} repeat; give each tier of an instance once")
        for p in pools:
            if p.chunk_tokens % block_size:
                raise ConfigError(
                    f"kv tier {p.name}: chunk_tokens={p.chunk_tokens} is not a multiple of the "
                    f"instance's block_size={block_size}; use chunk_tokens_for({block_size})"
                )
            if kv_bytes_per_token is not None and p.kv_bytes_per_token != kv_bytes_per_token:
                raise ConfigError(
                    f"kv tier {p.name}: the pool holds {p.kv_bytes_per_token} KV bytes per token, "
                    f"this instance {kv_bytes_per_token}; only instances with the same model and "
                    "KV dtype can share a pool"
                )
        self.pools = tuple(pools)
        self.factors = tuple(p.chunk_tokens // block_size for p in pools)
        self.requesters = _positive_int(
            recall_requesters,
            "kv tiers: recall_requesters",
            "give the number of NPUs of the instance that load recalled KV",
        )
        # The last lookup: (request index, tiers consulted, serving tier or -1, ext, loaded).
        self._pending: tuple[int, int, int, int, int] | None = None
        self._step_bytes = [0] * len(pools)
        self._step_dirty = False
        n = len(pools)
        self.queries = [0] * n
        self.query_tokens = [0] * n
        self.hit_tokens = [0] * n
        self.recall_bytes = [0] * n
        self.recall_ns = [0] * n
        self.write_through_bytes = [0] * n

    # -- admission -----------------------------------------------------------------------
    def lookup(self, req: Request, local_hit: int) -> int:
        """External hit tokens beyond the NPU's ``local_hit`` (vLLM connector semantics, last
        token recomputed). LRU tiers touch the request's resident keys. Remembered for
        :meth:`admit`; a result is valid only within the same ``schedule()`` call."""
        hashes = req.block_hashes
        reached = req.num_tokens
        for ti, pool in enumerate(self.pools):
            size = pool.chunk_tokens
            nb = reached // size
            if nb == 0:
                continue
            f = self.factors[ti]
            keys = hashes[f - 1 : f * nb : f]
            pool.touch(keys)
            if nb * size - local_hit < size:
                continue
            start = local_hit // size
            hits = pool.count_hits(keys, start)
            loaded = size * (start + hits) - local_hit
            if loaded < size:
                continue
            ext = loaded if local_hit + loaded < reached else reached - 1 - local_hit
            if ext <= 0:
                continue
            self._pending = (req.index, ti + 1, ti, ext, loaded)
            return ext
        self._pending = (req.index, len(self.pools), -1, 0, 0)
        return 0

    def admit(self, req: Request) -> int:
        """Record the admission of ``req`` after its :meth:`lookup`: query/hit counters and the
        recall bytes charged to this step. Returns the external hit tokens."""
        pending = self._pending
        if pending is None or pending[0] != req.index:
            raise RuntimeError(f"kv tiers: admit({req.request_id!r}) without a matching lookup")
        self._pending = None
        _, consulted, ti, ext, loaded = pending
        n = req.num_tokens
        for i in range(consulted):
            pool = self.pools[i]
            self.queries[i] += 1
            self.query_tokens[i] += n
            pool.queries += 1
            pool.query_tokens += n
        if ti >= 0:
            pool = self.pools[ti]
            nbytes = loaded * pool.kv_bytes_per_token
            self.hit_tokens[ti] += ext
            pool.hit_tokens += ext
            self.recall_bytes[ti] += nbytes
            pool.recall_bytes += nbytes
            self._step_bytes[ti] += nbytes
            self._step_dirty = True
        return ext

    def take_recall_ns(self) -> int:
        """Critical-path time of this step's recalls (one access per tier of the summed bytes,
        tiers one after another), and reset the step's accumulators."""
        if not self._step_dirty:
            return 0
        total = 0
        for ti, nbytes in enumerate(self._step_bytes):
            if nbytes:
                pool = self.pools[ti]
                t = pool.load_ns(nbytes, self.requesters)
                self.recall_ns[ti] += t
                pool.recall_ns += t
                total += t
                self._step_bytes[ti] = 0
        self._step_dirty = False
        return total

    # -- write-through -------------------------------------------------------------------
    def write_down(self, hashes: Sequence[int], old_full: int, new_full: int) -> None:
        """Store every chunk completed between ``old_full`` and ``new_full`` full NPU blocks."""
        for ti, pool in enumerate(self.pools):
            f = self.factors[ti]
            for c in range(old_full // f, new_full // f):
                if pool.store(hashes[f * c + f - 1]):
                    self.write_through_bytes[ti] += pool.bytes_per_chunk

    # -- stats ---------------------------------------------------------------------------
    def stats(self) -> dict[str, dict[str, float | int | str]]:
        """Per tier: this instance's counters, plus the pool's occupancy and pool-wide counters
        (under ``pool_*``; equal to the instance's when the pool is private)."""
        out: dict[str, dict[str, float | int | str]] = {}
        for ti, pool in enumerate(self.pools):
            q = self.query_tokens[ti]
            row: dict[str, float | int | str] = {
                "queries": self.queries[ti],
                "query_tokens": q,
                "hit_tokens": self.hit_tokens[ti],
                "hit_rate": self.hit_tokens[ti] / q if q else 0.0,
                "recall_bytes": self.recall_bytes[ti],
                "recall_ns": self.recall_ns[ti],
                "write_through_bytes": self.write_through_bytes[ti],
            }
            for key, value in pool.stats().items():
                if key in row:
                    row[f"pool_{key}"] = value
                else:
                    row[key] = value
            out[pool.name] = row
        return out
