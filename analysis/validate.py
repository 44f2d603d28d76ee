"""``python -m analysis validate``: replay a vLLM run and compare.

Two kinds of truth:

- a ground-truth folder (``analysis.groundtruth``): the engine runs with the settings the
  truth recorded (``vllm/meta.json`` engine kwargs, converted once by
  ``analysis.groundtruth.recorded_engine``, and the ``config.json`` cluster file) on the
  ``--workload`` it replayed;
- a ``vllm bench serve --save-result --save-detailed`` JSON (``analysis.bench_serve``): the
  server from ``--server-args`` (``analysis.server_args``) on the catalog ``--hardware``, the KV
  capacity from ``--num-gpu-blocks`` or ``--server-log`` (``analysis.server_log``), the
  workload rebuilt from the file or ``--workload``'s token ids on its send times; failed
  requests are left out on both sides and counted.

It prints a side-by-side table of the 15 validation metrics (TTFT/TPOT/E2E latency x
mean/median/P90/P95/P99; Diff% = (sim − vLLM)/vLLM·100) and writes a JSON report;
``--bench-json`` writes the simulated run as a bench result.

Which instant each side measures from: the same one (``analysis.metrics`` views). For a
folder, vLLM's times are taken from ``queued_ts``, which its engine core stamps when the busy
loop drains the input queue — at a step boundary, up to a step after the request reached the
process — and the simulator's from ``queued_ns``, the instant the simulated engine loop picked
the request up (view ``queued``; the first schedule at or after its arrival, the arrival
itself when the engine was idle). A bench result is timed at the client, so both sides are
read from the send (view ``client``: the simulated deployment has the sweep's default front
end between client and engine, ``engine.frontend``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from analysis.bench_serve import match_workload, read_result, rebuild_workload, write_result
from analysis.groundtruth import GroundTruth, RecordedEngine, load_groundtruth, recorded_engine
from analysis.metrics import (
    VALIDATION_METRICS,
    compare,
    compute_metrics,
    format_comparison,
    per_request,
)
from analysis.scenario import reference_plan, resolve_model
from analysis.server_args import read_server_args
from analysis.server_log import check_against, read_server_log
from engine.frontend import FRONTEND_MODES, FrontEndSpec
from engine.results import SimulationResult
from engine.simulate import simulate_deployment
from engine.specs import GIB, ConfigError, EngineConfig, ModelSpec, SettingError
from engine.workload import RequestSpec
from profiles.catalog import load_hardware, model_from_hf_config
from profiles.deployment import (
    BundleSource,
    DeploymentPlan,
    assemble,
    bundle_sources,
    comm_sources,
)
from workloads import read_jsonl

#: ``--profiles`` values selecting generated bundles instead of a measured-bundle root:
#: roofline bundles for the catalog hardware (``profiles.roofline``) or bundles derived from
#: aiconfigurator-core's tables (``profiles.aiconfigurator``).
AICONFIGURATOR = "aiconfigurator"
ROOFLINE = "roofline"
GENERATED = (ROOFLINE, AICONFIGURATOR)


@dataclass(slots=True)
class ValidationRun:
    """Everything a validation produced."""

    report: dict[str, Any]
    table_text: str
    kv_lines: list[str]
    result: SimulationResult
    # The truth's model id and run-level load settings (request_rate, burstiness,
    # max_concurrency) for a bench result written of this run.
    run: dict[str, Any] = field(default_factory=dict)


def _check_parallelism(gt: GroundTruth, recorded: RecordedEngine, plan: DeploymentPlan) -> None:
    """The cluster file and vLLM's engine kwargs must describe the same deployment."""
    n = len(plan.instances)
    tp = {i.config.tensor_parallel_size for i in plan.instances}
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


@dataclass(slots=True)
class _Setup:
    """What a truth implies for the replay: the deployment, the requests, the per-request
    truth frame and the view each side is read on (``analysis.metrics.VIEWS``)."""

    plan: DeploymentPlan
    requests: list[RequestSpec]
    truth: pd.DataFrame
    truth_view: str
    sim_view: str
    time_anchor: str
    title: str
    report: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)
    failed: int = 0  # truth requests that failed: left out on both sides


def _bundle(profiles: str | Path) -> BundleSource:
    """``--profiles``: a measured-bundle root, ``roofline`` or ``aiconfigurator`` (generated)."""
    if str(profiles) in GENERATED:
        return BundleSource(generate="always", generator=str(profiles))
    return BundleSource(root=str(profiles), generate="never")


