"""Reference cluster configs run unchanged; with the reference's clock semantics their total
simulated time equals LLMServingSim's own output (needs ../shared/data)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import analysis.validate as validate_mod
from analysis.run_scenario import run_scenario
from engine.specs import ConfigError

pytestmark = pytest.mark.groundtruth


@pytest.mark.parametrize(
    ("config", "reference", "opts", "tolerance_pct"),
    [
        ("single_node_single_instance", "example_single_run", {}, 0.0),
        ("single_node_multi_instance", "example_multi_run", {}, 0.0),
        ("single_node_pd_instance", "example_pd_run", {}, 0.0),
        ("single_node_dp_instance", "example_dp_run", {}, 0.0),
        ("single_node_moe_single_instance", "example_moe_run", {}, 0.0),
        (
            "dual_node_multi_instance",
            "example_dual_prefix_cpu_mem_pool_run",
            {"prefix_storage": "CPU", "prefix_sharing": True},
            0.0,
        ),
        ("single_node_cxl_instance", "example_cxl_run", {"prefix_storage": "CXL"}, 0.1),
        ("single_node_moe_dp_tp_pp_instance", "example_moe_dp_tp_pp_run", {}, 0.1),
    ],
)
def test_reference_clock_matches_reference_totals(
    shared_data: Path, config: str, reference: str, opts: dict, tolerance_pct: float
) -> None:
    d = shared_data / "llmservingsim"
    res, _ = run_scenario(
        d / "configs" / "cluster" / f"{config}.json",
        d / "workloads" / "example_trace.jsonl",
        d / "profiles",
        num_reqs=10,
        reference_clock=True,
        **opts,
    )
    ours = int(res.requests.finish_ns.max())
    ref = int(pd.read_csv(d / "reference_outputs" / f"{reference}.csv").end_time.max())
    assert abs(ours - ref) <= ref * tolerance_pct / 100, (ours, ref)
    assert len(res.requests) == 10 and (res.requests.finish_ns > 0).all()


def test_cpu_prefix_pool_is_shared_and_reported(shared_data: Path) -> None:
    d = shared_data / "llmservingsim"
    res, _ = run_scenario(
        d / "configs" / "cluster" / "single_node_multi_instance.json",
        d / "workloads" / "example_trace.jsonl",
        d / "profiles",
        num_reqs=10,
        prefix_storage="CPU",
        prefix_sharing=True,
    )
    stats = res.tier_stats
    assert set(stats) == {"instance0", "instance1"}
    assert all("cpu" in st and "npu" in st for st in stats.values())
    pools = {st["cpu"]["pool_id"] for st in stats.values()}
    assert len(pools) == 1  # one pool per node, shared by both instances


def test_missing_bundle_names_the_directory(shared_data: Path) -> None:
    d = shared_data / "llmservingsim"
    with pytest.raises(ConfigError, match="H100/meta-llama/Llama-3.1-70B/bf16"):
        run_scenario(
            d / "configs" / "cluster" / "single_node_single_instance_H100.json",
            d / "workloads" / "example_trace.jsonl",
            d / "profiles",
            num_reqs=2,
            roofline_fallback=False,
        )


def test_missing_bundle_falls_back_to_a_roofline_bundle(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The H100 scenario has no measured bundle: it runs on a generated one, and says so."""
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path))
    d = shared_data / "llmservingsim"
    res, notes = run_scenario(
        d / "configs" / "cluster" / "single_node_single_instance_H100.json",
        d / "workloads" / "example_trace.jsonl",
        d / "profiles",
        num_reqs=4,
    )
    assert len(res.requests) == 4 and (res.requests.finish_ns > 0).all()
    assert any("roofline bundle" in n and "H100/meta-llama/Llama-3.1-70B/bf16" in n for n in notes)
    assert any(tmp_path.rglob("tp4/dense.csv"))  # generated into the cache, TP4 tables


def test_unknown_hardware_without_bundle_is_one_clear_error(shared_data: Path, tmp_path: Path) -> None:
    src = shared_data / "llmservingsim" / "configs" / "cluster" / "single_node_single_instance_H100.json"
    cfg = tmp_path / "tpu.json"
    cfg.write_text(src.read_text().replace('"H100"', '"MysteryNPU"'))
    with pytest.raises(ConfigError, match="'MysteryNPU' is not in the catalog"):
        run_scenario(cfg, shared_data / "llmservingsim" / "workloads" / "example_trace.jsonl",
                     shared_data / "llmservingsim" / "profiles", num_reqs=2)


