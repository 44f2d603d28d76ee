"""A sweep point's ``cluster`` group as a deployment: replicas, TP/PP/DP/EP, P/D, KV tiers.

Shape of one point (all counts per point):

- ``num_instances`` serving replicas behind the router (``cluster.router``);
- each replica is one vLLM engine with ``tensor_parallel_size`` × ``pipeline_parallel_size``
  GPUs, or, with ``data_parallel_size`` = D > 1, D DP ranks of that size. For a MoE model the
  D ranks form one lock-step DP group (vLLM runs dummy batches on idle ranks, pads the
  batches to the group's largest when all run as CUDA graphs, and with EP each rank's experts
  process every rank's tokens; ``profiles.parallel.dp_pad.VllmDpPad``); for a dense
  model vLLM's DP ranks are independent engines, so they are D more replicas;
- ``expert_parallel_size``: 1 (no EP) or tp × D, vLLM's ``enable_expert_parallel`` degree;
- ``pd_disaggregation``: the first ``num_prefill_instances`` replicas are prefill instances,
  the rest decode instances; the KV hand-off is timed over the hardware's interconnect;
- ``prefix_storage`` ``cpu`` / ``cxl``: a prefix-cache tier below the NPU (``cpu``: one host-DRAM
  pool per replica; ``cxl``: one pool shared by all replicas);
- ``comm_backend``: ``analytical`` (the embedded model of ASTRA-Sim's analytical network, the
  default) or ``astra_sim`` with ``astra_sim_binary`` the path of a built
  ``AstraSim_Analytical_Congestion_Unaware`` (``astra_bridge.backend``).

:func:`point_plan` converts the point to the one deployment description
(``profiles.deployment.DeploymentPlan``) and :func:`build_deployment` assembles it
(``profiles.deployment.assemble``: KV capacity, bundle, step latency with the collectives over
the hardware's interconnect, ``interconnect_bw_gbs`` / ``interconnect_latency_ns`` of the
catalog entry). Errors name the ``cluster.`` / ``hardware.`` key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astra_bridge import CommBackend
from astra_bridge.memory import MemoryTier, TierKind
from engine.deployment import Deployment
from engine.frontend import FrontEndSpec
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec, SettingError
from profiles.catalog import load_hardware, load_model
from profiles.deployment import (
    BundleSource,
    DeploymentPlan,
    InstancePlan,
    Links,
    TierPlan,
    assemble,
)
from sweep.settings import PREFIX, engine_config

# Host DRAM and CXL defaults for the prefix tiers (GiB, GB/s, ns): a typical 2-socket server
# and one CXL 2.0 memory expander.
CPU_TIER = (512.0, 256.0, 0.0)
CXL_TIER = (1024.0, 60.0, 250.0)
# A hardware entry without an interconnect bandwidth: PCIe 4.0 x16-class links (GB/s).
DEFAULT_LINK_BW_GBS = 16.0


def comm_backend(cl: Any) -> CommBackend:
    """The point's collective backend; a bad value names ``cluster.comm_backend`` or
    ``cluster.astra_sim_binary``. A relative binary path is taken from the directory the sweep
    started in (a bare name is looked up on ``PATH``)."""
    from sweep.validate import resolve_path  # sweep.validate imports this module

    binary = cl.astra_sim_binary
    if binary is not None and ("/" in str(binary) or str(binary).startswith("~")):
        binary = str(resolve_path(str(Path(str(binary)).expanduser())))
    try:
        return CommBackend(str(cl.comm_backend), binary)
    except SettingError as err:
        raise err.named(PREFIX) from None


def check_shape(cl: Any, model: ModelSpec) -> None:
    """Validate the deployment part of ``cluster`` against the model; one clear error naming
    the key. The engine settings' own checks (PP vs layers, experts vs EP, ...) are
    ``EngineConfig.check_model``'s (``sweep.settings.engine_config``)."""
    for key in ("num_instances", "pipeline_parallel_size", "data_parallel_size", "expert_parallel_size"):
        v = cl[key]
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"cluster.{key}={v!r} is not allowed; allowed: an integer >= 1")
    tp, dp, ep = cl.tensor_parallel_size, cl.data_parallel_size, cl.expert_parallel_size
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
    comm_backend(cl)


