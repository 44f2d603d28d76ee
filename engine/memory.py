"""The instance memory model: per-rank weight bytes and the KV-cache capacity in blocks.

The one place capacity is computed. ``EngineConfig.kv_capacity_model`` selects the budget:

* ``"vllm"`` (default): vLLM 0.19's ``determine_available_memory`` —
  ``ceil(mem_size · gpu_memory_utilization)`` minus the weights as vLLM measures them
  (parameters + rotary cache), the activation peak of the profiling run at
  ``max_num_batched_tokens`` (forward pass and sampler at ``max_num_seqs``) and non-torch
  memory; CUDA-graph memory is not subtracted (0.19's default). Each term and its evidence is
  in :mod:`engine.kv_budget`; the published data points it is checked against are
  ``tests/engine/data/kv_published.yaml`` (docs/validation.md).
* ``"upper_bound"``: ``mem_size · gpu_memory_utilization − weights``, what vLLM could give at
  most.

The budget is split into blocks of ``block_size`` tokens over all layers of the rank (vLLM
``get_num_blocks``: ``floor(available / (page_size · L))``, with ``page_size = 2 · B ·
kv_heads_rank · head_dim · kv_bytes``). ``EngineConfig.extra["non_kv_overhead_gib"]`` reserves
more on top of either budget (another process on the GPU, say); a measured block count
(``num_gpu_blocks_override``) replaces the budget entirely, as vLLM does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.specs import GIB, ConfigError, EngineConfig, HardwareSpec, InfeasibleError, ModelSpec

# Architectures whose attention has per-head RMSNorms on q and k (head_dim weights each;
# vLLM ``Qwen3Attention.q_norm`` / ``k_norm``).
QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe"})

if TYPE_CHECKING:
    from engine.kv_budget import KVBudget

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
    """Parameter bytes one rank holds: vocab-parallel embedding/lm_head, TP-split attention and
    MLP, MoE experts split by EP (replicated router), replicated norms (and the per-head q/k
    norms of Qwen3); layers split by PP.

    This counts real parameters (tied embeddings stored once), as vLLM's weight memory does,
    with the vocabulary padded to a multiple of 64 before the TP split (vLLM
    ``VocabParallelEmbedding``: ``pad_vocab_size``, then ``num_embeddings_padded / tp``).
    Persistent buffers (the rotary cache) are :mod:`engine.kv_budget`'s.
    """
    from engine.kv_budget import padded_vocab  # the module imports this one's dtype table

    fp = dtype_bytes(model.dtype, "model.dtype")
    h = model.hidden_size
    q_dim = model.num_attention_heads * model.head_dim
    kv_rank = max(1, model.num_kv_heads // tp) * model.head_dim
    vocab_rank = math.ceil(padded_vocab(model) / tp)
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
    norms = 2 * h + (2 * model.head_dim if model.model_type in QK_NORM_MODEL_TYPES else 0)
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
    formula_num_blocks: int  # what the budget gives (== num_blocks unless overridden)
    num_ranks: int = 1  # GPUs of the instance holding a share of its KV: tp x pp
    budget: KVBudget | None = None  # the terms of the budget per rank (kv_capacity_model)

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


def kv_capacity(model: ModelSpec, hardware: HardwareSpec, config: EngineConfig, *,
                sampler: str | None = None) -> KVCapacity:
    """Blocks of KV cache one instance gets: the budget ``config.kv_capacity_model`` selects
    (vLLM 0.19's by default, :mod:`engine.kv_budget`) per rank, in blocks over the rank's
    layers. ``sampler`` prices the top-k/top-p implementation of an older vLLM release
    (``engine.kv_budget.SAMPLER_BYTES_PER_LOGIT``; the published-run checks use it); None is
    0.19's."""
    from engine.kv_budget import DEFAULT_SAMPLER, upper_bound_budget, vllm_budget

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
    params = weight_bytes_per_rank(model, tp=tp, ep=ep, pp=pp)
    if config.kv_capacity_model == "upper_bound":
        budget = upper_bound_budget(hardware, config, params)
    else:
        budget = vllm_budget(model, hardware, config, params, sampler or DEFAULT_SAMPLER)
    overhead = int(float(config.extra.get("non_kv_overhead_gib", 0.0)) * GIB)
    available = budget.available - overhead
    formula_blocks = available // bytes_per_block if available > 0 else 0
    if config.num_gpu_blocks_override is not None:
        num_blocks = config.num_gpu_blocks_override
    else:
        if formula_blocks < 2:
            raise InfeasibleError(
                f"{model.name} does not fit on {hardware.name} at tensor_parallel_size={tp}, "
                f"pipeline_parallel_size={pp}: {budget.describe()}"
                + (f" (+{overhead / GIB:.1f} GiB reserved)" if overhead else "")
                + f" at gpu_memory_utilization={config.gpu_memory_utilization}; raise "
                "tensor_parallel_size, use a larger accelerator, raise "
                "gpu_memory_utilization or lower max_num_batched_tokens / max_num_seqs"
            )
        num_blocks = int(formula_blocks)
    return KVCapacity(
        num_blocks=num_blocks,
        block_size=config.block_size,
        bytes_per_block=bytes_per_block,
        weight_bytes=budget.weights,
        formula_num_blocks=int(max(formula_blocks, 0)),
        num_ranks=tp * pp,
        budget=budget,
    )