def test_a_bad_instance_override_names_its_key(shared_data: Path, tmp_path: Path) -> None:
    import json

    from analysis.groundtruth import load_cluster_config
    from analysis.scenario import build_reference_cluster

    d = shared_data / "llmservingsim"
    data = json.loads((d / "configs" / "cluster" / "single_node_single_instance.json").read_text())
    data["nodes"][0]["instances"][0]["block_size"] = 7
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"^nodes\[0\]\.instances\[0\]\.block_size=7 is not "
                       r"allowed; allowed: one of \[1, 8, 16, 32, 64, 128, 256\]"):
        build_reference_cluster(load_cluster_config(path), d / "profiles")


def test_moe_dp_ep_validation_beats_the_reference(shared_data: Path) -> None:
    d = shared_data / "llmservingsim"
    run = validate_mod.run_validation(
        d / "groundtruth" / "RTXPRO6000" / "Qwen3-30B-A3B-Instruct-2507",
        d / "workloads" / "sharegpt-qwen3-30b-a3b-300-sps10.jsonl",
        d / "profiles",
    )
    r = run.report
    assert r["instances"] == 2
    assert set(run.result.requests.instance) == {"instance0", "instance1"}
    # Reference simulator: 5.5 % mean, 21.8 % worst (docs/validation.md explains the rest).
    assert r["mean_abs_diff_pct"] < 5.5 and r["max_abs_diff_pct"] < 21.8, run.table_text


def test_dense_dp_group_is_independent_engines_unless_reference_dp(shared_data: Path) -> None:
    """vLLM runs non-MoE DP ranks as independent engines; the reference keeps them in
    lock-step. MoE DP groups stay grouped either way."""
    from analysis.scenario import load_reference_cluster

    d = shared_data / "llmservingsim"
    cfgs, profiles = d / "configs" / "cluster", d / "profiles"
    dense = load_reference_cluster(cfgs / "single_node_dp_instance.json", profiles)
    assert [i.dp_group for i in dense.instances] == [None, None]
    assert any("independent engines" in n for n in dense.notes)
    ref = load_reference_cluster(cfgs / "single_node_dp_instance.json", profiles, reference_dp=True)
    assert [i.dp_group for i in ref.instances] == ["A", "A"]
    moe = load_reference_cluster(cfgs / "single_node_moe_dp_ep_instance.json", profiles)
    assert {i.dp_group for i in moe.instances} == {"A"}


def _scenario_cli(shared: Path, config: str, out: Path, *extra: str) -> None:
    import subprocess
    import sys

    d = shared / "llmservingsim"
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "scenario", "--cluster-config",
         str(d / "configs" / "cluster" / f"{config}.json"), "--workload",
         str(d / "workloads" / "example_trace.jsonl"), "--profiles", str(d / "profiles"),
         "--num-reqs", "10", "--reference-clock", "--output", str(out), *extra],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr


def test_output_csv_is_llmservingsim_s_layout(shared_data: Path, tmp_path: Path) -> None:
    from analysis.bench_serve import read_result
    from analysis.run_scenario import LLMSERVINGSIM_COLUMNS

    d = shared_data / "llmservingsim" / "reference_outputs"
    out, bench = tmp_path / "sim.csv", tmp_path / "sim.json"
    _scenario_cli(shared_data, "single_node_single_instance", out, "--bench-json", str(bench))
    ours, ref = pd.read_csv(out), pd.read_csv(d / "example_single_run.csv")
    assert tuple(ours.columns) == LLMSERVINGSIM_COLUMNS == tuple(ref.columns)
    # With the reference's clock, one instance: the reference's own file, cell for cell.
    pd.testing.assert_frame_equal(ours, ref)
    assert len(read_result(bench).completed()) == 10
    # P/D: rows only from the decode instance (id 1), in its completion order.
    _scenario_cli(shared_data, "single_node_pd_instance", out)
    ours, ref = pd.read_csv(out), pd.read_csv(d / "example_pd_run.csv")
    assert tuple(ours.columns) == tuple(ref.columns)
    for col in ("instance id", "request id", "model", "input", "output", "arrival", "end_time",
                "latency"):
        assert (ours[col] == ref[col]).all(), col


def test_output_parquet_streamed_is_the_kept_table(shared_data: Path, tmp_path: Path) -> None:
    # P/D: requests hand over from the prefill to the decode instance before they finish.
    kept, streamed = tmp_path / "kept.parquet", tmp_path / "streamed.parquet"
    _scenario_cli(shared_data, "single_node_pd_instance", kept)
    _scenario_cli(shared_data, "single_node_pd_instance", streamed, "--stream")
    a, b = pd.read_parquet(kept), pd.read_parquet(streamed)
    assert list(a.columns) == list(b.columns) and len(a) == 10
    for col in a.columns:
        if col.endswith("token_times_ns"):
            assert all(list(x) == list(y) for x, y in zip(a[col], b[col], strict=True)), col
        else:
            assert a[col].equals(b[col]), col