def _folder_setup(truth: Path, workload: str | Path | None, profiles: str | Path, *,
                  model_config: str | None, base: EngineConfig | None,
                  reference_dp: bool) -> _Setup:
    """A ground-truth folder (``analysis.groundtruth``): its cluster config and meta.json
    settings, the workload file, times from the engine's pickup (``queued_ts``)."""
    if workload is None:
        raise ConfigError(f"{truth}: a ground-truth folder needs --workload (the replayed JSONL)")
    gt = load_groundtruth(truth)
    recorded = recorded_engine(gt, base)
    config = recorded.config
    models: dict[str, ModelSpec] = {}
    if model_config:
        name = gt.cluster.instances[0].model_name
        models[name] = model_from_hf_config(model_config, name=name)
    derived = str(profiles) in GENERATED
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
        bundle=_bundle(profiles) if derived else None,
    )
    # The shared runs drove vLLM's AsyncLLM in the client's own process with token ids
    # (meta.json's engine_kwargs): no HTTP, no tokenising, the engine core's intake.
    plan = replace(plan, frontend=FrontEndSpec(mode="in_process"))
    _check_parallelism(gt, recorded, plan)
    limit = gt.meta.get("num_requests")
    requests = read_jsonl(workload, limit=int(limit) if limit else None)
    return _Setup(plan, requests, gt.requests, "engine", "queued",
                  "queued (vLLM queued_ts / servesweep queued_ns)",
                  f"vLLM vs servesweep - {truth.parent.name}/{truth.name}",
                  report={"truth_format": "groundtruth folder", "workload": str(workload)},
                  run={"model_id": str(gt.meta.get("model") or plan.instances[0].model.name)})


def _bench_setup(truth: Path, workload: str | Path | None, profiles: str | Path, *,
                 server_args: str | None, hardware: str | None, num_gpu_blocks: int | None,
                 server_log: str | Path | None, model_config: str | None,
                 base: EngineConfig | None) -> _Setup:
    """A ``vllm bench serve --save-detailed`` result (``analysis.bench_serve``): the server
    from ``server_args`` on the catalog ``hardware``, KV capacity from ``num_gpu_blocks`` or
    the ``server_log`` (else our memory formula), the workload rebuilt from the result or
    ``workload``'s token ids on the result's send times; times from the client's send."""
    from sweep.cluster import point_plan  # the one deployment of a catalog-hardware point
    from sweep.schema import ClusterConf

    for flag, value in (("--server-args", server_args), ("--hardware", hardware)):
        if not value:
            raise ConfigError(f"{truth}: a vllm bench serve result needs {flag} (the server's "
                              "command and the accelerator it ran on)")
    assert server_args is not None and hardware is not None
    bench = read_result(truth)
    args = read_server_args(server_args)
    hw = load_hardware(hardware)
    configs = Path(profiles).parent / "configs" / "model"
    model = (model_from_hf_config(model_config, name=args.model) if model_config else
             resolve_model(args.model, configs if configs.is_dir() else None))
    if bench.model_id is not None and bench.model_id not in args.names:
        raise ConfigError(f"{truth}: model_id {bench.model_id!r} is not a name the server of "
                          f"--server-args serves ({list(args.names)}); paste the command of the "
                          "server this benchmark ran against")
    settings = args.settings(model, hw, base)
    config = settings.config
    notes = list(settings.notes)
    log = read_server_log(server_log) if server_log else None
    blocks: dict[str, int] = {}
    if config.num_gpu_blocks_override is not None:
        blocks["--server-args --num-gpu-blocks-override"] = config.num_gpu_blocks_override
    if num_gpu_blocks is not None:
        blocks["--num-gpu-blocks"] = num_gpu_blocks
    if log is not None:
        notes += check_against(log, settings)
        logged = log.num_gpu_blocks(config.block_size)
        if logged is not None:
            blocks[f"--server-log ({log.where('kv_tokens')})"] = logged
    if len(set(blocks.values())) > 1:
        raise ConfigError("the KV capacity is given twice and differs: "
                          + ", ".join(f"{k} {v} blocks" for k, v in blocks.items())
                          + "; give one (the server log's is what vLLM ran with)")
    kv_source = next(iter(blocks), "memory formula (no --num-gpu-blocks or --server-log)")
    if blocks:
        try:
            config = replace(config, num_gpu_blocks_override=next(iter(blocks.values())))
        except SettingError as err:
            raise ConfigError(f"{kv_source}: {err}") from None
    dp = settings.data_parallel_size
    ep = config.expert_parallel_size
    # The sweep's cluster group with its defaults (front end: vllm serve's API server, what
    # vllm bench serve measures) and this server's shape.
    cluster = OmegaConf.merge(OmegaConf.structured(ClusterConf), {
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size, "data_parallel_size": dp,
        "expert_parallel_size": ep, "enable_prefix_caching": config.enable_prefix_caching,
    })
    plan = point_plan(cluster, settings.model, hw, config, _bundle(profiles))
    if workload is None:
        requests = rebuild_workload(bench)
        source = f"rebuilt from {truth} (send times and lengths, no shared prefixes)"
    else:
        requests = match_workload(bench, read_jsonl(workload), str(workload))
        source = str(workload)
    return _Setup(
        plan, requests, bench.completed(), "client", "client",
        "client send (vllm bench serve start_times / servesweep send_ns)",
        f"vllm bench serve vs servesweep - {truth.name}",
        report={
            "truth_format": "vllm bench serve result",
            "workload": source,
            "server": {"command": args.command, "model": settings.model.name,
                       "hardware": hw.name, "data_parallel_size": dp,
                       "ignored_flags": list(args.ignored), "kv_capacity_source": kv_source},
        },
        notes=notes,
        run={"model_id": bench.model_id or settings.model.name,
             **{k: bench.run.get(k) for k in ("request_rate", "burstiness", "max_concurrency")}},
        failed=bench.num_failed,
    )


