"""``python -m analysis scenario``: run a reference cluster config on a workload.

    python -m analysis scenario --cluster-config ../shared/data/llmservingsim/configs/cluster/single_node_pd_instance.json \\
        --workload ../shared/data/llmservingsim/workloads/example_trace.jsonl \\
        --profiles ../shared/data/llmservingsim/profiles --num-reqs 10 [--prefix-storage CPU --prefix-sharing]
        [--comm-backend astra_sim --astra-sim-binary path/to/AstraSim_Analytical_Congestion_Unaware]

Prints one line per instance (KV capacity, requests finished) and the run's totals, and writes
per-request results when ``--output`` is given (CSV or Parquet by extension).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from analysis.metrics import compute_metrics
from analysis.scenario import load_reference_cluster
from astra_bridge import COMM_BACKENDS, CommBackend
from engine.results import SimulationResult
from engine.simulate import simulate_deployment
from engine.specs import ConfigError, EngineConfig, SettingError
from workloads import read_jsonl


def run_scenario(
    cluster_config: str | Path,
    workload: str | Path,
    profiles: str | Path,
    *,
    num_reqs: int | None = None,
    router: str = "least_loaded",
    prefix_storage: str | None = None,
    prefix_sharing: bool = False,
    reference_clock: bool = False,
    streamed_pd: bool | None = None,
    model_configs: str | Path | None = None,
    roofline_fallback: bool = True,
    comm_backend: str = "analytical",
    astra_sim_binary: str | None = None,
) -> tuple[SimulationResult, list[str]]:
    try:
        backend = CommBackend(comm_backend, astra_sim_binary)
    except SettingError as err:  # name the command-line flags
        text = str(err.named("--"))
        for key in ("comm_backend", "astra_sim_binary"):
            text = text.replace(f"--{key}", "--" + key.replace("_", "-"))
        raise ConfigError(text) from None
    base = EngineConfig()
    if reference_clock:
        base = replace(base, async_scheduling=False, step_overhead_us=0.0)
    build = load_reference_cluster(
        cluster_config,
        profiles,
        base=base,
        prefix_storage=prefix_storage,
        prefix_sharing=prefix_sharing,
        model_configs=model_configs,
        streamed_pd=reference_clock if streamed_pd is None else streamed_pd,
        reference_dp=reference_clock,
        roofline_fallback=roofline_fallback,
        comm_backend=backend,
        router=router,
    )
    requests = read_jsonl(workload, limit=num_reqs)
    return simulate_deployment(build, requests), build.notes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster-config", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--profiles", required=True)
    p.add_argument("--num-reqs", type=int, default=None)
    p.add_argument(
        "--router",
        default="least_loaded",
        choices=["least_loaded", "round_robin", "random", "prefix_aware"],
    )
    p.add_argument("--prefix-storage", choices=["CPU", "CXL"], default=None)
    p.add_argument("--prefix-sharing", action="store_true")
    p.add_argument(
        "--reference-clock",
        action="store_true",
        help="the reference simulator's semantics: synchronous steps, no host overhead, "
        "streamed P/D KV, DP rounds padded to the group's largest batch with MoE experts on "
        "the member's own tokens",
    )
    p.add_argument(
        "--no-roofline-fallback",
        action="store_true",
        help="fail when an instance's hardware/model has no measured bundle instead of pricing "
        "it with a generated roofline bundle",
    )
    p.add_argument("--model-configs", help="folder of HF model configs for models not in the catalog")
    p.add_argument("--comm-backend", default="analytical", choices=list(COMM_BACKENDS),
                   help="collective timing: the embedded analytical model (default) or a built "
                   "ASTRA-Sim binary (astra_sim, with --astra-sim-binary)")
    p.add_argument("--astra-sim-binary", default=None,
                   help="path of AstraSim_Analytical_Congestion_Unaware (with --comm-backend "
                   "astra_sim)")
    p.add_argument("--output", help="per-request results (.csv or .parquet)")


def main(args: argparse.Namespace) -> int:
    result, notes = run_scenario(
        args.cluster_config,
        args.workload,
        args.profiles,
        num_reqs=args.num_reqs,
        router=args.router,
        prefix_storage=args.prefix_storage,
        prefix_sharing=args.prefix_sharing,
        reference_clock=args.reference_clock,
        model_configs=args.model_configs,
        roofline_fallback=not args.no_roofline_fallback,
        comm_backend=args.comm_backend,
        astra_sim_binary=args.astra_sim_binary,
    )
    for note in notes:
        print(f"note: {note}")
    df = result.requests
    for name, cap in result.instance_capacity.items():
        done = int((df.instance == name).sum())
        print(f"{cap.describe(name)}  finished {done}")
    m = compute_metrics(df)
    end = int(df.finish_ns.max())
    print(
        f"requests {len(df)}  last finish {end} ns  makespan {result.makespan_ns / 1e9:.3f} s  "
        f"TTFT mean {m['ttft_ms_mean']:.2f} ms  TPOT mean {m['tpot_ms_mean']:.2f} ms  "
        f"preemptions {result.num_preemptions}  prefix hits {result.prefix_hit_tokens}"
    )
    for name, tiers in result.tier_stats.items():
        for tier, st in tiers.items():
            if tier != "npu":
                print(f"{name} {tier}: {_fmt(st)}")
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        frame = df.copy()
        if out.suffix == ".parquet":
            frame.to_parquet(out, index=False)
        else:
            frame["token_times_ns"] = frame["token_times_ns"].map(lambda v: " ".join(map(str, v)))
            frame.to_csv(out, index=False)
    return 0


def _fmt(stats: dict[str, Any]) -> str:
    keys = ("hit_tokens", "query_tokens", "hit_rate", "recall_ns", "write_through_bytes")
    return "  ".join(f"{k} {stats[k]}" for k in keys if k in stats)
