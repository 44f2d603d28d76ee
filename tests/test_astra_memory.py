"""Memory tiers: reference host-I/O points, tier transfers, FIFO ports, config loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astra_bridge.memory import (
    MemoryModel,
    MemoryPort,
    MemoryTier,
    TierKind,
    load_memory_config,
    memory_model_from_dict,
)
from engine.specs import ConfigError


@pytest.mark.parametrize(
    ("input_bytes", "host_bw", "expected"),
    # timing model §3.5: five independently confirmed iterations
    [(8192, 256, 64), (1240, 256, 8), (8192, 50, 326), (1240, 50, 48), (5288, 256, 40)],
)
def test_host_io_reference_points(input_bytes: int, host_bw: float, expected: int) -> None:
    m = MemoryModel.from_params(hbm_bw_gbps=1597, host_bw_gbps=host_bw)
    assert m.host_io_ns(input_bytes, 4) == expected  # a 4-byte token store costs 0 ns here


def test_host_io_adds_latency_per_transfer() -> None:
    m = MemoryModel.from_params(hbm_bw_gbps=1597, host_bw_gbps=256, host_latency_ns=100)
    assert m.host_io_ns(8192) == 164
    assert m.host_io_ns(8192, 4) == 264
    assert m.host_io_ns(0) == 0


def test_kv_recall_from_host_is_latency_plus_stream() -> None:
    m = MemoryModel.from_params(hbm_bw_gbps=1597, host_bw_gbps=256, host_latency_ns=250)
    chunk = 32 * 2**20  # one LMCache chunk of Llama-8B (serving-core §10.4)
    assert m.transfer_ns(chunk, "cpu", "npu") == 250 + 131072
    assert m.transfer_ns(chunk, "REMOTE:0", "LOCAL") == 250 + 131072
    assert m.transfer_ns(chunk, "npu", "cpu") == 250 + 131072
    assert m.transfer_ns(chunk, "npu", "npu") == 0
    assert m.transfer_ns(0, "cpu", "npu") == 0


def test_concurrent_loads_queue_on_shared_devices() -> None:
    m = MemoryModel.from_params(hbm_bw_gbps=1597, host_bw_gbps=1, host_latency_ns=5)
    assert m.concurrent_load_ns(100, "cpu", 1) == 105
    assert m.concurrent_load_ns(100, "cpu", 4) == 4 * 105
    port = MemoryPort(m.tier("cpu"))
    assert [port.issue(0, 100) for _ in range(4)][-1] == m.concurrent_load_ns(100, "cpu", 4)
    assert m.concurrent_load_ns(100, "npu", 4) == 0
    with pytest.raises(ConfigError, match="requesters"):
        m.concurrent_load_ns(100, "cpu", 0)


def test_cxl_tier_and_lower_to_lower_transfer() -> None:
    m = MemoryModel.from_params(
        hbm_bw_gbps=1597,
        host_bw_gbps=256,
        host_latency_ns=10,
        cxl_bw_gbps=60,
        cxl_latency_ns=250,
        cxl_devices=4,
    )
    assert m.tier("cxl").num_devices == 4
    assert m.transfer_ns(60_000, "CXL:2", "npu") == 250 + 1000
    # host -> CXL: slower bandwidth, both latencies
    assert m.transfer_ns(60_000, "cpu", "cxl") == 260 + 1000


def test_tier_errors_name_the_fix() -> None:
    m = MemoryModel.from_params(hbm_bw_gbps=1597)
    with pytest.raises(ConfigError, match="not configured"):
        m.transfer_ns(10, "cpu", "npu")
    with pytest.raises(ConfigError, match="unknown"):
        m.transfer_ns(10, "ssd", "npu")
    with pytest.raises(ConfigError, match="non-negative"):
        m.transfer_ns(-1, "npu", "npu")
    with pytest.raises(ConfigError, match="mem_bw"):
        MemoryTier(TierKind.HOST_DRAM, 0)
    with pytest.raises(ConfigError, match="more than once"):
        MemoryModel((MemoryTier("cpu", 1), MemoryTier("host", 2)))


def test_shared_devices_serialise_fifo() -> None:
    host = MemoryTier(TierKind.HOST_DRAM, 1, 5)  # 1 GB/s: 1 ns per byte
    port = MemoryPort(host)
    assert port.issue(0, 100) == 105
    assert port.issue(0, 100) == 210  # waits for the first
    assert port.issue(500, 10) == 515  # device idle again
    hbm = MemoryPort(MemoryTier(TierKind.NPU_HBM, 1))
    assert hbm.issue(0, 100) == hbm.issue(0, 100) == 100


def test_load_shared_memory_config(shared_data: Path) -> None:
    m = load_memory_config(shared_data / "astra-sim/configs/memory/memory.json", hbm_bw_gbps=768)
    assert m.tier("cpu").bandwidth_gbps == 256
    assert m.tier("npu").bandwidth_gbps == 768


def test_llmservingsim_style_config_with_cxl(tmp_path: Path) -> None:
    raw = {
        "remote_mem": {
            "memory-type": "PER_NODE_MEMORY_EXPANSION",
            "mem-bw": 256,
            "mem-latency": 0,
            "num-devices": 2,
        },
        "cxl_mem": {
            "memory-type": "MEMORY_POOL",
            "mem-bw": 60,
            "mem-latency": 250,
            "num-devices": 4,
        },
    }
    p = tmp_path / "memory_expansion.json"
    p.write_text(json.dumps(raw))
    m = load_memory_config(p)
    assert m.tier("cxl").latency_ns == 250 and m.tier("cpu").num_devices == 2
    flat = memory_model_from_dict(
        {"memory-type": "PER_NODE_MEMORY_EXPANSION", "remote-mem-bw": 100, "remote-mem-latency": 7}
    )
    assert flat.tier("cpu").access_ns(1000) == 17
    with pytest.raises(ConfigError, match="mem-bw"):
        memory_model_from_dict({"remote_mem": {"mem-latency": 0}})
    with pytest.raises(ConfigError, match="no memory tier"):
        memory_model_from_dict({})
