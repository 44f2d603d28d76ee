"""The one place where a composed sweep config becomes engine calls and plain results.

``run_point(cfg)`` builds the specs, the latency model and the workload, runs
``engine.simulate`` and returns plain data (numbers, lists, Parquet bytes) that can cross
process boundaries and be logged by the driver. Loaded specs, latency models (profile
bundles) and workloads are cached at module level, so a long-lived Ray actor keeps them
warm across the jobs it runs.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import time
from functools import cache, lru_cache
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from analysis.answers import point_answers
from analysis.slo import SloSpec
from engine import HardwareSpec, ModelSpec, RequestSpec
from engine.batch import LatencyModel
from engine.simulate import simulate_cluster
from engine.specs import GIB
from profiles.bundle import ProfileBundle, load_bundle
from profiles.catalog import load_hardware, load_model
from profiles.parallel import latency_for_instance
from profiles.roofline import ensure_bundle
from sweep.cluster import PointCluster, build_point_cluster, gpus_per_point
from sweep.settings import engine_config
from sweep.validate import check_config, length_dist, resolve_path
from workloads import read_jsonl, synthetic

NS_PER_MS = 1_000_000
log = logging.getLogger(__name__)


@cache
def model_spec(name: str) -> ModelSpec:
    return load_model(name)


@cache
def hardware_spec(name: str) -> HardwareSpec:
    return load_hardware(name)


@lru_cache(maxsize=16)
def profile_bundle(
    source: str, root: str | None, variant: str, hardware: str, model: str, tp: int
) -> ProfileBundle:
    """The profile bundle of one (hardware, model, TP): generated (roofline) or measured."""
    hw, spec = hardware_spec(hardware), model_spec(model)
    if source == "roofline":
        cache = resolve_path(root) if root else None
        return load_bundle(ensure_bundle(hw, spec, tp, variant=variant, cache=cache))
    assert root is not None
    return load_bundle(resolve_path(root), hw.name, spec.name, variant)


@lru_cache(maxsize=16)
def latency_model(
    source: str, root: str | None, variant: str, hardware: str, model: str, tp: int
) -> LatencyModel:
    """The step latency of one (hardware, model, TP) instance: per-rank compute from the
    bundle plus TP all-reduces over the hardware's interconnect."""
    hw, spec = hardware_spec(hardware), model_spec(model)
    return latency_for_instance(
        profile_bundle(source, root, variant, hardware, model, tp),
        spec,
        tp=tp,
        hardware=hw,
        link_bw_gbs=hw.interconnect_bw_gbs or 16.0,
        link_latency_ns=hw.interconnect_latency_ns,
    )


@lru_cache(maxsize=32)
def point_cluster(cluster_key: str, hardware: str, model: str, bundle_key: tuple) -> PointCluster:
    """The engine instances of one cluster shape (cached: latency memos stay warm)."""
    cl = OmegaConf.create(json.loads(cluster_key))
    hw, spec = hardware_spec(hardware), model_spec(model)
    return build_point_cluster(cl, spec, hw, engine_config(cl), profile_bundle(*bundle_key))


def point_cluster_of(cfg: DictConfig) -> PointCluster:
    """The (cached) engine instances of the point ``cfg`` describes."""
    model = model_spec(cfg.model.name)
    hw = hardware_spec(cfg.hardware.name)
    bundle = cfg.hardware.bundle
    bundle_key = (
        bundle.source, bundle.root, bundle.variant, hw.name, model.name,
        int(cfg.cluster.tensor_parallel_size),
    )
    cluster_key = json.dumps(OmegaConf.to_container(cfg.cluster, resolve=True), sort_keys=True)
    return point_cluster(cluster_key, hw.name, model.name, bundle_key)


def warn_beyond_profiled_range(pc: PointCluster) -> list[str]:
    """Log, once for the point, each engine limit above what its profile bundle covers
    (step prices there are extrapolated: ``check_engine`` of the latency model)."""
    msgs: list[str] = []
    for inst in pc.instances:
        for msg in inst.latency.check_engine(inst.config):
            if msg not in msgs:
                msgs.append(msg)
    for msg in msgs:
        log.warning("%s", msg)
    return msgs


@lru_cache(maxsize=8)
def _synthetic(key: str) -> tuple[RequestSpec, ...]:
    return tuple(synthetic(**json.loads(key)))


@lru_cache(maxsize=4)
def _trace(path: str, limit: int | None) -> tuple[RequestSpec, ...]:
    return tuple(read_jsonl(path, limit=limit))


