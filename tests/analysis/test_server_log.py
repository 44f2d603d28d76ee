"""``vllm serve`` logs: KV capacity and settings (analysis.server_log), on excerpts written in
vLLM 0.19's logging format."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.server_args import read_server_args
from analysis.server_log import check_against, read_server_log
from engine.specs import ConfigError
from profiles.catalog import load_hardware, load_model

MOE = "Qwen/Qwen3-30B-A3B-Instruct-2507"
# A TP2 x DP2 MoE server: two engines each print their KV size.
LOG = f"""\
(APIServer pid=7) INFO 11-30 09:12:01 [api_server.py:1896] vLLM API server version 0.19.0
(APIServer pid=7) INFO 11-30 09:12:01 [utils.py:328] non-default args: {{'model_tag': '{MOE}', 'model': '{MOE}', 'tensor_parallel_size': 2, 'data_parallel_size': 2, 'enable_expert_parallel': True, 'max_num_seqs': 256, 'port': 8001}}
(EngineCore_DP0 pid=90) INFO 11-30 09:12:09 [core.py:77] Initializing a V1 LLM engine (v0.19.0) with config: model='{MOE}', speculative_config=None, dtype=torch.bfloat16, max_seq_len=262144, tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=2, quantization=None, enforce_eager=False, kv_cache_dtype=auto, enable_prefix_caching=True, enable_chunked_prefill=True, compilation_config={{"level":3,"cudagraph_capture_sizes":[512,504]}}
(EngineCore_DP0 pid=90) (Worker_TP0 pid=95) INFO 11-30 09:12:40 [gpu_worker.py:298] Available KV cache memory: 52.13 GiB
(EngineCore_DP0 pid=90) INFO 11-30 09:12:41 [kv_cache_utils.py:1087] GPU KV cache size: 1,138,688 tokens
(EngineCore_DP0 pid=90) INFO 11-30 09:12:41 [kv_cache_utils.py:1091] Maximum concurrency for 262,144 tokens per request: 4.34x
(EngineCore_DP1 pid=91) INFO 11-30 09:12:41 [kv_cache_utils.py:1087] GPU KV cache size: 1,138,688 tokens
(EngineCore_DP1 pid=91) INFO 11-30 09:12:41 [kv_cache_utils.py:1091] Maximum concurrency for 262,144 tokens per request: 4.34x
(APIServer pid=7) INFO 11-30 09:13:02 [api_server.py:1971] Starting vLLM API server 0 on http://127.0.0.1:8001
"""
COMMAND = f"vllm serve {MOE} -tp 2 -dp 2 --enable-expert-parallel --max-num-seqs 256 --port 8001"


def _settings(command: str = COMMAND):
    args = read_server_args(command)
    return args.settings(load_model(args.model), load_hardware("H100"))


def _log(tmp_path: Path, text: str = LOG) -> Path:
    p = tmp_path / "serve.log"
    p.write_text(text)
    return p


def test_reads_kv_size_concurrency_and_settings(tmp_path: Path) -> None:
    log = read_server_log(_log(tmp_path))
    assert log.kv_tokens == 1_138_688 and log.num_gpu_blocks(16) == 71_168
    assert log.max_model_len == 262_144 and log.max_concurrency == 4.34
    assert log.available_kv_gib == 52.13 and log.vllm_version == "0.19.0"
    assert log.non_default["max_num_seqs"] == 256
    assert log.engine["tensor_parallel_size"] == 2 and log.engine["kv_cache_dtype"] == "auto"
    assert log.where("kv_tokens") == f"{tmp_path / 'serve.log'}:5"
    assert check_against(log, _settings())  # agrees: a note, no error


def test_v0_block_line_and_override(tmp_path: Path) -> None:
    text = ("INFO 05-01 10:00:00 [executor_base.py:113] # GPU blocks: 27802, # CPU blocks: 2048\n"
            "INFO 05-01 10:00:00 [kv_cache_utils.py:634] Overriding num_gpu_blocks=27802 with "
            "num_gpu_blocks_override=1000\n")
    log = read_server_log(_log(tmp_path, text))
    assert log.num_gpu_blocks(16) == 27802 and log.override_blocks == 1000
    with pytest.raises(ConfigError, match="num_gpu_blocks_override=1000 but --server-args gives"):
        check_against(log, _settings(COMMAND + " --num-gpu-blocks-override 500"))


@pytest.mark.parametrize(("command", "message"), [
    (COMMAND.replace("--max-num-seqs 256", "--max-num-seqs 128"),
     r"serve\.log:2: the server log has max_num_seqs=256 but --server-args gives "
     r"--max-num-seqs 128"),
    (COMMAND.replace(" --max-num-seqs 256", ""),
     r"max_num_seqs=256 but --server-args does not set --max-num-seqs .*add --max-num-seqs 256"),
    (COMMAND + " --max-model-len 32768",
     r"serve\.log:3: the server log has max_model_len=262144 but --server-args gives "
     r"--max-model-len 32768"),
    (COMMAND + " --no-enable-prefix-caching", r"enable_prefix_caching=True"),
    (COMMAND.replace(MOE, "mistralai/Mixtral-8x7B-v0.1"),
     r"serve\.log:2: the server log served model 'Qwen/Qwen3-30B-A3B-Instruct-2507'"),
])
def test_a_log_of_another_server_is_an_error_naming_both(tmp_path: Path, command: str,
                                                         message: str) -> None:
    log = read_server_log(_log(tmp_path))
    with pytest.raises(ConfigError, match=message):
        check_against(log, _settings(command))


def test_bad_logs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no vLLM start-up lines found"):
        read_server_log(_log(tmp_path, "hello\nworld\n"))
    with pytest.raises(ConfigError, match="server log not found"):
        read_server_log(tmp_path / "missing.log")
    two = LOG.replace("(EngineCore_DP1 pid=91) INFO 11-30 09:12:41 [kv_cache_utils.py:1087] GPU "
                      "KV cache size: 1,138,688", "(EngineCore_DP1 pid=91) INFO 11-30 09:12:41 "
                      "[kv_cache_utils.py:1087] GPU KV cache size: 1,000,000")
    with pytest.raises(ConfigError, match=r"serve\.log:7: kv tokens 1000000 differs from "
                       r"1138688 at line 5"):
        read_server_log(_log(tmp_path, two))
    log = read_server_log(_log(tmp_path, "GPU KV cache size: 1,000 tokens\n"))
    with pytest.raises(ConfigError, match="not a whole number of 16-token blocks"):
        log.num_gpu_blocks(16)