def run_validation(
    truth: str | Path,
    workload: str | Path | None,
    profiles: str | Path,
    *,
    model_config: str | None = None,
    base: EngineConfig | None = None,
    reference_dp: bool = False,
    server_args: str | None = None,
    hardware: str | None = None,
    num_gpu_blocks: int | None = None,
    server_log: str | Path | None = None,
    frontend: str | None = None,
) -> ValidationRun:
    """Replay ``truth`` and compare (the 15 ``VALIDATION_METRICS``).

    ``truth`` is a ground-truth folder (its recorded settings on top of ``base``; see the
    module docstring) or a ``vllm bench serve --save-result --save-detailed`` JSON file
    (``analysis.bench_serve``; then ``server_args``, ``hardware`` and optionally
    ``num_gpu_blocks`` / ``server_log`` describe the server, ``analysis.server_args``).
    Failed requests of a bench result are left out on both sides and counted
    (``report["failed_requests"]``). ``profiles`` is a measured-bundle root, ``"roofline"``
    or ``"aiconfigurator"`` for generated bundles (the report's ``bundle_sources`` names each
    instance's source). ``reference_dp`` prices DP rounds as the reference does (see
    ``analysis.scenario.build_reference_cluster``) instead of as vLLM runs them. ``frontend``
    overrides the front end the truth implies (``engine.frontend.FRONTEND_MODES``; a folder:
    ``in_process``, a bench result: ``api_server``), e.g. ``none`` for the reference's clock."""
    path = Path(truth)
    if path.is_file() or path.suffix == ".json":
        if reference_dp:
            raise ConfigError("--reference-dp applies to a ground-truth folder's cluster config, "
                              "not to a vllm bench serve result")
        setup = _bench_setup(path, workload, profiles, server_args=server_args,
                             hardware=hardware, num_gpu_blocks=num_gpu_blocks,
                             server_log=server_log, model_config=model_config, base=base)
    else:
        for flag, value in (("--server-args", server_args), ("--hardware", hardware),
                            ("--num-gpu-blocks", num_gpu_blocks), ("--server-log", server_log)):
            if value is not None:
                raise ConfigError(f"{flag} describes the server of a vllm bench serve result; "
                                  f"{path} is a ground-truth folder, whose config.json and "
                                  "meta.json say how it ran: drop the flag")
        setup = _folder_setup(path, workload, profiles, model_config=model_config, base=base,
                              reference_dp=reference_dp)
    plan = setup.plan
    if frontend is not None:
        plan = replace(plan, frontend=FrontEndSpec(mode=frontend))
    build = assemble(plan)
    sources = bundle_sources(plan)
    requests = setup.requests

    t0 = time.perf_counter()
    result = simulate_deployment(build, requests)  # with the truth's front end
    sim_metrics = compute_metrics(result.requests, view=setup.sim_view)
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
        # Both counts, always: what the run used (vLLM's recorded count when the ground truth
        # has one) and what our capacity model predicts (engine.memory.kv_capacity).
        used = "vLLM recorded" if c.num_gpu_blocks_override is not None else "our prediction"
        kv_lines.append(
            f"  (the run used {cap.num_blocks} blocks, {used}; our {c.kv_capacity_model} "
            f"budget predicts {cap.formula_num_blocks} blocks = "
            f"{cap.formula_num_blocks * cap.block_size} tokens, "
            f"{cap.formula_num_blocks * cap.bytes_per_block / GIB:.2f} GiB/rank)"
        )
    cap = result.kv_capacity
    truth_metrics = compute_metrics(setup.truth, view=setup.truth_view)
    table = compare(sim_metrics, truth_metrics, VALIDATION_METRICS)
    diffs = table["diff_pct"].abs()
    first = build.instances[0].config
    report = {
        "truth": str(truth),
        **setup.report,
        "completed_requests": len(setup.truth),
        "failed_requests": setup.failed,
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
            "capacity_model": first.kv_capacity_model,
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
        "time_anchor": setup.time_anchor,
        "view": {"truth": setup.truth_view, "sim": setup.sim_view},
        "reference_dp": reference_dp,
        "frontend": plan.frontend.mode if plan.frontend is not None else "none",
        "bundle_source": ", ".join(dict.fromkeys(sources.values())),
        "bundle_sources": sources,
        "comm_sources": comm_sources(plan),
        "notes": [*setup.notes, *build.notes],
    }
    return ValidationRun(report, format_comparison(table, setup.title), kv_lines, result,
                         setup.run)


