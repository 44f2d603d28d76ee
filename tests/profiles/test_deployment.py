"""profiles.deployment: the typed deployment description and the one assembly of it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from astra_bridge.memory import MemoryTier, TierKind
from engine.memory import kv_capacity
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec
from profiles.bundle import BundleError, clear_bundle_cache
from profiles.catalog import load_hardware, load_model
from profiles.deployment import (
    BundleSource,
    DeploymentPlan,
    InstancePlan,
    Links,
    TierPlan,
    assemble,
    resolve_bundle,
)
from profiles.parallel.dp_pad import VllmDpPad, cudagraph_max_tokens, pad_dp_group
from profiles.parallel.latency import ParallelLatencyModel
from profiles.parallel.pd_transfer import ClusterKvTransfer
from tests.profiles.test_bundle import write_bundle

HW = load_hardware("RTXPRO6000")
LLAMA = load_model("meta-llama/Llama-3.1-8B")
CFG = EngineConfig()
LINKS = Links(bw_gbs=(16.0,), latency_ns=(20000.0,), local_mem_bw_gbs=HW.hbm_bw_gbs)
HOST = MemoryTier(TierKind.HOST_DRAM, 256.0)


@pytest.fixture(scope="module")
def measured(shared_data: Path) -> BundleSource:
    return BundleSource(root=str(shared_data / "llmservingsim" / "profiles"))


def inst(name: str, src: BundleSource, **kw) -> InstancePlan:
    return InstancePlan(name, LLAMA, HW, kw.pop("config", CFG), src, LINKS, **kw)


def test_resolve_bundle_picks_the_kv_dtype_variant(tmp_path: Path) -> None:
    clear_bundle_cache()
    tiny = ModelSpec(name="test/tiny", model_type="llama", num_layers=2, hidden_size=64,
                     num_attention_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                     vocab_size=1000, max_position_embeddings=4096)
    hw = HardwareSpec("TESTGPU", 24.0, 1000.0, 0.0, 0.0)
    write_bundle(tmp_path, variant="bf16-kvfp8")
    bundle, note = resolve_bundle(BundleSource(root=str(tmp_path)), hw, tiny, 1, "fp8")
    assert bundle.path.name == "bf16-kvfp8" and note is None
    with pytest.raises(BundleError, match=r"test/tiny/bf16: profile bundle directory not found"):
        resolve_bundle(BundleSource(root=str(tmp_path)), hw, tiny, 1, "auto")
    # no fallback for hardware the catalog has no peak figures for
    with pytest.raises(BundleError, match="No roofline fallback either"):
        resolve_bundle(BundleSource(root=str(tmp_path), generate="fallback"), hw, tiny, 1, "auto")


def test_capacity_once_tiers_shared_by_scope_and_fresh_per_assembly(measured) -> None:
    tier = TierPlan(("cpu", 0), HOST, 1 << 30)
    plan = DeploymentPlan((inst("a", measured, tiers=(tier,)), inst("b", measured, tiers=(tier,))))
    dep = assemble(plan)
    a, b = dep.instances
    assert a.capacity == kv_capacity(LLAMA, HW, CFG)
    assert a.tiers[0] is b.tiers[0]  # one pool for the scope
    assert a.tiers[0].kv_bytes_per_token == a.capacity.kv_bytes_per_token
    assert a.recall_requesters == 1 and dep.num_gpus == 2
    again = assemble(plan)
    assert again.instances[0].latency is a.latency  # memo shared across assemblies
    assert again.instances[0].tiers[0] is not a.tiers[0]  # pools hold state: never shared
    assert dep.kv_transfer_ns is None and dep.dp_pad is None


def test_pd_prefill_instances_get_a_handoff(measured) -> None:
    dep = assemble(DeploymentPlan((inst("p", measured, role="prefill"),
                                   inst("d", measured, role="decode"))))
    assert isinstance(dep.kv_transfer_ns, ClusterKvTransfer)
    assert set(dep.kv_transfer_ns.handoffs) == {"p"}
    assert dep.kv_transfer_ns("p", "d", 100) > dep.kv_transfer_ns("p", "d", 10) > 0
    assert isinstance(dep.instances[0].latency, ParallelLatencyModel)


def test_dp_groups_are_padded_as_the_plan_says(measured) -> None:
    cfg = replace(CFG, max_num_seqs=64)
    group = (inst("dp0", measured, config=cfg, dp_group="g", dp_size=2),
             inst("dp1", measured, config=cfg, dp_group="g", dp_size=2))
    pad = assemble(DeploymentPlan(group)).dp_pad
    assert isinstance(pad, VllmDpPad) and pad.cudagraph_max == cudagraph_max_tokens(64, 2048)
    assert assemble(DeploymentPlan(group, dp_padding="reference")).dp_pad is pad_dp_group


def test_limits_beyond_the_profiled_range_are_warned_once(measured) -> None:
    wide = replace(CFG, max_num_batched_tokens=1 << 16)
    dep = assemble(DeploymentPlan((inst("a", measured, config=wide),
                                   inst("b", measured, config=wide))))
    assert len(dep.range_warnings) == 1 and "extrapolate" in dep.range_warnings[0]
    assert assemble(DeploymentPlan((inst("a", measured),))).range_warnings == []


def test_a_model_that_does_not_fit_is_refused_at_assembly(measured) -> None:
    from engine.specs import InfeasibleError

    tiny_gpu = replace(HW, mem_gib=8.0)
    with pytest.raises(InfeasibleError, match="does not fit on RTXPRO6000"):
        assemble(DeploymentPlan((InstancePlan("a", LLAMA, tiny_gpu, CFG, measured, LINKS),)))


def test_plan_errors_name_the_problem(measured) -> None:
    with pytest.raises(ConfigError, match="no instances"):
        DeploymentPlan(())
    with pytest.raises(ConfigError, match="unique"):
        DeploymentPlan((inst("a", measured), inst("a", measured)))
    with pytest.raises(ConfigError, match="dp_padding='lockstep'"):
        DeploymentPlan((inst("a", measured),), dp_padding="lockstep")
    with pytest.raises(ConfigError, match="role='standby'"):
        inst("a", measured, role="standby")
    with pytest.raises(ConfigError, match="needs enable_prefix_caching=true"):
        inst("a", measured, config=replace(CFG, enable_prefix_caching=False),
             tiers=(TierPlan(("cpu", 0), HOST, 1 << 30),))
    with pytest.raises(ConfigError, match="generate='sometimes'"):
        BundleSource(root="x", generate="sometimes")
    with pytest.raises(ConfigError, match="root: required"):
        BundleSource()
