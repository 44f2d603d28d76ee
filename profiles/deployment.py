"""The typed description of a deployment and the one place it becomes engine input.

Front ends describe what runs where as a :class:`DeploymentPlan`: ``sweep.cluster`` from a
sweep point's ``cluster`` group, ``analysis.scenario`` from a reference (LLMServingSim)
cluster JSON. :func:`assemble` turns a plan into the engine's
:class:`engine.deployment.Deployment`, the same way for both:

* each instance's KV capacity (:func:`engine.memory.kv_capacity`), computed once, which also
  refuses a model that does not fit (``InfeasibleError``); its KV bytes per token
  (``KVCapacity.kv_bytes_per_token``) sizes the prefix-cache tiers below the NPU;
* each instance's profile bundle (:class:`BundleSource`: measured, generated roofline, or
  measured with a roofline fallback) and its step latency
  (:func:`profiles.parallel.latency.latency_for_instance`: per-rank compute plus collectives
  over the instance's links, priced by the plan's :class:`astra_bridge.CommBackend`, or by
  aiconfigurator's measured tables where the links are the catalog's:
  :func:`profiles.parallel.comm.collective_source`, reported by :func:`comm_sources`),
  memoised per (bundle, model, layout, links, backend) for the process, wrapped with weight
  streaming where a placement keeps weights off the NPU (``profiles.placement``);
* the P/D hand-off of the prefill instances (``profiles.parallel.pd_transfer``) and the
  padding of lock-step DP groups (``profiles.parallel.dp_pad``).

The prefix-cache pools are built fresh by every assembly (they hold state), the latency
models are shared (they hold only memos).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from astra_bridge import CommBackend
from astra_bridge.memory import MemoryTier
from engine.deployment import ROLES, Deployment, InstanceSpec
from engine.frontend import FrontEndSpec
from engine.kv_tiers import SharedTierPools, chunk_tokens_for
from engine.memory import kv_capacity
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec
from profiles.aiconfigurator import ensure_bundle as aiconfigurator_bundle
from profiles.bundle import BundleError, ProfileBundle, load_bundle, variant_name
from profiles.catalog import list_hardware
from profiles.parallel.comm import collective_source
from profiles.parallel.dp_pad import dp_pad_for
from profiles.parallel.latency import ParallelLatencyModel, latency_for_instance
from profiles.parallel.layout import ParallelLayout
from profiles.parallel.pd_transfer import ClusterKvTransfer, KvHandoff, pd_handoff
from profiles.placement import WeightPlacement
from profiles.roofline import ensure_bundle

BUNDLE_MODES = ("never", "always", "fallback")
GENERATORS = ("roofline", "aiconfigurator")
DP_PADDINGS = ("vllm", "reference")


@dataclass(frozen=True, slots=True)
class BundleSource:
    """Where an instance's profile bundle comes from.

    ``generate``: ``"never"`` (the measured bundle under ``root``), ``"always"`` (a roofline
    bundle, cached under ``cache``, default ``profiles.roofline.cache_dir()``) or
    ``"fallback"`` (the measured one, else a roofline bundle when the hardware has peak
    figures in the catalog, with a note). ``variant`` defaults to the model's dtype / KV-cache
    dtype variant (``profiles.bundle.variant_name``). ``generator`` says what an ``"always"``
    bundle is generated from: ``"roofline"`` or ``"aiconfigurator"`` (NVIDIA's measured vLLM
    operator tables, ``profiles.aiconfigurator``, cached under the same root).
    """

    root: str | None = None
    generate: str = "never"
    variant: str | None = None
    cache: str | None = None
    generator: str = "roofline"

    def __post_init__(self) -> None:
        if self.generate not in BUNDLE_MODES:
            raise ConfigError(f"bundle generate={self.generate!r}; use one of {BUNDLE_MODES}")
        if self.generator not in GENERATORS:
            raise ConfigError(f"bundle generator={self.generator!r}; use one of {GENERATORS}")
        if self.generate != "always" and not self.root:
            raise ConfigError("bundle root: required unless the bundle is generated (roofline)")


@dataclass(frozen=True, slots=True)
class Links:
    """What an instance's collectives and loads cross: per-dimension link bandwidth (GB/s,
    GB = 2**30 B) and latency (ns) of its topology (the last value repeated for further
    dimensions, as the reference does), the NPU's HBM bandwidth (the collectives' local
    reduction) and the host DRAM bandwidth (the step's token-id load), GB/s. ``hand_set``:
    the figures are the cluster config's own (they then price the collectives); False when
    they are the hardware catalog's, where measured collective tables win
    (:func:`profiles.parallel.comm.collective_source`)."""

    bw_gbs: tuple[float, ...]
    latency_ns: tuple[float, ...]
    local_mem_bw_gbs: float
    host_mem_bw_gbs: float = 256.0
    hand_set: bool = True


@dataclass(frozen=True, slots=True)
class TierPlan:
    """A prefix-cache tier below the NPU: a pool of ``capacity_bytes`` on ``tier``, shared by
    every instance of the deployment naming the same ``scope`` (e.g. ``("cpu", node)``)."""

    scope: tuple[str, int]
    tier: MemoryTier
    capacity_bytes: int


@dataclass(frozen=True)
class InstancePlan:
    """One serving instance (one vLLM engine, or one rank of a DP group).

    ``config`` holds its engine settings with the parallel degrees (tensor, pipeline, expert);
    ``dp_size`` is the number of DP members its collectives span (the DP group of a MoE model's
    experts; 1 for an independent engine); ``dp_group`` names the members that step in
    lock-step (None: an independent engine). ``placement`` keeps some weights off the NPU.
    """

    name: str
    model: ModelSpec
    hardware: HardwareSpec
    config: EngineConfig
    bundle: BundleSource
    links: Links
    role: str = "colocated"
    dp_group: str | None = None
    dp_size: int = 1
    tiers: tuple[TierPlan, ...] = ()
    placement: WeightPlacement | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"instance {self.name!r}: role={self.role!r}; use one of {ROLES}")
        if self.tiers and not self.config.enable_prefix_caching:
            raise ConfigError(f"instance {self.name!r}: a prefix-cache tier below the NPU needs "
                              "enable_prefix_caching=true")

    @property
    def layout(self) -> ParallelLayout:
        c = self.config
        return ParallelLayout(tp=c.tensor_parallel_size, pp=c.pipeline_parallel_size,
                              ep=c.expert_parallel_size, dp=self.dp_size)


@dataclass(frozen=True)
class DeploymentPlan:
    """The one typed description of a deployment: its instances, the router policy, the
    collective backend, how the P/D hand-off is priced (``pd_streamed``: the reference's
    layer-streamed KV instead of vLLM's connectors) and how lock-step DP groups are padded
    (``dp_padding``: ``"vllm"`` or the reference's). ``notes`` carry what the front end
    ignored or chose (they reach ``Deployment.notes``)."""

    instances: tuple[InstancePlan, ...]
    router: str = "least_loaded"
    comm_backend: CommBackend = field(default_factory=CommBackend)
    pd_streamed: bool = False
    dp_padding: str = "vllm"
    # The API server in front of every engine (engine.frontend; None: the client sees the
    # engine's instants, as the reference simulator assumes).
    frontend: FrontEndSpec | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.instances:
            raise ConfigError("the deployment has no instances")
        names = [i.name for i in self.instances]
        if len(set(names)) != len(names):
            raise ConfigError(f"instance names must be unique, got {names}")
        if self.dp_padding not in DP_PADDINGS:
            raise ConfigError(f"dp_padding={self.dp_padding!r}; use one of {DP_PADDINGS}")

    @property
    def num_gpus(self) -> int:
        return sum(i.config.tensor_parallel_size * i.config.pipeline_parallel_size
                   for i in self.instances)


def resolve_bundle(src: BundleSource, hardware: HardwareSpec, model: ModelSpec, tp: int,
                   kv_cache_dtype: str) -> tuple[ProfileBundle, str | None]:
    """The bundle ``src`` names for (hardware, model, TP), and a note when a roofline bundle
    stands in for a missing measured one."""
    variant = src.variant or variant_name(model.dtype, kv_cache_dtype)
    cache = Path(src.cache) if src.cache else None
    if src.generate == "always" and src.generator == "aiconfigurator":
        vdir = aiconfigurator_bundle(hardware, model, tp, variant=variant, cache=cache)
        return load_bundle(vdir), None
    if src.generate == "always":
        return load_bundle(ensure_bundle(hardware, model, tp, variant=variant, cache=cache)), None
    assert src.root is not None
    try:
        return load_bundle(src.root, hardware.name, model.name, variant), None
    except BundleError as exc:
        measured_missing = not (Path(src.root) / hardware.name / model.name / variant).is_dir()
        if not (src.generate == "fallback" and measured_missing):
            raise
        if hardware.peak_bf16_tflops <= 0:
            raise BundleError(
                f"{exc} No roofline fallback either: hardware {hardware.name!r} is not in the "
                f"catalog ({', '.join(list_hardware())}); add a profiles/hardware/<name>.yaml "
                "entry"
            ) from exc
    vdir = ensure_bundle(hardware, model, tp, variant=variant, cache=cache)
    return load_bundle(vdir), (
        f"no measured bundle for {hardware.name}/{model.name}/{variant} under {src.root}; "
        f"priced with a generated roofline bundle ({vdir}; error vs measured bundles: "
        "docs/roofline.md)"
    )


def bundle_sources(plan: DeploymentPlan) -> dict[str, str]:
    """Where each instance's step latencies come from, by instance name: its bundle's
    ``ProfileBundle.source`` (``measured bundle <path>``, ``aiconfigurator <version>
    <system>`` or ``roofline``). Bundles are loaded from the loader's cache."""
    out = {}
    for inst in plan.instances:
        bundle, _ = resolve_bundle(inst.bundle, inst.hardware, inst.model,
                                   inst.config.tensor_parallel_size, inst.config.kv_cache_dtype)
        out[inst.name] = bundle.source
    return out


def comm_sources(plan: DeploymentPlan) -> dict[str, str]:
    """Where each instance's TP / EP collectives are priced from, by instance name
    (:func:`profiles.parallel.comm.collective_source`'s label)."""
    return {inst.name: collective_source(inst.hardware, inst.links.hand_set,
                                         plan.comm_backend).label
            for inst in plan.instances}


_LATENCY_MEMO = 64
_latencies: OrderedDict[tuple[object, ...], tuple[ProfileBundle, ParallelLatencyModel]] = (
    OrderedDict()
)


def _latency(bundle: ProfileBundle, inst: InstancePlan,
             backend: CommBackend) -> ParallelLatencyModel:
    """The instance's step model, shared by every assembly of the same inputs (its memo stays
    warm across the points of a sweep)."""
    layout, links = inst.layout, inst.links
    collectives = collective_source(inst.hardware, links.hand_set, backend)
    key = (str(bundle.path), tuple(sorted(bundle.tps)), inst.model, layout, links, backend,
           collectives)
    hit = _latencies.get(key)
    if hit is not None and hit[0] is bundle:
        _latencies.move_to_end(key)
        return hit[1]
    lat = latency_for_instance(
        bundle, inst.model, tp=layout.tp, pp=layout.pp, ep=layout.ep, dp=layout.dp,
        link_bw_gbs=links.bw_gbs, link_latency_ns=links.latency_ns, hardware=inst.hardware,
        local_mem_bw_gbs=links.local_mem_bw_gbs, host_mem_bw_gbs=links.host_mem_bw_gbs,
        backend=backend, collectives=collectives,
    )
    _latencies[key] = (bundle, lat)
    if len(_latencies) > _LATENCY_MEMO:
        _latencies.popitem(last=False)
    return lat


def _dp_config(instances: Sequence[InstancePlan]) -> EngineConfig | None:
    """The engine settings of the deployment's lock-step DP groups (vLLM's DP ranks share one
    engine config; the engine refuses members that disagree)."""
    for inst in instances:
        if inst.dp_group is not None:
            return inst.config
    return None


def assemble(plan: DeploymentPlan) -> Deployment:
    """The engine's deployment for ``plan`` (see the module docstring)."""
    pools = SharedTierPools()
    notes = list(plan.notes)
    warnings: list[str] = []
    handoffs: dict[str, KvHandoff] = {}
    instances: list[InstanceSpec] = []
    for inst in plan.instances:
        cfg = inst.config
        tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
        capacity = kv_capacity(inst.model, inst.hardware, cfg)
        bundle, note = resolve_bundle(inst.bundle, inst.hardware, inst.model, tp,
                                      cfg.kv_cache_dtype)
        if note:
            notes.append(f"{inst.name}: {note}")
        for msg in bundle.beyond_profiled_range(cfg.max_num_batched_tokens, cfg.max_num_seqs):
            if msg not in warnings:
                warnings.append(msg)
        lat = _latency(bundle, inst, plan.comm_backend)
        if inst.role == "prefill":
            links = inst.links
            handoffs[inst.name] = pd_handoff(
                lat, links.bw_gbs, links.latency_ns, links.local_mem_bw_gbs,
                kv_cache_dtype=cfg.kv_cache_dtype, backend=plan.comm_backend,
            )
        step = lat
        if inst.placement is not None and inst.placement.streams:
            step = inst.placement.wrap(lat)
            notes.append(f"{inst.name}: {inst.placement.describe()}")
        tiers = [
            pools.get(t.scope, t.tier, capacity_bytes=t.capacity_bytes,
                      chunk_tokens=chunk_tokens_for(cfg.block_size),
                      kv_bytes_per_token=capacity.kv_bytes_per_token)
            for t in inst.tiers
        ]
        instances.append(InstanceSpec(
            inst.name, inst.model, inst.hardware, cfg, step, capacity, role=inst.role,
            dp_group=inst.dp_group, tiers=tiers, recall_requesters=tp * pp,
        ))
    dp_cfg = _dp_config(plan.instances)
    return Deployment(
        instances=instances,
        router=plan.router,
        kv_transfer_ns=ClusterKvTransfer(handoffs, streamed=plan.pd_streamed) if handoffs else None,
        dp_pad=dp_pad_for(plan.dp_padding, dp_cfg) if dp_cfg is not None else None,
        frontend=plan.frontend,
        num_gpus=plan.num_gpus,
        notes=notes,
        range_warnings=warnings,
    )
