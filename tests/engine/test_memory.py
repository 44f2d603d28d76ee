"""KV capacity (vLLM 0.19's budget by default, the ``mem_size · gpu_memory_utilization −
weights`` upper bound as the named alternative) and clear errors for bad engine input. The
budget's terms against published runs are tests/engine/test_kv_budget.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine import EngineConfig, RequestSpec, simulate
from engine.memory import kv_capacity
from engine.specs import ConfigError, HardwareSpec
from profiles.catalog import load_model


def _hw(gib: float) -> HardwareSpec:
    return HardwareSpec("card", gib, 1000.0, 100.0, 200.0)


UPPER = EngineConfig(kv_capacity_model="upper_bound")


@pytest.mark.parametrize(
    ("model", "gib", "tp", "util", "blocks"),
    [
        # Independently computed vectors of the upper-bound formula
        # (docs/reference-semantics.md §9).
        ("meta-llama/Llama-3.1-8B", 24, 1, 0.9, 3400),
        ("meta-llama/Llama-3.1-8B", 24, 1, 0.833919, 2588),
        ("meta-llama/Llama-3.1-8B", 96, 1, 0.9, 36578),
        ("meta-llama/Llama-3.1-8B", 96, 2, 0.9, 80815),
        ("Qwen/Qwen3-32B", 96, 2, 0.9, 28614),
        ("meta-llama/Llama-3.1-70B", 80, 4, 0.9, 32066),
    ],
)
def test_upper_bound_formula(model: str, gib: float, tp: int, util: float, blocks: int) -> None:
    cfg = replace(UPPER, gpu_memory_utilization=util, tensor_parallel_size=tp)
    cap = kv_capacity(load_model(model), _hw(gib), cfg)
    assert cap.num_blocks == blocks
    assert cap.tokens == blocks * 16
    # vLLM's budget subtracts the profiling peak and non-torch memory on top: always fewer
    vllm = kv_capacity(load_model(model), _hw(gib), replace(cfg, kv_capacity_model="vllm"))
    assert vllm.num_blocks < blocks


@pytest.mark.parametrize(
    ("model", "gib", "tp", "blocks"),
    [
        # (requested − params − rotary cache − activation peak − non-torch) // bytes per block
        # for vLLM 0.19 at max_num_seqs 128 / 2048 batched tokens, by hand:
        # Llama-3.1-8B: ceil(96 GiB·0.9) = 92,771,293,594 − 16,060,522,496 params −
        #   33,554,432 rotary (131072·128·2) − 313,327,616 peak (sampler: 128·128,256·14
        #   + Triton buffer 128·128,256·4 + hidden (2048+128)·4096·2) − 268,435,456 non-torch
        #   = 76,095,453,594 // 2,097,152 (16·8·128·2·2·32) = 36,285.
        # Qwen3-32B TP2: peak 372,342,784 (128·151,936·14 + 128·151,936·4 + 2176·5120·2),
        #   non-torch 0.55 GiB per rank (multi-GPU).
        ("meta-llama/Llama-3.1-8B", 96, 1, 36285),
        ("Qwen/Qwen3-32B", 96, 2, 28150),
    ],
)
def test_vllm_budget_default(model: str, gib: float, tp: int, blocks: int) -> None:
    cap = kv_capacity(load_model(model), _hw(gib), EngineConfig(tensor_parallel_size=tp))
    assert cap.num_blocks == blocks
    b = cap.budget
    assert cap.num_blocks == (b.requested - b.weights - b.activation_peak - b.non_torch) // (
        cap.bytes_per_block)


@pytest.mark.parametrize(
    ("model", "tp", "pp", "ep", "blocks"),
    [
        ("meta-llama/Llama-3.1-8B", 1, 4, 1, 166282),
        ("meta-llama/Llama-3.1-8B", 2, 2, 1, 168286),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", 1, 1, 2, 38590),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", 2, 1, 2, 79124),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", 1, 1, 1, 20158),
    ],
)
def test_capacity_with_pipeline_and_expert_parallel(
    model: str, tp: int, pp: int, ep: int, blocks: int
) -> None:
    cfg = replace(UPPER, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                  expert_parallel_size=ep)
    cap = kv_capacity(load_model(model), _hw(96), cfg)
    assert cap.num_blocks == blocks
    assert cap.tokens == blocks * 16


def test_fp8_kv_doubles_blocks() -> None:
    m = load_model("meta-llama/Llama-3.1-8B")
    bf16 = kv_capacity(m, _hw(96), UPPER)
    fp8 = kv_capacity(m, _hw(96), replace(UPPER, kv_cache_dtype="fp8"))
    assert fp8.bytes_per_block * 2 == bf16.bytes_per_block
    assert fp8.num_blocks in (2 * bf16.num_blocks, 2 * bf16.num_blocks + 1)


def test_override_replaces_formula_and_is_reported() -> None:
    m = load_model("meta-llama/Llama-3.1-8B")
    cap = kv_capacity(m, _hw(96), EngineConfig(num_gpu_blocks_override=500))
    assert cap.num_blocks == 500 and cap.formula_num_blocks == 36285
    assert "8000 tokens / 500 blocks" in cap.describe()


def test_mem_util_as_percent_is_refused_with_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization=90.*did you mean 0\.90"):
        EngineConfig(gpu_memory_utilization=90)


def test_model_that_does_not_fit_names_the_fix() -> None:
    with pytest.raises(ConfigError, match="does not fit.*raise tensor_parallel_size"):
        kv_capacity(load_model("meta-llama/Llama-3.1-70B"), _hw(24), EngineConfig())


def test_tp_must_divide_heads() -> None:
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=3 is not allowed; allowed: a "
                       r"divisor of the 32 attention heads .*\[1, 2, 4, 8, 16, 32\]"):
        kv_capacity(load_model("meta-llama/Llama-3.1-8B"), _hw(96), EngineConfig(tensor_parallel_size=3))


class _FlatLatency:
    def iteration_ns(self, shape) -> int:  # noqa: ANN001 - protocol
        return 1_000_000 + 1000 * shape.total_tokens


def _req(i: int, arrival: int, plen: int = 20, olen: int = 4) -> RequestSpec:
    return RequestSpec(f"r{i}", arrival, tuple(range(i * 100, i * 100 + plen)), olen)


def test_request_longer_than_context_is_refused() -> None:
    m = load_model("meta-llama/Llama-3.1-8B")
    with pytest.raises(ConfigError, match="max_model_len=64"):
        simulate(m, _hw(96), EngineConfig(max_model_len=64), [_req(0, 0, 60, 10)], _FlatLatency())


def test_unsorted_workload_is_refused() -> None:
    m = load_model("meta-llama/Llama-3.1-8B")
    with pytest.raises(ConfigError, match="sort the workload"):
        simulate(m, _hw(96), EngineConfig(), [_req(0, 10), _req(1, 5)], _FlatLatency())


def test_request_that_never_fits_the_cache_is_a_clear_error() -> None:
    m = load_model("meta-llama/Llama-3.1-8B")
    cfg = EngineConfig(num_gpu_blocks_override=3)
    with pytest.raises(ConfigError, match="never fits in the KV cache"):
        simulate(m, _hw(96), cfg, [_req(0, 0, 100, 4)], _FlatLatency())


def test_idle_clock_jumps_to_arrivals_and_times_are_consistent() -> None:
    m = load_model("meta-llama/Llama-3.1-8B")
    reqs = [_req(0, 0), _req(1, 5_000_000_000)]
    for async_ in (True, False):
        res = simulate(m, _hw(96), replace(EngineConfig(), async_scheduling=async_, step_overhead_us=0),
                       reqs, _FlatLatency())
        df = res.requests
        # Request 1 arrives to an idle engine: its prefill starts at its arrival.
        assert df.first_token_ns[1] == 5_000_000_000 + 1_000_000 + 1000 * 20
        assert (df.output_len == 4).all()
        assert all(len(t) == 4 for t in df.token_times_ns)
        assert (df.finish_ns >= df.first_token_ns).all()
        assert res.num_steps == 8


def test_budget_below_max_num_seqs_is_refused_as_vllm_does() -> None:
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens=64 is not allowed; allowed: a "
                       r"value >= max_num_seqs \(128\)"):
        EngineConfig(max_num_batched_tokens=64)
