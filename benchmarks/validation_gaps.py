"""Per-request comparison of a ground-truth replay: where the remaining gaps come from.

    python benchmarks/validation_gaps.py [--truth-name Llama-3.1-8B | Qwen3-32B]

Prints the 15-metric table for several engine variants side by side (reference clock
semantics, vLLM's async scheduling, a constant per-step host overhead, and the default
exposed-overhead model) and, for the
default engine, the per-request TPOT ratio vLLM/sim binned by the mean number of running
requests during each request's decode, plus the E2E error by arrival order.
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
}


def _run(truth: Path, workload: Path, profiles: Path, cfg: EngineConfig):
    run = V.run_validation(truth, workload, profiles, base=cfg)
    return run, run.result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth-name", default="Llama-3.1-8B")
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
    cols = {}
    for label, cfg in variants.items():
        run, res = _run(truth, workload, profiles, cfg)
        cols[label] = {k: v["diff_pct"] for k, v in run.report["metrics"].items()}
        cols[label]["mean |diff|"] = run.report["mean_abs_diff_pct"]
        cols[label]["max |diff|"] = run.report["max_abs_diff_pct"]
    table = pd.DataFrame(cols)
    print("Diff% (sim - vLLM)/vLLM per variant")
    print(table.round(2).to_string())

    run, res = _run(truth, workload, profiles, base)
    gt = V.load_groundtruth(truth).requests
    df = res.requests
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
    x["bin"] = pd.cut(x.running, [0, 40, 60, 80, 100, 110, 120, 125, 129])
    print("\nTPOT vLLM/sim by mean running requests during the decode (default engine)")
    print(x.groupby("bin", observed=True).ratio.agg(["size", "mean"]).round(3).to_string())
    e2e = ((df.finish_ns - df.arrival_ns).to_numpy() - (gt.finish_ns - gt.arrival_ns).to_numpy()) / 1e6
    ttft = ((df.first_token_ns - df.arrival_ns).to_numpy() - (gt.first_token_ns - gt.arrival_ns).to_numpy()) / 1e6
    order = pd.DataFrame({"e2e_ms": e2e, "ttft_ms": ttft})
    order["requests"] = pd.cut(np.arange(len(order)), [-1, 29, 99, 199, 249, 299])
    print("\nmedian sim - vLLM by arrival order (ms)")
    print(order.groupby("requests", observed=True)[["ttft_ms", "e2e_ms"]].median().round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
