"""vLLM 0.19's KV-cache memory budget of one rank, term by term.

vLLM 0.19 sizes the KV cache in ``Worker.determine_available_memory``
(``vllm/v1/worker/gpu_worker.py``)::

    available = requested − (weights + torch_peak_increase + non_torch_increase)
                − cudagraph_estimate_applied

* ``requested = ceil(total · gpu_memory_utilization)`` (``request_memory`` in
  ``vllm/v1/worker/utils.py``), ``total`` as ``cudaMemGetInfo`` reports it
  (``HardwareSpec.mem_gib`` holds that figure for the catalog GPUs).
* ``weights`` is ``model_memory_usage``: what the torch allocator gained while the model
  loaded (``DeviceMemoryProfiler`` in ``vllm/utils/mem_utils.py``) — the parameters
  (:func:`engine.memory.weight_bytes_per_rank`) plus the persistent buffers built in the
  model's ``__init__``, of which the rotary ``cos_sin_cache`` (``max_position × rotary_dim`` in
  the model dtype, one instance shared by every layer: ``get_rope`` caches it) is the one that
  matters.
* ``torch_peak_increase``: the rise of ``allocated_bytes.all.peak`` over the profiling run,
  ``GPUModelRunner.profile_run``: one forward pass of ``max_num_batched_tokens`` dummy tokens
  split over ``min(max_num_seqs, max_num_batched_tokens)`` requests, then
  ``_dummy_sampler_run`` on one row per request. Forward activations are freed layer by
  layer, so the peak is the larger of (a) the tensors live inside one decoder layer and
  (b) what the sampler holds (see :func:`activation_peak_bytes`).
* ``non_torch_increase``: device memory gained outside the torch allocator from the worker's
  memory snapshot to the end of profiling. 0.19 takes that snapshot *after* NCCL and the
  custom all-reduce are initialised (``init_device``), so it is the lazily loaded CUDA
  kernel modules (cuBLAS/cuBLASLt, attention, Triton and Inductor kernels) plus, at TP > 1,
  the NCCL channel buffers connected at the first collective. No formula for it exists in
  vLLM: the figure comes from published 0.19-era logs (:data:`NON_TORCH_BYTES`).
* CUDA-graph memory: 0.19 estimates it (``profile_cudagraph_memory``) but subtracts the
  estimate only with ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``, whose default is 0
  (``vllm/envs.py``; the log calls it "will become the default in v0.19" but 0.19.0 ships
  it off). Graphs are captured after the KV cache is allocated, out of the
  ``1 − gpu_memory_utilization`` slack. So the default budget has no CUDA-graph term.

``engine.memory.kv_capacity`` turns ``available`` into blocks (``get_num_blocks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.memory import dtype_bytes
from engine.specs import GIB, EngineConfig, HardwareSpec, ModelSpec

# Device memory gained outside torch during vLLM 0.19's profiling, per rank (CUDA kernel
# modules loaded on first use, cuBLAS handles; at TP > 1 also the NCCL channels connected at
# the first collectives), as published logs print it:
#   single GPU: 0.25 GiB, vLLM 0.19.0 on H100, Llama-3.1-8B ("non-torch forward increase
#     memory: 0.25GiB", DEBUG profiling line); 0.13 GiB on H100 in llm-d-benchmark's runs of
#     0.1x releases; 0.26 GiB A100-80G (v0.31, consumed 15.26 − loaded 15.0).
#   multi-GPU: 0.54-0.55 GiB per rank at TP2 on H100 (llm-d-benchmark, Qwen3-32B and
#     Llama-3.3-70B; "GiB for non-torch memory").
# tests/engine/data/kv_published.yaml quotes each line. No formula for it exists in vLLM.
NON_TORCH_BYTES = {1: int(0.25 * GIB)}
NON_TORCH_BYTES_MULTI_GPU = int(0.55 * GIB)

# Bytes held per element of the ``R × vocab`` logits at the sampler's peak, by top-k/top-p
# implementation, counting the model-dtype logits the caller keeps (2 for bf16) and the
# float32 copy the sampler makes (4) (vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py):
#   "triton" (vLLM >= 0.16 on CUDA for R >= 8, PR #33538; 0.19's default): the kernel works
#     in place; softmax ``probs`` (4) and ``random_sample``'s exponential noise ``q`` (4) → 14.
#   "sort" (the PyTorch-native path before 0.16): ``logits.sort`` returns float32 values (4)
#     and int64 indices (8); CUDA's segmented radix sort adds an int64 index input (8) and
#     CUB temp storage the size of keys + values (12) → 38. Checked against llm-d-benchmark's
#     H100 profiles at R=1024: predicted peaks 4.71 / 5.53 / 5.60 GiB vs logged 4.76 / 5.56 /
#     5.64 (Llama-3.1-8B, Qwen3-0.6B, Qwen3-32B).
#   "flashinfer" (``Using FlashInfer for top-p & top-k sampling``): sampling fused on the
#     float32 logits, no full-vocabulary temporaries → 6.
SAMPLER_BYTES_PER_LOGIT = {"triton": 14, "sort": 38, "flashinfer": 6}
DEFAULT_SAMPLER = "triton"  # vLLM 0.19

# The Triton top-k/top-p kernel caches one float32 row of the vocabulary per program
# (``apply_top_k_top_p_triton`` in vllm/v1/sample/ops/topk_topp_triton.py): rows =
# min(next_pow2(num_reqs), number of SMs). The catalog GPUs have 108-188 SMs; 128 rows is
# within 60 rows (30 MiB at a 128k vocabulary) of every one of them.
SAMPLER_BUFFER_ROWS = 128
# vLLM pads the vocabulary of its parallel embedding / lm_head to a multiple of 64
# (DEFAULT_VOCAB_PADDING_SIZE, vllm/model_executor/layers/vocab_parallel_embedding.py).
VOCAB_PADDING = 64


def padded_vocab(model: ModelSpec) -> int:
    """The vocabulary as vLLM's ``VocabParallelEmbedding`` stores it (padded to 64)."""
    return math.ceil(model.vocab_size / VOCAB_PADDING) * VOCAB_PADDING


