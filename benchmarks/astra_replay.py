"""Replay the ASTRA-Sim golden table against the analytical model and time memoised look-ups.

Usage: ``python benchmarks/astra_replay.py [--data PATH_TO/astra-sim]`` (default: the
``astra-sim`` folder under ``$SERVESWEEP_DATA`` or ``../shared/data``).

Prints, for completed runs, how many the model reproduces exactly / within 0.1 % / not, the
max relative error, how many aborted runs it rejects, then the cost of a cold (first) and a
memoised (repeated) ``NetworkModel.collective_ns`` call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

from astra_bridge import NetworkModel, SystemConfig, Topology
from astra_bridge.collectives import p2p_ns, time_on
from astra_bridge.golden import replay_all


def default_data_dir() -> Path:
    root = Path(__file__).resolve().parents[1]
    return Path(os.environ.get("SERVESWEEP_DATA", root.parent / "shared" / "data")) / "astra-sim"


def replay(data: Path) -> int:
    """Print fidelity counts; return the number of failures (mismatches + unrejected aborts)."""
    t0 = time.perf_counter()
    results = list(replay_all(data))
    elapsed = time.perf_counter() - t0
    counts: Counter[str] = Counter()
    max_rel = 0.0
    for r in results:
        row = r.row
        if row.status == "ok":
            assert row.time_ns is not None
            if r.ns is None:
                counts["completed rejected"] += 1
                continue
            rel = abs(r.ns - row.time_ns) / max(row.time_ns, 1)
            max_rel = max(max_rel, rel)
            if r.ns == row.time_ns:
                counts["completed exact"] += 1
            elif rel <= 1e-3:
                counts["completed within 0.1%"] += 1
            else:
                counts["completed mismatched"] += 1
            counts["min time exact" if r.min_ns == row.time_min_ns else "min time differs"] += 1
        else:
            counts["aborted rejected" if r.error else "aborted accepted"] += 1
    print(f"replayed {len(results)} rows in {elapsed:.3f} s (cold, incl. CSV and config parsing)")
    for key in (
        "completed exact",
        "completed within 0.1%",
        "completed mismatched",
        "completed rejected",
        "min time exact",
        "min time differs",
        "aborted rejected",
        "aborted accepted",
    ):
        print(f"  {key:24s} {counts[key]:6d}")
    print(f"  max relative error       {max_rel:.3g}")
    return (
        counts["completed mismatched"] + counts["completed rejected"] + counts["aborted accepted"]
    )


def lookup_speed(repeats: int = 200_000) -> None:
    """Cold vs memoised cost of the engine-facing call."""
    nm = NetworkModel(
        Topology.from_lists(["FullyConnected", "Switch"], [8, 4], [900, 50], [100, 5000]),
        SystemConfig(local_mem_bw_gbps=3350, dataset_splits=4, active_chunks=2),
    )
    time_on.cache_clear()
    cold_sizes = [5120 * (i + 1) for i in range(2000)]  # 2,000 distinct shapes: all misses
    t0 = time.perf_counter()
    for s in cold_sizes:
        nm.collective_ns("all-reduce", s)
    cold = (time.perf_counter() - t0) / len(cold_sizes)
    sizes = cold_sizes[:12]
    t0 = time.perf_counter()
    for i in range(repeats):
        nm.collective_ns("all-reduce", sizes[i % len(sizes)])
    warm = (time.perf_counter() - t0) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        p2p_ns(1 << 20, 0, 9, nm.topology)
    p2p = (time.perf_counter() - t0) / repeats
    print(f"collective_ns cold (2-D, 4 chunks): {cold * 1e6:8.1f} us/call")
    print(f"collective_ns memoised:             {warm * 1e6:8.2f} us/call")
    print(f"p2p_ns memoised:                    {p2p * 1e6:8.2f} us/call")
    print(f"memo: {time_on.cache_info()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=default_data_dir(), help="astra-sim data folder")
    args = ap.parse_args(argv)
    if not (args.data / "collectives.csv").is_file():
        print(f"no collectives.csv under {args.data}; pass --data", file=sys.stderr)
        return 2
    failures = replay(args.data)
    lookup_speed()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
