"""Every workload kind and trace format as a sweep point: ``workload=<name>`` composed by Hydra,
checked by the validator, run by ``sweep.job.run_point`` (in-process, no Ray)."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from hydra import compose

from engine.specs import ConfigError
from sweep import job
from sweep.schema import register
from sweep.validate import check_config
from workloads.config import FORMAT_KEYS, KIND_KEYS

register()
pytestmark = pytest.mark.usefixtures("hydra_conf")
S = 1_000_000_000
BASE = ["tracking.uri=null", "tracking.plots=false"]


def _cfg(*overrides: str):
    cfg = compose("config", overrides=[*BASE, *overrides])
    check_config(cfg)
    return cfg


def _run(*overrides: str) -> tuple[dict, pd.DataFrame]:
    """The point's metrics and per-request table (``send_ns``: the workload's arrival times, as
    the client sends them; ``arrival_ns`` is when the engine core received each request)."""
    out = job.run_point(_cfg(*overrides))
    return out["metrics"], pd.read_parquet(io.BytesIO(out["requests_parquet"]))


def test_staged(tmp_path):
    m, req = _run("workload=staged", "workload.stages=[{rate:4,duration_s:2},{rate:8,duration_s:1}]",
                  "workload.input_len=64", "workload.output_len=8")
    assert m["completed"] == 16
    arrivals = sorted(req.send_ns.tolist())
    assert arrivals == [S // 4 * k for k in range(1, 9)] + [2 * S + S // 8 * k for k in range(1, 9)]


def test_staged_poisson_default_stages():
    cfg = _cfg("workload=staged", "workload.arrival=poisson", "workload.input_len=32",
               "workload.output_len=4")
    reqs = job.build_workload(cfg, job.model_spec(cfg.model.name))
    t = [r.arrival_ns / S for r in reqs]
    counts = [sum(a < t_ <= b for t_ in t) for a, b in ((0, 30), (30, 60), (60, 90))]
    assert counts[0] < counts[1] < counts[2]  # 2, 4, 8 req/s
    assert sum(counts) == len(reqs) and t[-1] <= 90


def test_shared_prefix():
    m, req = _run("workload=shared_prefix", "workload.num_requests=30",
                  "workload.system_prompt_len=64", "workload.question_len=16",
                  "workload.output_len=8")
    assert m["completed"] == 30 and set(req.prompt_len) == {80} and set(req.output_len) == {8}
    assert m["prefix_hit_rate"] > 0.3  # the groups' system prompts are cached


def test_vllm_random():
    m, req = _run("workload=vllm_random", "workload.num_requests=20", "workload.input_len=96",
                  "workload.output_len=8", "workload.range_ratio=0.5", "workload.prefix_len=64",
                  "workload.num_special_tokens=1")
    assert m["completed"] == 20
    assert req.prompt_len.min() >= 1 + 64 + 47 and req.prompt_len.max() <= 1 + 64 + 143
    assert m["prefix_hit_rate"] > 0.2  # the shared random prefix (and the BOS) are cached


def test_prefix_repetition():
    m, req = _run("workload=prefix_repetition", "workload.num_requests=25",
                  "workload.prefix_len=64", "workload.suffix_len=16", "workload.num_prefixes=4",
                  "workload.output_len=8")
    assert m["completed"] == 24  # 4 prefixes x 6, vLLM drops the remainder
    assert set(req.prompt_len) == {80}
    assert m["prefix_hit_rate"] > 0.5


def test_azure_trace(tmp_path):
    p = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 + "".join(f"2023-11-16 18:15:{10 + i:02d}.5000000,{64 + i},{4 + i % 3}\n"
                           for i in range(12)))
    m, req = _run("workload=azure_trace", f"workload.path={p}", "workload.rate_scale=2")
    assert m["completed"] == 12
    assert sorted(req.send_ns) == [i * S // 2 for i in range(12)]


def test_burstgpt_trace(tmp_path):
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 + "".join(f"{5 + 2 * i},{'GPT-4' if i % 2 else 'ChatGPT'},{50 + i},{3 + i % 2},"
                           f"{53 + i + i % 2},Conversation log\n" for i in range(10)))
    m, req = _run("workload=burstgpt_trace", f"workload.path={p}", "workload.models=[GPT-4]",
                  "workload.time_scale=0.5")
    assert m["completed"] == 5
    assert sorted(req.send_ns) == [S * (1 + 2 * k) for k in range(5)]  # (2 + 4k) s x 0.5


def test_mooncake_trace(tmp_path):
    p = tmp_path / "conversation_trace.jsonl"
    rows = [{"timestamp": 500 * i, "input_length": 600, "output_length": 4,
             "hash_ids": [0, 10 + i]} for i in range(8)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    m, req = _run("workload=mooncake_trace", f"workload.path={p}", "workload.limit=6")
    assert m["completed"] == 6
    # block 0 (512 tokens) is shared: every request after the first finds it
    assert m["prefix_hit_rate"] == pytest.approx(5 * 512 / (6 * 600))


def test_jsonl_trace_rate_scale(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps({"input_toks": 20, "output_toks": 3,
                                     "arrival_time_ns": i * S}) + "\n" for i in range(6)))
    m, req = _run("workload=trace", f"workload.path={p}", "workload.rate_scale=4")
    assert m["completed"] == 6 and sorted(req.send_ns) == [i * S // 4 for i in range(6)]


def test_every_conf_entry_composes_and_names_its_keys():
    """Each conf/workload entry sets only keys its kind reads (the validator's own rule)."""
    for name in ("staged", "shared_prefix", "vllm_random", "prefix_repetition",
                 "sharegpt_synthetic", "bursty"):
        _cfg(f"workload={name}")
    for name, fmt in (("azure_trace", "azure"), ("burstgpt_trace", "burstgpt"),
                      ("mooncake_trace", "mooncake"), ("trace", "jsonl")):
        cfg = compose("config", overrides=[*BASE, f"workload={name}"])
        assert cfg.workload.format == fmt
        assert set(FORMAT_KEYS[fmt]) <= set(KIND_KEYS["trace"])
        if name != "trace":
            with pytest.raises(ConfigError, match="workload.path=None is not allowed; allowed: "
                                                  f"an existing {fmt} trace file"):
                check_config(cfg)


@pytest.mark.parametrize("overrides, needle", [
    (["workload=vllm_random", "workload.shared_prefix_len=16"],
     "workload.shared_prefix_len=16 is not allowed; allowed: its default 0 with "
     "workload.kind=vllm_random, which does not read it \\(read by kind synthetic\\)"),
    (["workload.range_ratio=0.5"], "workload.range_ratio=0.5 .*read by kind vllm_random"),
    (["workload=azure_trace", "workload.path=x", "workload.models=[GPT-4]"],
     "workload.models=\\['GPT-4'\\] .* workload.format=azure, which does not read it \\(read "
     "by format burstgpt\\)"),
    (["workload=trace", "workload.start_s=5"], "workload.start_s=5.0 .* workload.format=jsonl"),
    (["workload=staged", "workload.num_requests=10"],
     "workload.num_requests=10 is not allowed; allowed: null with workload.stages"),
    (["workload=staged", "workload.stages=[{rate:0,duration_s:5}]"],
     "at least one stage with rate > 0"),
    (["workload=staged", "workload.stages=[{rate:1,duration_s:-5}]"],
     "workload.stages\\[0\\].duration_s=-5.0"),
    (["workload=staged", "workload.stages=[{rate:1}]"], "duration_s"),
    (["workload=shared_prefix", "workload.output_len=sharegpt"],
     "workload.output_len='sharegpt' .* an integer >= 1 \\(workload.kind=shared_prefix takes "
     "a fixed length\\)"),
    (["workload=vllm_random", "workload.range_ratio=1.0"], "workload.range_ratio=1.0"),
    (["workload=prefix_repetition", "workload.num_prefixes=0"], "workload.num_prefixes=0"),
    (["workload=burstgpt_trace", "workload.path=x", "workload.rate_scale=0"],
     "workload.path='x' is not allowed"),
    (["workload.arrival=uniform"], "one of \\['poisson', 'gamma', 'constant'\\]"),
    (["workload=trace", "workload.format=csv"], "workload.format='csv'"),
])
def test_bad_workload_settings_are_refused_by_key(overrides, needle):
    from omegaconf.errors import OmegaConfBaseException

    with pytest.raises((ConfigError, OmegaConfBaseException), match=needle):
        _cfg(*overrides)


def test_trace_scaling_is_checked_by_key(tmp_path):
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens\n1,GPT-4,3,4\n")
    for key, value in (("rate_scale", "0"), ("time_scale", "-1"), ("start_s", "-2"),
                       ("duration_s", "0"), ("limit", "0")):
        with pytest.raises(ConfigError, match=f"workload.{key}="):
            _cfg("workload=burstgpt_trace", f"workload.path={p}", f"workload.{key}={value}")
