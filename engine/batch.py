"""What the scheduler hands to the latency model for one engine step."""

from __future__ import annotations

from typing import NamedTuple, Protocol


class BatchShape(NamedTuple):
    """Aggregate shape of one scheduled step, as the profiled timing model sees it.

    A scheduled entry with more than one token is a prefill chunk; exactly one token is a
    decode (vLLM has no phases; this is the reference timing model's classification).
    Hashable so lookups can be memoised.
    """

    total_tokens: int  # sum of scheduled tokens over all entries
    num_seqs: int  # number of scheduled requests (lm_head / sampler rows)
    prefill_tokens: int  # sum of prefill chunk sizes ("pc")
    prefill_kv: int  # sum of tokens already computed before this step, prefill entries ("kp")
    num_decode: int  # number of decode entries ("nd")
    decode_kv_sum: int  # sum over decodes of tokens computed before this step
    decode_kv_min: int  # 0 when num_decode == 0
    decode_kv_max: int  # 0 when num_decode == 0
    # Tokens this rank's MoE experts process, when not total_tokens: under DP with EP across
    # the group, vLLM all-gathers every member's batch before the experts run. 0 = total_tokens.
    moe_tokens: int = 0


def decode_advanced(shape: BatchShape, i: int) -> BatchShape:
    """``shape`` with every decode ``i`` tokens further: step ``i`` of a run of pure-decode
    steps from ``shape`` (what ``decode_steps_ns`` prices, see :class:`LatencyModel`)."""
    if i == 0:
        return shape
    n = shape.num_decode
    return BatchShape(shape.total_tokens, shape.num_seqs, shape.prefill_tokens, shape.prefill_kv,
                      n, shape.decode_kv_sum + i * n, shape.decode_kv_min + i,
                      shape.decode_kv_max + i, shape.moe_tokens)


class LatencyModel(Protocol):
    """Prices one engine step: every method the engine calls. Implemented by ``profiles``
    (measured or roofline bundles, with collectives: ``profiles.parallel.latency``).

    A model may also offer ``decode_steps_ns(shape, k) -> list[int]``: :meth:`iteration_ns`
    of ``k`` consecutive pure-decode steps from ``shape`` (step ``i`` with every decode ``i``
    tokens further), the same integers as ``k`` calls; ``engine.instance`` uses it for steady
    decode spans and otherwise calls :meth:`iteration_ns` per step."""

    def iteration_ns(self, shape: BatchShape) -> int:
        """Wall time of one forward step of this batch through every pipeline stage: when its
        tokens are produced, integer nanoseconds."""
        ...

    def stage_ns(self, shape: BatchShape) -> int:
        """How long after this step starts the next one may start: the busiest pipeline
        stage's time (pipelined steps overlap), integer nanoseconds. Equal to
        :meth:`iteration_ns` without pipeline parallelism."""
        ...
