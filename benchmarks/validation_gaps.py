"""Per-request comparison of a ground-truth replay: where the remaining gaps come from.

    python benchmarks/validation_gaps.py [--truth-name Llama-3.1-8B | Qwen3-32B |
                                          Qwen3-30B-A3B-Instruct-2507]

Prints the 15-metric table for several engine variants side by side (reference clock
semantics, vLLM's async scheduling, a constant per-step host overhead, the default
exposed-overhead model and, for a DP run, the default engine with the reference's DP rounds)
and, for the default engine, per request (both sides timed from the engine's pickup,
``queued_ns`` / ``queued_ts``): the TPOT ratio vLLM/sim binned by the mean number of running
requests during each request's decode, the TTFT of low-load and queued requests, and the
TTFT/E2E error by arrival order.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

import analysis.validate as V
from engine import EngineConfig

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "Llama-3.1-8B": "sharegpt-llama-3.1-8b-300-sps10.jsonl",
    "Qwen3-32B": "sharegpt-qwen3-32b-300-sps10.jsonl",
    "Qwen3-30B-A3B-Instruct-2507": "sharegpt-qwen3-30b-a3b-300-sps10.jsonl",
}
LOW_LOAD_MS = 500.0  # a request whose vLLM TTFT is below this did not queue for a seat


def _run(truth: Path, workload: Path, profiles: Path, cfg: EngineConfig, reference_dp=False):
    run = V.run_validation(truth, workload, profiles, base=cfg, reference_dp=reference_dp)
    return run, run.result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth-name", default="Llama-3.1-8B", choices=sorted(WORKLOADS))
    args = ap.parse_args()
    data = Path(os.environ.get("SERVESWEEP_DATA", REPO.parent / "shared" / "data")) / "llmservingsim"
    truth = data / "groundtruth" / "RTXPRO6000" / args.truth_name
    workload = data / "workloads" / WORKLOADS[args.truth_name]
    profiles = data / "profiles"
    base = EngineConfig()
    variants = {
        "reference clock (sync, no overhead)": replace(base, async_scheduling=False, step_overhead_us=0),
        "async, no overhead": replace(base, step_overhead_us=0),
        "async, constant 550 us/step": replace(base, step_overhead_us=550, step_overhead_hidden_ms=0),
        "default (async, exposed overhead)": base,
    }
    runs = {label: (cfg, False) for label, cfg in variants.items()}
    if V.recorded_engine(V.load_groundtruth(truth)).data_parallel_size > 1:
        runs["default, reference DP rounds"] = (base, True)
    cols = {}
    for label, (cfg, ref_dp) in runs.items():
        run, res = _run(truth, workload, profiles, cfg, ref_dp)
        cols[label] = {k: v["diff_pct"] for k, v in run.report["metrics"].items()}
        cols[label]["mean |diff|"] = run.report["mean_abs_diff_pct"]
        cols[label]["max |diff|"] = run.report["max_abs_diff_pct"]
    table = pd.DataFrame(cols)
    print("Diff% (sim - vLLM)/vLLM per variant")
    print(table.round(2).to_string())

    run, res = _run(truth, workload, profiles, base)
    gt = V.load_groundtruth(truth).requests.sort_values("request_index").reset_index(drop=True)
    df = res.requests.reset_index(drop=True)
    s_tpot = (df.finish_ns - df.first_token_ns) / (df.output_len - 1)
    v_tpot = (gt.finish_ns - gt.first_token_ns) / (gt.output_len - 1)
    ts = res.timeseries
    t0 = int(df.arrival_ns.iloc[0])
    running = ts.running.to_numpy()
    mean_running = []
    for a, b in zip(df.first_token_ns, df.finish_ns, strict=True):
        i, j = int((a - t0) // 1e9), int((b - t0) // 1e9) + 1
        mean_running.append(running[i:j].mean())
    x = pd.DataFrame({"ratio": (v_tpot / s_tpot).to_numpy(), "running": mean_running})
    top = float(running.max())
    edges = sorted({0.0, *np.round(np.linspace(0, top, 8)[1:]).tolist(), top + 1})
    x["bin"] = pd.cut(x.running, edges)
    print("\nTPOT vLLM/sim by mean running requests during the decode (default engine)")
    print(x.groupby("bin", observed=True).ratio.agg(["size", "mean"]).round(3).to_string())
    s_ttft = (df.first_token_ns - df.queued_ns).to_numpy() / 1e6
    v_ttft = (gt.first_token_ns - gt.arrival_ns).to_numpy() / 1e6
    low = v_ttft < LOW_LOAD_MS
    print(f"\nTTFT, default engine: {int(low.sum())} low-load requests (vLLM TTFT < "
          f"{LOW_LOAD_MS:.0f} ms): median sim - vLLM {np.median(s_ttft[low] - v_ttft[low]):+.1f} ms; "
          f"{int((~low).sum())} queued: median sim/vLLM "
          + (f"{np.median(s_ttft[~low] / v_ttft[~low]):.3f}" if (~low).any() else "n/a")
          + f"; TPOT sim/vLLM per-request median {np.median(s_tpot / v_tpot):.3f}")
    e2e = ((df.finish_ns - df.queued_ns).to_numpy() - (gt.finish_ns - gt.arrival_ns).to_numpy()) / 1e6
    order = pd.DataFrame({"e2e_ms": e2e, "ttft_ms": s_ttft - v_ttft})
    order["requests"] = pd.cut(np.arange(len(order)), [-1, 29, 99, 199, 249, len(order) - 1])
    print("\nmedian sim - vLLM by arrival order (ms)")
    print(order.groupby("requests", observed=True)[["ttft_ms", "e2e_ms"]].median().round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
