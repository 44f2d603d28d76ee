"""Plain, typed descriptions of what a simulation runs on: model, hardware, engine settings.

These are the engine's own types. Readers for other formats (Hydra sweep configs, HF configs,
YAML catalogs, LLMServingSim cluster JSON, vLLM's ``meta.json``) live at the edges
(``sweep.settings``, ``profiles.catalog``, ``analysis.groundtruth``, ``analysis.scenario``) and
convert into these once. ``EngineConfig`` owns the engine settings: their vLLM names, their one
default each and their range checks (it refuses a bad value when it is built).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.block_pool import MAX_BLOCKS

GIB = 1024**3

# vLLM 0.19 ``vllm/config/cache.py``: ``BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]``
# (``--block-size`` accepts only these).
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
# The values of vLLM's ``CacheDType`` (same file) the memory model can price: "auto" (the
# model's dtype) and the fp8 formats (one byte per element). fp8_inc (Intel Gaudi only) and
# fp8_ds_mla (DeepSeek's MLA layout) are left out.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# How the KV capacity is computed (engine.memory.kv_capacity): "vllm" is vLLM 0.19's budget
# (weights, profiling activation peak, non-torch memory; engine.kv_budget), "upper_bound" the
# bound ``mem_size · gpu_memory_utilization − weights``.
KV_CAPACITY_MODELS = ("vllm", "upper_bound")
# EngineConfig fields that are the simulator's, not vLLM settings: the host-overhead
# calibration (docs/validation.md) and free-form extras.
SIMULATOR_FIELDS = ("step_overhead_us", "step_overhead_hidden_ms", "extra")


class ConfigError(ValueError):
    """A configuration value is wrong. The message names the field and the fix."""


class InfeasibleError(ConfigError):
    """The configuration is valid but cannot serve on its hardware (the model does not fit,
    a request is longer than ``max_model_len``): a capacity answer, not a mistake."""


class SettingError(ConfigError):
    """One engine setting is out of range: names the field, the allowed values and the fix.

    ``prefix`` is how a front end spells the field (``cluster.`` for the sweep's Hydra config);
    ``{p}`` in ``allowed`` and ``fix`` stands for it, so a message naming a second field names
    it the same way. ``named(prefix)`` gives the same error as that front end reports it.
    """

    def __init__(self, field: str, value: object, allowed: str, fix: str = "",
                 prefix: str = "") -> None:
        self.field, self.value, self.allowed, self.fix, self.prefix = (
            field, value, allowed, fix, prefix
        )
        text = f"{prefix}{field}={value!r} is not allowed; allowed: {allowed}"
        if fix:
            text += f"; {fix}"
        super().__init__(text.replace("{p}", prefix))

    @property
    def key(self) -> str:
        """The setting as the front end that reports it names it (``cluster.block_size``)."""
        return self.prefix + self.field

    def named(self, prefix: str) -> SettingError:
        return SettingError(self.field, self.value, self.allowed, self.fix, prefix)

    def __reduce__(self):  # noqa: ANN204 - pickling (Ray returns errors across processes)
        return (SettingError, (self.field, self.value, self.allowed, self.fix, self.prefix))


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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """vLLM V1 engine settings of one serving instance, by vLLM's names (defaults as vLLM 0.19).

    The one definition of each setting: front ends (the sweep's ``cluster`` group, the
    reference cluster JSON, a ground-truth run's ``meta.json``) convert to it once, and
    building one checks every value (``validate``), raising ``SettingError`` naming the
    field, what is allowed and the fix. ``check_model`` adds the checks that need the model.
    """

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    reserve_full_isl: bool = True  # vLLM `scheduler_reserve_full_isl`
    long_prefill_token_threshold: int = 0  # 0: off
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None  # None: model's max_position_embeddings
    kv_cache_dtype: str = "auto"  # "auto" (= model dtype) or an fp8 format (KV_CACHE_DTYPES)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # MoE experts are split over this many ranks (vLLM: TP x DP when expert parallelism is on).
    expert_parallel_size: int = 1
    num_gpu_blocks_override: int | None = None
    kv_capacity_model: str = "vllm"  # one of KV_CAPACITY_MODELS (the simulator's choice)
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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``SettingError`` for the first value vLLM (or the simulator) would refuse."""
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise SettingError(name, value, "an integer >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM SchedulerConfig: max_num_batched_tokens must be >= max_num_seqs
            raise SettingError(
                "max_num_batched_tokens", self.max_num_batched_tokens,
                "a value >= {p}max_num_seqs"
                f" ({self.max_num_seqs}), as vLLM requires",
                "raise {p}max_num_batched_tokens or lower {p}max_num_seqs",
            )
        if self.block_size not in VLLM_BLOCK_SIZES or not _is_int(self.block_size):
            raise SettingError("block_size", self.block_size,
                               f"one of {list(VLLM_BLOCK_SIZES)} (vLLM's block sizes)",
                               "vLLM's default is 16")
        u = self.gpu_memory_utilization
        if not _is_number(u) or not 0.0 < u <= 1.0:
            hint = ""
            if _is_number(u) and 1.0 < u <= 100.0:
                hint = f"it is a fraction of device memory: did you mean {u / 100:.2f}?"
            raise SettingError("gpu_memory_utilization", u, "0 < value <= 1", hint)
        for name in ("enable_prefix_caching", "reserve_full_isl", "enable_chunked_prefill",
                     "async_scheduling"):
            if not isinstance(getattr(self, name), bool):
                raise SettingError(name, getattr(self, name), "true or false")
        if not _is_int(self.long_prefill_token_threshold) or self.long_prefill_token_threshold < 0:
            raise SettingError("long_prefill_token_threshold", self.long_prefill_token_threshold,
                               "an integer >= 0 (0 turns it off)")
        if self.max_model_len is not None and (
            not _is_int(self.max_model_len) or self.max_model_len < 1
        ):
            raise SettingError("max_model_len", self.max_model_len,
                               "null (the model's context length) or an integer >= 1")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise SettingError("kv_cache_dtype", self.kv_cache_dtype,
                               f"one of {list(KV_CACHE_DTYPES)}")
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise SettingError(name, value, "an integer >= 1")
        n = self.num_gpu_blocks_override
        if n is not None and (not _is_int(n) or not 2 <= n <= MAX_BLOCKS):
            raise SettingError("num_gpu_blocks_override", n,
                               f"null (the memory formula) or an integer from 2 (block 0 is "
                               f"vLLM's null block) to {MAX_BLOCKS} (the block pool's index)")
        if self.kv_capacity_model not in KV_CAPACITY_MODELS:
            raise SettingError("kv_capacity_model", self.kv_capacity_model,
                               f"one of {list(KV_CAPACITY_MODELS)}",
                               "'vllm' is vLLM 0.19's budget, 'upper_bound' mem_size x "
                               "gpu_memory_utilization - weights")
        for name, note in (("step_overhead_us", ""),
                           ("step_overhead_hidden_ms", " (0 = a constant per-step cost)")):
            value = getattr(self, name)
            if not _is_number(value) or not 0 <= value < math.inf:
                raise SettingError(name, value, f"a finite number >= 0{note}")
        if not isinstance(self.extra, dict):
            raise SettingError("extra", self.extra, "a mapping")

    def model_len(self, model: ModelSpec) -> int:
        """The longest request (prompt + output tokens) this engine accepts: ``max_model_len``,
        or the model's context when unset (vLLM derives it from ``max_position_embeddings``)."""
        return self.max_model_len or model.max_position_embeddings

    def check_model(self, model: ModelSpec) -> None:
        """Raise ``SettingError`` for a setting the model cannot run with (TP vs its attention
        heads, PP vs its layers, EP vs its experts, ``max_model_len`` vs its context)."""
        tp, heads = self.tensor_parallel_size, model.num_attention_heads
        if heads % tp:
            divisors = [d for d in range(1, heads + 1) if heads % d == 0]
            raise SettingError("tensor_parallel_size", tp,
                               f"a divisor of the {heads} attention heads of {model.name}: "
                               f"{divisors}")
        if self.pipeline_parallel_size > model.num_layers:
            raise SettingError("pipeline_parallel_size", self.pipeline_parallel_size,
                               f"1..{model.num_layers} (the layers of {model.name})")
        ep = self.expert_parallel_size
        if model.is_moe and model.num_experts % ep:
            divisors = [d for d in range(1, model.num_experts + 1) if model.num_experts % d == 0]
            raise SettingError("expert_parallel_size", ep,
                               f"a divisor of the {model.num_experts} experts of {model.name}: "
                               f"{divisors}")
        if self.max_model_len is not None and self.max_model_len > model.max_position_embeddings:
            raise SettingError("max_model_len", self.max_model_len,
                               f"null or 1..{model.max_position_embeddings} (the context "
                               f"length of {model.name})")
