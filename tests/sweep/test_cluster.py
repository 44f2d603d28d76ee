"""sweep.cluster: a point's cluster group as the one deployment description (no simulation)."""

from __future__ import annotations

import pytest
from hydra import compose

from astra_bridge import CommBackend
from engine.specs import ConfigError
from profiles.catalog import load_hardware, load_model
from sweep.cluster import bundle_source, point_plan
from sweep.schema import register
from sweep.settings import engine_config

register()
pytestmark = pytest.mark.usefixtures("hydra_conf")


def plan_of(*overrides: str):
    cfg = compose("config", overrides=list(overrides))
    model = load_model(cfg.model.name)
    return point_plan(cfg.cluster, model, load_hardware(cfg.hardware.name),
                      engine_config(cfg.cluster, model), bundle_source(cfg.hardware.bundle))


def test_moe_dp_ranks_form_one_lockstep_group():
    plan = plan_of("model=qwen3_30b_a3b", "cluster=dp2_ep2")
    assert [i.name for i in plan.instances] == ["r0.dp0", "r0.dp1"]
    assert {i.dp_group for i in plan.instances} == {"r0"}
    assert all(i.layout.ep == 2 and i.layout.dp == 2 for i in plan.instances)
    assert plan.num_gpus == 2


def test_dense_dp_ranks_are_independent_replicas():
    plan = plan_of("cluster.data_parallel_size=2")
    assert [i.dp_group for i in plan.instances] == [None, None]
    assert all(i.dp_size == 1 for i in plan.instances)


def test_pd_roles_tiers_links_and_backend():
    plan = plan_of("cluster=pd_1p2d", "cluster.prefix_storage=cpu")
    assert [i.role for i in plan.instances] == ["prefill", "decode", "decode"]
    assert [i.tiers[0].scope for i in plan.instances] == [("cpu", 0), ("cpu", 1), ("cpu", 2)]
    hw = plan.instances[0].hardware
    assert plan.instances[0].links.bw_gbs == (hw.interconnect_bw_gbs,)
    assert plan.comm_backend == CommBackend()
    cxl = plan_of("cluster=tp1_x4", "cluster.prefix_storage=cxl")
    assert {i.tiers[0].scope for i in cxl.instances} == {("cxl", 0)}  # one shared pool


def test_bundle_source_follows_hardware_bundle():
    src = plan_of().instances[0].bundle
    assert (src.generate, src.variant) == ("always", "bf16")
    measured = plan_of("hardware=rtxpro6000_measured").instances[0].bundle
    assert measured.generate == "never" and measured.root


def test_bad_backend_names_the_cluster_key():
    with pytest.raises(ConfigError, match=r"^cluster\.comm_backend='ns3' is not allowed"):
        plan_of("cluster.comm_backend=ns3")
    with pytest.raises(ConfigError, match=r"^cluster\.astra_sim_binary=None is not allowed"):
        plan_of("cluster.comm_backend=astra_sim")
