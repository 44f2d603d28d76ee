"""The engine's view of a workload: a list of request specifications sorted by arrival."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to replay.

    ``prompt_ids`` are the prompt token ids (used for prefix-cache hashing); ``output_ids``
    are the ids to emit (``None``: the engine generates deterministic ids that never collide
    with another request's output). ``output_len`` is the number of tokens to generate.
    """

    request_id: str
    arrival_ns: int
    prompt_ids: tuple[int, ...]
    output_len: int
    output_ids: tuple[int, ...] | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)