@dataclass(frozen=True, slots=True)
class KVBudget:
    """The terms of vLLM's KV budget for one rank, in bytes."""

    requested: int  # ceil(total · gpu_memory_utilization)
    weights: int  # parameters + persistent buffers of the rank (model_memory_usage)
    activation_peak: int  # torch_peak_increase of profile_run
    non_torch: int  # non_torch_increase
    cudagraph: int = 0  # subtracted only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1

    @property
    def non_kv(self) -> int:
        return self.weights + self.activation_peak + self.non_torch + self.cudagraph

    @property
    def available(self) -> int:
        return self.requested - self.non_kv

    def describe(self) -> str:
        def g(b: int) -> str:
            return f"{b / GIB:.2f}"

        return (
            f"requested {g(self.requested)} GiB − weights {g(self.weights)} − activation peak "
            f"{g(self.activation_peak)} − non-torch {g(self.non_torch)} − CUDA graphs "
            f"{g(self.cudagraph)} = {g(self.available)} GiB for KV"
        )


def rotary_cache_bytes(model: ModelSpec) -> int:
    """The rotary ``cos_sin_cache`` buffer: ``max_position × rotary_dim`` in the model dtype
    (``RotaryEmbedding.__init__``, vllm/model_executor/layers/rotary_embedding/base.py; cos
    and sin halves of ``rotary_dim / 2`` each; one instance shared by all layers)."""
    return model.max_position_embeddings * model.head_dim * dtype_bytes(model.dtype)