def write_bench_json(run: ValidationRun, path: str | Path) -> Path:
    """The simulated run of ``run`` as a ``vllm bench serve`` result (client view; the
    truth's request rate, burstiness and max concurrency when it recorded them)."""
    load = {k: v for k, v in run.run.items() if v is not None}
    return write_result(path, per_request(run.result.requests, view="client"), **load)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--truth", required=True,
                   help="ground-truth folder (config.json + vllm/), or a vllm bench serve "
                   "--save-result --save-detailed JSON file")
    p.add_argument("--workload", default=None,
                   help="the replayed workload JSONL (required with a folder; with a bench "
                   "JSON its token ids are used, else the workload is rebuilt from the JSON)")
    p.add_argument(
        "--profiles",
        required=True,
        help="profile bundle root (<hw>/<org>/<model>/<variant>), 'roofline' for a generated "
        "roofline bundle of the catalog hardware, or 'aiconfigurator' for bundles derived from "
        "aiconfigurator-core's vLLM tables (extra [aiconfigurator])",
    )
    p.add_argument("--server-args", default=None,
                   help="with a bench JSON: the vllm serve command the server ran, quoted "
                   "(\"vllm serve MODEL --tensor-parallel-size 2 ...\")")
    p.add_argument("--hardware", default=None,
                   help="with a bench JSON: the accelerator, a catalog name or alias "
                   "(profiles/hardware/)")
    p.add_argument("--num-gpu-blocks", type=int, default=None,
                   help="with a bench JSON: vLLM's KV block count (else --server-log, else "
                   "our memory formula)")
    p.add_argument("--server-log", default=None,
                   help="with a bench JSON: the vllm serve log (KV cache size, settings)")
    p.add_argument("--bench-json", default=None,
                   help="also write the simulated run as a vllm bench serve result JSON")
    p.add_argument("--json", dest="json_out", help="write the report here")
    p.add_argument("--model-config", help="HF config.json when the model is not in the catalog")
    p.add_argument(
        "--sync", action="store_true", help="synchronous scheduling (vLLM default is async; "
        "with a bench JSON use --no-async-scheduling in --server-args)"
    )
    p.add_argument(
        "--step-overhead-us",
        type=float,
        default=None,
        help=f"host-side cost per step (default {EngineConfig().step_overhead_us})",
    )
    p.add_argument(
        "--frontend", choices=FRONTEND_MODES, default=None,
        help="the front end between client and engine (default: what the truth implies: "
        "in_process for a ground-truth folder, api_server for a vllm bench serve result; "
        "none: the client sees the engine's instants, as the reference simulator)",
    )
    p.add_argument(
        "--reference-dp",
        action="store_true",
        help="DP rounds as the reference simulator prices them (every batch padded to the "
        "group's largest, MoE experts on the member's own tokens) instead of as vLLM runs them",
    )


def main(args: argparse.Namespace) -> int:
    if args.sync and Path(args.truth).is_file():
        raise ConfigError("--sync: a vllm bench serve result's scheduling comes from "
                          "--server-args; add --no-async-scheduling there instead")
    base = EngineConfig(async_scheduling=not args.sync)
    if args.step_overhead_us is not None:
        base = replace(base, step_overhead_us=args.step_overhead_us)
    run = run_validation(
        args.truth, args.workload, args.profiles, model_config=args.model_config, base=base,
        reference_dp=args.reference_dp, server_args=args.server_args, hardware=args.hardware,
        num_gpu_blocks=args.num_gpu_blocks, server_log=args.server_log,
        frontend=args.frontend,
    )
    for name, source in run.report["bundle_sources"].items():
        print(f"profiles: {name}: {source}")
    for name, source in run.report["comm_sources"].items():
        print(f"collectives: {name}: {source}")
    server = run.report.get("server")
    if server:
        print(f"server: {server['model']} on {server['hardware']}, KV capacity from "
              f"{server['kv_capacity_source']}; ignored flags: "
              f"{', '.join(server['ignored_flags']) or 'none'}")
    print(f"requests: {run.report['completed_requests']} completed, "
          f"{run.report['failed_requests']} failed (left out on both sides); times from the "
          f"{run.report['time_anchor']}")
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
    if args.bench_json:
        print(f"bench result: {write_bench_json(run, args.bench_json)}")
    return 0
