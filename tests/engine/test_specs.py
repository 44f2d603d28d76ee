"""``EngineConfig``: one definition of each engine setting, checked when it is built."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.specs import (
    KV_CACHE_DTYPES,
    VLLM_BLOCK_SIZES,
    ConfigError,
    EngineConfig,
    SettingError,
)
from profiles.catalog import load_model


def test_defaults_are_valid_and_vllms():
    cfg = EngineConfig()
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.block_size) == (128, 2048, 16)
    assert cfg.gpu_memory_utilization == 0.9 and cfg.enable_prefix_caching


@pytest.mark.parametrize(
    ("kwargs", "field", "allowed"),
    [
        ({"block_size": 7}, "block_size", "[1, 8, 16, 32, 64, 128, 256]"),
        ({"block_size": 0}, "block_size", "vLLM's block sizes"),
        ({"block_size": 16.0}, "block_size", "vLLM's block sizes"),
        ({"block_size": True}, "block_size", "vLLM's block sizes"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization", "0 < value <= 1"),
        ({"gpu_memory_utilization": float("nan")}, "gpu_memory_utilization", "0 < value <= 1"),
        ({"gpu_memory_utilization": 1.01}, "gpu_memory_utilization", "0 < value <= 1"),
        ({"max_num_seqs": 0}, "max_num_seqs", "an integer >= 1"),
        ({"max_num_seqs": 2.5}, "max_num_seqs", "an integer >= 1"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens", "an integer >= 1"),
        ({"max_num_batched_tokens": 64}, "max_num_batched_tokens", ">= max_num_seqs (128)"),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold", ">= 0"),
        ({"max_model_len": 0}, "max_model_len", "null"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype", "'fp8'"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size", "an integer >= 1"),
        ({"pipeline_parallel_size": -2}, "pipeline_parallel_size", "an integer >= 1"),
        ({"expert_parallel_size": 0}, "expert_parallel_size", "an integer >= 1"),
        ({"num_gpu_blocks_override": 1}, "num_gpu_blocks_override", "null block"),
        ({"num_gpu_blocks_override": 1 << 30}, "num_gpu_blocks_override", "to 1073741823"),
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching", "true or false"),
        ({"step_overhead_us": -1.0}, "step_overhead_us", ">= 0"),
        ({"step_overhead_hidden_ms": float("inf")}, "step_overhead_hidden_ms", "finite"),
    ],
)
def test_a_bad_setting_is_refused_naming_field_and_allowed(kwargs, field, allowed):
    with pytest.raises(SettingError) as err:
        EngineConfig(**kwargs)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}=")
    assert "is not allowed; allowed:" in str(err.value) and allowed in str(err.value)


@given(st.integers(min_value=-4, max_value=600))
def test_block_size_is_one_of_vllms(block_size):
    if block_size in VLLM_BLOCK_SIZES:
        assert EngineConfig(block_size=block_size).block_size == block_size
    else:
        with pytest.raises(SettingError, match="block_size"):
            EngineConfig(block_size=block_size)


def test_every_kv_cache_dtype_is_accepted():
    for dtype in KV_CACHE_DTYPES:
        EngineConfig(kv_cache_dtype=dtype)


def test_replace_checks_again():
    with pytest.raises(SettingError, match="gpu_memory_utilization=90.*did you mean 0.90"):
        replace(EngineConfig(), gpu_memory_utilization=90)


def test_a_front_end_names_its_own_key_everywhere_in_the_message():
    with pytest.raises(SettingError) as err:
        EngineConfig(max_num_seqs=256, max_num_batched_tokens=128)
    named = err.value.named("cluster.")
    assert isinstance(named, ConfigError) and named.key == "cluster.max_num_batched_tokens"
    assert str(named) == (
        "cluster.max_num_batched_tokens=128 is not allowed; allowed: a value >= "
        "cluster.max_num_seqs (256), as vLLM requires; raise cluster.max_num_batched_tokens "
        "or lower cluster.max_num_seqs"
    )
    assert "{p}" not in str(err.value) and "cluster." not in str(err.value)


def test_the_error_survives_pickling():  # Ray returns a job's exception to the driver
    err = SettingError("block_size", 7, "one of [16]", "use {p}block_size=16", "cluster.")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.key == "cluster.block_size"


@pytest.mark.parametrize(
    ("model", "kwargs", "match"),
    [
        ("meta-llama/Llama-3.1-8B", {"tensor_parallel_size": 3},
         r"tensor_parallel_size=3 .* \[1, 2, 4, 8, 16, 32\]"),
        ("meta-llama/Llama-3.1-8B", {"pipeline_parallel_size": 33},
         r"pipeline_parallel_size=33 .* 1\.\.32"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", {"expert_parallel_size": 3},
         r"expert_parallel_size=3 .* divisor of the 128 experts"),
        ("meta-llama/Llama-3.1-8B", {"max_model_len": 10**7}, r"max_model_len=10000000 .* 1\.\."),
    ],
)
def test_check_model_refuses_what_the_model_cannot_run(model, kwargs, match):
    cfg = EngineConfig(**kwargs)
    with pytest.raises(SettingError, match=match):
        cfg.check_model(load_model(model))

