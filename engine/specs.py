"""Plain, typed descriptions of what a simulation runs on: model, hardware, engine knobs.

These are the engine's own types. Readers for other formats (HF configs, YAML catalogs,
LLMServingSim cluster JSON) live at the edges (``profiles.catalog``, ``analysis.groundtruth``)
and convert into these once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1024**3


class ConfigError(ValueError):
    """A configuration value is wrong. The message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture facts of a decoder-only transformer (HF config subset)."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    num_experts: int = 0  # 0 = dense model
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    # Total parameter count; when 0 it is derived from the shapes above.
    num_params: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator type."""

    name: str
    mem_gib: float
    hbm_bw_gbs: float  # GB/s (1e9 bytes/s)
    peak_bf16_tflops: float  # dense
    peak_fp8_tflops: float  # dense
    interconnect_bw_gbs: float = 0.0  # per direction, intra-node (NVLink-class / PCIe)
    interconnect_latency_ns: float = 0.0
    cost_per_hour: float = 0.0  # USD per accelerator-hour


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """vLLM V1 engine knobs for one serving instance (defaults as vLLM 0.19.1)."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    reserve_full_isl: bool = True  # vLLM `scheduler_reserve_full_isl`
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None  # None: model's max_position_embeddings
    kv_cache_dtype: str = "auto"  # "auto" (= model dtype) or "fp8"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # MoE experts are split over this many ranks (vLLM: TP x DP when expert parallelism is on).
    expert_parallel_size: int = 1
    num_gpu_blocks_override: int | None = None
    async_scheduling: bool = True
    # Host-side work of one engine step that kernel-level profiles do not contain (input
    # preparation, launch gaps, output processing). Async scheduling hides it behind the GPU's
    # work: the exposed part is ``step_overhead_us · max(0, 1 − t_gpu / step_overhead_hidden_ms)``
    # (t_gpu = the step's priced time), i.e. the full cost for a tiny step, none for a step of
    # ``step_overhead_hidden_ms`` or longer (0 = never hidden: a constant cost per step).
    # Calibrated on the RTX PRO 6000 vLLM 0.19 runs (docs/validation.md).
    step_overhead_us: float = 1000.0
    step_overhead_hidden_ms: float = 60.0
    extra: dict[str, object] = field(default_factory=dict)
