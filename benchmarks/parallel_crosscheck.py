"""Cross-check the communication-aware latency model (profiles.parallel) against the reference.

    python benchmarks/parallel_crosscheck.py [--data /path/to/shared/data] [--repeat 3]

Prints, side by side:

1. docs/reference-semantics.md §8: the TP=2 all-reduce sizes measured on the reference, vs ours.
2. Qwen3-32B TP=2 (``groundtruth/.../peer_sim/sim.csv``): every recoverable pure-decode
   iteration, reference time vs ours (compute + 128 all-reduces + host I/O).
3. Qwen3-30B-A3B DP=2 x EP=2: one-request iterations, reference vs the lock-step member time.
4. ``reference_outputs/example_*_run.csv``: request 0 alone (10-token prompt) in every TP / PP /
   EP / DP / P/D scenario: its TTFT (the prefill step) and first ITL (one decode step) vs ours;
   and the whole P/D scenario through ``engine.simulate_cluster`` with the KV hand-off.
5. The Qwen3-32B vLLM validation, default engine and reference clock, and whether the reference
   clock reproduces the reference simulator's output token for token; plus, as a sensitivity
   only, the default engine with the links' latency at 15 us instead of the config's 20 us.
6. Engine CPU time per step: TP1 Llama (ProfiledLatencyModel) vs this model at TP1, TP2 and in
   a DP2 x EP2 group.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import latency_crosscheck as xc  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import analysis.validate as V  # noqa: E402
from analysis.groundtruth import load_cluster_config  # noqa: E402
from engine import simulate  # noqa: E402
from engine.batch import BatchShape  # noqa: E402
from engine.deployment import InstanceSpec  # noqa: E402
from engine.memory import kv_capacity  # noqa: E402
from engine.simulate import simulate_cluster  # noqa: E402
from engine.specs import EngineConfig, ModelSpec  # noqa: E402
from profiles.architecture import load_architecture  # noqa: E402
from profiles.bundle import load_bundle  # noqa: E402
from profiles.catalog import load_hardware, model_from_hf_config  # noqa: E402
from profiles.latency import ProfiledLatencyModel  # noqa: E402
from profiles.parallel.dp_pad import pad_dp_group  # noqa: E402
from profiles.parallel.latency import ParallelLatencyModel, latency_for_instance  # noqa: E402
from profiles.parallel.layout import ParallelLayout, build_network, layout_for_instance  # noqa: E402
from profiles.parallel.pd_transfer import ClusterKvTransfer, pd_handoff  # noqa: E402
from workloads import read_jsonl  # noqa: E402

HW = "RTXPRO6000"
GT = Path("llmservingsim") / "groundtruth" / HW
# docs/reference-semantics.md §8: measured TP=2 all-reduce per size (bytes -> ns, averaged over
# 128 / step)
AR_FIT = {10_240: 40_635.0, 14_755_840: 912_789.3, 20_971_520: 1_280_427.5}
# docs/reference-semantics.md §8: DP=2 x EP=2 (Qwen3-30B-A3B, topology [1, 2]): measured per MoE
# layer (48 per step) for a wave of T tokens: the AG + RS pair plus, spread over the layers, what
# else the step paid beyond compute: the idle member's 1 ms re-poll (T = 1), host I/O
# 2*floor(4T/256) (T = 2048).
DP_EP_FIT = {1: (61_248.3, 1_000_000), 2048: (551_458.3, 64)}
# scenario key (reference_outputs/example_<key>_run.csv) -> cluster config
SCENARIOS = {
    "single": "single_node_single_instance",
    "multi": "single_node_multi_instance",
    "pd": "single_node_pd_instance",
    "moe": "single_node_moe_single_instance",
    "pp": "single_node_pp_instance",
    "tp_pp": "single_node_tp_pp_instance",
    "moe_pp": "single_node_moe_pp_instance",
    "dp": "single_node_dp_instance",
    "moe_dp_tp": "single_node_moe_dp_tp_instance",
    "moe_dp_pp": "single_node_moe_dp_pp_instance",
    "moe_dp_tp_pp": "single_node_moe_dp_tp_pp_instance",
    "dual_moe_dp_ep": "dual_node_moe_dp_ep_intra_inter_instance",
}
PREFILL10 = BatchShape(10, 1, 10, 0, 0, 0, 0, 0)
DECODE10 = BatchShape(1, 1, 0, 0, 1, 10, 10, 10)


def lss(data: Path) -> Path:
    return data / "llmservingsim"


def model_spec(data: Path, name: str) -> ModelSpec:
    return model_from_hf_config(lss(data) / "configs" / "model" / f"{name}.json", name=name)


@dataclass(frozen=True)
class ScenarioRow:
    key: str
    layout: ParallelLayout
    ref_ttft: int
    ttft: int
    ref_itl0: int
    itl0: int


def scenario_rows(data: Path) -> list[ScenarioRow]:
    """Request 0 alone in each reference scenario: TTFT and first ITL, reference vs ours.

    DP groups: the idle member runs a dummy batch padded to the real one; request 0's token
    completes at its member's own finish time, the next round starts when the slowest member
    finishes (so the first ITL carries the previous round's slack).
    """
    rows = []
    csv.field_size_limit(1 << 30)
    for key, cfg in SCENARIOS.items():
        cluster = load_cluster_config(lss(data) / "configs" / "cluster" / f"{cfg}.json")
        inst = cluster.instances[0]
        spec = model_spec(data, inst.model_name)
        lay = layout_for_instance(inst, cluster.instances, spec)
        m = latency_for_instance(
            lss(data) / "profiles", spec, tp=lay.tp, pp=lay.pp, ep=lay.ep, dp=lay.dp,
            link_bw_gbs=cluster.link_bw, link_latency_ns=cluster.link_latency,
            hardware=inst.hardware, local_mem_bw_gbs=inst.npu_mem.mem_bw,
            host_mem_bw_gbs=cluster.nodes[0].cpu_mem.mem_bw,
        )
        if lay.dp > 1:
            r1 = m.dp_member_ns(pad_dp_group([PREFILL10, None] + [None] * (lay.dp - 2)))
            r2 = m.dp_member_ns(pad_dp_group([DECODE10, None] + [None] * (lay.dp - 2)))
            ttft, itl0 = r1[0], max(r1) - r1[0] + r2[0]
        else:
            ttft, itl0 = m.iteration_ns(PREFILL10), m.iteration_ns(DECODE10)
        if inst.pd_type == "prefill":
            handoff = pd_handoff(m, cluster.link_bw, cluster.link_latency, inst.npu_mem.mem_bw)
            ttft += handoff.pd_prefill_extra_ns(PREFILL10)
        path = lss(data) / "reference_outputs" / f"example_{key}_run.csv"
        with path.open(newline="") as fh:
            r0 = next(r for r in csv.DictReader(fh) if r["request id"] == "0")
        rows.append(ScenarioRow(key, lay, int(r0["TTFT"]), ttft, json.loads(r0["ITL"])[0], itl0))
    return rows


def pd_scenario_end(data: Path, streamed: bool = True) -> tuple[int, int]:
    """(reference, ours) last finish of the P/D scenario (``single_node_pd_instance``,
    example trace, 10 requests) with the reference clock and the KV hand-off priced here."""
    cluster = load_cluster_config(lss(data) / "configs" / "cluster" / "single_node_pd_instance.json")
    insts, handoffs = [], {}
    for k, inst in enumerate(cluster.instances):
        spec = model_spec(data, inst.model_name)
        lay = layout_for_instance(inst, cluster.instances, spec)
        hw = replace(load_hardware(inst.hardware), mem_gib=inst.npu_mem.mem_size)
        lat = latency_for_instance(
            lss(data) / "profiles", spec, tp=lay.tp, link_bw_gbs=cluster.link_bw,
            link_latency_ns=cluster.link_latency, hardware=hw,
            host_mem_bw_gbs=cluster.nodes[0].cpu_mem.mem_bw)
        if inst.pd_type == "prefill":
            handoffs[f"i{k}"] = pd_handoff(lat, cluster.link_bw, cluster.link_latency,
                                           hw.hbm_bw_gbs)
        cfg = EngineConfig(async_scheduling=False, step_overhead_us=0.0)
        insts.append(InstanceSpec(f"i{k}", spec, hw, cfg, lat, kv_capacity(spec, hw, cfg),
                                  role=inst.pd_type))
    workload = read_jsonl(lss(data) / "workloads" / "example_trace.jsonl", limit=10)
    res = simulate_cluster(insts, workload, router="round_robin",
                           kv_transfer_ns=ClusterKvTransfer(handoffs, streamed=streamed))
    with (lss(data) / "reference_outputs" / "example_pd_run.csv").open(newline="") as fh:
        ref = max(int(r["end_time"]) for r in csv.DictReader(fh))
    return ref, int(res.requests.finish_ns.max())


def dp_ep_pair_ns(tokens: int) -> int:
    """EP all-gather + reduce-scatter of one Qwen3-30B-A3B MoE layer in a DP2 x EP2 group."""
    spec = ModelSpec(name="Qwen3-30B-A3B", model_type="qwen3_moe", num_layers=48,
                     hidden_size=2048, num_attention_heads=32, num_kv_heads=4, head_dim=128,
                     intermediate_size=6144, vocab_size=151936, max_position_embeddings=262144,
                     num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768)
    lay = ParallelLayout(tp=1, ep=2, dp=2)

    class _NoCompute:  # only the collectives are priced
        arch = load_architecture(spec.model_type)

        def iteration_ns(self, shape: BatchShape) -> int:
            return 0

        def breakdown(self, shape: BatchShape) -> dict[str, int]:
            return {}

    m = ParallelLatencyModel(_NoCompute(), spec, lay, build_network(lay, 16, 20000, 1597))
    return m.ep_collectives_ns(tokens)


def qwen32b_model(data: Path) -> ParallelLatencyModel:
    return latency_for_instance(lss(data) / "profiles", model_spec(data, "Qwen/Qwen3-32B"), tp=2,
                                hardware=HW, local_mem_bw_gbs=1597)


def qwen32b_decode_residuals(data: Path) -> Counter:
    """(reference - ours) over every recoverable pure-decode iteration of the TP2 run."""
    m = qwen32b_model(data)
    reqs = xc.read_sim_csv(data / GT / "Qwen3-32B" / "peer_sim" / "sim.csv")
    return Counter(ref - m.iteration_ns(s) for s, ref in xc.decode_iterations(reqs))


def qwen30b_dp_ep_residuals(data: Path) -> Counter:
    """(reference - our member time) over the one-request iterations of the DP2 x EP2 run."""
    name = "Qwen/Qwen3-30B-A3B-Instruct-2507"
    m = latency_for_instance(lss(data) / "profiles", model_spec(data, name), tp=1, ep=2, dp=2,
                             hardware=HW, local_mem_bw_gbs=1597)
    reqs = xc.read_sim_csv(data / GT / "Qwen3-30B-A3B-Instruct-2507" / "peer_sim" / "sim.csv")
    return Counter(ref - m.dp_member_ns(pad_dp_group([s, None]))[0]
                   for s, ref in xc.decode_iterations(reqs, instances=2))


def run_validation(data: Path, cfg: EngineConfig, link_latency_ns: float | None = None,
                   frontend: str | None = None):
    """Qwen3-32B validation; returns (ValidationRun, SimulationResult).

    ``link_latency_ns`` replaces the cluster config's link latency (sensitivity only);
    ``frontend`` overrides the truth's front end (``none`` for the reference's clock).
    """
    real_load = V.load_groundtruth

    def load(path):
        gt = real_load(path)
        if link_latency_ns is None:
            return gt
        return replace(gt, cluster=replace(gt.cluster, link_latency=(link_latency_ns,)))

    V.load_groundtruth = load
    try:
        run = V.run_validation(data / GT / "Qwen3-32B",
                               lss(data) / "workloads" / "sharegpt-qwen3-32b-300-sps10.jsonl",
                               lss(data) / "profiles", base=cfg, frontend=frontend)
    finally:
        V.load_groundtruth = real_load
    return run, run.result


def token_mismatches(data: Path, requests: pd.DataFrame) -> tuple[int, int]:
    """(token intervals differing from the reference simulator's, total), plus TTFT/end."""
    ref = pd.read_csv(data / GT / "Qwen3-32B" / "peer_sim" / "sim.csv")
    ref = ref.sort_values("request id").reset_index(drop=True)
    bad = int(((requests.first_token_ns - requests.arrival_ns).to_numpy() != ref.TTFT).sum())
    bad += int((requests.finish_ns.to_numpy() != ref.end_time).sum())
    total = 2 * len(ref)
    for times, itl in zip(requests.token_times_ns, ref.ITL, strict=True):
        a, b = np.diff(times), np.asarray(json.loads(itl))
        total += len(b)
        bad += len(b) if len(a) != len(b) else int((a != b).sum())
    return bad, total


def _timed(fn, repeat: int) -> tuple[float, int]:
    walls, steps = [], 0
    for _ in range(repeat):
        t0 = time.process_time()  # CPU time: robust to other load on the machine
        res = fn()
        walls.append(time.process_time() - t0)
        steps = res.num_steps
    return statistics.median(walls), steps


def speed(data: Path, repeat: int) -> list[tuple[str, float, int]]:
    """(label, median CPU us per engine step, steps) of 300-request replays, default engine.

    A fresh latency model for every repeat (its memo is part of what is measured). The DP case
    counts one step per member and lock-step round.
    """
    out = []
    cfg = EngineConfig()
    hw = load_hardware(HW)
    cases = (("Llama-3.1-8B tp1 ProfiledLatencyModel", "meta-llama/Llama-3.1-8B", 1, False),
             ("Llama-3.1-8B tp1 ParallelLatencyModel", "meta-llama/Llama-3.1-8B", 1, True),
             ("Llama-3.1-8B tp2 ParallelLatencyModel", "meta-llama/Llama-3.1-8B", 2, True),
             ("Qwen3-32B tp2 ParallelLatencyModel", "Qwen/Qwen3-32B", 2, True))
    workloads = {"meta-llama/Llama-3.1-8B": "sharegpt-llama-3.1-8b-300-sps10.jsonl",
                 "Qwen/Qwen3-32B": "sharegpt-qwen3-32b-300-sps10.jsonl",
                 "Qwen/Qwen3-30B-A3B-Instruct-2507": "sharegpt-qwen3-30b-a3b-300-sps10.jsonl"}
    for label, name, tp, par in cases:
        spec = model_spec(data, name)
        bundle = load_bundle(lss(data) / "profiles", HW, name)
        workload = read_jsonl(lss(data) / "workloads" / workloads[name])

        def run(spec=spec, bundle=bundle, workload=workload, tp=tp, par=par):
            lat = (latency_for_instance(bundle, spec, tp=tp, hardware=hw) if par
                   else ProfiledLatencyModel(bundle, spec, tp))
            return simulate(spec, hw, replace(cfg, tensor_parallel_size=tp), workload, lat)

        run()  # warm-up (imports, allocator)
        wall, steps = _timed(run, repeat)
        out.append((label, wall / steps * 1e6, steps))

    name = "Qwen/Qwen3-30B-A3B-Instruct-2507"
    spec = model_spec(data, name)
    bundle = load_bundle(lss(data) / "profiles", HW, name)
    workload = read_jsonl(lss(data) / "workloads" / workloads[name])

    def run_dp():
        insts = [InstanceSpec(f"dp{k}", spec, hw, cfg,
                              latency_for_instance(bundle, spec, tp=1, ep=2, dp=2, hardware=hw),
                              kv_capacity(spec, hw, cfg), dp_group="A") for k in range(2)]
        return simulate_cluster(insts, workload, router="round_robin", dp_pad=pad_dp_group)

    wall, steps = _timed(run_dp, repeat)
    out.append(("Qwen3-30B-A3B dp2 x ep2 (2 members)", wall / steps * 1e6, steps))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path,
                    default=Path(os.environ.get("SERVESWEEP_DATA", REPO.parent / "shared" / "data")))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    data = args.data
    bad = 0

    print("== timing model 3.6: TP=2 all-reduce (16 GB/s, 20 us, local 1597 GB/s) ==")
    net = build_network(ParallelLayout(tp=2), 16, 20000, 1597)
    for size, meas in AR_FIT.items():
        ours = net.collective_ns("all-reduce", size, 2)
        bad += abs(ours - meas) > 1
        print(f"   {size:>11,d} B   reference {meas:>13,.1f} ns   ours {ours:>11,d} ns")

    print("\n== timing model 3.6: DP2 x EP2 AG + RS per MoE layer (Qwen3-30B-A3B, [1, 2]) ==")
    for T, (meas, other) in DP_EP_FIT.items():
        ours = dp_ep_pair_ns(T)
        bad += abs(ours + other / 48 - meas) > 0.5
        print(f"   T = {T:5d}: reference {meas:>11,.1f} ns   ours {ours:>9,d} + {other:,} / 48 ns "
              f"= {ours + other / 48:,.1f}")

    print("\n== Qwen3-32B TP2 pure-decode iterations (peer_sim/sim.csv) ==")
    res = qwen32b_decode_residuals(data)
    n = sum(res.values())
    print(f"   {n} iterations, exact {res.get(0, 0)}; residuals {dict(res)}")
    bad += n - res.get(0, 0)

    print("\n== Qwen3-30B-A3B DP2 x EP2 one-request iterations (member time) ==")
    res = qwen30b_dp_ep_residuals(data)
    print(f"   {sum(res.values())} iterations: reference - ours {dict(res)}")
    print("   (+1,000,000 ns: the reference re-polls the idle member 1 ms later before its dummy)")

    print("\n== reference_outputs: request 0 alone (10-token prompt) ==")
    print(f"   {'scenario':16s}{'layout':>22s}{'TTFT ref':>14s}{'ours':>14s}{'diff':>8s}"
          f"{'ITL0 ref':>14s}{'ours':>14s}{'diff':>8s}")
    for r in scenario_rows(data):
        lay = r.layout
        desc = f"tp{lay.tp} pp{lay.pp} ep{lay.ep} dp{lay.dp}"
        print(f"   {r.key:16s}{desc:>22s}{r.ref_ttft:>14,d}{r.ttft:>14,d}{r.ref_ttft - r.ttft:>8,d}"
              f"{r.ref_itl0:>14,d}{r.itl0:>14,d}{r.ref_itl0 - r.itl0:>8,d}")
        bad += abs(r.ref_ttft - r.ttft) > 1e-3 * r.ref_ttft or abs(r.ref_itl0 - r.itl0) > 1e-3 * r.ref_itl0

    print("\n== P/D scenario (single_node_pd_instance), last finish, reference clock ==")
    for streamed in (True, False):
        ref, ours = pd_scenario_end(data, streamed)
        how = "streamed per layer (reference)" if streamed else "whole KV after prefill (vLLM)"
        print(f"   {how:34s} reference {ref:,}  ours {ours:,}  diff {ours - ref:+,} ns")
        bad += streamed and ours != ref

    print("\n== Qwen3-32B TP2 vs vLLM (Diff% = (sim - vLLM)/vLLM) ==")
    variants = {"default engine": EngineConfig(),
                "reference clock": EngineConfig(async_scheduling=False, step_overhead_us=0.0)}
    cols = {}
    for label, cfg in variants.items():
        run, result = run_validation(data, cfg,
                                     frontend="none" if label == "reference clock" else None)
        cols[label] = {k: v["diff_pct"] for k, v in run.report["metrics"].items()}
        cols[label]["mean |diff|"] = run.report["mean_abs_diff_pct"]
        cols[label]["max |diff|"] = run.report["max_abs_diff_pct"]
        if label == "reference clock":
            mis, tot = token_mismatches(data, result.requests)
            bad += mis
    cols["LLMServingSim"] = {"ttft_ms_mean": 1.3, "tpot_ms_mean": 0.8, "e2el_ms_mean": 1.0,
                             "mean |diff|": 1.0, "max |diff|": 1.7}
    run, _ = run_validation(data, EngineConfig(), link_latency_ns=15000.0)
    cols["default, 15 us links (sensitivity)"] = {
        **{k: v["diff_pct"] for k, v in run.report["metrics"].items()},
        "mean |diff|": run.report["mean_abs_diff_pct"], "max |diff|": run.report["max_abs_diff_pct"]}
    print(pd.DataFrame(cols).round(2).to_string())
    print(f"   reference clock vs the reference simulator: {mis} of {tot} TTFT/end/ITL values differ")

    print("\n== engine speed, default engine, 300-request replays ==")
    rows = speed(data, args.repeat)
    base = rows[0][1]
    for label, us, steps in rows:
        print(f"   {label:40s} {us:8.1f} CPU us/step  ({steps} steps)  x{us / base:.2f} of TP1")
    bad += any(us > 2 * base for _, us, _ in rows)
    print("\nMISMATCHES:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
