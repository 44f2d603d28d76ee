"""profiles.parallel against the reference simulator's own numbers and the Qwen3-32B vLLM run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.specs import EngineConfig

pytestmark = pytest.mark.groundtruth

_SPEC = importlib.util.spec_from_file_location(
    "parallel_crosscheck",
    Path(__file__).resolve().parents[2] / "benchmarks" / "parallel_crosscheck.py",
)
pc = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("parallel_crosscheck", pc)
_SPEC.loader.exec_module(pc)


def test_tp2_allreduce_matches_timing_model_fits() -> None:
    net = pc.build_network(pc.ParallelLayout(tp=2), 16, 20000, 1597)
    for size, measured in pc.AR_FIT.items():
        assert abs(net.collective_ns("all-reduce", size, 2) - measured) <= 1


def test_dp_ep_collectives_match_timing_model_fits() -> None:
    for tokens, (measured, other) in pc.DP_EP_FIT.items():
        assert abs(pc.dp_ep_pair_ns(tokens) + other / 48 - measured) <= 0.5


def test_qwen32b_tp2_every_decode_iteration_exact(shared_data: Path) -> None:
    res = pc.qwen32b_decode_residuals(shared_data)
    assert sum(res.values()) > 900
    assert set(res) == {0}


def test_qwen30b_dp_ep_member_time_exact_up_to_idle_poll(shared_data: Path) -> None:
    res = pc.qwen30b_dp_ep_residuals(shared_data)
    # the reference's idle DP member is re-polled 1 ms later (its clock), else exact
    assert res[0] + res[1_000_000] >= sum(res.values()) - 1
    assert res[0] >= 20 and res[1_000_000] >= 100


def test_reference_scenarios_request0_steps(shared_data: Path) -> None:
    rows = {r.key: r for r in pc.scenario_rows(shared_data)}
    assert len(rows) == len(pc.SCENARIOS)
    exact = set(pc.SCENARIOS) - {"moe_dp_tp_pp", "dual_moe_dp_ep"}
    for key in exact:
        r = rows[key]
        assert (r.ttft, r.itl0) == (r.ref_ttft, r.ref_itl0), key
    for key in ("moe_dp_tp_pp", "dual_moe_dp_ep"):  # DP member skew inside collectives
        r = rows[key]
        assert abs(r.ttft - r.ref_ttft) <= 1e-3 * r.ref_ttft
        assert abs(r.itl0 - r.ref_itl0) <= 1e-3 * r.ref_itl0


def test_pd_scenario_total_exact_with_streamed_hand_off(shared_data: Path) -> None:
    ref, ours = pc.pd_scenario_end(shared_data, streamed=True)
    assert ours == ref == 1_661_784_496
    ref, whole = pc.pd_scenario_end(shared_data, streamed=False)
    assert whole > ours  # the whole KV after the prefill is slower than streaming it


def test_qwen32b_reference_clock_reproduces_reference_simulator_token_for_token(
    shared_data: Path,
) -> None:
    """Synchronous steps without host overhead: every TTFT, end time and inter-token
    interval of the 300 requests equals LLMServingSim's peer_sim/sim.csv to the nanosecond."""
    run, result = pc.run_validation(shared_data,
                                    EngineConfig(async_scheduling=False, step_overhead_us=0.0),
                                    frontend="none")
    ours = result.requests
    ref = pd.read_csv(shared_data / pc.GT / "Qwen3-32B" / "peer_sim" / "sim.csv")
    ref = ref.sort_values("request id").reset_index(drop=True)
    np.testing.assert_array_equal((ours.first_token_ns - ours.arrival_ns).to_numpy(), ref.TTFT)
    np.testing.assert_array_equal(ours.finish_ns.to_numpy(), ref.end_time)
    for times, itl in zip(ours.token_times_ns, ref.ITL, strict=True):
        np.testing.assert_array_equal(np.diff(times), json.loads(itl))
    # the reference's own score on this run: 1.0 % mean, 1.7 % worst
    assert run.report["mean_abs_diff_pct"] <= 1.1
    assert run.report["max_abs_diff_pct"] <= 1.8


def test_qwen32b_validate_cli_default_engine(shared_data: Path, tmp_path: Path) -> None:
    d = shared_data / "llmservingsim"
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "analysis", "validate", "--truth",
         str(d / "groundtruth" / "RTXPRO6000" / "Qwen3-32B"), "--workload",
         str(d / "workloads" / "sharegpt-qwen3-32b-300-sps10.jsonl"), "--profiles",
         str(d / "profiles"), "--json", str(out)],
        capture_output=True, text=True, check=True,
    )
    assert "tp2" in proc.stdout
    r = json.loads(out.read_text())
    assert r["engine_config"]["tensor_parallel_size"] == 2
    assert r["prefix_hit_tokens"] == 20448  # the reference simulator's count
    assert r["kv_cache"]["num_blocks"] == 28150  # vLLM 0.19's budget (engine.kv_budget)
    # measured 0.98 / 1.45 (issue 4 target: mean <= 1.0)
    assert r["mean_abs_diff_pct"] <= 1.0
    assert r["max_abs_diff_pct"] <= 2.0


def test_qwen30b_dp2_ep2_validate_within_targets(shared_data: Path) -> None:
    """The MoE DP2 x EP2 run: vLLM's DP rounds (padding only for CUDA-graph batches, experts
    on the all-gathered tokens) and TTFT from the engine's pickup, as vLLM's ``queued_ts``."""
    import analysis.validate as V

    d = shared_data / "llmservingsim"
    run = V.run_validation(d / "groundtruth" / "RTXPRO6000" / "Qwen3-30B-A3B-Instruct-2507",
                           d / "workloads" / "sharegpt-qwen3-30b-a3b-300-sps10.jsonl",
                           d / "profiles")
    r = run.report
    # measured 2.19 / 7.88 (issue 4 targets: mean <= 3.0, no metric beyond +-10 %)
    assert r["mean_abs_diff_pct"] <= 3.0, run.table_text
    assert r["max_abs_diff_pct"] <= 10.0, run.table_text
    assert r["kv_cache"]["num_blocks"] == 37944  # vLLM 0.19's budget (engine.kv_budget)
