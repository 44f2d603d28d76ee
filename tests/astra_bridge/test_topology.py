"""Topology / system-config types, validation and ASTRA-Sim config loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astra_bridge.topology import (
    Dimension,
    DimKind,
    SystemConfig,
    Topology,
    load_network_config,
    load_system_config,
    network_config_to_yaml,
    system_config_from_dict,
    system_config_to_dict,
)
from engine.specs import ConfigError


def test_hops_per_building_block() -> None:
    ring = Dimension(DimKind.RING, 8, 50, 500)
    assert [ring.hops(d) for d in range(1, 8)] == [1, 2, 3, 4, 3, 2, 1]
    assert ring.max_hops == 4
    fc = Dimension("FullyConnected", 8, 50, 500)
    sw = Dimension("switch", 8, 50, 500)
    assert fc.kind is DimKind.FULLY_CONNECTED and sw.kind is DimKind.SWITCH
    assert (fc.hops(3), fc.max_hops, sw.hops(3), sw.max_hops) == (1, 1, 2, 2)


def test_message_time_uses_binary_gigabytes_and_truncates() -> None:
    d = Dimension(DimKind.SWITCH, 4, 1, 10)
    # 2**30 B/s = 1.073741824 B/ns; 1000 B -> 931.32 ns; + 2 hops * 10 ns
    assert d.message_ns(2, 1000) == 951


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"npus": 0}, "npus_count"),
        ({"npus": 2.5}, "npus_count"),
        ({"bandwidth_gbps": 0}, "bandwidth"),
        ({"latency_ns": -1}, "latency"),
        ({"kind": "Torus"}, "unknown topology"),
    ],
)
def test_dimension_validation_names_the_field(kwargs: dict, match: str) -> None:
    base = {"kind": "Ring", "npus": 4, "bandwidth_gbps": 50, "latency_ns": 500} | kwargs
    with pytest.raises(ConfigError, match=match):
        Dimension(**base)


def test_coords_dimension_zero_fastest() -> None:
    t = Topology.from_lists(["Ring", "Switch"], [4, 2], [400, 50], [100, 500])
    assert t.num_npus == 8
    assert t.coords(0) == (0, 0) and t.coords(5) == (1, 1) and t.coords(3) == (3, 0)
    with pytest.raises(ConfigError, match="outside"):
        t.coords(8)


def test_topology_validation() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        Topology(())
    with pytest.raises(ConfigError, match="differ"):
        Topology.from_lists(["Ring", "Switch"], [4], [1, 2], [1, 2])


def test_from_params_builds_intra_and_inter_dimensions() -> None:
    t = Topology.from_params(
        8,
        4,
        intra_bandwidth_gbps=900,
        intra_latency_ns=0,
        inter_bandwidth_gbps=50,
        inter_latency_ns=5000,
    )
    assert [(d.kind, d.npus) for d in t.dims] == [(DimKind.FULLY_CONNECTED, 8), (DimKind.SWITCH, 4)]
    assert len(Topology.from_params(8, intra_bandwidth_gbps=900, intra_latency_ns=0).dims) == 1
    with pytest.raises(ConfigError, match="inter_bandwidth_gbps"):
        Topology.from_params(8, 2, intra_bandwidth_gbps=900, intra_latency_ns=0)


def test_load_shared_network_config(shared_data: Path) -> None:
    path = shared_data / "astra-sim/configs/network/network_Ring4-Switch4_bw400-50_lat100-500.yml"
    t = load_network_config(path)
    assert t == Topology.from_lists(["Ring", "Switch"], [4, 4], [400, 50], [100, 500])


def test_network_yaml_round_trip(tmp_path: Path) -> None:
    t = Topology.from_lists(["Ring", "FullyConnected"], [4, 3], [400.5, 50], [100, 0])
    p = tmp_path / "net.yml"
    p.write_text(network_config_to_yaml(t))
    assert load_network_config(p) == t


def test_bad_network_files(tmp_path: Path) -> None:
    p = tmp_path / "net.yml"
    p.write_text("topology: [Ring]\nnpus_count: [4]\n")
    with pytest.raises(ConfigError, match="missing keys"):
        load_network_config(p)
    p.write_text("topology: [Ring]\nnpus_count: [4]\nbandwidth: [-1]\nlatency: [1]\n")
    with pytest.raises(ConfigError, match="bandwidth"):
        load_network_config(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_network_config(tmp_path / "absent.yml")


def test_load_shared_system_config(shared_data: Path) -> None:
    path = (
        shared_data / "astra-sim/configs/system/system_direct-direct_ac2_ds4_ed10_lmb768_base.json"
    )
    s = load_system_config(path)
    assert (s.active_chunks, s.dataset_splits, s.endpoint_delay_ns) == (2, 4, 10)
    assert s.collective_optimization == "baseline"
    assert s.local_mem_bw_gbps == 768
    assert s.algorithms_for("all-reduce", 2) == ("direct", "direct")


def test_system_config_round_trip_and_defaults(tmp_path: Path) -> None:
    s = SystemConfig(local_mem_bw_gbps=1597).with_algorithms(["ring", "halving_doubling"])
    assert s.algorithms_for("all-gather", 3) == ("ring", "halvingDoubling", "halvingDoubling")
    p = tmp_path / "system.json"
    p.write_text(json.dumps(system_config_to_dict(s)))
    assert load_system_config(p) == s


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"local-mem-bw": None}, "local-mem-bw"),
        ({"preferred-dataset-splits": 0}, "preferred-dataset-splits"),
        ({"active-chunks-per-dimension": 0}, "active-chunks"),
        ({"collective-optimization": "fast"}, "collective-optimization"),
        ({"all-reduce-implementation": ["tree"]}, "unknown collective algorithm"),
    ],
)
def test_system_config_validation(change: dict, match: str) -> None:
    raw: dict = {"local-mem-bw": 768, "endpoint-delay": 10} | change
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError, match=match):
        system_config_from_dict(raw)


def test_package_imports_no_platform_libraries() -> None:
    import subprocess
    import sys

    code = (
        "import sys, astra_bridge, astra_bridge.golden; "
        "bad = [m for m in ('ray', 'hydra', 'mlflow') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
