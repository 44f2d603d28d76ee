"""Request state in vLLM V1 terms (``vllm/v1/request.py``).

The engine knows every token id of a replayed request in advance (prompt ids from the
workload, output ids from the workload or generated), so ``all_token_ids`` holds the whole
final sequence and ``num_tokens`` says how much of it has been *reached* (prompt plus the
outputs accepted so far). Block hashes are computed once for the whole sequence; only the
first ``num_tokens // block_size`` of them are visible, exactly as vLLM's incremental
request block hasher would have produced them by then.
"""

from __future__ import annotations

from enum import IntEnum

from engine.workload import RequestSpec

# The parent hash of block 0 (vLLM's NONE_HASH). Any fixed value works: hashes only need
# to be equal for equal prefixes within one simulation.
NONE_HASH = 0x5E7E5EED


class RequestStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


def chained_block_hashes(token_ids: tuple[int, ...] | list[int], block_size: int) -> list[int]:
    """Chained hash of every full block: ``h_i = H((h_{i-1}, tokens_i))``.

    Python's tuple hash over ints is deterministic across processes (no hash
    randomisation for ints/tuples), which keeps simulations reproducible.
    """
    hashes: list[int] = []
    parent = NONE_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


def synthetic_output_ids(index: int, length: int) -> tuple[int, ...]:
    """Output ids for a request whose workload gives none: unique per request, negative so
    they never collide with real vocabulary ids (and so never produce false prefix hits)."""
    base = -(index + 1) * 1_000_003
    return tuple(range(base, base - length, -1))


class Request:
    """Mutable per-request simulation state. All timestamps are integer ns."""

    __slots__ = (
        "request_id",
        "index",
        "arrival_ns",
        "prompt_len",
        "max_tokens",
        "all_token_ids",
        "block_hashes",
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
        "token_times_ns",
        "prefix_hit_tokens",
        "recomputed_tokens",
    )

    def __init__(self, spec: RequestSpec, index: int, block_size: int, hash_blocks: bool) -> None:
        self.request_id = spec.request_id
        self.index = index
        self.arrival_ns = int(spec.arrival_ns)
        self.prompt_len = spec.prompt_len
        self.max_tokens = int(spec.output_len)
        out_ids = (
            spec.output_ids
            if spec.output_ids is not None and len(spec.output_ids) >= spec.output_len
            else synthetic_output_ids(index, spec.output_len)
        )
        self.all_token_ids: tuple[int, ...] = tuple(spec.prompt_ids) + tuple(
            out_ids[: spec.output_len]
        )
        self.block_hashes: list[int] = (
            chained_block_hashes(self.all_token_ids, block_size) if hash_blocks else []
        )
        self.num_tokens = self.prompt_len  # prompt + outputs accepted so far
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0  # async scheduling: scheduled, not yet returned
        self.num_cached_tokens = -1  # set once, on first admission (vLLM semantics)
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        # When the engine loop picked the request up (vLLM stamps EngineCoreEventType.QUEUED
        # in Scheduler.add_request, called from the busy loop's input-queue drain, i.e. at a
        # step boundary, not at network arrival); -1 until then.
        self.queued_ns = -1
        self.first_scheduled_ns = -1
        self.first_token_ns = -1
        self.finish_ns = -1
        self.token_times_ns: list[int] = []
        self.prefix_hit_tokens = 0  # summed over every admission (first and resumed)
        self.recomputed_tokens = 0  # tokens recomputed after preemption

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.prompt_len

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={self.status.name})"
        )
