"""The engine's public entry point: replay a workload on one serving instance."""

from __future__ import annotations

import time
from collections.abc import Sequence

from engine.batch import LatencyModel
from engine.instance import Instance
from engine.kv_cache import KVCacheManager
from engine.memory import kv_capacity
from engine.request import Request
from engine.results import SimulationResult, requests_frame, timeseries_frame
from engine.scheduler import Scheduler
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec
from engine.workload import RequestSpec


def _check_workload(workload: Sequence[RequestSpec], max_model_len: int) -> None:
    if not workload:
        raise ConfigError("workload is empty: give at least one request")
    prev = None
    for i, spec in enumerate(workload):
        if spec.prompt_len < 1:
            raise ConfigError(f"workload request {i} ({spec.request_id!r}) has an empty prompt")
        if spec.output_len < 1:
            raise ConfigError(
                f"workload request {i} ({spec.request_id!r}): output_len={spec.output_len} "
                "must be >= 1"
            )
        if spec.prompt_len + spec.output_len > max_model_len:
            raise ConfigError(
                f"workload request {i} ({spec.request_id!r}) needs {spec.prompt_len} prompt + "
                f"{spec.output_len} output tokens > max_model_len={max_model_len} "
                "(vLLM rejects it); raise max_model_len or drop the request"
            )
        if spec.arrival_ns < 0:
            raise ConfigError(f"workload request {i} ({spec.request_id!r}) arrives before 0 ns")
        if prev is not None and spec.arrival_ns < prev:
            raise ConfigError(
                f"workload request {i} ({spec.request_id!r}) arrives before request {i - 1}; "
                "sort the workload by arrival time"
            )
        prev = spec.arrival_ns


def simulate(
    model: ModelSpec,
    hardware: HardwareSpec,
    config: EngineConfig,
    workload: Sequence[RequestSpec],
    latency: LatencyModel,
) -> SimulationResult:
    """Simulate one vLLM V1 instance serving ``workload`` and return its results.

    ``latency`` prices each step (``profiles.ProfiledLatencyModel`` or a roofline bundle);
    ``config.step_overhead_us`` adds a fixed host-side cost per step.
    """
    t0 = time.perf_counter()
    cap = kv_capacity(model, hardware, config)
    max_model_len = config.max_model_len or model.max_position_embeddings
    _check_workload(workload, max_model_len)
    kv = KVCacheManager(cap.num_blocks, config.block_size, max_model_len, config.enable_prefix_caching)
    sched = Scheduler(
        kv,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=min(config.max_num_batched_tokens, max_model_len),
        max_model_len=max_model_len,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        reserve_full_isl=config.reserve_full_isl,
        async_scheduling=config.async_scheduling,
    )
    requests = [
        Request(spec, i, config.block_size, config.enable_prefix_caching)
        for i, spec in enumerate(workload)
    ]
    inst = Instance(sched, latency, step_overhead_ns=round(config.step_overhead_us * 1000))
    end_ns = inst.run(requests)
    start_ns = requests[0].arrival_ns
    result = SimulationResult(
        requests=requests_frame(requests),
        timeseries=timeseries_frame(inst.log, start_ns),
        num_preemptions=sched.num_preemptions,
        prefix_hit_tokens=sum(r.prefix_hit_tokens for r in requests),
        makespan_ns=end_ns - start_ns,
        kv_capacity=cap,
        wall_s=0.0,
        num_steps=inst.num_steps,
    )
    result.wall_s = time.perf_counter() - t0
    return result
