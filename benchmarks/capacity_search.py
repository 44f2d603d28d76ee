"""How many probes does the capacity search need, and how long does a study take?

    python benchmarks/capacity_search.py            # probe counts (a few seconds)
    python benchmarks/capacity_search.py --study    # + the shipped study from an empty cache

Probe counts (saturation probe included) per tolerance over 300 random configurations whose
SLO margin has an M/M/1 shape (``margin = log((1 - knee) / (1 - rate / capacity))``,
capacity 0.3-100 req/s, knee at 5-99 % of it) and over the same configurations when the
search only sees pass/fail (a step margin). Every answer is checked to be within tolerance
of the true knee. ``--study`` runs ``python -m sweep.capacity +experiment=capacity_search`` in
a temporary directory with an empty probe and bundle cache and prints its summary line and
wall time.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from capacity.search import RateSearch, SearchSettings

REPO = Path(__file__).resolve().parents[1]


def count(tolerance: float, shape: str, n: int = 300, seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    counts = []
    for _ in range(n):
        capacity, knee = 10 ** rng.uniform(-0.5, 2), rng.uniform(0.05, 0.99)
        target = knee * capacity

        def margin(rate: float, capacity: float = capacity, knee: float = knee,
                   target: float = target) -> float:
            if shape == "step":
                return -0.1 if rate <= target else 0.5
            if rate >= capacity:
                return math.log(1e3)
            return math.log(max((1 - knee) / (1 - rate / capacity), 1e-3))

        search = RateSearch(SearchSettings(tolerance=tolerance))
        while (step := search.next_rate()) is not None:
            rate, kind = step
            m = margin(rate)
            search.record(rate, m <= 0, m, capacity if kind == "saturation" else math.nan)
        res = search.result
        assert res is not None and res.status == "converged", res
        assert target / (1 + tolerance) <= res.max_rate * (1 + 1e-9) <= target * (1 + 1e-9)
        counts.append(res.probes)
    return counts


def study() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
        env.update(SERVESWEEP_CACHE=str(Path(tmp) / "cache"), PYTHONPATH=str(REPO))
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "sweep.capacity", "+experiment=capacity_search"],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=1200)
        wall = time.perf_counter() - t0
        if done.returncode:
            sys.exit(done.stderr[-3000:])
        line = next(x for x in done.stdout.splitlines() if " probes (" in x)
        print(f"shipped study from an empty cache: {wall:.1f} s wall\n  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", action="store_true", help="also run the shipped study")
    args = parser.parse_args()
    print(f"{'tolerance':>9} {'margin':>8} {'mean':>6} {'p90':>5} {'max':>5}")
    for tol in (0.05, 0.02, 0.01):
        for shape in ("mm1", "step"):
            c = count(tol, shape)
            print(f"{100 * tol:>8g}% {shape:>8} {np.mean(c):>6.2f} {np.percentile(c, 90):>5.0f} "
                  f"{max(c):>5d}")
    if args.study:
        study()


if __name__ == "__main__":
    main()
