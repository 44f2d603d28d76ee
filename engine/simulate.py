"""The engine's public entry points: replay a workload on one instance or on a cluster."""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from engine.batch import LatencyModel
from engine.cluster import Router, run_cluster
from engine.deployment import Deployment, DpPad, InstanceSpec, KvTransfer
from engine.frontend import ApiServer, FrontEndSpec
from engine.instance import EngineUnit, Member
from engine.kv_cache import KVCacheManager, PrefixCacheStats
from engine.memory import KVCapacity, kv_capacity
from engine.request import Request
from engine.results import RequestRecords, RequestStream, SimulationResult, timeseries_frame
from engine.scheduler import Scheduler
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec
from engine.workload import RequestSpec


def _check_spec(i: int, spec: RequestSpec, prev: int | None, max_model_len: int) -> None:
    """One clear message for request ``i`` of the workload if vLLM could not serve it (or it
    is out of order: ``prev`` is the previous request's arrival)."""
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


def _checked_specs(workload: Iterable[RequestSpec], max_model_len: int) -> Iterator[RequestSpec]:
    """``workload``'s requests, checked (``_check_spec``) before any work when it is a
    sequence, each as it is read otherwise (a generator is never held in memory)."""
    if isinstance(workload, Sequence):
        if not workload:
            raise ConfigError("workload is empty: give at least one request")
        prev = None
        for i, spec in enumerate(workload):
            _check_spec(i, spec, prev, max_model_len)
            prev = spec.arrival_ns
        yield from workload
        return
    prev = None
    i = -1
    for i, spec in enumerate(workload):
        _check_spec(i, spec, prev, max_model_len)
        prev = spec.arrival_ns
        yield spec
    if i < 0:
        raise ConfigError("workload is empty: give at least one request")


def _member(spec: InstanceSpec) -> tuple[Member, KVCapacity, int]:
    config = spec.config
    cap = spec.capacity
    max_model_len = config.model_len(spec.model)
    kv = KVCacheManager(
        cap.num_blocks,
        config.block_size,
        max_model_len,
        config.enable_prefix_caching,
        tiers=spec.tiers,
        kv_bytes_per_token=cap.kv_bytes_per_token,
        recall_requesters=spec.recall_requesters,
    )
    sched = Scheduler(
        kv,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=min(config.max_num_batched_tokens, max_model_len),
        max_model_len=max_model_len,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        reserve_full_isl=config.reserve_full_isl,
        async_scheduling=config.async_scheduling,
        enable_chunked_prefill=config.enable_chunked_prefill,
        pipeline_parallel=config.pipeline_parallel_size > 1,
    )
    return Member(spec.name, sched, spec.latency, spec.role), cap, max_model_len


