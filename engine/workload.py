"""The engine's view of a workload: a list of request specifications sorted by arrival."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to replay.

    ``prompt_ids`` are the prompt token ids (used for prefix-cache hashing); ``output_ids``
    are the ids to emit (``None``: the engine generates deterministic ids that never collide
    with another request's output). ``output_len`` is the number of tokens to generate.

    The ids may be any sequence of ints: a tuple, a ``range`` (the JSONL reader's lazy
    placeholder ids) or a compact ``array('q')`` (ids the readers load). The engine only
    takes their length, slices and int values, so block hashes depend on the values alone.
    """

    request_id: str
    arrival_ns: int
    prompt_ids: Sequence[int]
    output_len: int
    output_ids: Sequence[int] | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)