def bundle_source(bundle: Any, resolve: Any = None) -> BundleSource:
    """``hardware.bundle`` as a bundle source (``resolve`` makes its root absolute)."""
    root = str(resolve(bundle.root)) if resolve and bundle.root else bundle.root
    if bundle.source in ("roofline", "aiconfigurator"):
        return BundleSource(generate="always", generator=bundle.source, variant=bundle.variant,
                            cache=root)
    return BundleSource(root=root, generate="never", variant=bundle.variant)


def point_plan(
    cl: Any,
    model: ModelSpec,
    hardware: HardwareSpec,
    config: EngineConfig,
    bundle: BundleSource,
) -> DeploymentPlan:
    """The deployment one point's ``cluster`` group describes (see the module docstring)."""
    check_shape(cl, model)
    tp, pp, dp, ep = (
        int(cl.tensor_parallel_size),
        int(cl.pipeline_parallel_size),
        int(cl.data_parallel_size),
        int(cl.expert_parallel_size),
    )
    lockstep = model.is_moe and dp > 1
    if (config.tensor_parallel_size, config.pipeline_parallel_size,
            config.expert_parallel_size) != (tp, pp, ep):
        raise ConfigError("point_plan: the engine settings' parallel sizes differ from the "
                          "cluster's; convert them with sweep.settings.engine_config(cluster)")
    links = Links(
        bw_gbs=(hardware.interconnect_bw_gbs or DEFAULT_LINK_BW_GBS,),
        latency_ns=(hardware.interconnect_latency_ns,),
        local_mem_bw_gbs=hardware.hbm_bw_gbs,
        hand_set=False,  # the catalog's figures: measured collective tables win
    )
    storage = str(cl.prefix_storage).lower()
    n_pre = int(cl.num_prefill_instances) if cl.pd_disaggregation else 0
    instances: list[InstancePlan] = []
    for replica in range(int(cl.num_instances)):
        role = "colocated" if not cl.pd_disaggregation else (
            "prefill" if replica < n_pre else "decode"
        )
        for rank in range(dp):
            tiers: tuple[TierPlan, ...] = ()
            if storage == "cpu":
                size, bw, lat = CPU_TIER
                tiers = (TierPlan(("cpu", len(instances)), MemoryTier(TierKind.HOST_DRAM, bw, lat),
                                  int(size * 2**30)),)
            elif storage == "cxl":
                size, bw, lat = CXL_TIER
                tiers = (TierPlan(("cxl", 0), MemoryTier(TierKind.CXL, bw, lat),
                                  int(size * 2**30)),)
            instances.append(InstancePlan(
                f"r{replica}" + (f".dp{rank}" if dp > 1 else ""),
                model,
                hardware,
                config,
                bundle,
                links,
                role=role,
                dp_group=f"r{replica}" if lockstep else None,
                dp_size=dp if lockstep else 1,
                tiers=tiers,
            ))
    return DeploymentPlan(tuple(instances), router=str(cl.router), comm_backend=comm_backend(cl),
                          frontend=FrontEndSpec(mode=str(cl.frontend)))


def deployment_plan(cfg: Any) -> DeploymentPlan:
    """The deployment plan of the composed point ``cfg``: its ``cluster`` group on
    ``hardware`` with ``model`` and the ``hardware.bundle`` profiles (no bundle loaded yet)."""
    from sweep.validate import resolve_path

    model = load_model(cfg.model.name)
    hardware = load_hardware(cfg.hardware.name)
    return point_plan(cfg.cluster, model, hardware, engine_config(cfg.cluster, model),
                      bundle_source(cfg.hardware.bundle, resolve_path))


def build_deployment(cfg: Any) -> Deployment:
    """The assembled deployment of the composed point ``cfg`` (:func:`deployment_plan`).

    Raises ``ConfigError`` naming the key for a bad value, ``InfeasibleError`` (a
    ``ConfigError``) when the model does not fit an instance's memory, ``BundleError`` for a
    missing or damaged bundle."""
    return assemble(deployment_plan(cfg))
