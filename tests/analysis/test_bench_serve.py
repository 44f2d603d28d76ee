"""``vllm bench serve`` results as ground truth and as output (needs ../shared/data).

The truth is a ``vllm bench serve --save-result --save-detailed`` JSON built at test time from
the shared RTX PRO 6000 / Llama-3.1-8B ground truth (never copied into the repository).

vLLM 0.19's format (``vllm/benchmarks/serve.py``): run keys, per-request ``input_lens``,
``output_lens``, ``ttfts`` / ``itls`` / ``latencies`` / ``start_times`` in seconds on the
client's ``time.perf_counter()`` clock, ``generated_texts``, ``errors``, and the summaries of
the default ``--percentile-metrics ttft,tpot,itl`` at ``--metric-percentiles 99`` computed as
``calculate_metrics`` does (numpy on seconds, x1000).

What is assumed to turn ``requests.jsonl`` into client-side times (the file records the
client's send ``arrival_time`` on the wall clock and the engine's ``queued_ts`` /
``first_token_ts`` / ``last_token_ts`` on its monotonic clock):

- the send on the engine clock is ``arrival_time + offset`` with ``offset = min(queued_ts -
  arrival_time)``: the request the engine received soonest after its send had no lag, every
  other one the lag the clocks show (median ~15 ms, docs/groundtruth-observations);
- ``start_times`` are those sends; ``ttfts`` = ``first_token_ts`` - send; ``latencies`` =
  ``last_token_ts`` - send (the engine's token instants stand for the client's receipt);
- ``itls``: the file has no per-token times, so ``output_toks - 1`` equal gaps between the
  first and the last token;
- a failed request (``failed`` indices) is written as vLLM writes one: ``output_lens`` 0,
  ``ttfts`` and ``latencies`` 0, no ``itls``, empty text, the error text in ``errors``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import analysis.validate as validate_mod
from analysis.bench_serve import read_result, rebuild_workload, write_result
from analysis.metrics import VALIDATION_METRICS, compare, compute_metrics, per_request
from engine.specs import ConfigError

LLAMA = Path("llmservingsim") / "groundtruth" / "RTXPRO6000" / "Llama-3.1-8B"
SERVER_ARGS = ("vllm serve meta-llama/Llama-3.1-8B --max-num-seqs 128 "
               "--max-num-batched-tokens 2048 --port 8000 --disable-log-requests")
# A vllm serve 0.19 start-up log excerpt for the Llama run (the lines analysis.server_log
# reads, in vLLM's logging format; the KV size is 36,578 blocks x 16 tokens).
SERVER_LOG = """\
(APIServer pid=1201) INFO 04-25 18:46:51 [api_server.py:1896] vLLM API server version 0.19.0
(APIServer pid=1201) INFO 04-25 18:46:51 [utils.py:328] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B', 'model': 'meta-llama/Llama-3.1-8B', 'max_num_seqs': 128, 'max_num_batched_tokens': 2048}
(EngineCore_DP0 pid=1333) INFO 04-25 18:46:58 [core.py:77] Initializing a V1 LLM engine (v0.19.0) with config: model='meta-llama/Llama-3.1-8B', speculative_config=None, tokenizer='meta-llama/Llama-3.1-8B', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=131072, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name=meta-llama/Llama-3.1-8B, enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, compilation_config={"level":3,"mode":3,"debug_dump_path":""}
(EngineCore_DP0 pid=1333) INFO 04-25 18:47:10 [gpu_worker.py:298] Available KV cache memory: 71.44 GiB
(EngineCore_DP0 pid=1333) INFO 04-25 18:47:10 [kv_cache_utils.py:1087] GPU KV cache size: 585,248 tokens
(EngineCore_DP0 pid=1333) INFO 04-25 18:47:10 [kv_cache_utils.py:1091] Maximum concurrency for 131,072 tokens per request: 4.47x
"""
ERROR = ("Traceback (most recent call last):\n  File \"endpoint_request_func.py\", line 143, in "
         "async_request_openai_completions\naiohttp.client_exceptions.ServerDisconnectedError: "
         "Server disconnected\n")


def llama_result(shared: Path, failed: Iterable[int] = ()) -> dict[str, Any]:
    """The Llama run as a bench result dict (see the module docstring)."""
    lost = set(failed)
    rows = [json.loads(line) for line in
            (shared / LLAMA / "vllm" / "requests.jsonl").read_text().splitlines() if line.strip()]
    offset = min(r["queued_ts"] - r["arrival_time"] for r in rows)
    per: dict[str, list[Any]] = {k: [] for k in ("input_lens", "output_lens", "ttfts", "itls",
                                                 "latencies", "start_times", "generated_texts",
                                                 "errors")}
    for i, r in enumerate(rows):
        send = r["arrival_time"] + offset
        per["start_times"].append(send)
        per["input_lens"].append(r["input_toks"])
        if i in lost:
            for key, value in (("output_lens", 0), ("ttfts", 0.0), ("itls", []),
                               ("latencies", 0.0), ("generated_texts", ""), ("errors", ERROR)):
                per[key].append(value)
            continue
        n = r["output_toks"]
        ttft, latency = r["first_token_ts"] - send, r["last_token_ts"] - send
        per["output_lens"].append(n)
        per["ttfts"].append(ttft)
        per["itls"].append([(latency - ttft) / (n - 1)] * (n - 1))
        per["latencies"].append(latency)
        per["generated_texts"].append("text")
        per["errors"].append("")
    ok = [i for i in range(len(rows)) if i not in lost]
    ttfts = [per["ttfts"][i] for i in ok]
    tpots = [(per["latencies"][i] - per["ttfts"][i]) / (per["output_lens"][i] - 1)
             for i in ok if per["output_lens"][i] > 1]
    itls = [g for i in ok for g in per["itls"][i]]
    duration = max(per["start_times"][i] + per["latencies"][i] for i in ok) - min(
        per["start_times"])
    out_tokens = sum(per["output_lens"])
    in_tokens = sum(per["input_lens"][i] for i in ok)
    result: dict[str, Any] = {
        "date": "20260425-184718", "endpoint_type": "openai", "backend": "openai",
        "label": None, "model_id": "meta-llama/Llama-3.1-8B",
        "tokenizer_id": "meta-llama/Llama-3.1-8B", "num_prompts": len(rows),
        "request_rate": 10.0, "burstiness": 1.0, "max_concurrency": None,
        "duration": duration, "completed": len(ok), "failed": len(lost),
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration, "request_goodput": None,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        **per,
        "max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0, "rtfx": 0.0,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls)):
        result[f"mean_{name}_ms"] = float(np.mean(values)) * 1000
        result[f"median_{name}_ms"] = float(np.median(values)) * 1000
        result[f"std_{name}_ms"] = float(np.std(values)) * 1000
        result[f"p99_{name}_ms"] = float(np.percentile(values, 99)) * 1000
    return result


def write_llama_result(shared: Path, path: Path, failed: Iterable[int] = (),
                       **changes: Any) -> Path:
    """``llama_result`` (with ``changes`` applied to its top-level keys) written to ``path``
    as vLLM writes it (one ``json.dump``)."""
    data = llama_result(shared, failed)
    data.update(changes)
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------------------------------
# Tests


pytestmark = pytest.mark.groundtruth
PROFILES = Path("llmservingsim") / "profiles"
WORKLOAD = Path("llmservingsim") / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"


def _validate(shared: Path, truth: Path, **kwargs: Any) -> validate_mod.ValidationRun:
    kwargs.setdefault("server_args", SERVER_ARGS)
    kwargs.setdefault("hardware", "RTXPRO6000")
    return validate_mod.run_validation(truth, kwargs.pop("workload", None),
                                       shared / PROFILES, **kwargs)


def test_reader_gives_vllm_s_own_summaries(shared_data: Path, tmp_path: Path) -> None:
    data = llama_result(shared_data)
    bench = read_result(write_llama_result(shared_data, tmp_path / "r.json"))
    assert bench.num_failed == 0 and len(bench.completed()) == 300
    assert bench.model_id == "meta-llama/Llama-3.1-8B"
    m = compute_metrics(bench.completed(), view="client")
    for ours, theirs in (("ttft_ms_mean", "mean_ttft_ms"), ("ttft_ms_median", "median_ttft_ms"),
                         ("ttft_ms_p99", "p99_ttft_ms"), ("tpot_ms_mean", "mean_tpot_ms"),
                         ("tpot_ms_median", "median_tpot_ms"), ("tpot_ms_p99", "p99_tpot_ms"),
                         ("itl_ms_mean", "mean_itl_ms"), ("itl_ms_p99", "p99_itl_ms")):
        assert m[ours] == pytest.approx(data[theirs], rel=1e-6), ours
    assert m["completed"] == data["completed"]


def test_failed_requests_are_left_out_on_both_sides_and_counted(shared_data: Path,
                                                                 tmp_path: Path) -> None:
    truth = write_llama_result(shared_data, tmp_path / "r.json", failed=(3, 77, 150))
    bench = read_result(truth)
    assert bench.num_failed == 3
    assert set(bench.requests.loc[bench.requests["failed"], "request_index"]) == {3, 77, 150}
    assert "ServerDisconnectedError" in bench.requests.loc[3, "error"]
    rebuilt = rebuild_workload(bench)
    assert len(rebuilt) == 297 and "bench-3" not in {r.request_id for r in rebuilt}
    run = _validate(shared_data, truth)
    assert run.report["failed_requests"] == 3 and run.report["completed_requests"] == 297
    assert len(run.result.requests) == 297
    assert run.report["metrics"]["ttft_ms_mean"]["vllm"] == pytest.approx(
        llama_result(shared_data, (3, 77, 150))["mean_ttft_ms"], rel=1e-6)


def test_bench_json_validates_end_to_end_with_server_args_and_hardware(
        shared_data: Path, tmp_path: Path) -> None:
    truth = write_llama_result(shared_data, tmp_path / "r.json")
    out, bench_out = tmp_path / "report.json", tmp_path / "sim.json"
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "validate", "--truth", str(truth), "--server-args",
         SERVER_ARGS, "--hardware", "RTXPRO6000", "--profiles", str(shared_data / PROFILES),
         "--json", str(out), "--bench-json", str(bench_out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "300 completed, 0 failed" in proc.stdout
    assert "ignored flags: --port=8000, --disable-log-requests" in proc.stdout
    report = json.loads(out.read_text())
    assert set(report["metrics"]) == set(VALIDATION_METRICS) and len(report["metrics"]) == 15
    assert report["truth_format"] == "vllm bench serve result"
    assert report["view"] == {"truth": "client", "sim": "client"}
    assert report["engine_config"]["max_num_seqs"] == 128
    assert report["bundle_source"].startswith("measured bundle")
    # The RTX PRO 6000 Llama run replayed from its lengths alone (no prefix sharing, the
    # catalog's memory, client-side times): within a few percent of vLLM.
    assert report["mean_abs_diff_pct"] < 5.0, proc.stdout
    assert report["prefix_hit_tokens"] == 0
    sim = read_result(bench_out)
    assert len(sim.completed()) == 300


def test_workload_token_ids_are_used_and_lengths_checked(shared_data: Path,
                                                         tmp_path: Path) -> None:
    truth = write_llama_result(shared_data, tmp_path / "r.json")
    run = _validate(shared_data, truth, workload=shared_data / WORKLOAD)
    assert run.report["workload"] == str(shared_data / WORKLOAD)
    assert run.report["prefix_hit_tokens"] > 0  # the ShareGPT prompts share system prompts
    data = llama_result(shared_data)
    data["input_lens"][5] += 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"request 5 has \d+ prompt tokens but .*input_lens\[5\]"):
        _validate(shared_data, bad, workload=shared_data / WORKLOAD)


def test_kv_capacity_from_blocks_or_server_log(shared_data: Path, tmp_path: Path) -> None:
    truth = write_llama_result(shared_data, tmp_path / "r.json")
    run = _validate(shared_data, truth, num_gpu_blocks=36578)
    assert run.report["kv_cache"]["num_blocks"] == 36578
    assert run.report["server"]["kv_capacity_source"] == "--num-gpu-blocks"
    log = tmp_path / "server.log"
    log.write_text(SERVER_LOG)
    run = _validate(shared_data, truth, server_log=log)
    assert run.report["kv_cache"]["num_blocks"] == 36578
    with pytest.raises(ConfigError, match="given twice and differs"):
        _validate(shared_data, truth, server_log=log, num_gpu_blocks=1000)
    with pytest.raises(ConfigError, match=r"server\.log:2: the server log has max_num_seqs=128 "
                       r"but --server-args gives --max-num-seqs 256"):
        _validate(shared_data, truth, server_log=log,
                  server_args=SERVER_ARGS.replace("128", "256"))


def test_round_trip_ours_written_and_read_back_is_zero_diff(shared_data: Path,
                                                            tmp_path: Path) -> None:
    truth = write_llama_result(shared_data, tmp_path / "r.json", failed=(9,))
    run = _validate(shared_data, truth)
    pm = per_request(run.result.requests, view="client")
    path = write_result(tmp_path / "ours.json", pm, model_id="meta-llama/Llama-3.1-8B",
                        request_rate=10.0)
    data = json.loads(path.read_text())
    for key in ("mean_ttft_ms", "median_tpot_ms", "std_itl_ms", "p99_e2el_ms", "p90_ttft_ms",
                "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                "generated_texts", "errors", "duration", "completed", "failed", "model_id",
                "request_rate", "burstiness", "max_concurrency", "max_concurrent_requests"):
        assert key in data, key
    sim = compute_metrics(run.result.requests, view="client")
    assert data["mean_ttft_ms"] == pytest.approx(sim["ttft_ms_mean"], rel=1e-12)
    assert data["p99_e2el_ms"] == pytest.approx(sim["e2el_ms_p99"], rel=1e-12)
    back = compute_metrics(read_result(path).completed(), view="client")
    for key in VALIDATION_METRICS:
        assert back[key] == pytest.approx(sim[key], rel=1e-9, abs=1e-6), key
    back_table = compare(back, sim, VALIDATION_METRICS)
    assert back_table["diff_pct"].abs().max() < 1e-7


@pytest.mark.parametrize(("change", "message"), [
    ({"start_times": None}, r"per-request keys missing: \['start_times'\]; rerun vllm bench "
     r"serve with --save-result --save-detailed"),
    ({"ttfts": "bad"}, r"ttfts must be a list"),
    ({"errors": ["" for _ in range(299)]}, r"errors has 299 entries but input_lens has 300"),
    ({"failed": 4}, r"failed is 4 but the per-request lists give 0"),
    ({"dataset_name": "prefix_repetition", "prefix_repetition_num_prefixes": "7"},
     r"prefix_repetition_num_prefixes is 7, which does not divide the 300 requests"),
    ({"dataset_name": "random", "random_prefix_len": "lots"},
     r"random_prefix_len must be an integer, got 'lots'"),
])
def test_malformed_results_are_one_clear_error(shared_data: Path, tmp_path: Path,
                                               change: dict, message: str) -> None:
    data = llama_result(shared_data)
    for key, value in change.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message) as err:
        rebuild_workload(read_result(path))
    assert str(path) in str(err.value)


def test_a_dataset_that_shares_prefixes_is_rebuilt_as_vllm_draws_it(shared_data: Path,
                                                                    tmp_path: Path) -> None:
    data = llama_result(shared_data, failed=(4,))
    data.update(dataset_name="prefix_repetition", prefix_repetition_num_prefixes="10")
    data["input_lens"] = [512] * 299 + [510]  # vLLM's re-tokenisation may move a length
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    rebuilt = {r.request_id: r for r in rebuild_workload(read_result(path))}
    assert len(rebuilt) == 299 and rebuilt["bench-299"].prompt_len == 510
    assert len({tuple(r.prompt_ids[:256]) for r in rebuilt.values()}) == 10  # 10 prefixes
    assert len({tuple(r.prompt_ids[256:]) for r in rebuilt.values()}) == 299  # own suffixes
    from workloads import Load, prefix_repetition

    drawn = prefix_repetition(Load(num_requests=300, rate=float("inf")))
    assert list(rebuilt["bench-7"].prompt_ids) == list(drawn[7].prompt_ids)
    plain = rebuild_workload(read_result(write_llama_result(shared_data, tmp_path / "p.json")))
    assert len({r.prompt_ids[0] for r in plain}) == 300  # no dataset name: nothing shared


def test_bad_values_name_the_key_and_index(shared_data: Path, tmp_path: Path) -> None:
    data = llama_result(shared_data)
    data["ttfts"][12] = "x"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"r\.json: ttfts\[12\] must be a finite number"):
        read_result(path)
    data = llama_result(shared_data)
    data["itls"][4][2] = -1.0
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"itls\[4\]\[2\] must be >= 0"):
        read_result(path)
    path.write_text(json.dumps(llama_result(shared_data)) + "\n" + json.dumps({"a": 1}))
    with pytest.raises(ConfigError, match="more than one JSON object.*--append-result"):
        read_result(path)
    path.write_text("{")
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        read_result(path)


def test_cli_errors_name_the_flag(shared_data: Path, tmp_path: Path) -> None:
    truth = write_llama_result(shared_data, tmp_path / "r.json")
    base = [sys.executable, "-m", "analysis", "validate", "--truth", str(truth), "--profiles",
            str(shared_data / PROFILES), "--hardware", "RTXPRO6000"]
    for args, message in (
        (["--server-args", SERVER_ARGS + " --speculative-config {}"],
         "--speculative-config is not modelled by servesweep"),
        (["--server-args", SERVER_ARGS + " --max-num-seq 4"],
         "--max-num-seq is not a vllm serve flag servesweep knows"),
        ([], "needs --server-args"),
        (["--server-args", SERVER_ARGS.replace("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-32B")],
         "model_id 'meta-llama/Llama-3.1-8B' is not a name the server"),
    ):
        proc = subprocess.run([*base, *args], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stdout
        assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.slow
def test_profiles_roofline_prices_catalog_hardware(shared_data: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "cache"))
    truth = write_llama_result(shared_data, tmp_path / "r.json")
    run = validate_mod.run_validation(truth, None, "roofline", server_args=SERVER_ARGS,
                                      hardware="H100")
    assert run.report["bundle_source"] == "roofline"
    assert len(run.report["metrics"]) == 15
