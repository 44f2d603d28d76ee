"""Receive lag, measured against modelled: how long after the client sent a request the engine
core took it up, on the shared RTX PRO 6000 ground-truth runs.

The truth records the client's send (``arrival_time``, wall clock) and the engine's pickup
(``queued_ts``, monotonic clock) on two clocks with an unknown offset, so the lag is compared
relative to request 0, on both sides: ``lag_i = (pickup_i - pickup_0) - (send_i - send_0)``.
The simulated side is ``validate``'s replay (the front end it models for these runs, the
engine's step-boundary pickup). Run::

    python benchmarks/receive_lag.py [--data ../shared/data] [--markdown]

Prints, per run, the percentiles of the measured and the simulated lag (ms) and the median
per-request difference.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from analysis.validate import run_validation

RUNS = {
    "Llama-3.1-8B": "sharegpt-llama-3.1-8b-300-sps10.jsonl",
    "Qwen3-32B": "sharegpt-qwen3-32b-300-sps10.jsonl",
    "Qwen3-30B-A3B-Instruct-2507": "sharegpt-qwen3-30b-a3b-300-sps10.jsonl",
}
PCTS = (10, 50, 90, 99, 100)


def measured_lag_ms(truth: Path) -> np.ndarray:
    """Per request (file order), the measured lag relative to request 0 (ms)."""
    rows = [json.loads(line) for line in (truth / "vllm" / "requests.jsonl").open()]
    send = np.array([r["arrival_time"] for r in rows], dtype=np.float64)
    picked = np.array([r["queued_ts"] for r in rows], dtype=np.float64)
    return ((picked - picked[0]) - (send - send[0])) * 1e3


def simulated_lag_ms(truth: Path, workload: Path, profiles: Path) -> np.ndarray:
    """Per request (workload order), the simulated lag relative to request 0 (ms)."""
    df = run_validation(truth, workload, profiles).result.requests
    picked = df["queued_ns"].to_numpy(np.float64)
    send = df["send_ns"].to_numpy(np.float64)
    return ((picked - picked[0]) - (send - send[0])) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("SERVESWEEP_DATA", "../shared/data"))
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args()
    root = Path(args.data) / "llmservingsim"
    head = " | ".join(f"p{q}" if q < 100 else "max" for q in PCTS)
    if args.markdown:
        print(f"| run | side | {head} | median per-request diff |")
        print("|---|---|" + "---:|" * (len(PCTS) + 1))
    for name, wl in RUNS.items():
        truth = root / "groundtruth" / "RTXPRO6000" / name
        real = measured_lag_ms(truth)
        sim = simulated_lag_ms(truth, root / "workloads" / wl, root / "profiles")
        n = min(len(real), len(sim))
        diff = float(np.median(sim[:n] - real[:n]))
        for side, lag in (("measured", real), ("simulated", sim)):
            vals = " | ".join(f"{v:.1f}" for v in np.percentile(lag, PCTS))
            tail = f"{diff:+.1f}" if side == "simulated" else ""
            if args.markdown:
                print(f"| {name} | {side} | {vals} | {tail} |")
            else:
                print(f"{name:30s} {side:9s} {vals}  {tail}")


if __name__ == "__main__":
    main()
