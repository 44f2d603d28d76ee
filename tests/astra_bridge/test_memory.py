"""Memory tiers: one access to host DRAM / CXL, which devices serialise, errors."""

from __future__ import annotations

import pytest

from astra_bridge.memory import MemoryTier, TierKind
from engine.specs import ConfigError


def test_kv_recall_from_host_is_latency_plus_stream() -> None:
    host = MemoryTier(TierKind.HOST_DRAM, 256, 250)
    chunk = 32 * 2**20  # one LMCache chunk of Llama-8B (docs/reference-semantics.md §10)
    assert host.access_ns(chunk) == 250 + 131072
    assert host.stream_ns(chunk) == 131072
    assert host.access_ns(0) == 250


def test_cxl_tier_bandwidth_in_decimal_gb() -> None:
    cxl = MemoryTier("CXL:2", 60, 250, 4)
    assert cxl.kind is TierKind.CXL and cxl.num_devices == 4
    assert cxl.access_ns(60_000) == 250 + 1000  # 60 GB/s with GB = 1e9 B


def test_which_devices_serialise() -> None:
    assert MemoryTier(TierKind.HOST_DRAM, 1).serialised
    assert MemoryTier(TierKind.CXL, 1).serialised
    assert not MemoryTier(TierKind.NPU_HBM, 1).serialised


@pytest.mark.parametrize(("name", "kind"), [("REMOTE:0", TierKind.HOST_DRAM),
                                             ("host", TierKind.HOST_DRAM),
                                             ("LOCAL", TierKind.NPU_HBM), ("cxl", TierKind.CXL)])
def test_tier_names_parse(name: str, kind: TierKind) -> None:
    assert TierKind.parse(name) is kind


def test_tier_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="unknown"):
        TierKind.parse("ssd")
    with pytest.raises(ConfigError, match="mem_bw"):
        MemoryTier(TierKind.HOST_DRAM, 0)
    with pytest.raises(ConfigError, match="mem_latency"):
        MemoryTier(TierKind.HOST_DRAM, 1, -1)
    with pytest.raises(ConfigError, match="num_devices"):
        MemoryTier(TierKind.CXL, 1, 0, 0)
