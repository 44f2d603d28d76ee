"""Work of one layer on one tensor-parallel rank: floating-point operations and HBM bytes.

Everything is vectorised over numpy arrays of keys (tokens, sequences, attention grid rows,
MoE rows) and returns a :class:`Work` with float64 arrays. Shapes are per rank: attention
heads, KV heads, MLP width and vocabulary are split by the TP degree as vLLM shards them
(KV heads are replicated when ``tp > num_kv_heads``). Layers whose work does not shrink
with TP (norms, sampler) are priced with ``tp = 1`` by the caller, as the profiler does.

Byte counts use the weight dtype for weights, the KV dtype for the KV cache and 2-byte
(bf16) activations; ``lm_head``, the embedding table and the MoE router stay in the
activation dtype (vLLM's fp8 schemes leave them unquantised).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from engine.specs import ConfigError, ModelSpec

ACT_BYTES = 2.0  # bf16/fp16 activations
Q_TILE = 128  # query rows per thread block of the varlen (prefill) attention kernel


@dataclass(frozen=True, slots=True)
class Precision:
    """Byte widths of one bundle variant."""

    weight_bytes: float
    kv_bytes: float
    fp8_compute: bool  # GEMMs run on fp8 tensor cores (W8A8)


_WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def parse_variant(variant: str) -> Precision:
    """Precision of a bundle variant name: ``<weights>`` or ``<weights>-kv<kv>`` (``bf16-kvfp8``)."""
    weights, sep, kv = variant.partition("-kv")
    if weights not in _WEIGHT_BYTES:
        raise ConfigError(
            f"variant '{variant}': unknown weight dtype '{weights}'; use one of {sorted(_WEIGHT_BYTES)}"
        )
    wb = _WEIGHT_BYTES[weights]
    if not sep:
        kvb = max(wb, ACT_BYTES) if weights != "fp32" else 4.0
    elif kv in ("fp8", "int8"):
        kvb = 1.0
    elif kv in ("bf16", "fp16"):
        kvb = 2.0
    else:
        raise ConfigError(f"variant '{variant}': unknown KV-cache dtype '{kv}'; use fp8, bf16 or fp16")
    return Precision(weight_bytes=wb, kv_bytes=kvb, fp8_compute=weights == "fp8")


@dataclass(frozen=True, slots=True)
class RankShape:
    """Per-rank tensor dimensions of a model at one TP degree."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    experts: int
    top_k: int
    expert_inter: int

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> RankShape:
        if tp < 1:
            raise ConfigError(f"tensor parallel degree must be >= 1, got {tp}")
        if model.num_attention_heads % tp:
            raise ConfigError(
                f"{model.name}: {model.num_attention_heads} attention heads do not split over tp={tp}"
            )
        if model.num_kv_heads >= tp:
            if model.num_kv_heads % tp:
                raise ConfigError(f"{model.name}: {model.num_kv_heads} KV heads do not split over tp={tp}")
            kv_heads = model.num_kv_heads // tp
        else:
            if tp % model.num_kv_heads:
                raise ConfigError(
                    f"{model.name}: tp={tp} is not a multiple of its {model.num_kv_heads} KV heads"
                )
            kv_heads = 1
        inter = model.intermediate_size
        if not model.is_moe:
            if inter % tp:
                raise ConfigError(f"{model.name}: intermediate_size {inter} does not split over tp={tp}")
            inter //= tp
        return cls(
            hidden=model.hidden_size,
            heads=model.num_attention_heads // tp,
            kv_heads=kv_heads,
            head_dim=model.head_dim,
            inter=inter,
            vocab=-(-model.vocab_size // tp),
            experts=model.num_experts,
            top_k=model.num_experts_per_tok,
            expert_inter=model.moe_intermediate_size or model.intermediate_size,
        )


@dataclass(frozen=True, slots=True)
class Work:
    """Per-row work of one kernel: FLOPs, HBM bytes, and serial keys (attention only)."""

    flops: np.ndarray
    bytes: np.ndarray
    serial_keys: np.ndarray | None = None  # longest key sequence one thread block walks
    sequences: np.ndarray | None = None  # sequences in the varlen batch (attention only)
    # Attention only: extra KV bytes if decodes batched with a prefill re-read K/V once per
    # query head instead of once per KV head (the non-split varlen path); scaled by a factor.
    gqa_extra_bytes: np.ndarray | None = None
    # Attention only: K+V bytes of the decodes for one KV head (the set the query heads of a
    # group re-read; it is re-read from HBM once it outgrows the on-chip cache).
    gqa_set_bytes: np.ndarray | None = None
    # Attention only: thread blocks launched for decodes beyond their one query tile (the
    # varlen grid is sized by the longest query, the prefill chunk) that exit at once.
    empty_blocks: np.ndarray | None = None
    # Attention only: rows without a prefill chunk, which run the split-KV decode kernel.
    decode_only: np.ndarray | None = None
    # Lower bounds: (work, mask) pairs; where mask is true the row takes at least that work's
    # time (a mixed attention call is never faster than its prefill or its decodes alone).
    floors: tuple[tuple[Work, np.ndarray], ...] = ()


def _gemm(t: np.ndarray, k: int, n: int, wb: float) -> Work:
    flops = 2.0 * t * k * n
    nbytes = k * n * wb + t * (k + n) * ACT_BYTES
    return Work(flops, nbytes)


def dense_work(layer: str, s: RankShape, p: Precision, tokens: np.ndarray) -> Work:
    """Work of a dense-table layer at ``tokens`` new tokens (one request, no history)."""
    t = tokens.astype(np.float64)
    h, d = s.hidden, s.head_dim
    zero = np.zeros_like(t)
    if layer == "embedding":
        return Work(zero, t * 4.0 + 2.0 * t * h * ACT_BYTES)
    if layer == "layernorm":
        # The two block norms are averaged by the profiler: a plain RMSNorm (read, write)
        # and a fused residual-add RMSNorm (read x and residual, write both): 3 passes.
        return Work(5.0 * t * h, 3.0 * t * h * ACT_BYTES + h * ACT_BYTES)
    if layer == "final_layernorm":
        return Work(5.0 * t * h, 4.0 * t * h * ACT_BYTES + h * ACT_BYTES)
    if layer == "qk_norm":
        # Averaged over the q-norm (heads) and k-norm (kv_heads) invocations.
        width = 0.5 * (s.heads + s.kv_heads) * d
        return Work(5.0 * t * width, 2.0 * t * width * ACT_BYTES)
    if layer == "rotary_emb":
        width = (s.heads + s.kv_heads) * d
        return Work(3.0 * t * width, 2.0 * t * width * ACT_BYTES + t * (d * ACT_BYTES + 8.0))
    if layer == "act_fn":
        return Work(5.0 * t * s.inter, 3.0 * t * s.inter * ACT_BYTES)
    wb = p.weight_bytes
    if layer == "qkv_proj":
        return _gemm(t, h, (s.heads + 2 * s.kv_heads) * d, wb)
    if layer == "o_proj":
        return _gemm(t, s.heads * d, h, wb)
    if layer == "gate_up_proj":
        return _gemm(t, h, 2 * s.inter, wb)
    if layer == "down_proj":
        return _gemm(t, s.inter, h, wb)
    raise ConfigError(f"the roofline model has no dense cost formula for layer '{layer}'")


def per_sequence_work(layer: str, s: RankShape, sequences: np.ndarray) -> Work:
    """Work of ``lm_head`` / ``sampler`` for ``sequences`` one-token requests."""
    n = sequences.astype(np.float64)
    if layer == "lm_head":
        w = _gemm(n, s.hidden, s.vocab, ACT_BYTES)
        return Work(w.flops, w.bytes + n * s.vocab * 4.0)  # fp32 logits
    if layer == "sampler":
        # Greedy sampling over fp32 logits: read them, write a float copy, reduce.
        return Work(2.0 * n * s.vocab, 2.0 * n * s.vocab * 4.0 + n * 8.0)
    raise ConfigError(f"the roofline model has no per-sequence cost formula for layer '{layer}'")


def attention_work(
    s: RankShape,
    p: Precision,
    prefill_chunk: np.ndarray,
    kv_prefill: np.ndarray,
    n_decode: np.ndarray,
    kv_decode: np.ndarray,
) -> Work:
    """Work of one varlen attention call (see :func:`attention_call_work`), with floors.

    A row holding both a prefill chunk and decodes is floored by the time of its prefill part
    alone and of its decode part alone, so adding work to a call never makes it faster.
    """
    pc, kp, nd, kv = (np.asarray(a) for a in (prefill_chunk, kv_prefill, n_decode, kv_decode))
    zero = np.zeros_like(pc)
    full = attention_call_work(s, p, pc, kp, nd, kv)
    prefill_part = attention_call_work(s, p, pc, kp, zero, zero)
    decode_part = attention_call_work(s, p, zero, zero, nd, kv)
    mixed = (pc > 0) & (nd > 0)
    return dataclasses.replace(full, floors=((prefill_part, mixed), (decode_part, mixed)))


def attention_call_work(
    s: RankShape,
    p: Precision,
    prefill_chunk: np.ndarray,
    kv_prefill: np.ndarray,
    n_decode: np.ndarray,
    kv_decode: np.ndarray,
) -> Work:
    """One varlen attention call: a causal prefill chunk with history plus ``n_decode`` decodes.

    FLOPs count QK^T and PV (2 x 2 per query-key-dim), causal within the chunk. Bytes: Q
    read and O written in activation dtype, every KV position of each KV head read once, and
    the new tokens' K and V written into the cache (the profiled module includes that).
    """
    pc = prefill_chunk.astype(np.float64)
    kp = kv_prefill.astype(np.float64)
    nd = n_decode.astype(np.float64)
    kv = kv_decode.astype(np.float64)
    d = s.head_dim
    qk_pairs = pc * (kp + (pc + 1.0) / 2.0) + nd * (kv + 1.0)
    flops = 4.0 * s.heads * d * qk_pairs
    kv_row = 2.0 * s.kv_heads * d * p.kv_bytes  # K and V of one position
    keys_read = np.where(pc > 0, kp + pc, 0.0) + nd * (kv + 1.0)
    nbytes = kv_row * (keys_read + pc + nd) + 2.0 * (pc + nd) * s.heads * d * ACT_BYTES
    # A varlen call with a prefill walks each sequence's keys with one block per (head, q-tile):
    # the longest sequence bounds it. Pure-decode calls split the keys across blocks.
    longest = np.maximum(np.where(pc > 0, kp + pc, 0.0), np.where(nd > 0, kv + 1.0, 0.0))
    serial = np.where(pc > 0, longest * (d / 128.0), 0.0)
    sequences = nd + (pc > 0)
    group = s.heads / s.kv_heads
    mixed = pc > 0
    gqa_extra = np.where(mixed, kv_row * nd * (kv + 1.0) * (group - 1.0), 0.0)
    gqa_set = np.where(mixed, kv_row / s.kv_heads * nd * (kv + 1.0), 0.0)
    q_tiles = np.ceil(pc / Q_TILE)
    empty = np.where(mixed, nd * np.maximum(q_tiles - 1.0, 0.0) * s.heads, 0.0)
    return Work(flops, nbytes, serial_keys=serial, sequences=sequences, gqa_extra_bytes=gqa_extra,
                gqa_set_bytes=gqa_set, empty_blocks=empty, decode_only=pc == 0)


def moe_work(s: RankShape, p: Precision, tokens: np.ndarray, activated: np.ndarray) -> Work:
    """Sparse MoE block on one rank holding all experts: router GEMM plus fused experts.

    ``activated`` experts each receive ``tokens * top_k / activated`` routed rows. Only the
    activated experts' weights (gate/up and down, ``3 * hidden * expert_inter``) are read.
    """
    if s.experts <= 0:
        raise ConfigError("moe_work called for a dense model")
    t = tokens.astype(np.float64)
    a = activated.astype(np.float64)
    h, fe, e, k = s.hidden, s.expert_inter, s.experts, s.top_k
    routed = t * k
    flops = 2.0 * t * h * e + 2.0 * routed * 3.0 * h * fe
    nbytes = (
        h * e * ACT_BYTES
        + a * 3.0 * h * fe * p.weight_bytes
        + 2.0 * t * h * ACT_BYTES
        + routed * (2.0 * h + 3.0 * fe) * ACT_BYTES
    )
    return Work(flops, nbytes)
