"""Engine speed with TP and DP against the single-instance engine, per simulated request.

Issue 4 asks that the TP and DP cases stay within 2x of the single-instance engine's wall time
per simulated request. This script measures, side by side in one run:

- the baseline: the RTX PRO 6000 / Llama-3.1-8B ground-truth replay (TP1, one instance);
- the same 300 requests on the same model with TP2, as a DP2 group of TP1 ranks (a dense model:
  vLLM runs the ranks as independent engines) and as a lock-step DP2 group (the reference's DP
  rounds: dummy batches, padding), isolating what the parallel machinery costs;
- the two parallel ground-truth replays as they are validated: Qwen3-32B TP2 and
  Qwen3-30B-A3B DP2 x EP2 (other models and outputs, so more steps per request).

Each case is built through the reference-config importer with the run's recorded engine
settings, then ``simulate_cluster`` is timed from the loaded workload to finished per-request
results (a fresh latency model each repeat: its memo is part of what is measured). Prints the
median wall time, wall ms per request, us per step and the ratio per request to the baseline.

    python benchmarks/cluster_speed.py [--repeat 5]

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

from analysis.groundtruth import ClusterSpec, load_groundtruth, recorded_engine
from analysis.scenario import build_reference_cluster
from engine.simulate import simulate_cluster
from engine.specs import EngineConfig
from profiles.bundle import clear_bundle_cache
from workloads import read_jsonl

REPO = Path(__file__).resolve().parents[1]
RUNS = {
    "llama": ("Llama-3.1-8B", "sharegpt-llama-3.1-8b-300-sps10.jsonl"),
    "qwen32b": ("Qwen3-32B", "sharegpt-qwen3-32b-300-sps10.jsonl"),
    "moe": ("Qwen3-30B-A3B-Instruct-2507", "sharegpt-qwen3-30b-a3b-300-sps10.jsonl"),
}


def _with_instances(cluster: ClusterSpec, **fields: object) -> ClusterSpec:
    """The cluster with every instance's fields replaced."""
    nodes = tuple(
        replace(n, instances=tuple(replace(i, **fields) for i in n.instances)) for n in cluster.nodes
    )
    return replace(cluster, nodes=nodes)


def _dp_group(cluster: ClusterSpec, size: int) -> ClusterSpec:
    """The single instance of ``cluster`` repeated ``size`` times as one DP group."""
    node = cluster.nodes[0]
    inst = replace(node.instances[0], dp_group="A")
    return replace(cluster, nodes=(replace(node, instances=(inst,) * size),))


def cases(data: Path) -> list[tuple[str, ClusterSpec, EngineConfig, Path, bool]]:
    """(label, cluster, engine settings, workload, reference DP rounds) per case."""
    out = []
    for key, (name, workload) in RUNS.items():
        gt = load_groundtruth(data / "groundtruth" / "RTXPRO6000" / name)
        cfg = recorded_engine(gt).config
        wl = data / "workloads" / workload
        if key == "llama":
            out.append(("Llama-3.1-8B TP1 (baseline)", gt.cluster, cfg, wl, False))
            out.append(("Llama-3.1-8B TP2, same requests",
                        _with_instances(gt.cluster, tp_size=2, num_npus=2), cfg, wl, False))
            out.append(("Llama-3.1-8B DP2, independent ranks", _dp_group(gt.cluster, 2), cfg, wl,
                        False))
            out.append(("Llama-3.1-8B DP2, lock-step rounds", _dp_group(gt.cluster, 2), cfg, wl,
                        True))
        elif key == "qwen32b":
            out.append(("Qwen3-32B TP2 (its replay)", gt.cluster, cfg, wl, False))
        else:
            out.append(("Qwen3-30B-A3B DP2 x EP2 (its replay)", gt.cluster, cfg, wl, False))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    data = Path(os.environ.get("SERVESWEEP_DATA", REPO.parent / "shared" / "data")) / "llmservingsim"
    if not data.is_dir():
        print(f"reference data not found at {data}; set SERVESWEEP_DATA", file=sys.stderr)
        return 2
    profiles = data / "profiles"
    print(f"{'case':<50}{'wall s':>9}{'requests':>10}{'ms/request':>12}{'steps':>8}"
          f"{'us/step':>9}{'x baseline/request':>20}")
    baseline = None
    for label, cluster, cfg, wl, reference_dp in cases(data):
        workload = read_jsonl(wl)
        walls = []
        for _ in range(args.repeat):
            clear_bundle_cache()
            build = build_reference_cluster(cluster, profiles, base=cfg, reference_dp=reference_dp)
            t0 = time.perf_counter()
            res = simulate_cluster(build.instances, workload, kv_transfer_ns=build.kv_transfer_ns,
                                   dp_pad=build.dp_pad)
            walls.append(time.perf_counter() - t0)
        wall = statistics.median(walls)
        per_req = wall / len(workload)
        if baseline is None:
            baseline = per_req
        print(f"{label:<50}{wall:>9.3f}{len(workload):>10}{per_req * 1e3:>12.3f}"
              f"{res.num_steps:>8}{wall / res.num_steps * 1e6:>9.0f}{per_req / baseline:>20.2f}")
    print("\n(steps are summed over the instances of a case; a DP round of two ranks is 2 steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
