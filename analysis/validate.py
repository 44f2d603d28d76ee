"""``python -m analysis validate``: replay a vLLM ground-truth run and compare.

It runs the engine with the settings the truth recorded (``vllm/meta.json`` engine kwargs,
converted once by ``analysis.groundtruth.recorded_engine``, and the ``config.json`` cluster
file), prints a side-by-side table of the 15 validation
metrics (TTFT/TPOT/E2E latency x mean/median/P90/P95/P99; Diff% = (sim − vLLM)/vLLM·100)
and writes a JSON report.

Which instant each side measures from: the same one. vLLM's times are taken from
``queued_ts``, which its engine core stamps when the busy loop drains the input queue — at a
step boundary, up to a step after the request reached the process. The simulator's are taken
from ``queued_ns``, the instant the simulated engine loop picked the request up (the first
schedule at or after its arrival; the arrival itself when the engine was idle).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analysis.groundtruth import GroundTruth, RecordedEngine, load_groundtruth, recorded_engine
from analysis.metrics import VALIDATION_METRICS, compare, compute_metrics, format_comparison
from analysis.scenario import reference_plan
from engine.deployment import Deployment
from engine.memory import kv_capacity
from engine.results import SimulationResult
from engine.simulate import simulate_cluster
from engine.specs import GIB, ConfigError, EngineConfig, ModelSpec
from profiles.catalog import model_from_hf_config
from profiles.deployment import BundleSource, assemble, resolve_bundle
from workloads import read_jsonl

#: ``--profiles`` value selecting bundles derived from aiconfigurator-core's tables
#: (``profiles.aiconfigurator``) instead of a measured-bundle root.
AICONFIGURATOR = "aiconfigurator"


@dataclass(slots=True)
class ValidationRun:
    """Everything a validation produced."""

    report: dict[str, Any]
    table_text: str
    kv_lines: list[str]
    result: SimulationResult


def _check_parallelism(gt: GroundTruth, recorded: RecordedEngine, build: Deployment) -> None:
    """The cluster file and vLLM's engine kwargs must describe the same deployment."""
    n = len(build.instances)
    tp = {i.config.tensor_parallel_size for i in build.instances}
    ran_tp, dp = recorded.config.tensor_parallel_size, recorded.data_parallel_size
    if tp != {ran_tp}:
        raise ConfigError(
            f"{gt.path}: config.json gives tensor parallel {sorted(tp)} but vLLM ran "
            f"tensor_parallel_size={ran_tp}; make them agree"
        )
    if dp > 1 and n != dp:
        raise ConfigError(
            f"{gt.path}: vLLM ran data_parallel_size={dp} but config.json has {n} "
            "instance(s); give one instance per DP rank"
        )


