"""``vllm serve`` commands as the engine settings we simulate (analysis.server_args)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.server_args import batch_defaults, read_server_args
from engine.specs import ConfigError
from profiles.catalog import load_hardware, load_model

LLAMA = "meta-llama/Llama-3.1-8B"
MOE = "Qwen/Qwen3-30B-A3B-Instruct-2507"


def _settings(command: str, hardware: str = "RTXPRO6000"):
    args = read_server_args(command)
    return args.settings(load_model(args.model), load_hardware(hardware))


def test_both_value_forms_underscores_and_short_flags() -> None:
    a = read_server_args(f"vllm serve {LLAMA} -tp=2 --pipeline_parallel_size 1 "
                         "--max-num-seqs=64 --max_num_batched_tokens 4096 "
                         "--gpu-memory-utilization 0.85 --block-size=32 --max-model-len 32k "
                         "--kv-cache-dtype fp8 --long-prefill-token-threshold 512 "
                         "--num-gpu-blocks-override 9000")
    assert a.model == LLAMA
    assert a.given == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1,
                       "max_num_seqs": 64, "max_num_batched_tokens": 4096,
                       "gpu_memory_utilization": 0.85, "block_size": 32,
                       "max_model_len": 32000, "kv_cache_dtype": "fp8",
                       "long_prefill_token_threshold": 512, "num_gpu_blocks_override": 9000}
    c = a.settings(load_model(LLAMA), load_hardware("H100")).config
    assert (c.tensor_parallel_size, c.max_num_seqs, c.max_num_batched_tokens, c.block_size,
            c.max_model_len, c.kv_cache_dtype, c.num_gpu_blocks_override) == (
        2, 64, 4096, 32, 32000, "fp8", 9000)
    assert read_server_args(f"vllm serve {LLAMA} --max-model-len 32K").given[
        "max_model_len"] == 32768
    assert read_server_args(f"vllm serve --model {LLAMA}").model == LLAMA


def test_booleans_are_vllm_s_optional_actions() -> None:
    c = _settings(f"vllm serve {LLAMA} --no-enable-prefix-caching --no-async-scheduling "
                  "--enable-chunked-prefill").config
    assert not c.enable_prefix_caching and not c.async_scheduling and c.enable_chunked_prefill
    c = _settings(f"vllm serve {LLAMA}").config
    assert c.enable_prefix_caching and c.async_scheduling and c.enable_chunked_prefill
    assert c.reserve_full_isl and c.long_prefill_token_threshold == 0
    assert c.gpu_memory_utilization == 0.9 and c.block_size == 16 and c.max_model_len is None


@pytest.mark.parametrize(("hardware", "expected"), [
    ("RTXPRO6000", (1024, 8192)),  # 94.97 GiB
    ("H100", (1024, 8192)),
    ("A100", (256, 2048)),  # >= 70 GiB but an A100 (vLLM PR #17885)
    ("RTX4090", (256, 2048)),  # 24 GiB
])
def test_batch_defaults_follow_vllm_s_device_table(hardware: str, expected: tuple) -> None:
    assert batch_defaults(load_hardware(hardware)) == expected
    c = _settings(f"vllm serve {LLAMA}", hardware).config
    assert (c.max_num_seqs, c.max_num_batched_tokens) == expected


def test_default_budget_clamps_as_vllm_does() -> None:
    # chunked prefill off: the budget rises to max_model_len
    c = _settings(f"vllm serve {LLAMA} --no-enable-chunked-prefill --max-model-len 16384").config
    assert c.max_num_batched_tokens == 16384
    # a default budget is capped at max_num_seqs x max_model_len ...
    c = _settings(f"vllm serve {LLAMA} --max-num-seqs 2 --max-model-len 1024").config
    assert (c.max_num_seqs, c.max_num_batched_tokens) == (2, 2048)
    # ... and a default max_num_seqs at the budget
    c = _settings(f"vllm serve {LLAMA} --max-num-batched-tokens 512").config
    assert (c.max_num_seqs, c.max_num_batched_tokens) == (512, 512)


@settings(max_examples=60, deadline=None)
@given(seqs=st.one_of(st.none(), st.integers(1, 4096)),
       tokens=st.one_of(st.none(), st.integers(1, 65536)),
       model_len=st.one_of(st.none(), st.integers(16, 131072)),
       chunked=st.booleans())
def test_resolved_defaults_always_satisfy_vllm_s_budget_rule(seqs, tokens, model_len,
                                                              chunked) -> None:
    """vLLM's resolution never produces max_num_batched_tokens < max_num_seqs from defaults;
    explicit values that break the rule are refused naming the flag."""
    cmd = f"vllm serve {LLAMA}"
    for flag, value in (("--max-num-seqs", seqs), ("--max-num-batched-tokens", tokens),
                        ("--max-model-len", model_len)):
        if value is not None:
            cmd += f" {flag} {value}"
    if not chunked:
        cmd += " --no-enable-chunked-prefill"
    if seqs is not None and tokens is not None and tokens < seqs:
        with pytest.raises(ConfigError, match="--max-num-batched-tokens"):
            _settings(cmd)
        return
    c = _settings(cmd).config
    assert c.max_num_batched_tokens >= c.max_num_seqs
    if tokens is None and not chunked:
        assert c.max_num_batched_tokens >= min(model_len or 131072, 131072 * c.max_num_seqs)


def test_expert_parallel_spreads_experts_over_tp_x_dp() -> None:
    s = _settings(f"vllm serve {MOE} -tp 2 -dp 2 --enable-expert-parallel", "H100")
    assert s.config.expert_parallel_size == 4 and s.data_parallel_size == 2
    s = _settings(f"vllm serve {LLAMA} -ep")
    assert s.config.expert_parallel_size == 1
    assert "--enable-expert-parallel ignored" in s.notes[0]


def test_flags_that_do_not_change_the_simulation_are_listed() -> None:
    a = read_server_args(f"vllm serve {LLAMA} --host 127.0.0.1 --port 8001 --api-key k "
                         "--served-model-name llama llama-8b --disable-log-requests "
                         "--trust-remote-code --seed 3 -O3 --uvicorn-log-level warning")
    assert a.ignored == ("--host=127.0.0.1", "--port=8001", "--api-key=k",
                         "--disable-log-requests", "--trust-remote-code", "--seed=3", "-O3",
                         "--uvicorn-log-level=warning")
    assert a.names == ("llama", "llama-8b") and a.given == {}


@pytest.mark.parametrize(("command", "message"), [
    (f"vllm serve {LLAMA} --quantization fp8", "--quantization is not modelled by servesweep"),
    (f"vllm serve {LLAMA} --enforce-eager", "--enforce-eager is not modelled"),
    (f"vllm serve {LLAMA} --speculative-config '{{\"method\": \"eagle\"}}'",
     "--speculative-config is not modelled"),
    (f"vllm serve {LLAMA} -O0", "-O0 is not modelled"),
    (f"vllm serve {LLAMA} --optimization-level 1", "-O1 is not modelled"),
    (f"vllm serve {LLAMA} --max-num-seq 8", "--max-num-seq is not a vllm serve flag"),
    (f"vllm serve {LLAMA} --max-num-seqs", "--max-num-seqs needs a value"),
    (f"vllm serve {LLAMA} --max-num-seqs lots", "--max-num-seqs='lots'; give an integer"),
    (f"vllm serve {LLAMA} --max-model-len -1", "--max-model-len=-1 (fit to memory)"),
    (f"vllm serve {LLAMA} --enable-prefix-caching=false", "takes no value"),
    (f"vllm serve {LLAMA} --dtype int4", "--dtype='int4'"),
    (f"vllm serve {LLAMA} --model other", "the model is given twice"),
    ("vllm serve --port 8000", "no model"),
    ("serve x", "paste the whole 'vllm serve MODEL"),
    (f"vllm serve {LLAMA} --max-num-partial-prefills 4", "--max-num-partial-prefills=4"),
])
def test_bad_commands_are_one_clear_error(command: str, message: str) -> None:
    with pytest.raises(ConfigError, match="--server-args") as err:
        _settings(command)
    assert message in str(err.value)


def test_out_of_range_values_name_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--server-args: --block-size: block_size=17"):
        _settings(f"vllm serve {LLAMA} --block-size 17")
    with pytest.raises(ConfigError, match=r"--tensor-parallel-size: tensor_parallel_size=3"):
        _settings(f"vllm serve {LLAMA} -tp 3")
    with pytest.raises(ConfigError, match="Ray executor does not support async"):
        _settings(f"vllm serve {LLAMA} --distributed-executor-backend ray --async-scheduling")
    c = _settings(f"vllm serve {LLAMA} --distributed-executor-backend ray").config
    assert not c.async_scheduling
