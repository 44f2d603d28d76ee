"""The one place where a composed sweep config becomes engine calls and plain results.

``run_point(cfg)`` builds the point's deployment (``sweep.cluster.build_deployment``, the one
assembly) and workload, runs ``engine.simulate_deployment`` and returns plain data (numbers,
lists, Parquet bytes) that can cross process boundaries and be logged by the driver. Loaded
specs, profile bundles and workloads are cached at module level, so a long-lived Ray actor
keeps them warm across the jobs it runs.
"""

from __future__ import annotations

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
from engine.deployment import Deployment
from engine.simulate import simulate_deployment
from profiles.catalog import load_hardware, load_model
from profiles.deployment import bundle_sources, comm_sources
from sweep.cluster import build_deployment, deployment_plan
from sweep.validate import check_config, resolve_path
from workloads.config import build as build_requests

NS_PER_MS = 1_000_000
log = logging.getLogger(__name__)


@cache
def model_spec(name: str) -> ModelSpec:
    return load_model(name)


@cache
def hardware_spec(name: str) -> HardwareSpec:
    return load_hardware(name)


def point_cluster_of(cfg: DictConfig) -> Deployment:
    """The deployment of the point ``cfg`` describes (``sweep.cluster.build_deployment``; its
    latency models are shared across points, its prefix-cache pools are fresh)."""
    return build_deployment(cfg)


def point_bundle_source(cfg: DictConfig) -> str:
    """Where the point's step latencies come from: ``measured bundle <path>``,
    ``aiconfigurator <version> <system>`` or ``roofline`` (``ProfileBundle.source``; the
    distinct sources of its instances joined by ``; ``)."""
    return "; ".join(sorted(set(bundle_sources(deployment_plan(cfg)).values())))


def point_comm_source(cfg: DictConfig) -> str:
    """Where the point's TP / EP collectives are priced from
    (``profiles.deployment.comm_sources``; distinct sources joined by ``; ``)."""
    return "; ".join(sorted(set(comm_sources(deployment_plan(cfg)).values())))


def warn_beyond_profiled_range(pc: Deployment) -> list[str]:
    """Log, once for the point, each engine limit above what its profile bundles cover
    (step prices there are extrapolated: ``Deployment.range_warnings``)."""
    for msg in pc.range_warnings:
        log.warning("%s", msg)
    return list(pc.range_warnings)


@lru_cache(maxsize=8)
def _workload(key: str, vocab_size: int) -> tuple[RequestSpec, ...]:
    return tuple(build_requests(json.loads(key), vocab_size))


def build_workload(cfg: DictConfig, model: ModelSpec, cache: bool = True,
                   ) -> tuple[RequestSpec, ...]:
    """The requests of ``cfg.workload`` (``workloads.config.build``; cached: grid points
    often share a workload; ``cache=False`` builds without keeping it, for a workload no
    later point shares, such as a capacity probe's rate)."""
    wl = OmegaConf.to_container(cfg.workload, resolve=True)
    assert isinstance(wl, dict)
    if wl["kind"] == "trace":
        wl["path"] = str(resolve_path(wl["path"]))
    key = json.dumps(wl, sort_keys=True)
    if not cache:
        return tuple(build_requests(json.loads(key), model.vocab_size))
    return _workload(key, model.vocab_size)


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
        "kv_gib_per_rank": cap.gib_per_rank,
    }


def deployment_usd_per_hour(cfg: DictConfig, hw: HardwareSpec, gpus: int) -> float:
    """USD per hour of the point's deployment: its ``gpus`` (``Deployment.num_gpus``, the one
    count) at ``hardware.cost_per_hour`` (default: the catalog price)."""
    price = cfg.hardware.cost_per_hour
    gpu_hour = hw.cost_per_hour if price is None else float(price)
    return gpu_hour * gpus


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def run_point(cfg: DictConfig, keep_tables: bool = True, cache_workload: bool = True,
              ) -> dict[str, Any]:
    """Simulate one grid point; return ``{"metrics", "params", "slo_margins", "timeseries",
    "requests_parquet"}``.

    ``metrics`` maps names to floats: the answers of ``analysis.answers.point_answers``
    (analysis metrics, the SLO verdict ``slo_met`` with the observed statistics, goodput,
    cost) and the engine's (KV usage, preemptions, prefix hit rate, simulated makespan, wall
    times); ``params`` are the SLO bounds as params (``slo.ttft_ms_p99.bound``) and
    ``bundle_source``, where the step latencies came from (``point_bundle_source``), and
    ``comm_source``, where its collectives came from (``point_comm_source``);
    ``slo_margins`` each bound's log(observed / bound); ``timeseries`` maps the per-second
    columns to lists; ``requests_parquet`` is the per-request frame as Parquet.
    ``keep_tables=False`` (a capacity probe, which keeps only numbers) leaves the time series
    empty and ``requests_parquet`` None: serialising a fleet check's per-request table
    doubled its process's peak memory. ``cache_workload=False``: the workload is not kept
    for later points (``build_workload``).
    """
    t0 = time.perf_counter()
    check_config(cfg)
    model = model_spec(cfg.model.name)
    hw = hardware_spec(cfg.hardware.name)
    pc = point_cluster_of(cfg)
    warn_beyond_profiled_range(pc)
    workload = build_workload(cfg, model, cache=cache_workload)
    result = simulate_deployment(pc, workload, seed=int(cfg.workload.seed))
    requests = result.requests
    gpus = pc.num_gpus
    usd_per_hour = deployment_usd_per_hour(cfg, hw, gpus)
    answers = point_answers(requests, SloSpec.from_config(cfg.slo), usd_per_hour, gpus)
    metrics = dict(answers.metrics)
    metrics.update(_engine_metrics(result, requests))
    metrics["job_wall_s"] = time.perf_counter() - t0
    params = dict(answers.params)
    params["bundle_source"] = point_bundle_source(cfg)
    params["comm_source"] = point_comm_source(cfg)
    return {
        "metrics": metrics,
        "params": params,
        "slo_margins": answers.slo.margins,
        "timeseries": ({c: result.timeseries[c].tolist() for c in result.timeseries.columns}
                       if keep_tables else {}),
        "requests_parquet": _parquet_bytes(requests) if keep_tables else None,
    }

