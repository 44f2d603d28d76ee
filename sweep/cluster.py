"""A sweep point's ``cluster`` group as engine instances: replicas, TP/PP/DP/EP, P/D, KV tiers.

Shape of one point (all counts per point):

- ``num_instances`` serving replicas behind the router (``cluster.router``);
- each replica is one vLLM engine with ``tensor_parallel_size`` × ``pipeline_parallel_size``
  GPUs, or, with ``data_parallel_size`` = D > 1, D DP ranks of that size. For a MoE model the
  D ranks form one lock-step DP group (vLLM runs dummy batches on idle ranks, pads the
  batches to the group's largest when all run as CUDA graphs, and with EP each rank's experts
  process every rank's tokens; ``profiles.parallel.VllmDpPad``); for a dense
  model vLLM's DP ranks are independent engines, so they are D more replicas;
- ``expert_parallel_size``: 1 (no EP) or tp × D, vLLM's ``enable_expert_parallel`` degree;
- ``pd_disaggregation``: the first ``num_prefill_instances`` replicas are prefill instances,
  the rest decode instances; the KV hand-off is timed over the hardware's interconnect;
- ``prefix_storage`` ``cpu`` / ``cxl``: a prefix-cache tier below the NPU (``cpu``: one host-DRAM
  pool per replica; ``cxl``: one pool shared by all replicas).

Step latency comes from ``profiles.parallel.latency_for_instance``: per-rank compute from the
profile bundle plus TP all-reduces, EP collectives and PP sends over the hardware's
interconnect (``interconnect_bw_gbs`` / ``interconnect_latency_ns`` of the catalog entry).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from astra_bridge.memory import MemoryTier, TierKind
from engine.kv_tiers import KVTierPool, SharedTierPools, chunk_tokens_for
from engine.memory import kv_capacity
from engine.simulate import InstanceSpec
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec
from profiles.bundle import ProfileBundle
from profiles.parallel import (
    VllmDpPad,
    cluster_kv_transfer,
    cudagraph_max_tokens,
    latency_for_instance,
)

# Host DRAM and CXL defaults for the prefix tiers (GiB, GB/s, ns): a typical 2-socket server
# and one CXL 2.0 memory expander.
CPU_TIER = (512.0, 256.0, 0.0)
CXL_TIER = (1024.0, 60.0, 250.0)


@dataclass(slots=True)
class PointCluster:
    """Everything ``engine.simulate_cluster`` needs for one sweep point."""

    instances: list[InstanceSpec]
    router: str
    kv_transfer_ns: Any
    dp_pad: Any
    num_gpus: int


def gpus_per_point(cl: Any) -> int:
    return (
        int(cl.num_instances)
        * int(cl.data_parallel_size)
        * int(cl.tensor_parallel_size)
        * int(cl.pipeline_parallel_size)
    )


def check_shape(cl: Any, model: ModelSpec) -> None:
    """Validate the cluster shape against the model; one clear error naming the key."""
    for key in ("num_instances", "pipeline_parallel_size", "data_parallel_size", "expert_parallel_size"):
        v = cl[key]
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"cluster.{key}={v!r} is not allowed; allowed: an integer >= 1")
    tp, pp, dp, ep = (
        cl.tensor_parallel_size,
        cl.pipeline_parallel_size,
        cl.data_parallel_size,
        cl.expert_parallel_size,
    )
    if pp > model.num_layers:
        raise ConfigError(
            f"cluster.pipeline_parallel_size={pp} is not allowed; allowed: 1..{model.num_layers} "
            f"(the layers of {model.name})"
        )
    if ep > 1:
        if not model.is_moe:
            raise ConfigError(
                f"cluster.expert_parallel_size={ep} is not allowed for the dense model "
                f"{model.name}; allowed: 1"
            )
        if ep != tp * dp:
            raise ConfigError(
                f"cluster.expert_parallel_size={ep} is not allowed; allowed: 1 or "
                f"tensor_parallel_size × data_parallel_size = {tp * dp} (vLLM spreads the "
                "experts over every TP × DP rank)"
            )
        if model.num_experts % ep:
            raise ConfigError(
                f"cluster.expert_parallel_size={ep} does not divide the {model.num_experts} "
                f"experts of {model.name}"
            )
    storage = str(cl.prefix_storage).lower()
    if storage not in ("none", "cpu", "cxl"):
        raise ConfigError(f"cluster.prefix_storage={cl.prefix_storage!r}; allowed: none, cpu, cxl")
    if storage != "none" and not cl.enable_prefix_caching:
        raise ConfigError(
            f"cluster.prefix_storage={cl.prefix_storage} needs cluster.enable_prefix_caching=true"
        )
    if cl.pd_disaggregation:
        n_pre = cl.num_prefill_instances
        if not 1 <= n_pre < cl.num_instances:
            raise ConfigError(
                f"cluster.num_prefill_instances={n_pre} is not allowed with "
                f"cluster.num_instances={cl.num_instances}; allowed: 1.."
                f"{cl.num_instances - 1} (at least one prefill and one decode instance)"
            )
    elif cl.num_prefill_instances:
        raise ConfigError(
            f"cluster.num_prefill_instances={cl.num_prefill_instances} needs "
            "cluster.pd_disaggregation=true"
        )


def build_point_cluster(
    cl: Any,
    model: ModelSpec,
    hardware: HardwareSpec,
    config: EngineConfig,
    bundle: ProfileBundle,
) -> PointCluster:
    """Engine instances for one point (see the module docstring)."""
    check_shape(cl, model)
    tp, pp, dp, ep = (
        int(cl.tensor_parallel_size),
        int(cl.pipeline_parallel_size),
        int(cl.data_parallel_size),
        int(cl.expert_parallel_size),
    )
    lockstep = model.is_moe and dp > 1
    config = replace(
        config,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        expert_parallel_size=ep if model.is_moe else 1,
    )
    link_bw = hardware.interconnect_bw_gbs or 16.0
    link_lat = hardware.interconnect_latency_ns
    storage = str(cl.prefix_storage).lower()
    pools = SharedTierPools()
    cap = kv_capacity(model, hardware, config)
    bpt = cap.bytes_per_block // config.block_size * tp * pp
    models: dict[str, Any] = {}

    def latency(role: str) -> Any:
        if role not in models:
            models[role] = latency_for_instance(
                bundle,
                model,
                tp=tp,
                pp=pp,
                ep=ep if model.is_moe else 1,
                dp=dp if lockstep else 1,
                link_bw_gbs=link_bw,
                link_latency_ns=link_lat,
                hardware=hardware,
                kv_cache_dtype=config.kv_cache_dtype,
                pd=role == "prefill",
            )
        return models[role]

    instances: list[InstanceSpec] = []
    n_pre = int(cl.num_prefill_instances) if cl.pd_disaggregation else 0
    for replica in range(int(cl.num_instances)):
        role = "colocated" if not cl.pd_disaggregation else (
            "prefill" if replica < n_pre else "decode"
        )
        for rank in range(dp):
            name = f"r{replica}" + (f".dp{rank}" if dp > 1 else "")
            tiers: list[KVTierPool] = []
            if storage == "cpu":
                size, bw, lat = CPU_TIER
                tiers.append(
                    pools.get(
                        ("cpu", len(instances)),
                        MemoryTier(TierKind.HOST_DRAM, bw, lat),
                        capacity_bytes=int(size * 2**30),
                        chunk_tokens=chunk_tokens_for(config.block_size),
                        kv_bytes_per_token=bpt,
                    )
                )
            elif storage == "cxl":
                size, bw, lat = CXL_TIER
                tiers.append(
                    pools.get(
                        ("cxl", 0),
                        MemoryTier(TierKind.CXL, bw, lat),
                        capacity_bytes=int(size * 2**30),
                        chunk_tokens=chunk_tokens_for(config.block_size),
                        kv_bytes_per_token=bpt,
                    )
                )
            instances.append(
                InstanceSpec(
                    name,
                    model,
                    hardware,
                    config,
                    latency(role),
                    role=role,
                    dp_group=f"r{replica}" if lockstep else None,
                    tiers=tiers,
                    recall_requesters=tp * pp,
                )
            )
    return PointCluster(
        instances=instances,
        router=str(cl.router),
        kv_transfer_ns=cluster_kv_transfer() if cl.pd_disaggregation else None,
        dp_pad=VllmDpPad(cudagraph_max_tokens(config.max_num_seqs, config.max_num_batched_tokens))
        if lockstep else None,
        num_gpus=gpus_per_point(cl),
    )
