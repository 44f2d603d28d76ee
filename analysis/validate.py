"""``python -m analysis validate``: replay a vLLM ground-truth run and compare.

It runs the engine with the settings the truth recorded (``vllm/meta.json`` engine kwargs
and the ``config.json`` cluster file), prints a side-by-side table of the 15 validation
metrics (TTFT/TPOT/E2E latency x mean/median/P90/P95/P99; Diff% = (sim − vLLM)/vLLM·100)
and writes a JSON report.

Which instant each side measures from: vLLM's times are taken from the engine's receive
time (``queued_ts``), the simulator's from the workload's nominal ``arrival_time_ns`` (the
instant the simulated engine receives the request).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analysis.groundtruth import GroundTruth, engine_settings, load_groundtruth
from analysis.metrics import VALIDATION_METRICS, compare, compute_metrics, format_comparison
from engine import simulate
from engine.memory import kv_capacity
from engine.specs import GIB, ConfigError, EngineConfig, HardwareSpec, ModelSpec
from profiles.bundle import load_bundle, variant_name
from profiles.catalog import list_hardware, load_hardware, load_model, model_from_hf_config
from profiles.parallel import latency_for_instance
from workloads import read_jsonl


@dataclass(slots=True)
class ValidationRun:
    """Everything a validation produced."""

    report: dict[str, Any]
    table_text: str
    kv_lines: list[str]


def _hardware_for(gt: GroundTruth) -> HardwareSpec:
    inst = gt.cluster.instances[0]
    mem = inst.npu_mem
    if inst.hardware in list_hardware():
        hw = load_hardware(inst.hardware)
        # The run's own memory figure is authoritative for the KV capacity.
        return replace(hw, mem_gib=float(mem.mem_size), hbm_bw_gbs=float(mem.mem_bw or hw.hbm_bw_gbs))
    return HardwareSpec(
        name=inst.hardware,
        mem_gib=float(mem.mem_size),
        hbm_bw_gbs=float(mem.mem_bw),
        peak_bf16_tflops=0.0,
        peak_fp8_tflops=0.0,
    )


def _model_for(gt: GroundTruth, model_config: str | None) -> ModelSpec:
    name = gt.cluster.instances[0].model_name
    if model_config:
        return model_from_hf_config(model_config, name=name)
    try:
        return load_model(name)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc}; or pass --model-config with the model's HF config.json"
        ) from None


def build_config(gt: GroundTruth, settings: dict[str, Any], base: EngineConfig) -> EngineConfig:
    if settings["dp"] != 1 or len(gt.cluster.instances) != 1:
        raise ConfigError(
            f"{gt.path}: data_parallel_size={settings['dp']} with "
            f"{len(gt.cluster.instances)} instance(s): multi-instance / data-parallel "
            "validation is not yet supported (single instance only)"
        )
    return replace(
        base,
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        gpu_memory_utilization=settings["mem_util"],
        tensor_parallel_size=settings["tp"],
        kv_cache_dtype=settings["kv_cache_dtype"],
        max_model_len=settings.get("max_model_len"),
        num_gpu_blocks_override=settings.get("num_gpu_blocks"),
    )


def run_validation(
    truth: str | Path,
    workload: str | Path,
    profiles: str | Path,
    *,
    model_config: str | None = None,
    base: EngineConfig | None = None,
) -> ValidationRun:
    gt = load_groundtruth(truth)
    settings = engine_settings(gt)
    model = _model_for(gt, model_config)
    hardware = _hardware_for(gt)
    config = build_config(gt, settings, base or EngineConfig())
    variant = variant_name(settings["dtype"], settings["kv_cache_dtype"])
    bundle = load_bundle(profiles, hardware.name, model.name, variant)
    latency = latency_for_instance(
        bundle, model, tp=config.tensor_parallel_size,
        link_bw_gbs=gt.cluster.link_bw, link_latency_ns=gt.cluster.link_latency,
        hardware=hardware, host_mem_bw_gbs=gt.cluster.nodes[0].cpu_mem.mem_bw,
        kv_cache_dtype=config.kv_cache_dtype,
    )
    limit = gt.meta.get("num_requests")
    requests = read_jsonl(workload, limit=int(limit) if limit else None)

    t0 = time.perf_counter()
    result = simulate(model, hardware, config, requests, latency)
    sim_metrics = compute_metrics(result.requests)
    wall_s = time.perf_counter() - t0

    cap = result.kv_capacity
    kv_lines = [cap.describe(f"{hardware.name} {model.name} tp{config.tensor_parallel_size}")]
    if config.num_gpu_blocks_override is not None:
        formula = kv_capacity(model, hardware, replace(config, num_gpu_blocks_override=None))
        kv_lines.append(
            f"  (vLLM recorded {cap.num_blocks} blocks; our formula gives "
            f"{formula.num_blocks} blocks = {formula.tokens} tokens, "
            f"{formula.num_blocks * formula.bytes_per_block / GIB:.2f} GiB/rank)"
        )
    table = compare(sim_metrics, gt.metrics(), VALIDATION_METRICS)
    diffs = table["diff_pct"].abs()
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
        "kv_cache": {
            "num_blocks": cap.num_blocks,
            "tokens": cap.tokens,
            "gib_per_rank": cap.gib_per_rank,
            "formula_num_blocks": cap.formula_num_blocks,
        },
        "engine_config": {
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "gpu_memory_utilization": config.gpu_memory_utilization,
            "tensor_parallel_size": config.tensor_parallel_size,
            "async_scheduling": config.async_scheduling,
            "step_overhead_us": config.step_overhead_us,
            "step_overhead_hidden_ms": config.step_overhead_hidden_ms,
            "reserve_full_isl": config.reserve_full_isl,
            "enable_prefix_caching": config.enable_prefix_caching,
        },
    }
    title = f"vLLM vs servesweep - {Path(truth).parent.name}/{Path(truth).name}"
    return ValidationRun(report, format_comparison(table, title), kv_lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--truth", required=True, help="ground-truth folder (config.json + vllm/)")
    p.add_argument("--workload", required=True, help="the replayed workload JSONL")
    p.add_argument("--profiles", required=True, help="profile bundle root (<hw>/<org>/<model>/<variant>)")
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


def main(args: argparse.Namespace) -> int:
    base = EngineConfig(async_scheduling=not args.sync)
    if args.step_overhead_us is not None:
        base = replace(base, step_overhead_us=args.step_overhead_us)
    run = run_validation(
        args.truth, args.workload, args.profiles, model_config=args.model_config, base=base
    )
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