@contextmanager
def _collect_run_objects_only() -> Iterator[None]:
    """Run the block with the cyclic garbage collector looking only at objects created in it:
    everything alive before (modules, bundles, the workload) is moved to the permanent
    generation (``gc.freeze``) and back after. A full collection during a run otherwise walks
    every object of the process: a quarter of the CPU of a 300-request replay. Left alone
    when the caller froze objects itself."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def simulate_cluster(
    instances: Sequence[InstanceSpec],
    workload: Iterable[RequestSpec],
    *,
    router: str = "least_loaded",
    seed: int = 0,
    kv_transfer_ns: KvTransfer | None = None,
    dp_pad: DpPad | None = None,
    frontend: FrontEndSpec | None = None,
    stream_to: str | Path | None = None,
    chunk_rows: int = 4096,
) -> SimulationResult:
    """Simulate a cluster of instances serving ``workload``.

    ``workload`` is a sequence of requests sorted by arrival, checked before the run starts,
    or any iterable of them (a generator), read lazily and checked request by request: the
    engine creates each ``Request`` when it is due and keeps only its compact record once it
    finishes (``engine.results.RequestRecords``), so a generator's run holds only the
    requests in flight.

    ``stream_to``: write the per-request table to this Parquet file while the run goes on,
    in row groups of ``chunk_rows`` requests (``engine.results.RequestStream``), instead of
    returning it; the result's ``requests`` is then None and ``requests_path`` the file
    (``analysis.metrics.metrics_from_parquet`` reads it). The file holds exactly the rows and
    columns the in-memory table would.

    ``frontend`` puts an API server (``engine.frontend``) in front of every engine unit: the
    workload's arrival times are then the client's send times (``send_ns``), requests reach
    the engine when the server hands them over (``arrival_ns``), and the ``client_*`` columns
    hold what the client sees. Without it the client sees the engine's instants.

    ``kv_transfer_ns(prefill_name, decode_name, tokens)`` prices the P/D hand-off;
    ``dp_pad`` pads the batches of a DP group before pricing (vLLM runs dummy batches on idle
    ranks). Per-request results carry the ``instance`` that finished each request.
    """
    t0 = time.perf_counter()
    if not instances:
        raise ConfigError("the cluster has no instances")
    names = [s.name for s in instances]
    if len(set(names)) != len(names):
        raise ConfigError(f"instance names must be unique, got {names}")
    built = [_member(s) for s in instances]
    max_len = min(b[2] for b in built)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(instances):
        if s.dp_group is not None:
            groups[s.dp_group].append(i)
    units: list[EngineUnit] = []
    done_group: set[str] = set()
    for i, s in enumerate(instances):
        cfg = s.config
        overhead = round(cfg.step_overhead_us * 1000)
        hidden = round(cfg.step_overhead_hidden_ms * 1_000_000)
        if s.dp_group is None:
            units.append(
                EngineUnit(
                    [built[i][0]],
                    step_overhead_ns=overhead,
                    overhead_hidden_ns=hidden,
                    pp=cfg.pipeline_parallel_size,
                )
            )
        elif s.dp_group not in done_group:
            done_group.add(s.dp_group)
            idx = groups[s.dp_group]
            ref = instances[idx[0]]
            for j in idx:
                o = instances[j]
                a, b = o.config, ref.config
                if (
                    a.tensor_parallel_size,
                    a.pipeline_parallel_size,
                    a.expert_parallel_size,
                    a.async_scheduling,
                    a.max_num_seqs,
                    a.max_num_batched_tokens,
                    o.role,
                ) != (
                    b.tensor_parallel_size,
                    b.pipeline_parallel_size,
                    b.expert_parallel_size,
                    b.async_scheduling,
                    b.max_num_seqs,
                    b.max_num_batched_tokens,
                    ref.role,
                ):
                    # vLLM's DP ranks share one engine config (and one CUDA-graph size limit).
                    raise ConfigError(
                        f"dp_group {s.dp_group!r}: members must agree on tensor/pipeline/expert "
                        "parallel sizes, max_num_seqs, max_num_batched_tokens, role and "
                        f"async_scheduling ({ref.name!r} vs {o.name!r})"
                    )
            units.append(
                EngineUnit(
                    [built[j][0] for j in idx],
                    step_overhead_ns=overhead,
                    overhead_hidden_ns=hidden,
                    pp=cfg.pipeline_parallel_size,
                    dp_pad=dp_pad,
                )
            )
    hash_blocks = any(s.config.enable_prefix_caching for s in instances)
    block_size = instances[0].config.block_size
    if any(s.config.block_size != block_size for s in instances):
        raise ConfigError("all instances of a cluster must use the same block_size")
    costs = frontend.costs() if frontend is not None else None
    servers = [ApiServer(costs) for _ in units] if costs is not None else None
    members = [m for u in units for m in u.members]
    names = [m.name for m in members]
    position = {id(m): k for k, m in enumerate(members)}
    # Behind an API server a request's arrival_ns becomes its engine receipt: its send time
    # is kept here while it is in flight.
    sends: dict[int, int] = {}
    first_send: list[int] = []

    def arrivals() -> Iterator[Request]:
        for i, spec in enumerate(specs):
            req = Request(spec, i, block_size, hash_blocks)
            if not first_send:
                first_send.append(req.arrival_ns)
            if servers is not None:
                sends[i] = req.arrival_ns
            yield req

    records = RequestRecords([m.scheduler.token_log for m in members])
    stream: RequestStream | None = None
    if stream_to is not None:
        client = delivered = None
        if servers is not None:
            fe = servers
            unit_of = [ui for ui, u in enumerate(units) for _ in u.members]

            def delivered(k: int) -> list[int]:
                return fe[unit_of[k]].client_ns.get(k, [])

            def client(k: int, lo: int, hi: int) -> np.ndarray:
                return np.asarray(delivered(k)[lo:hi], dtype=np.int64)

        stream = RequestStream(stream_to, records, chunk_rows=chunk_rows, instances=names,
                               client=client, delivered=delivered)
    sink = stream if stream is not None else records
    prefix_hits = 0

    def on_done(req: Request, m: Member) -> None:
        nonlocal prefix_hits
        prefix_hits += req.prefix_hit_tokens
        sink.add(req, sends.pop(req.index, None), position[id(m)])

    specs = _checked_specs(workload, max_len)
    try:
        with _collect_run_objects_only():
            run = run_cluster(units, arrivals(), Router(router, seed),
                              kv_transfer_ns=kv_transfer_ns, frontends=servers, on_done=on_done)
        requests_path = stream.close() if stream is not None else None
    except BaseException:
        if stream is not None:
            stream.abort()
        raise
    start_ns = first_send[0]
    frame = None
    if stream is None:
        client_steps = [np.asarray(c, dtype=np.int64) for c in run.client_step_ns]
        logs = records.logs

        def client_times(k: int, lo: int, hi: int) -> np.ndarray:
            v = client_steps[k]
            assert len(v) == len(logs[k].times), "client times must cover every step"
            return v[lo:hi]

        order = np.argsort(records.column("index"), kind="stable")  # workload order
        frame = records.frame(order, client=client_times if client_steps else None,
                              instances=names)
    prefix = sum((m.kv.prefix_cache_stats() for m in members), PrefixCacheStats())
    result = SimulationResult(
        requests=frame,
        timeseries=timeseries_frame([m.log for m in members], start_ns),
        num_preemptions=sum(m.scheduler.num_preemptions for m in members),
        prefix_hit_tokens=prefix_hits,
        prefix_cache_queries=prefix.queries,
        prefix_cache_hits=prefix.hits,
        makespan_ns=run.end_ns - start_ns,
        kv_capacity=built[0][1],
        wall_s=0.0,
        num_steps=sum(m.num_steps for m in members),
        instance_capacity={s.name: b[1] for s, b in zip(instances, built, strict=True)},
        tier_stats={m.name: m.kv.tier_stats() for m in members},
        requests_path=requests_path,
    )
    result.wall_s = time.perf_counter() - t0
    return result


def simulate_deployment(
    deployment: Deployment,
    workload: Iterable[RequestSpec],
    *,
    seed: int = 0,
    stream_to: str | Path | None = None,
    chunk_rows: int = 4096,
) -> SimulationResult:
    """Simulate ``deployment`` (its instances, router, P/D hand-off and DP padding) serving
    ``workload``; ``seed`` drives the ``random`` router, ``stream_to`` / ``chunk_rows`` as in
    :func:`simulate_cluster`."""
    return simulate_cluster(
        deployment.instances,
        workload,
        router=deployment.router,
        seed=seed,
        kv_transfer_ns=deployment.kv_transfer_ns,
        dp_pad=deployment.dp_pad,
        frontend=deployment.frontend,
        stream_to=stream_to,
        chunk_rows=chunk_rows,
    )


def simulate(
    model: ModelSpec,
    hardware: HardwareSpec,
    config: EngineConfig,
    workload: Sequence[RequestSpec],
    latency: LatencyModel,
) -> SimulationResult:
    """Simulate one vLLM V1 instance serving ``workload`` and return its results.

    ``latency`` prices each step (``profiles.ProfiledLatencyModel`` or a roofline bundle);
    ``config.step_overhead_us`` / ``step_overhead_hidden_ms`` add the exposed host-side
    cost of each step. The KV capacity is ``engine.memory.kv_capacity`` of the three specs.
    """
    cap = kv_capacity(model, hardware, config)
    return simulate_cluster(
        [InstanceSpec("instance0", model, hardware, config, latency, cap)], workload
    )
