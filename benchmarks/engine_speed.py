"""Engine speed on the 300-request RTX PRO 6000 / Llama-3.1-8B replay.

Prints, measured side by side in one run, the wall time of the simulation (loaded workload
to finished per-request results, excluding interpreter start-up and imports) and the ratio
simulated-seconds per wall-second, for the default engine and a few variants.

    python benchmarks/engine_speed.py [--repeat 5]

Needs the shared reference data (``$SERVESWEEP_DATA`` or ``../shared/data``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from analysis.metrics import compute_metrics
from engine import EngineConfig, simulate
from profiles.bundle import load_bundle
from profiles.catalog import load_hardware, load_model
from profiles.latency import ProfiledLatencyModel
from workloads import read_jsonl

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    data = Path(os.environ.get("SERVESWEEP_DATA", REPO.parent / "shared" / "data"))
    d = data / "llmservingsim"
    if not d.is_dir():
        print(f"reference data not found at {data}; set SERVESWEEP_DATA", file=sys.stderr)
        return 2
    model = load_model("meta-llama/Llama-3.1-8B")
    hw = load_hardware("RTXPRO6000")
    bundle = load_bundle(d / "profiles", "RTXPRO6000", model.name)
    workload = read_jsonl(d / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl")
    base = EngineConfig()
    variants = {
        "default (async, prefix caching)": base,
        "sync scheduling": replace(base, async_scheduling=False),
        "no prefix caching": replace(base, enable_prefix_caching=False),
        "tight KV (2588 blocks)": replace(base, num_gpu_blocks_override=2588),
    }
    print(f"{'variant':<34}{'wall s (median)':>16}{'sim s':>10}{'sim-s/wall-s':>14}"
          f"{'steps':>8}{'us/step':>9}{'preempt':>9}")
    for label, cfg in variants.items():
        walls = []
        for i in range(args.repeat):
            # A fresh latency model each time: the memo is part of what is measured.
            latency = ProfiledLatencyModel(bundle, model, 1)
            t0 = time.perf_counter()
            res = simulate(model, hw, cfg, workload, latency)
            compute_metrics(res.requests)
            walls.append(time.perf_counter() - t0)
            del i
        w = statistics.median(walls)
        sim_s = res.makespan_ns / 1e9
        print(f"{label:<34}{w:>16.3f}{sim_s:>10.1f}{sim_s / w:>14.0f}{res.num_steps:>8}"
              f"{w / res.num_steps * 1e6:>9.0f}{res.num_preemptions:>9}")
    print("\nreference simulator (LLMServingSim + ASTRA-Sim) on this replay: about 180 s of wall "
          "time on this machine kind (issue 2), i.e. ~0.36 sim-s/wall-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
