"""Scan of the exposed host-overhead model over the three vLLM ground-truth runs.

The engine adds ``c * max(0, 1 - t/h)`` to a step whose priced GPU time is ``t``
(``EngineConfig.step_overhead_us`` = c, ``step_overhead_hidden_ms`` = h). This prints, for a
grid of (c, h), the mean / max |Diff%| over the 15 validation metrics of each run (both sides
timed from the engine's pickup, as ``python -m analysis validate``), plus what the setting adds
to an 11 ms single-request step, so the choice of the default can be checked in one run.

    python benchmarks/overhead_scan.py [--c-ms 0.5 1 1.5 2 2.5] [--h-ms 30 35 40 45 50 60]

Needs the shared reference data (``$SERVESWEEP_DATA`` or ``../shared/data``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import sys
from pathlib import Path

from analysis.validate import run_validation
from engine.specs import EngineConfig

REPO = Path(__file__).resolve().parents[1]
RUNS = (
    ("Llama-3.1-8B", "sharegpt-llama-3.1-8b-300-sps10.jsonl"),
    ("Qwen3-32B", "sharegpt-qwen3-32b-300-sps10.jsonl"),
    ("Qwen3-30B-A3B-Instruct-2507", "sharegpt-qwen3-30b-a3b-300-sps10.jsonl"),
)
SINGLE_STEP_MS = 11.0  # a one-request Llama-3.1-8B decode step on the RTX PRO 6000 bundle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--c-ms", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0, 2.5])
    ap.add_argument("--h-ms", type=float, nargs="+", default=[30, 35, 40, 45, 50, 60])
    args = ap.parse_args()
    data = Path(os.environ.get("SERVESWEEP_DATA", REPO.parent / "shared" / "data")) / "llmservingsim"
    if not data.is_dir():
        print(f"reference data not found at {data}; set SERVESWEEP_DATA", file=sys.stderr)
        return 2
    default = EngineConfig()
    head = "".join(f"{name[:14]:>16}" for name, _ in RUNS)
    print(f"{'c ms':>6}{'h ms':>6}{head}{'worst mean':>12}{'+% 11 ms step':>15}")
    for c, h in itertools.product(args.c_ms, args.h_ms):
        cfg = EngineConfig(step_overhead_us=c * 1000, step_overhead_hidden_ms=h)
        cells, means = [], []
        for name, workload in RUNS:
            with contextlib.redirect_stdout(io.StringIO()):
                r = run_validation(data / "groundtruth" / "RTXPRO6000" / name,
                                   data / "workloads" / workload, data / "profiles", base=cfg).report
            cells.append(f"{r['mean_abs_diff_pct']:.2f} / {r['max_abs_diff_pct']:.1f}")
            means.append(r["mean_abs_diff_pct"])
        added = c * max(0.0, 1 - SINGLE_STEP_MS / h) / SINGLE_STEP_MS * 100
        mark = "  <- default" if (c * 1000, h) == (default.step_overhead_us,
                                                   default.step_overhead_hidden_ms) else ""
        print(f"{c:>6.1f}{h:>6.0f}" + "".join(f"{x:>16}" for x in cells)
              + f"{max(means):>12.2f}{added:>15.1f}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
