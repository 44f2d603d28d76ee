"""Which source prices the TP / EP collectives (profiles.parallel.comm) and the measured
network built from aiconfigurator's tables."""

from __future__ import annotations

import pytest

from astra_bridge import CommBackend
from profiles.catalog import load_hardware, load_model
from profiles.parallel.comm import (
    CUDA_GRAPH_MAX_TOKENS,
    MEASURED,
    MeasuredNetwork,
    collective_source,
)
from profiles.parallel.latency import latency_for_instance
from profiles.parallel.layout import ParallelLayout, build_network

pytest.importorskip("aiconfigurator_core")
from profiles.aiconfigurator.tables import custom_allreduce_table, nccl_table  # noqa: E402

H100 = load_hardware("H100-SXM")
LLAMA = load_model("meta-llama/Llama-3.1-8B")


def test_hand_set_links_keep_the_analytical_model():
    src = collective_source(H100, True, CommBackend())
    assert src.kind == "analytical" and "cluster config" in src.label


def test_catalog_links_take_the_measured_tables_at_the_engines_vllm():
    src = collective_source(H100, False, CommBackend())
    assert src.kind == MEASURED and src.system == "h100_sxm"
    assert src.allreduce_version == "0.19.0"  # h100_sxm ships 0.19.0 beside 0.24.0
    assert src.label.startswith("aiconfigurator 0.12.0 h100_sxm")
    # L40S has no 0.19.0 all-reduce table: its newest at or below the system's version.
    assert collective_source(load_hardware("L40S"), False, CommBackend()).allreduce_version == "0.22.0"
    # A GPU without an aiconfigurator system: the analytical model over the catalog link.
    assert collective_source(load_hardware("RTX4090"), False, CommBackend()).kind == "analytical"


def test_measured_network_prices_from_the_tables_and_falls_back():
    src = collective_source(H100, False, CommBackend())
    layout = ParallelLayout(tp=2)
    analytical = build_network(layout, 450.0, 600.0, H100.hbm_bw_gbs, None)
    graph_max = CUDA_GRAPH_MAX_TOKENS * LLAMA.hidden_size * 2
    net = MeasuredNetwork(src, analytical, graph_max)
    flags = layout.tp_flags()
    small, big = 16 * 4096 * 2, 2048 * 4096 * 2
    graph = custom_allreduce_table("h100_sxm", graph=True, version="0.19.0")
    eager = custom_allreduce_table("h100_sxm", graph=False, version="0.19.0")
    assert net.collective_ns("all-reduce", small, involved_dims=flags) == round(graph(2, small) * 1e3)
    assert net.collective_ns("all-reduce", big, involved_dims=flags) == round(eager(2, big) * 1e3)
    ag = nccl_table("h100_sxm", "all_gather")
    assert net.collective_ns("all-gather", small, involved_dims=flags) == round(ag(2, small) * 1e3)
    # No measured rows for 16 GPUs: the analytical model.
    wide = build_network(ParallelLayout(tp=16), 450.0, 600.0, H100.hbm_bw_gbs, None)
    wnet = MeasuredNetwork(src, wide, graph_max)
    assert wnet.collective_ns("all-reduce", small) == wide.collective_ns("all-reduce", small)
    assert wnet.p2p_ns(small, 0, 1) == wide.p2p_ns(small, 0, 1)


def test_latency_model_uses_the_source_it_is_given(tmp_path, monkeypatch):
    from profiles.bundle import load_bundle
    from profiles.roofline import ensure_bundle

    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path))
    bundle = load_bundle(ensure_bundle(H100, LLAMA, 2, cache=tmp_path))
    kw = dict(tp=2, hardware=H100, link_bw_gbs=450.0, link_latency_ns=600.0)
    plain = latency_for_instance(bundle, LLAMA, **kw)
    hand = latency_for_instance(bundle, LLAMA, **kw,
                                collectives=collective_source(H100, True, CommBackend()))
    measured = latency_for_instance(bundle, LLAMA, **kw,
                                    collectives=collective_source(H100, False, CommBackend()))
    assert hand.tp_allreduce_ns(1024) == plain.tp_allreduce_ns(1024)
    eager = custom_allreduce_table("h100_sxm", graph=False, version="0.19.0")  # > 512 tokens
    assert measured.tp_allreduce_ns(1024) == round(eager(2, 1024 * 4096 * 2) * 1e3)
    assert measured.tp_allreduce_ns(1024) > plain.tp_allreduce_ns(1024)