def _forward_peak(model: ModelSpec, config: EngineConfig, tokens: int) -> int:
    """Bytes live at the peak of one decoder layer of the profiling forward pass, per rank.

    The residual stream and the normalised hidden state (``T × h`` each) live across the
    layer; on top, the larger of the attention block (qkv projection output and attention
    output, ``T × (q + 2·kv)`` and ``T × q`` of this rank's heads) and the MLP (gate_up
    output ``T × 2I`` and the SiLU·mul output ``T × I``, TP-split; vLLM's compiled graph keeps
    both until down_proj has read the second). For MoE the fused-MoE kernel's
    intermediate caches (``T·k × 2I``, ``T·k × I``, ``T·k × h`` for top-k routing) and the
    router logits take the MLP's place; with expert parallelism over DP ranks every rank's
    experts see the tokens of all its DP peers (all-gather dispatch). At TP > 1 the
    all-reduce of the block output holds one more ``T × h``.
    """
    b = dtype_bytes(model.dtype, "model.dtype")
    tp = config.tensor_parallel_size
    h = model.hidden_size
    q_rank = model.num_attention_heads // tp * model.head_dim
    kv_rank = max(1, model.num_kv_heads // tp) * model.head_dim
    stream = 2 * tokens * h
    attention = tokens * (q_rank + 2 * kv_rank) + tokens * q_rank
    if model.is_moe:
        dp = max(1, config.expert_parallel_size // tp)
        moe_tokens = tokens * dp
        k = model.num_experts_per_tok
        f = model.moe_intermediate_size
        f_rank = f if config.expert_parallel_size > 1 else f // tp
        mlp = moe_tokens * k * (2 * f_rank + f_rank + h) + moe_tokens * model.num_experts * 2
    else:
        i_rank = model.intermediate_size // tp
        mlp = tokens * 3 * i_rank
    all_reduce = tokens * h if tp > 1 else 0
    return (stream + max(attention, mlp) + all_reduce) * b


def _sampler_peak(model: ModelSpec, config: EngineConfig, tokens: int,
                  sampler: str = DEFAULT_SAMPLER) -> int:
    """Bytes live at the peak of ``_dummy_sampler_run`` (vllm/v1/worker/gpu_model_runner.py).

    ``R = min(max_num_seqs, max_num_batched_tokens)`` rows (one per dummy request). Live
    together at the peak: the forward pass's hidden states (``T × h``, held by
    ``profile_run``) and the ``R × h`` rows gathered for the sampler, then
    :data:`SAMPLER_BYTES_PER_LOGIT` per element of the ``R × vocab`` logits for the top-k /
    top-p implementation in use (at TP > 1 the gathered logits replace this rank's slice),
    plus, for the Triton kernel, its row buffer (:data:`SAMPLER_BUFFER_ROWS`).
    """
    b = dtype_bytes(model.dtype, "model.dtype")
    rows = min(config.max_num_seqs, tokens)
    v = model.vocab_size
    hidden = (tokens + rows) * model.hidden_size * b
    logits = rows * v * SAMPLER_BYTES_PER_LOGIT[sampler]
    buffer = 0
    if sampler == "triton" and rows >= 8:  # smaller batches take the PyTorch sort path
        buffer = min(1 << max(0, rows - 1).bit_length(), SAMPLER_BUFFER_ROWS) * v * 4
    elif sampler == "triton":
        logits = rows * v * SAMPLER_BYTES_PER_LOGIT["sort"]
    return hidden + logits + buffer


def activation_peak_bytes(model: ModelSpec, config: EngineConfig,
                          sampler: str = DEFAULT_SAMPLER) -> int:
    """``torch_peak_increase`` of vLLM 0.19's ``profile_run`` for one rank: the larger of the
    forward pass's per-layer peak and the sampler's (the last pipeline stage runs the
    sampler; every stage's forward peak is the same per layer). ``sampler`` names the top-k /
    top-p implementation (:data:`SAMPLER_BYTES_PER_LOGIT`); 0.19's is the default."""
    tokens = config.max_num_batched_tokens
    return max(_forward_peak(model, config, tokens),
               _sampler_peak(model, config, tokens, sampler))


def non_torch_bytes(config: EngineConfig) -> int:
    """``non_torch_increase`` per rank (:data:`NON_TORCH_BYTES`): the single-GPU figure, or
    the multi-GPU one when the rank runs collectives (TP or PP peers, or the DP peers of
    expert parallelism)."""
    world = max(config.tensor_parallel_size * config.pipeline_parallel_size,
                config.expert_parallel_size)
    return NON_TORCH_BYTES.get(world, NON_TORCH_BYTES_MULTI_GPU)


def vllm_budget(model: ModelSpec, hardware: HardwareSpec, config: EngineConfig,
                parameter_bytes: int, sampler: str = DEFAULT_SAMPLER) -> KVBudget:
    """vLLM 0.19's KV budget of one rank; ``parameter_bytes`` is the rank's parameters
    (:func:`engine.memory.weight_bytes_per_rank`). ``sampler`` exists to price published
    runs of older V1 releases (tests/engine/data/kv_published.yaml); the engine uses 0.19's."""
    return KVBudget(
        requested=math.ceil(hardware.mem_gib * GIB * config.gpu_memory_utilization),
        weights=parameter_bytes + rotary_cache_bytes(model),
        activation_peak=activation_peak_bytes(model, config, sampler),
        non_torch=non_torch_bytes(config),
    )


def upper_bound_budget(hardware: HardwareSpec, config: EngineConfig,
                       parameter_bytes: int) -> KVBudget:
    """The upper bound ``mem_size · gpu_memory_utilization − weights`` (no activation,
    non-torch or CUDA-graph term): what vLLM could give at most."""
    return KVBudget(
        requested=math.ceil(hardware.mem_gib * GIB * config.gpu_memory_utilization),
        weights=parameter_bytes,
        activation_peak=0,
        non_torch=0,
    )
