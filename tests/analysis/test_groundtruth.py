"""Ground-truth reader, cluster-config schema and engine settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.groundtruth import (
    ClusterSpec,
    engine_settings,
    load_cluster_config,
    load_groundtruth,
    parse_cluster_config,
    read_vllm_requests,
    recorded_engine,
)
from analysis.metrics import VALIDATION_METRICS, compute_metrics
from engine.specs import ConfigError, EngineConfig

# vLLM columns of the committed validation summaries (docs/reference-semantics.md §13), ms, in
# VALIDATION_METRICS order: TTFT, TPOT, Latency x mean/median/p90/p95/p99.
REFERENCE_VLLM = {
    "Llama-3.1-8B": [
        7097.2, 9442.7, 16852.7, 18397.9, 19755.3,
        32.5, 33.4, 36.5, 36.9, 37.3,
        28200.7, 29615.6, 35450.7, 36617.4, 37638.8,
    ],
    "Qwen3-32B": [
        36905.2, 40701.8, 84318.7, 88007.4, 93347.1,
        80.3, 84.3, 94.5, 96.3, 97.1,
        90408.1, 98648.9, 118256.3, 123302.7, 126337.0,
    ],
    "Qwen3-30B-A3B-Instruct-2507": [
        1086.0, 138.8, 5182.6, 8431.3, 9587.9,
        47.3, 48.9, 52.2, 52.6, 53.3,
        32344.6, 31462.3, 38448.2, 39648.9, 43901.1,
    ],
}  # fmt: skip


def _truth(shared_data: Path, model: str) -> Path:
    return shared_data / "llmservingsim" / "groundtruth" / "RTXPRO6000" / model


@pytest.mark.groundtruth
@pytest.mark.parametrize("model", sorted(REFERENCE_VLLM))
def test_vllm_metrics_match_reference_summary(shared_data, model):
    gt = load_groundtruth(_truth(shared_data, model))
    m = gt.metrics()
    got = [round(m[k], 1) for k in VALIDATION_METRICS]
    assert got == pytest.approx(REFERENCE_VLLM[model], abs=0.051)
    assert m["completed"] == 300


@pytest.mark.groundtruth
def test_llama_request_frame(shared_data):
    gt = load_groundtruth(_truth(shared_data, "Llama-3.1-8B"))
    df = gt.requests
    for col in (
        "request_id",
        "arrival_ns",
        "first_token_ns",
        "finish_ns",
        "prompt_len",
        "output_len",
        "scheduled_ns",
        "arrival_time",
        "request_index",
    ):
        assert col in df.columns
    r0 = df.iloc[0]
    assert r0.request_id == "bench-0" and r0.request_index == 0
    assert r0.arrival_ns == 0  # the earliest queued_ts is the origin
    # queued 479748.340626232 -> first token 479748.510151426 -> last 479764.054028055
    assert r0.first_token_ns == pytest.approx(169_525_194, abs=2)
    assert r0.finish_ns == pytest.approx(15_713_401_823, abs=2)
    assert r0.scheduled_ns == pytest.approx(46_148, abs=2)
    assert r0.arrival_time == pytest.approx(1777142838.338653)
    assert (r0.prompt_len, r0.output_len) == (2358, 531)
    assert df.prompt_len.sum() == 257_239 and df.output_len.sum() == 195_753
    # requests 4-6 reach the engine within 20 us during one step and are scheduled together
    assert df.arrival_ns.iloc[6] - df.arrival_ns.iloc[4] < 20_000
    assert df.scheduled_ns.iloc[4] == df.scheduled_ns.iloc[5] == df.scheduled_ns.iloc[6]
    assert len(gt.timeseries) == 67
    assert gt.meta["dataset_path"].endswith("sharegpt-llama-3.1-8b-300-sps10.jsonl")


@pytest.mark.groundtruth
def test_recorded_engine_settings_in_vllms_names(shared_data):
    llama = recorded_engine(_truth(shared_data, "Llama-3.1-8B"))
    assert llama.config == EngineConfig(max_num_seqs=128, max_num_batched_tokens=2048,
                                        gpu_memory_utilization=0.9, kv_cache_dtype="auto")
    assert (llama.data_parallel_size, llama.dtype, llama.seed) == (1, "bfloat16", 42)
    params = engine_settings(_truth(shared_data, "Llama-3.1-8B"))
    assert params["gpu_memory_utilization"] == 0.9 and params["tensor_parallel_size"] == 1
    assert params["max_model_len"] is None and params["data_parallel_size"] == 1
    assert "mem_util" not in params and "step_overhead_us" not in params
    moe = recorded_engine(load_groundtruth(_truth(shared_data, "Qwen3-30B-A3B-Instruct-2507")))
    c = moe.config
    assert (c.tensor_parallel_size, moe.data_parallel_size, c.expert_parallel_size) == (1, 2, 2)
    assert recorded_engine(_truth(shared_data, "Qwen3-32B")).config.tensor_parallel_size == 2


@pytest.mark.groundtruth
def test_groundtruth_cluster_configs(shared_data):
    moe = load_groundtruth(_truth(shared_data, "Qwen3-30B-A3B-Instruct-2507")).cluster
    assert isinstance(moe, ClusterSpec)
    assert moe.num_nodes == 1 and len(moe.instances) == 2
    inst = moe.instances[1]
    assert (inst.tp_size, inst.ep_size, inst.dp_group, inst.num_npus) == (1, 2, "A", 1)
    assert inst.npu_mem.mem_size == 96 and inst.npu_mem.mem_bw == 1597
    assert inst.npu_mem.mem_util == 0.9
    assert moe.link_bw == (16.0,) and moe.link_latency == (20000.0,)
    assert moe.nodes[0].cpu_mem.mem_size == 512


def test_every_shipped_cluster_config_parses(shared_data):
    folder = shared_data / "llmservingsim" / "configs" / "cluster"
    paths = sorted(folder.glob("*.json"))
    assert len(paths) == 24
    parsed = {p.stem: load_cluster_config(p) for p in paths}
    h100 = parsed["single_node_single_instance_H100"].instances[0]
    assert (h100.model_name, h100.tp_size, h100.npu_mem.mem_bw) == (
        "meta-llama/Llama-3.1-70B",
        4,
        3350,
    )
    dual = parsed["dual_node_moe_dp_ep_intra_inter_instance"]
    assert dual.num_nodes == 2 and dual.link_bw == (128.0, 16.0)
    assert dual.link_latency == (500.0, 20000.0)
    cxl = parsed["single_node_cxl_instance"]
    assert cxl.cxl_mem.num_devices == 4 and cxl.cxl_mem.mem_bw == 60
    assert cxl.instances[0].placement["default"]["weights"] == "cxl:0"
    pd = parsed["single_node_pd_per_instance_config"].instances
    assert [i.pd_type for i in pd] == ["prefill", "decode"]
    assert pd[0].overrides["max_num_batched_tokens"] == 8192
    assert pd[0].overrides["long_prefill_token_threshold"] == 2048
    het = parsed["single_node_heterogeneous"].instances[1]
    assert het.overrides["enable_prefix_caching"] is False
    assert (
        parsed["single_node_power_instance"].nodes[0].power["npu"]["RTXPRO6000"]["active_power"]
        == 600
    )
    assert parsed["single_node_pim_instance"].nodes[0].cpu_mem.pim_config == "DDR4_8GB_3200_pim"
    assert parsed["single_node_pp_instance"].instances[0].pp_size == 4
    assert all(not i.extra for c in parsed.values() for i in c.instances)


# ---------------------------------------------------------------------------------------
# Bad input, on small hand-written folders

CLUSTER = {
    "num_nodes": 1,
    "link_bw": 16,
    "link_latency": 20000,
    "nodes": [
        {
            "num_instances": 1,
            "cpu_mem": {"mem_size": 512, "mem_bw": 256, "mem_latency": 0},
            "instances": [
                {
                    "model_name": "meta-llama/Llama-3.1-8B",
                    "hardware": "RTXPRO6000",
                    "npu_mem": {"mem_size": 96, "mem_bw": 1597, "mem_latency": 0, "mem_util": 0.8},
                    "num_npus": 1,
                    "tp_size": 1,
                    "pd_type": None,
                    "my_knob": 3,
                }
            ],
        }
    ],
}
META = {
    "engine_kwargs": {
        "tensor_parallel_size": 1,
        "data_parallel_size": 1,
        "enable_expert_parallel": False,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 1024,
        "dtype": "bfloat16",
        "kv_cache_dtype": "fp8",
        "seed": 1,
    },
    "kv_cache": {"num_gpu_blocks": 1234},
}
REQ = {
    "request_id": "bench-0",
    "input_toks": 10,
    "output_toks": 3,
    "arrival_time": 1.7e9,
    "queued_ts": 100.0,
    "scheduled_ts": 100.001,
    "first_token_ts": 100.05,
    "last_token_ts": 100.15,
}


def _make_truth(
    tmp_path,
    cluster=CLUSTER,
    meta=META,
    reqs=(REQ,),
    ts="t,prompt_throughput,gen_throughput,running,waiting\n1.0,1,2,3,4\n",
):  # noqa: E501
    root = tmp_path / "truth"
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    if cluster is not None:
        (root / "config.json").write_text(json.dumps(cluster))
    if meta is not None:
        (root / "vllm" / "meta.json").write_text(json.dumps(meta))
    (root / "vllm" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs))
    if ts is not None:
        (root / "vllm" / "timeseries.csv").write_text(ts)
    return root


def test_small_truth_and_num_gpu_blocks(tmp_path):
    second = {**REQ, "request_id": "bench-1", "queued_ts": 100.1, "scheduled_ts": 100.1,
              "first_token_ts": 100.2, "last_token_ts": 100.3, "output_toks": 1}  # fmt: skip
    gt = load_groundtruth(_make_truth(tmp_path, reqs=(REQ, second)))
    c = recorded_engine(gt).config
    assert c.num_gpu_blocks_override == 1234
    assert c.gpu_memory_utilization == 0.8  # from the cluster config: meta does not record it
    assert c.kv_cache_dtype == "fp8" and (c.max_num_seqs, c.max_num_batched_tokens) == (64, 1024)
    assert gt.cluster.instances[0].extra == {"my_knob": 3}
    m = compute_metrics(gt.requests)
    assert m["ttft_ms_mean"] == pytest.approx((50 + 100) / 2)
    assert m["tpot_ms_mean"] == pytest.approx(50.0)  # only bench-0 has > 1 token
    assert m["duration_s"] == pytest.approx(0.3)


@pytest.mark.parametrize("missing", ["config.json", "vllm/meta.json", "vllm/requests.jsonl"])
def test_missing_files_named(tmp_path, missing):
    root = _make_truth(tmp_path)
    (root / missing).unlink()
    with pytest.raises(ConfigError, match=missing.split("/")[-1]):
        load_groundtruth(root)


def test_timeseries_is_optional(tmp_path):
    root = _make_truth(tmp_path)
    (root / "vllm" / "timeseries.csv").unlink()
    gt = load_groundtruth(root)
    assert gt.timeseries.empty and len(gt.requests) == 1


def test_missing_folder(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_groundtruth(tmp_path / "nope")


def test_missing_request_field_named(tmp_path):
    bad = {k: v for k, v in REQ.items() if k != "first_token_ts"}
    root = _make_truth(tmp_path, reqs=(REQ, bad))
    with pytest.raises(
        ConfigError, match=r"requests.jsonl:2: missing field\(s\) \['first_token_ts'\]"
    ):
        read_vllm_requests(root / "vllm" / "requests.jsonl")


def test_bad_request_value_and_json(tmp_path):
    root = _make_truth(tmp_path, reqs=({**REQ, "queued_ts": "soon"},))
    with pytest.raises(ConfigError, match="queued_ts"):
        load_groundtruth(root)
    path = root / "vllm" / "requests.jsonl"
    path.write_text('{"request_id": "bench-0", "input_')
    with pytest.raises(ConfigError, match="invalid JSON"):
        read_vllm_requests(path)


def test_missing_engine_kwargs_and_settings_field(tmp_path):
    with pytest.raises(ConfigError, match="engine_kwargs"):
        load_groundtruth(_make_truth(tmp_path, meta={"model": "x"}))
    kw = {k: v for k, v in META["engine_kwargs"].items() if k != "max_num_seqs"}
    gt = load_groundtruth(_make_truth(tmp_path, meta={"engine_kwargs": kw}))
    with pytest.raises(ConfigError, match="max_num_seqs"):
        recorded_engine(gt)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"block_size": 7}, r"engine_kwargs\.block_size: block_size=7 is not allowed; allowed: "
                            r"one of \[1, 8, 16, 32, 64, 128, 256\]"),
        ({"gpu_memory_utilization": 90}, r"engine_kwargs\.gpu_memory_utilization: .*did you mean"),
        ({"scheduler_reserve_full_isl": "yes"}, r"engine_kwargs\.scheduler_reserve_full_isl: "
                                                r"reserve_full_isl='yes'"),
        ({"data_parallel_size": 0}, r"engine_kwargs\.data_parallel_size"),
    ],
)
def test_a_bad_recorded_setting_names_meta_json_and_its_key(tmp_path, change, needle):
    meta = {**META, "engine_kwargs": {**META["engine_kwargs"], **change}}
    gt = load_groundtruth(_make_truth(tmp_path, meta=meta))
    with pytest.raises(ConfigError, match=needle) as err:
        recorded_engine(gt)
    assert "meta.json" in str(err.value)


def test_recorded_kwargs_override_the_base_and_the_defaults(tmp_path):
    kw = {**META["engine_kwargs"], "block_size": 32, "enable_prefix_caching": False,
          "scheduler_reserve_full_isl": False, "gpu_memory_utilization": 0.7}
    gt = load_groundtruth(_make_truth(tmp_path, meta={**META, "engine_kwargs": kw}))
    c = recorded_engine(gt, EngineConfig(async_scheduling=False, max_model_len=4096)).config
    assert (c.block_size, c.enable_prefix_caching, c.reserve_full_isl) == (32, False, False)
    assert c.gpu_memory_utilization == 0.7  # recorded by vLLM: wins over the cluster config
    assert c.async_scheduling is False  # from the base
    assert c.max_model_len is None  # not recorded: vLLM used the model's context length


def test_timeseries_missing_column(tmp_path):
    root = _make_truth(tmp_path, ts="t,running\n1.0,3\n")
    with pytest.raises(ConfigError, match="prompt_throughput"):
        load_groundtruth(root)


def _mutated(path_fn):
    data = json.loads(json.dumps(CLUSTER))
    path_fn(data)
    return data


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.update(num_nodes=2), "num_nodes"),
        (lambda d: d.pop("link_bw"), "link_bw"),
        (lambda d: d.update(link_bw="fast"), "link_bw"),
        (lambda d: d["nodes"][0].update(num_instances=3), "num_instances"),
        (lambda d: d["nodes"][0].pop("cpu_mem"), "cpu_mem"),
        (lambda d: d["nodes"][0]["instances"][0].update(pd_type="both"), "pd_type"),
        (lambda d: d["nodes"][0]["instances"][0].pop("pd_type"), "pd_type"),
        (lambda d: d["nodes"][0]["instances"][0].pop("model_name"), "model_name"),
        (lambda d: d["nodes"][0]["instances"][0]["npu_mem"].pop("mem_bw"), r"npu_mem.*mem_bw"),
        (lambda d: d["nodes"][0]["instances"][0]["npu_mem"].update(mem_util=1.5), "mem_util"),
        (lambda d: d["nodes"][0]["instances"][0].update(tp_size=0), "tp_size"),
        (
            lambda d: d.update(
                cxl_mem={"mem_size": 1, "mem_bw": 1, "mem_latency": 1, "num_devices": 0}
            ),
            "num_devices",
        ),
    ],
)
def test_bad_cluster_configs(mutate, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_cluster_config(_mutated(mutate))