def build_workload(cfg: DictConfig, model: ModelSpec) -> tuple[RequestSpec, ...]:
    """The requests of ``cfg.workload`` (cached: grid points often share a workload)."""
    wl = cfg.workload
    if wl.kind == "trace":
        return _trace(str(resolve_path(wl.path)), wl.limit)
    burstiness = 1.0 if wl.arrival == "poisson" else 1.0 / wl.cv**2
    args = {
        "rate": float(wl.rate),
        "num_requests": wl.num_requests,
        "duration_s": wl.duration_s,
        "input_len": dataclasses.asdict(length_dist(wl, "input_len")),
        "output_len": dataclasses.asdict(length_dist(wl, "output_len")),
        "seed": int(wl.seed),
        "burstiness": burstiness,
        "shared_prefix_len": int(wl.shared_prefix_len),
        "num_prefix_groups": int(wl.num_prefix_groups),
        "vocab_size": model.vocab_size,
    }
    return _synthetic(json.dumps(args, sort_keys=True))


def _engine_metrics(result: Any, requests: pd.DataFrame) -> dict[str, float]:
    ts = result.timeseries
    cap = result.kv_capacity
    return {
        "kv_usage_pct_mean": float(ts["kv_usage_pct"].mean()) if len(ts) else 0.0,
        "kv_usage_pct_max": float(ts["kv_usage_pct"].max()) if len(ts) else 0.0,
        "waiting_max": float(ts["waiting"].max()) if len(ts) else 0.0,
        "num_preemptions": float(result.num_preemptions),
        "preempted_requests": float((requests["num_preemptions"] > 0).sum()),
        "prefix_hit_tokens": float(result.prefix_hit_tokens),
        "prefix_hit_rate": result.prefix_hit_rate,  # vLLM's: hits / queried tokens
        "queueing_delay_ms_mean": float(requests["queueing_delay_ns"].mean()) / NS_PER_MS,
        "makespan_s": result.makespan_ns / 1e9,
        "sim_wall_s": float(result.wall_s),
        "num_steps": float(result.num_steps),
        "kv_num_blocks": float(cap.num_blocks),
        "kv_tokens": float(cap.tokens),
        "kv_gib_per_rank": cap.num_blocks * cap.bytes_per_block / GIB,
    }


def deployment_usd_per_hour(cfg: DictConfig, hw: HardwareSpec) -> tuple[float, int]:
    """``(USD per hour, GPUs)`` of the point's deployment: every GPU of the cluster shape at
    ``hardware.cost_per_hour`` (default: the catalog price)."""
    price = cfg.hardware.cost_per_hour
    gpu_hour = hw.cost_per_hour if price is None else float(price)
    gpus = gpus_per_point(cfg.cluster)
    return gpu_hour * gpus, gpus


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def run_point(cfg: DictConfig) -> dict[str, Any]:
    """Simulate one grid point; return ``{"metrics", "params", "slo_margins", "timeseries",
    "requests_parquet"}``.

    ``metrics`` maps names to floats: the answers of ``analysis.answers.point_answers``
    (analysis metrics, the SLO verdict ``slo_met`` with the observed statistics, goodput,
    cost) and the engine's (KV usage, preemptions, prefix hit rate, simulated makespan, wall
    times); ``params`` are the SLO bounds as params (``slo.ttft_ms_p99.bound``);
    ``slo_margins`` each bound's log(observed / bound); ``timeseries`` maps the per-second
    columns to lists; ``requests_parquet`` is the per-request frame as Parquet.
    """
    t0 = time.perf_counter()
    check_config(cfg)
    model = model_spec(cfg.model.name)
    hw = hardware_spec(cfg.hardware.name)
    pc = point_cluster_of(cfg)
    warn_beyond_profiled_range(pc)
    workload = build_workload(cfg, model)
    result = simulate_cluster(
        pc.instances, workload, router=pc.router, kv_transfer_ns=pc.kv_transfer_ns,
        dp_pad=pc.dp_pad, seed=int(cfg.workload.seed),
    )
    requests = result.requests
    usd_per_hour, gpus = deployment_usd_per_hour(cfg, hw)
    answers = point_answers(requests, SloSpec.from_config(cfg.slo), usd_per_hour, gpus)
    metrics = dict(answers.metrics)
    metrics.update(_engine_metrics(result, requests))
    metrics["job_wall_s"] = time.perf_counter() - t0
    return {
        "metrics": metrics,
        "params": answers.params,
        "slo_margins": answers.slo.margins,
        "timeseries": {c: result.timeseries[c].tolist() for c in result.timeseries.columns},
        "requests_parquet": _parquet_bytes(requests),
    }