def run_validation(
    truth: str | Path,
    workload: str | Path,
    profiles: str | Path,
    *,
    model_config: str | None = None,
    base: EngineConfig | None = None,
    reference_dp: bool = False,
) -> ValidationRun:
    """Replay ``truth`` with ``base`` engine settings (the run's recorded ones on top) and
    compare. ``profiles`` is a measured-bundle root, or ``"aiconfigurator"`` for bundles
    derived from aiconfigurator-core's vLLM tables (``profiles.aiconfigurator``; the report's
    ``bundle_sources`` names each instance's source). ``reference_dp`` prices DP rounds as the
    reference does (see ``analysis.scenario.build_reference_cluster``) instead of as vLLM runs
    them."""
    gt = load_groundtruth(truth)
    recorded = recorded_engine(gt, base)
    config = recorded.config
    models: dict[str, ModelSpec] = {}
    if model_config:
        name = gt.cluster.instances[0].model_name
        models[name] = model_from_hf_config(model_config, name=name)
    derived = str(profiles) == AICONFIGURATOR
    # Models missing from the catalog: the HF configs beside the profiles in the reference
    # data layout (<data>/profiles, <data>/configs/model/<org>/<name>.json).
    configs = None if derived else Path(profiles).parent / "configs" / "model"
    plan = reference_plan(
        gt.cluster,
        profiles,
        base=config,
        models=models,
        model_configs=configs if configs is not None and configs.is_dir() else None,
        roofline_fallback=False,  # validate the profiles given, never a generated stand-in
        reference_dp=reference_dp,
        bundle=BundleSource(generate="always", generator=AICONFIGURATOR) if derived else None,
    )
    build = assemble(plan)
    sources = {
        inst.name: resolve_bundle(inst.bundle, inst.hardware, inst.model,
                                  inst.config.tensor_parallel_size, inst.config.kv_cache_dtype)[0].source
        for inst in plan.instances
    }
    _check_parallelism(gt, recorded, build)
    limit = gt.meta.get("num_requests")
    requests = read_jsonl(workload, limit=int(limit) if limit else None)

    t0 = time.perf_counter()
    result = simulate_cluster(
        build.instances, requests, kv_transfer_ns=build.kv_transfer_ns, dp_pad=build.dp_pad
    )
    sim_metrics = compute_metrics(result.requests, anchor="queued_ns")
    wall_s = time.perf_counter() - t0

    kv_lines = []
    for inst in build.instances:
        cap = result.instance_capacity[inst.name]
        c = inst.config
        label = (
            f"{inst.name}: {inst.hardware.name} {inst.model.name} tp{c.tensor_parallel_size}"
            f" pp{c.pipeline_parallel_size} ep{c.expert_parallel_size}"
        )
        kv_lines.append(cap.describe(label))
        if c.num_gpu_blocks_override is not None:
            formula = kv_capacity(inst.model, inst.hardware, replace(c, num_gpu_blocks_override=None))
            kv_lines.append(
                f"  (vLLM recorded {cap.num_blocks} blocks; our formula gives "
                f"{formula.num_blocks} blocks = {formula.tokens} tokens, "
                f"{formula.num_blocks * formula.bytes_per_block / GIB:.2f} GiB/rank)"
            )
    cap = result.kv_capacity
    table = compare(sim_metrics, gt.metrics(), VALIDATION_METRICS)
    diffs = table["diff_pct"].abs()
    first = build.instances[0].config
    report = {
        "truth": str(truth),
        "workload": str(workload),
        "metrics": {
            row.metric: {"vllm": row.vllm, "sim": row.sim, "diff_pct": row.diff_pct}
            for row in table.itertuples(index=False)
        },
        "mean_abs_diff_pct": float(diffs.mean()),
        "max_abs_diff_pct": float(diffs.max()),
        "sim_makespan_s": result.makespan_ns / 1e9,
        "wall_s": wall_s,
        "preemptions": result.num_preemptions,
        "prefix_hit_tokens": result.prefix_hit_tokens,
        "num_steps": result.num_steps,
        "instances": len(build.instances),
        "kv_cache": {
            "num_blocks": cap.num_blocks,
            "tokens": cap.tokens,
            "gib_per_rank": cap.gib_per_rank,
            "formula_num_blocks": cap.formula_num_blocks,
        },
        "engine_config": {
            "max_num_seqs": first.max_num_seqs,
            "max_num_batched_tokens": first.max_num_batched_tokens,
            "gpu_memory_utilization": first.gpu_memory_utilization,
            "tensor_parallel_size": first.tensor_parallel_size,
            "pipeline_parallel_size": first.pipeline_parallel_size,
            "expert_parallel_size": first.expert_parallel_size,
            "async_scheduling": first.async_scheduling,
            "step_overhead_us": first.step_overhead_us,
            "step_overhead_hidden_ms": first.step_overhead_hidden_ms,
            "reserve_full_isl": first.reserve_full_isl,
            "enable_prefix_caching": first.enable_prefix_caching,
        },
        "time_anchor": "queued (vLLM queued_ts / servesweep queued_ns)",
        "reference_dp": reference_dp,
        "bundle_sources": sources,
        "notes": list(build.notes),
    }
    title = f"vLLM vs servesweep - {Path(truth).parent.name}/{Path(truth).name}"
    return ValidationRun(report, format_comparison(table, title), kv_lines, result)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--truth", required=True, help="ground-truth folder (config.json + vllm/)")
    p.add_argument("--workload", required=True, help="the replayed workload JSONL")
    p.add_argument(
        "--profiles",
        required=True,
        help="profile bundle root (<hw>/<org>/<model>/<variant>), or 'aiconfigurator' for "
        "bundles derived from aiconfigurator-core's vLLM tables (extra [aiconfigurator])",
    )
    p.add_argument("--json", dest="json_out", help="write the report here")
    p.add_argument("--model-config", help="HF config.json when the model is not in the catalog")
    p.add_argument(
        "--sync", action="store_true", help="synchronous scheduling (vLLM default is async)"
    )
    p.add_argument(
        "--step-overhead-us",
        type=float,
        default=None,
        help=f"host-side cost per step (default {EngineConfig().step_overhead_us})",
    )
    p.add_argument(
        "--reference-dp",
        action="store_true",
        help="DP rounds as the reference simulator prices them (every batch padded to the "
        "group's largest, MoE experts on the member's own tokens) instead of as vLLM runs them",
    )


def main(args: argparse.Namespace) -> int:
    base = EngineConfig(async_scheduling=not args.sync)
    if args.step_overhead_us is not None:
        base = replace(base, step_overhead_us=args.step_overhead_us)
    run = run_validation(
        args.truth, args.workload, args.profiles, model_config=args.model_config, base=base,
        reference_dp=args.reference_dp,
    )
    for name, source in run.report["bundle_sources"].items():
        print(f"profiles: {name}: {source}")
    for note in run.report["notes"]:
        print(f"note: {note}")
    for line in run.kv_lines:
        print(line)
    print(run.table_text)
    r = run.report
    print(
        f"mean |Diff%| {r['mean_abs_diff_pct']:.2f}  max |Diff%| {r['max_abs_diff_pct']:.2f}  "
        f"makespan {r['sim_makespan_s']:.2f} s  preemptions {r['preemptions']}  "
        f"prefix hits {r['prefix_hit_tokens']} tokens  wall {r['wall_s']:.2f} s"
    )
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(r, indent=2) + "\n")
    return 0
