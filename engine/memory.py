"""The instance memory model: per-rank weight bytes and the KV-cache capacity in blocks.

Capacity follows the formula ``mem_size · gpu_memory_utilization − weights`` per rank, split
into blocks of ``block_size`` tokens over all layers of the rank (vLLM ``get_num_blocks``:
``floor(available / (page_size · L))``, with ``page_size = 2 · B · kv_heads_rank · head_dim ·
kv_bytes``). Activation peak and CUDA context are not subtracted unless
``EngineConfig.extra["non_kv_overhead_gib"]`` says how much to reserve; a measured block count
(``num_gpu_blocks_override``) replaces the formula entirely, as vLLM does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.specs import GIB, ConfigError, EngineConfig, HardwareSpec, InfeasibleError, ModelSpec

DTYPE_BYTES = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}


def dtype_bytes(name: str, field: str = "dtype") -> int:
    """Bytes per element of a weight or KV-cache dtype name (the one table of them)."""
    try:
        return DTYPE_BYTES[str(name).lower()]
    except KeyError:
        raise ConfigError(
            f"{field}={name!r} is not a known dtype; use one of {sorted(DTYPE_BYTES)}"
        ) from None


def kv_dtype_bytes(model: ModelSpec, kv_cache_dtype: str | None) -> int:
    """Bytes per element of the KV cache: the model's dtype for ``"auto"``, else the KV dtype
    (vLLM ``CacheConfig.cache_dtype``)."""
    if kv_cache_dtype in ("auto", "", None):
        return dtype_bytes(model.dtype, "model.dtype")
    return dtype_bytes(kv_cache_dtype, "kv_cache_dtype")


def weight_bytes_per_rank(model: ModelSpec, tp: int = 1, ep: int = 1, pp: int = 1) -> int:
    """Weight bytes one rank holds: vocab-parallel embedding/lm_head, TP-split attention and
    MLP, MoE experts split by EP (replicated router), replicated norms; layers split by PP.

    This counts real parameters (tied embeddings stored once), as vLLM's weight memory does.
    """
    fp = dtype_bytes(model.dtype, "model.dtype")
    h = model.hidden_size
    q_dim = model.num_attention_heads * model.head_dim
    kv_rank = max(1, model.num_kv_heads // tp) * model.head_dim
    vocab_rank = math.ceil(model.vocab_size / tp)
    embed = vocab_rank * h
    lm_head = 0 if model.tie_word_embeddings else vocab_rank * h
    attn = h * (q_dim // tp + 2 * kv_rank) + (q_dim // tp) * h
    if model.is_moe:
        f = model.moe_intermediate_size or model.intermediate_size
        experts_rank = math.ceil(model.num_experts / ep)
        mlp = h * model.num_experts + experts_rank * 3 * h * f
        if ep == 1 and tp > 1:  # without EP, vLLM shards each expert's FFN over TP
            mlp = h * model.num_experts + model.num_experts * 3 * h * (f // tp)
    else:
        mlp = 3 * h * (model.intermediate_size // tp)
    norms = 2 * h
    layers_rank = math.ceil(model.num_layers / pp)
    params = embed + lm_head + layers_rank * (attn + mlp + norms) + h
    return params * fp


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """KV-cache size of one instance (per rank; every rank holds the same number of blocks)."""

    num_blocks: int  # including the null block, as vLLM's num_gpu_blocks
    block_size: int
    bytes_per_block: int  # per rank, all layers of the rank
    weight_bytes: int  # per rank
    formula_num_blocks: int  # what the formula gives (== num_blocks unless overridden)
    num_ranks: int = 1  # GPUs of the instance holding a share of its KV: tp x pp

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token for the whole instance (every rank's shard, all layers): what a
        prefix-cache tier below the NPU stores per token. The one definition of it."""
        return self.bytes_per_block // self.block_size * self.num_ranks

    @property
    def gib_per_rank(self) -> float:
        return self.num_blocks * self.bytes_per_block / GIB

    def describe(self, label: str = "instance 0") -> str:
        return (
            f"KV cache [{label}]: {self.tokens} tokens / {self.num_blocks} blocks "
            f"({self.gib_per_rank:.2f} GiB/rank)"
        )


def kv_capacity(model: ModelSpec, hardware: HardwareSpec, config: EngineConfig) -> KVCapacity:
    """Blocks of KV cache one instance gets (``mem_size · gpu_memory_utilization − weights``
    per rank)."""
    config.check_model(model)  # the settings' own range checks ran when it was built
    tp = config.tensor_parallel_size
    pp = config.pipeline_parallel_size
    ep = config.expert_parallel_size
    kv_bytes = kv_dtype_bytes(model, config.kv_cache_dtype)
    kv_heads_rank = max(1, model.num_kv_heads // tp)
    page = 2 * config.block_size * kv_heads_rank * model.head_dim * kv_bytes
    # The rank holding the most layers bounds the block count (vLLM takes the minimum over
    # workers); stages get L//pp layers, the remainder one each (vLLM get_pp_indices).
    bytes_per_block = page * math.ceil(model.num_layers / pp)
    weights = weight_bytes_per_rank(model, tp=tp, ep=ep, pp=pp)
    requested = math.ceil(hardware.mem_gib * GIB * config.gpu_memory_utilization)
    overhead = int(float(config.extra.get("non_kv_overhead_gib", 0.0)) * GIB)
    available = requested - weights - overhead
    formula_blocks = available // bytes_per_block if available > 0 else 0
    if config.num_gpu_blocks_override is not None:
        num_blocks = config.num_gpu_blocks_override
    else:
        if formula_blocks < 2:
            raise InfeasibleError(
                f"{model.name} does not fit on {hardware.name} at tensor_parallel_size={tp}, "
                f"pipeline_parallel_size={pp}: "
                f"{weights / GIB:.1f} GiB of weights per rank (+{overhead / GIB:.1f} GiB reserved) "
                f"vs {requested / GIB:.1f} GiB usable at gpu_memory_utilization="
                f"{config.gpu_memory_utilization}; raise tensor_parallel_size, use a larger "
                "accelerator or raise gpu_memory_utilization"
            )
        num_blocks = int(formula_blocks)
    return KVCapacity(
        num_blocks=num_blocks,
        block_size=config.block_size,
        bytes_per_block=bytes_per_block,
        weight_bytes=weights,
        formula_num_blocks=int(max(formula_blocks, 0)),
        num_ranks=tp * pp,
    )
