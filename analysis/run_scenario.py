"""``python -m analysis scenario``: run a reference cluster config on a workload.

    python -m analysis scenario --cluster-config ../shared/data/llmservingsim/configs/cluster/single_node_pd_instance.json \\
        --workload ../shared/data/llmservingsim/workloads/example_trace.jsonl \\
        --profiles ../shared/data/llmservingsim/profiles --num-reqs 10 [--prefix-storage CPU --prefix-sharing]
        [--comm-backend astra_sim --astra-sim-binary path/to/AstraSim_Analytical_Congestion_Unaware]

Prints one line per instance (KV capacity, requests finished) and the run's totals. ``--output
FILE.csv`` writes the per-request results in LLMServingSim's layout (``llmservingsim_frame``),
``--output FILE.parquet`` servesweep's full per-request table; ``--bench-json FILE`` writes the
run as a ``vllm bench serve`` result (``analysis.bench_serve``).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.bench_serve import write_result
from analysis.metrics import compute_metrics, metrics_from_parquet, per_request
from analysis.scenario import load_reference_cluster
from astra_bridge import COMM_BACKENDS, CommBackend
from engine.deployment import Deployment
from engine.results import SimulationResult
from engine.simulate import simulate_deployment
from engine.specs import ConfigError, EngineConfig, SettingError
from engine.workload import RequestSpec
from workloads import read_jsonl

#: LLMServingSim's per-request CSV header (its ``--output``; all times integer ns).
LLMSERVINGSIM_COLUMNS = ("instance id", "request id", "model", "input", "output", "arrival",
                         "end_time", "latency", "queuing_delay", "TTFT", "TPOT", "ITL")


def llmservingsim_frame(result: SimulationResult, deployment: Deployment) -> pd.DataFrame:
    """The finished requests in LLMServingSim's per-request CSV layout
    (``docs/reference-semantics.md``; the reference's ``--output``): one row per request
    finished on a colocated or decode instance (P/D prefill instances write none), instance
    by instance in deployment order, each in completion order. ``instance id`` is the
    instance's position in the deployment, ``request id`` the workload line, ``input`` /
    ``output`` the token counts; ``arrival``, ``end_time`` (last token), ``latency`` (end -
    arrival), ``TTFT`` (first token - arrival), ``TPOT`` (``floor((latency - TTFT) / (output
    - 1))``, 0 for one output token) and ``ITL`` (the gaps between output tokens, as a Python
    list) are engine-side ns, as the reference measures them. ``queuing_delay`` is the first
    scheduling - arrival (the reference takes the last prefill chunk's scheduling, so the two
    differ for a prompt prefilled in several chunks)."""
    df = result.requests
    index = {inst.name: k for k, inst in enumerate(deployment.instances)}
    model = {inst.name: inst.model.name for inst in deployment.instances}
    prefill = {inst.name for inst in deployment.instances if inst.role == "prefill"}
    done = df[(df["finish_ns"] >= 0) & ~df["instance"].isin(prefill)].copy()
    done["_k"] = done["instance"].map(index)
    done = done.sort_values(["_k", "finish_ns"], kind="stable")
    ttft = done["first_token_ns"] - done["arrival_ns"]
    latency = done["finish_ns"] - done["arrival_ns"]
    out_len = done["output_len"]
    tpot = np.where(out_len > 1, (latency - ttft) // np.maximum(out_len - 1, 1), 0)
    ids = done["request_id"].astype(str).str.extract(r"(\d+)$")[0]
    return pd.DataFrame({
        "instance id": done["_k"].to_numpy(),
        "request id": ids.fillna(done["request_id"].astype(str)).to_numpy(),
        "model": done["instance"].map(model).to_numpy(),
        "input": done["prompt_len"].to_numpy(),
        "output": out_len.to_numpy(),
        "arrival": done["arrival_ns"].to_numpy(),
        "end_time": done["finish_ns"].to_numpy(),
        "latency": latency.to_numpy(),
        "queuing_delay": (done["first_scheduled_ns"] - done["arrival_ns"]).to_numpy(),
        "TTFT": ttft.to_numpy(),
        "TPOT": tpot.astype(np.int64),
        "ITL": [str([int(g) for g in np.diff(np.asarray(t, dtype=np.int64))])
                for t in done["token_times_ns"]],
    }, columns=list(LLMSERVINGSIM_COLUMNS))


def build_scenario(
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
) -> tuple[Deployment, list[RequestSpec]]:
    """The assembled deployment of a reference cluster config and the workload to run on it
    (``run_scenario``'s arguments)."""
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
    return build, read_jsonl(workload, limit=num_reqs)


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
    """Run a reference cluster config on ``workload``: the result and the deployment's notes."""
    build, requests = build_scenario(
        cluster_config, workload, profiles, num_reqs=num_reqs, router=router,
        prefix_storage=prefix_storage, prefix_sharing=prefix_sharing,
        reference_clock=reference_clock, streamed_pd=streamed_pd, model_configs=model_configs,
        roofline_fallback=roofline_fallback, comm_backend=comm_backend,
        astra_sim_binary=astra_sim_binary,
    )
    return simulate_deployment(build, requests), list(build.notes)


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
    p.add_argument("--output", help="per-request results: .csv in LLMServingSim's layout, "
                   ".parquet servesweep's full table")
    p.add_argument("--stream", action="store_true",
                   help="write the per-request table to --output (.parquet) in row groups while "
                   "the run goes on instead of keeping it; metrics are read from the file")
    p.add_argument("--bench-json", default=None,
                   help="write the run as a vllm bench serve result JSON (client view)")


def main(args: argparse.Namespace) -> int:
    if args.output and Path(args.output).suffix not in (".csv", ".parquet"):
        raise ConfigError(f"--output {args.output}: use a .csv (LLMServingSim's layout) or "
                          ".parquet (servesweep's table) file")
    if args.stream and (not args.output or Path(args.output).suffix != ".parquet"):
        raise ConfigError("--stream writes the per-request table as the run goes: give "
                          "--output FILE.parquet")
    if args.stream and args.bench_json:
        raise ConfigError("--stream keeps no per-request table for --bench-json; drop one of them")
    build, requests = build_scenario(
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
    stream_to = Path(args.output) if args.stream else None
    result = simulate_deployment(build, requests, stream_to=stream_to)
    for note in build.notes:
        print(f"note: {note}")
    if result.requests is None:  # streamed: only the columns printed here are read back
        assert result.requests_path is not None
        df = pd.read_parquet(result.requests_path, columns=["instance", "finish_ns"])
        m = metrics_from_parquet(result.requests_path)
    else:
        df = result.requests
        m = compute_metrics(df)
    for name, cap in result.instance_capacity.items():
        done = int((df.instance == name).sum())
        print(f"{cap.describe(name)}  finished {done}")
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
    if args.output and result.requests is None:
        print(f"per-request results: {result.requests_path}")
    elif args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".parquet":
            df.to_parquet(out, index=False)
        else:
            llmservingsim_frame(result, build).to_csv(out, index=False)
        print(f"per-request results: {out}")
    if args.bench_json:
        model = build.instances[0].model.name
        path = write_result(args.bench_json, per_request(df, view="client"), model_id=model)
        print(f"bench result: {path}")
    return 0


def _fmt(stats: dict[str, Any]) -> str:
    keys = ("hit_tokens", "query_tokens", "hit_rate", "recall_ns", "write_through_bytes")
    return "  ".join(f"{k} {stats[k]}" for k in keys if k in stats)
