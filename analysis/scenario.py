"""Run an LLMServingSim cluster config (``configs/cluster/*.json``) unchanged on our engine.

``reference_plan`` turns a parsed :class:`analysis.groundtruth.ClusterSpec` into the one
deployment description (``profiles.deployment.DeploymentPlan``): the reference's parallelism
inference, its 14 per-instance runtime overrides on top of the run-wide engine settings,
hardware from our catalog (memory size and bandwidth from the config), the links, the P/D
roles, DP groups and the prefix-cache tier below the NPU (``prefix_storage`` CPU or CXL,
private or shared as ``--enable-prefix-sharing``). ``build_reference_cluster`` assembles it
(``profiles.deployment.assemble``: KV capacity, a communication-aware latency model per
instance, the P/D KV hand-off, DP padding).

An instance whose (hardware, model) has no measured bundle under the profiles root is priced with
a generated roofline bundle (``profiles.roofline``) when the hardware is in our catalog, and the
run's notes say so (``roofline_fallback=False`` makes the missing bundle an error instead).

Deliberate differences from the reference (docs/validation.md): a lower-tier recall is priced at
the tier's own bandwidth (the reference bills CPU bandwidth even for CXL); weights placed on CXL
or host memory stream from there every step (``profiles.placement``).
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from analysis.groundtruth import (
    INSTANCE_OVERRIDES,
    ClusterSpec,
    InstanceSpec,
    load_cluster_config,
)
from astra_bridge import CommBackend
from astra_bridge.memory import MemoryTier, TierKind
from engine.deployment import Deployment
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec, SettingError
from profiles.catalog import load_hardware, load_model, model_from_hf_config
from profiles.deployment import (
    BundleSource,
    DeploymentPlan,
    InstancePlan,
    Links,
    TierPlan,
    assemble,
)
from profiles.parallel.layout import ParallelLayout, layout_for_instance
from profiles.placement import placement_for_instance

UNLIMITED = 1 << 30  # the reference maps 0 to "no limit" for max_num_seqs / batched tokens

# The reference's per-instance runtime overrides (its CLI flags) that are EngineConfig fields
# by the same name: every one of them but ``dtype`` (a model property) and the unsupported ones.
_OVERRIDES = tuple(
    key for key in INSTANCE_OVERRIDES if key in {f.name for f in fields(EngineConfig)}
)
# Reference features that change timing and that we do not model: refuse rather than ignore.
_UNSUPPORTED = ("enable_local_offloading", "enable_attn_offloading", "enable_sub_batch_interleaving")


def resolve_model(name: str, model_configs: Path | None = None,
                  models: dict[str, ModelSpec] | None = None) -> ModelSpec:
    """The model ``name``: from ``models`` (specs that take precedence), the catalog (names
    and aliases), or ``<model_configs>/<name>.json`` (an HF config), in that order."""
    models = models or {}
    if name in models:
        return models[name]
    try:
        return load_model(name)
    except ConfigError:
        if model_configs is not None:
            path = model_configs / f"{name}.json"
            if path.is_file():
                return model_from_hf_config(path, name=name)
        raise


def _hardware(inst: InstanceSpec) -> HardwareSpec:
    mem = inst.npu_mem
    try:
        hw = load_hardware(inst.hardware)  # names and aliases (H100 -> H100-SXM)
    except ConfigError:
        return HardwareSpec(inst.hardware, float(mem.mem_size), float(mem.mem_bw), 0.0, 0.0)
    return replace(hw, name=inst.hardware, mem_gib=float(mem.mem_size), hbm_bw_gbs=float(mem.mem_bw))


def _engine_config(
    inst: InstanceSpec, model: ModelSpec, base: EngineConfig, layout: ParallelLayout, where: str
) -> EngineConfig:
    """``base`` with the instance's overrides, memory share and parallel layout, converted
    once (``EngineConfig`` checks the result; an override's error names its key at ``where``)."""
    ov = inst.overrides
    for key in _UNSUPPORTED:
        if ov.get(key):
            raise ConfigError(f"instance override {key}=true is not supported by servesweep")
    values: dict[str, Any] = {key: ov[key] for key in _OVERRIDES if key in ov}
    if values.get("max_num_seqs") == 0:
        values["max_num_seqs"] = UNLIMITED
    if values.get("max_num_batched_tokens") == 0:
        values["max_num_batched_tokens"] = model.max_position_embeddings
    if inst.npu_mem.mem_util is not None:  # the reference's name for gpu_memory_utilization
        values["gpu_memory_utilization"] = float(inst.npu_mem.mem_util)
    values.update(
        tensor_parallel_size=layout.tp,
        pipeline_parallel_size=layout.pp,
        expert_parallel_size=layout.ep if model.is_moe else 1,
    )
    try:
        return replace(base, **values)
    except SettingError as err:  # name the cluster-config key when the value came from there
        raise (err.named(f"{where}.") if err.field in ov else err) from None


def reference_plan(
    cluster: ClusterSpec,
    profiles_root: str | Path,
    *,
    base: EngineConfig | None = None,
    prefix_storage: str | None = None,
    prefix_sharing: bool = False,
    model_configs: str | Path | None = None,
    models: dict[str, ModelSpec] | None = None,
    streamed_pd: bool = False,
    reference_dp: bool = False,
    roofline_fallback: bool = True,
    comm_backend: CommBackend | None = None,
    router: str = "least_loaded",
    bundle: BundleSource | None = None,
) -> DeploymentPlan:
    """The deployment a reference cluster config describes (see the module docstring).

    ``models`` maps model names to specs that take precedence over the catalog;
    ``model_configs`` is a folder of HF configs (``<org>/<name>.json``) for models the catalog
    lacks. ``streamed_pd`` selects the reference's layer-streamed P/D hand-off;
    ``reference_dp`` its DP rounds (every batch padded to the group's largest, MoE experts priced
    on the member's own tokens, dense groups in lock-step too) instead of vLLM's
    (:class:`profiles.parallel.dp_pad.VllmDpPad`; dense DP ranks are independent engines);
    ``roofline_fallback`` a generated bundle where no measured one exists (see module docstring);
    ``comm_backend`` the collective backend (default: the embedded analytical model);
    ``router`` the policy spreading requests over the instances; ``bundle`` where every
    instance's profile bundle comes from (default: ``profiles_root``, with the roofline
    fallback when ``roofline_fallback``)."""
    base = base or EngineConfig()
    storage = (prefix_storage or "none").lower()
    if storage not in ("none", "cpu", "cxl"):
        raise ConfigError(f"prefix_storage={prefix_storage!r}; use None, 'CPU' or 'CXL'")
    if storage == "cxl" and cluster.cxl_mem is None:
        raise ConfigError("prefix_storage='CXL' needs a cxl_mem block in the cluster config")
    mc = Path(model_configs) if model_configs else None
    if bundle is None:
        bundle = BundleSource(root=str(profiles_root),
                              generate="fallback" if roofline_fallback else "never")
    notes: list[str] = []
    all_insts = cluster.instances
    out: list[InstancePlan] = []
    index = 0
    for node_id, node in enumerate(cluster.nodes):
        if node.power is not None:
            notes.append(f"node {node_id}: power modelling is not supported; timing is unaffected")
        if node.cpu_mem.pim_config:
            notes.append(
                f"node {node_id}: cpu_mem.pim_config ignored (PIM attention offloading is off "
                "unless enabled, and servesweep does not model it)"
            )
        for k, inst in enumerate(node.instances):
            name = f"instance{index}"
            model = resolve_model(inst.model_name, mc, models)
            layout = layout_for_instance(inst, all_insts, model)
            hw = _hardware(inst)
            cfg = _engine_config(inst, model, base, layout, f"nodes[{node_id}].instances[{k}]")
            if "dtype" in inst.overrides:
                model = replace(model, dtype=inst.overrides["dtype"])
            tiers: tuple[TierPlan, ...] = ()
            if storage != "none":
                if not cfg.enable_prefix_caching:
                    raise ConfigError(
                        f"{name}: prefix_storage={prefix_storage} needs prefix caching on"
                    )
                if storage == "cpu":
                    mem = node.cpu_mem
                    tier = MemoryTier(TierKind.HOST_DRAM, float(mem.mem_bw), float(mem.mem_latency))
                    scope = ("cpu", node_id) if prefix_sharing else ("cpu-private", index)
                else:
                    mem = cluster.cxl_mem
                    assert mem is not None
                    tier = MemoryTier(TierKind.CXL, float(mem.mem_bw), float(mem.mem_latency))
                    scope = ("cxl", 0) if prefix_sharing else ("cxl-private", index)
                tiers = (TierPlan(scope, tier, int(float(mem.mem_size) * 2**30)),)
            if inst.dp_group is not None and not (reference_dp or model.is_moe):
                note = (f"dp_group {inst.dp_group!r}: {model.name} is dense; vLLM runs its DP ranks "
                        "as independent engines (no lock-step)")
                if note not in notes:
                    notes.append(note)
            out.append(InstancePlan(
                name,
                model,
                hw,
                cfg,
                bundle,
                Links(bw_gbs=tuple(cluster.link_bw), latency_ns=tuple(cluster.link_latency),
                      local_mem_bw_gbs=float(inst.npu_mem.mem_bw),
                      host_mem_bw_gbs=float(node.cpu_mem.mem_bw)),
                role={None: "colocated", "prefill": "prefill", "decode": "decode"}[inst.pd_type],
                # vLLM runs non-MoE DP ranks as independent engines (EngineCoreProc, not
                # DPEngineCoreProc): no lock-step, no dummy batches. The reference does not.
                dp_group=inst.dp_group if reference_dp or model.is_moe else None,
                dp_size=layout.dp,
                tiers=tiers,
                placement=placement_for_instance(inst.placement, cluster, node_id, model,
                                                 tp=layout.tp),
            ))
            index += 1
    return DeploymentPlan(
        tuple(out),
        router=router,
        comm_backend=comm_backend or CommBackend(),
        pd_streamed=streamed_pd,
        dp_padding="reference" if reference_dp else "vllm",
        notes=tuple(notes),
    )


def build_reference_cluster(cluster: ClusterSpec, profiles_root: str | Path,
                            **kwargs: Any) -> Deployment:
    """The assembled deployment of a reference cluster config (``reference_plan``'s keyword
    arguments)."""
    return assemble(reference_plan(cluster, profiles_root, **kwargs))


def load_reference_cluster(path: str | Path, profiles_root: str | Path, **kwargs: Any) -> Deployment:
    return build_reference_cluster(load_cluster_config(path), profiles_root, **kwargs)
