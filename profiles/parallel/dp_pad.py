"""How the batches of a lock-step DP group are lined up before they are priced.

The engine's ``engine.deployment.DpPad``: given each member's batch (None for an idle
member), the shapes the members run in one round. :class:`VllmDpPad` is vLLM 0.19's rule,
:func:`pad_dp_group` the reference simulator's (docs/reference-semantics.md §6.4).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.batch import BatchShape
from engine.deployment import DpPad
from engine.specs import ConfigError, EngineConfig


def dummy_batch() -> BatchShape:
    """The batch an idle DP member runs: one decode of KV length 1 (reference / vLLM dummy run)."""
    return BatchShape(1, 1, 0, 0, 1, 1, 1, 1)


def pad_dp_group(shapes: Sequence[BatchShape | None]) -> list[BatchShape]:
    """Shapes the members of a DP group run in one lock-step round.

    ``None`` (an idle member) becomes :func:`dummy_batch`. Every batch is then padded to the
    group's largest ``total_tokens`` m as the reference does (docs/reference-semantics.md
    §6.4): the pad counts as dummy decodes, so ``total_tokens = m`` and ``num_seqs`` grows by
    the pad (dense rows, MoE, lm_head and sampler see it) while the attention fields
    (``num_decode`` and the decode KV statistics) keep only the real entries. An all-idle group
    yields no round (empty list).
    """
    real = _with_dummies(shapes, "pad_dp_group")
    if not real:
        return []
    m = max(s.total_tokens for s in real)
    return [s if s.total_tokens == m else
            _resized(s, m, s.num_seqs + m - s.total_tokens, s.moe_tokens) for s in real]


def _with_dummies(shapes: Sequence[BatchShape | None], who: str) -> list[BatchShape]:
    """The group's batches with each idle member's dummy batch; [] when all are idle."""
    if not shapes:
        raise ConfigError(f"{who}: empty group; pass one entry (or None) per DP member")
    out = []
    busy = False
    for s in shapes:  # (loops, not generators: this runs every round of a DP group)
        if s is None:
            out.append(dummy_batch())
        else:
            out.append(s)
            busy = True
    return out if busy else []


def _resized(s: BatchShape, total_tokens: int, num_seqs: int, moe_tokens: int) -> BatchShape:
    """``s`` with these token, sequence and MoE counts (``s._replace``'s result, built
    directly: a DP round pads every member's batch, and ``_replace`` costs several times a
    constructor call)."""
    return BatchShape(total_tokens, num_seqs, s.prefill_tokens, s.prefill_kv, s.num_decode,
                      s.decode_kv_sum, s.decode_kv_min, s.decode_kv_max, moe_tokens)


def cudagraph_max_tokens(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """vLLM 0.19's default largest CUDA-graph batch: ``min(2*max_num_seqs, 512,
    max_num_batched_tokens)`` tokens (``VllmConfig`` capture sizes, no speculative decoding)."""
    return max(1, min(2 * max_num_seqs, 512, max_num_batched_tokens))


class VllmDpPad:
    """How vLLM 0.19 lines up the batches of a DP group for one lock-step round.

    An idle member runs a dummy batch of one token (``execute_dummy_batch``). Every member then
    takes part in ``coordinate_batch_across_dp``: the batches are padded to the group's largest
    token count only when every member's batch runs as a CUDA graph (at most ``cudagraph_max``
    tokens, see :func:`cudagraph_max_tokens`); otherwise each member runs its own size
    (``vllm/v1/worker/dp_utils.py``: DP padding follows the synced CUDA-graph mode). The pad
    runs through the model's layers but is never sampled (vLLM computes logits only at the real
    requests' ``logits_indices``), so unlike :func:`pad_dp_group` it leaves ``num_seqs`` alone.
    Every batch carries the group's token sum as
    ``moe_tokens``: when EP spans the DP group, vLLM's default ``allgather_reducescatter``
    dispatch all-gathers the batches before the experts run, so each member's experts see all
    of them (``profiles.parallel.latency.ParallelLatencyModel`` ignores it for layouts whose EP
    stays inside the instance, and for dense models). The finer padding to each member's CUDA-graph bucket
    (125 -> 128 tokens) is not modelled.
    """

    def __init__(self, cudagraph_max: int) -> None:
        if cudagraph_max < 0:
            raise ConfigError(f"cudagraph_max = {cudagraph_max}: must be >= 0 (0: no CUDA graphs)")
        self.cudagraph_max = cudagraph_max

    def __call__(self, shapes: Sequence[BatchShape | None]) -> list[BatchShape]:
        real = _with_dummies(shapes, "VllmDpPad")
        if not real:
            return []
        m = 0
        total = 0
        for s in real:
            t = s.total_tokens
            total += t
            if t > m:
                m = t
        pad = m <= self.cudagraph_max
        if len(real) == 1:
            return real  # its own size is the group's largest: nothing to pad or gather
        g = m * len(real) if pad else total  # the group's token sum after padding
        out = []
        for s in real:
            out.append(_resized(s, m if pad else s.total_tokens, s.num_seqs, g))
        return out


def dp_pad_for(rule: str, config: EngineConfig) -> DpPad | None:
    """The padding of a deployment's lock-step DP groups: ``"vllm"`` (:class:`VllmDpPad` at
    the CUDA-graph limit of ``config``), ``"reference"`` (:func:`pad_dp_group`) or ``"none"``."""
    if rule == "vllm":
        return VllmDpPad(cudagraph_max_tokens(config.max_num_seqs, config.max_num_batched_tokens))
    if rule == "reference":
        return pad_dp_group
    if rule == "none":
        return None
    raise ConfigError(f"dp padding {rule!r}: use 'vllm', 'reference' or 'none'")
