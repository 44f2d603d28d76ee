"""Memory tiers and memory-transfer timing, as the reference simulator's analytical memory model.

Tiers: the NPU's own HBM (``npu``), host DRAM of a node (``cpu``, ASTRA-Sim's
``PER_NODE_MEMORY_EXPANSION`` "remote memory") and a CXL memory pool (``cxl``, ``MEMORY_POOL``).
Bandwidths are GB/s with GB = 1e9 B (unlike the network, whose GB is 2**30 B).

Formulas (integer ns):

* One access of ``m`` bytes to a lower tier (host DRAM or CXL), the reference's memory-load
  cost (serving-core §9.7, ASTRA-Sim's analytical remote memory):
  ``latency + floor(m / (bw*1e9) * 1e9)``. The HBM side is not charged: reads and writes of
  local HBM are part of the profiled kernel times.
* A transfer between the NPU and a lower tier (KV recall, weight load, KV write-down when
  charged) costs one such access on the lower tier. Between two lower tiers (not a case of the
  reference) the bytes stream at the slower bandwidth and pay both latencies. A transfer within
  one tier, or within HBM, costs 0 ns.
* The per-iteration host I/O term (timing model §1 point 3, §3.5): the batch's input load from
  host memory costs ``2*floor(B_in / bw_host)`` ns plus the host latency, with
  ``B_in = total_len * 2 * weight_bytes`` (the token ids) and the same charge for the output
  store (``4`` bytes per sampled sequence). The factor 2 is the reference's observed behaviour,
  confirmed on five points, not derived; the latency multiplicity was not verified.
* Serialisation: a host-DRAM device serves one request at a time per node and a CXL pool one at
  a time overall (FIFO), while HBM and per-NPU expansions do not queue. :class:`MemoryPort`
  tracks that for callers that issue overlapping transfers;
  :meth:`MemoryModel.concurrent_load_ns` prices the common case of every NPU of an instance
  loading the same bytes at once (the reference bills a KV recall that way).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from astra_bridge.topology import read_config_mapping
from engine.specs import ConfigError

HOST_IO_PASSES = 2
"""Observed multiplier of the host-memory input load per iteration (timing model §3.5)."""


class TierKind(StrEnum):
    """Memory tier, named as the reference's placement names (``npu``, ``cpu``, ``cxl``)."""

    NPU_HBM = "npu"
    HOST_DRAM = "cpu"
    CXL = "cxl"

    @classmethod
    def parse(cls, value: str | TierKind) -> TierKind:
        """Accept ``npu``/``hbm``/``local``, ``cpu``/``host``/``dram``/``remote``, ``cxl``."""
        if isinstance(value, TierKind):
            return value
        key = str(value).split(":")[0].strip().lower()
        aliases = {
            "npu": cls.NPU_HBM,
            "hbm": cls.NPU_HBM,
            "local": cls.NPU_HBM,
            "cpu": cls.HOST_DRAM,
            "host": cls.HOST_DRAM,
            "dram": cls.HOST_DRAM,
            "remote": cls.HOST_DRAM,
            "cxl": cls.CXL,
        }
        if key not in aliases:
            raise ConfigError(
                f"memory tier: unknown {value!r}; use npu (HBM), cpu (host DRAM) or cxl"
            )
        return aliases[key]


@dataclass(frozen=True, slots=True)
class MemoryTier:
    """One memory tier: bandwidth (GB/s, GB = 1e9 B), access latency (ns), device count."""

    kind: TierKind
    bandwidth_gbps: float
    latency_ns: float = 0.0
    num_devices: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TierKind.parse(self.kind))
        if not math.isfinite(self.bandwidth_gbps) or self.bandwidth_gbps <= 0:
            raise ConfigError(f"{self.kind.value} mem_bw: {self.bandwidth_gbps!r} GB/s must be > 0")
        if not math.isfinite(self.latency_ns) or self.latency_ns < 0:
            raise ConfigError(f"{self.kind.value} mem_latency: {self.latency_ns!r} ns must be >= 0")
        if (
            isinstance(self.num_devices, bool)
            or not isinstance(self.num_devices, int)
            or (self.num_devices < 1)
        ):
            raise ConfigError(f"{self.kind.value} num_devices: {self.num_devices!r} must be >= 1")
        object.__setattr__(self, "bandwidth_gbps", float(self.bandwidth_gbps))
        object.__setattr__(self, "latency_ns", float(self.latency_ns))

    def stream_ns(self, nbytes: int) -> int:
        """Bandwidth term of one access: ``floor(nbytes / (bw*1e9) * 1e9)`` ns."""
        return int(nbytes / (self.bandwidth_gbps * 1e9) * 1e9)

    def access_ns(self, nbytes: int) -> int:
        """One access: ``latency + floor(nbytes / (bw*1e9) * 1e9)`` ns."""
        return int(self.latency_ns) + self.stream_ns(nbytes)

    @property
    def serialised(self) -> bool:
        """Whether concurrent requests to one device queue FIFO (host DRAM, CXL pool)."""
        return self.kind is not TierKind.NPU_HBM


def _check_bytes(nbytes: int) -> None:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ConfigError(f"transfer bytes: {nbytes!r} must be a non-negative integer")


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """The memory tiers of one node/cluster and transfer times between them."""

    tiers: tuple[MemoryTier, ...]

    def __post_init__(self) -> None:
        tiers = tuple(self.tiers)
        kinds = [t.kind for t in tiers]
        dup = {k.value for k in kinds if kinds.count(k) > 1}
        if dup:
            raise ConfigError(f"memory tiers: {sorted(dup)} given more than once; give one each")
        object.__setattr__(self, "tiers", tiers)

    @classmethod
    def from_params(
        cls,
        *,
        hbm_bw_gbps: float,
        host_bw_gbps: float | None = None,
        host_latency_ns: float = 0.0,
        cxl_bw_gbps: float | None = None,
        cxl_latency_ns: float = 0.0,
        cxl_devices: int = 1,
        hbm_latency_ns: float = 0.0,
    ) -> MemoryModel:
        """Tiers from plain numbers; host DRAM and CXL are present only if their bandwidth is set."""
        tiers = [MemoryTier(TierKind.NPU_HBM, hbm_bw_gbps, hbm_latency_ns)]
        if host_bw_gbps is not None:
            tiers.append(MemoryTier(TierKind.HOST_DRAM, host_bw_gbps, host_latency_ns))
        if cxl_bw_gbps is not None:
            tiers.append(MemoryTier(TierKind.CXL, cxl_bw_gbps, cxl_latency_ns, cxl_devices))
        return cls(tuple(tiers))

    def tier(self, kind: str | TierKind) -> MemoryTier:
        """The tier of a kind (``npu``/``cpu``/``cxl`` or a placement name like ``REMOTE:0``)."""
        k = TierKind.parse(kind)
        for t in self.tiers:
            if t.kind is k:
                return t
        have = [t.kind.value for t in self.tiers]
        raise ConfigError(f"memory tier {k.value!r} is not configured (have {have}); add it")

    def transfer_ns(self, nbytes: int, src: str | TierKind, dst: str | TierKind) -> int:
        """Time to move ``nbytes`` from tier ``src`` to tier ``dst`` (no queueing), integer ns."""
        _check_bytes(nbytes)
        a, b = self.tier(src), self.tier(dst)
        if a.kind is b.kind or nbytes == 0:
            return 0
        if a.kind is TierKind.NPU_HBM:
            return b.access_ns(nbytes)
        if b.kind is TierKind.NPU_HBM:
            return a.access_ns(nbytes)
        slow = a if a.bandwidth_gbps <= b.bandwidth_gbps else b
        return int(a.latency_ns) + int(b.latency_ns) + slow.stream_ns(nbytes)

    def concurrent_load_ns(self, nbytes: int, tier: str | TierKind, requesters: int = 1) -> int:
        """Finish time of ``requesters`` NPUs loading the same ``nbytes`` from ``tier`` at t = 0.

        The reference bills a KV recall at its full size on every NPU of the instance (serving-
        core §9.7). A serialised device (a node's host DRAM, a CXL pool) serves them one after
        another, so the last NPU finishes after ``requesters`` accesses; HBM does not queue.
        """
        _check_bytes(nbytes)
        if isinstance(requesters, bool) or not isinstance(requesters, int) or requesters < 1:
            raise ConfigError(f"requesters: {requesters!r} must be a positive integer")
        t = self.tier(tier)
        if t.kind is TierKind.NPU_HBM or nbytes == 0:
            return 0
        return (requesters if t.serialised else 1) * t.access_ns(nbytes)

    def host_io_ns(self, input_bytes: int, output_bytes: int = 0) -> int:
        """Per-iteration host I/O: input load plus output store, each ``2*floor(B/bw) + latency``.

        ``input_bytes`` = total scheduled tokens * 2 * weight bytes; ``output_bytes`` = 4 per
        sampled sequence. A zero-byte side costs nothing.
        """
        _check_bytes(input_bytes)
        _check_bytes(output_bytes)
        host = self.tier(TierKind.HOST_DRAM)
        total = 0
        for nbytes in (input_bytes, output_bytes):
            if nbytes:
                total += int(host.latency_ns) + HOST_IO_PASSES * host.stream_ns(nbytes)
        return total


@dataclass(slots=True)
class MemoryPort:
    """FIFO service of one serialised memory device (a node's host DRAM or a CXL pool).

    ``issue(now, nbytes)`` returns the completion time of a request issued at ``now``: it starts
    when the device is free (after every earlier request) and lasts one access.
    """

    tier: MemoryTier
    busy_until_ns: int = field(default=0)

    def issue(self, now_ns: int, nbytes: int) -> int:
        """Completion time (ns) of an access of ``nbytes`` issued at ``now_ns``."""
        _check_bytes(nbytes)
        start = max(now_ns, self.busy_until_ns) if self.tier.serialised else now_ns
        end = start + self.tier.access_ns(nbytes)
        if self.tier.serialised:
            self.busy_until_ns = end
        return end


_ASTRA_KEYS = {
    "remote_mem": TierKind.HOST_DRAM,
    "cxl_mem": TierKind.CXL,
    "local_mem": TierKind.NPU_HBM,
}


def memory_model_from_dict(
    raw: Mapping[str, object], hbm_bw_gbps: float | None = None, where: str = "memory config"
) -> MemoryModel:
    """Tiers from an ASTRA-Sim/LLMServingSim memory config (``remote_mem``, ``cxl_mem``, ...).

    Also accepts a single flat upstream ASTRA-Sim remote-memory object (``memory-type``,
    ``remote-mem-bw``, ``remote-mem-latency``). ``hbm_bw_gbps`` adds the NPU tier when the file
    has no ``local_mem`` block.
    """
    blocks: dict[TierKind, Mapping[str, object]] = {}
    if "memory-type" in raw:
        blocks[TierKind.HOST_DRAM] = raw
    for key, kind in _ASTRA_KEYS.items():
        if key in raw:
            block = raw[key]
            if not isinstance(block, Mapping):
                raise ConfigError(f"{where}: '{key}' must be an object")
            blocks[kind] = block
    tiers = []
    for kind, block in blocks.items():
        bw = block.get("mem-bw", block.get("remote-mem-bw"))
        lat = block.get("mem-latency", block.get("remote-mem-latency", 0))
        if bw is None:
            raise ConfigError(f"{where}: {kind.value} block has no 'mem-bw' (GB/s); add it")
        try:
            tiers.append(
                MemoryTier(kind, float(bw), float(lat), int(block.get("num-devices", 1)))  # type: ignore[arg-type]
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{where}: {kind.value} block has a non-numeric value ({exc})"
            ) from exc
    if TierKind.NPU_HBM not in blocks and hbm_bw_gbps is not None:
        tiers.insert(0, MemoryTier(TierKind.NPU_HBM, hbm_bw_gbps))
    if not tiers:
        raise ConfigError(
            f"{where}: no memory tier found (expected remote_mem / cxl_mem / local_mem)"
        )
    return MemoryModel(tuple(tiers))


def load_memory_config(path: str | Path, hbm_bw_gbps: float | None = None) -> MemoryModel:
    """Read an ASTRA-Sim memory config JSON file into a :class:`MemoryModel`."""
    p = Path(path)
    raw = read_config_mapping(p, "memory config")
    return memory_model_from_dict(raw, hbm_bw_gbps, where=f"memory config {p}")
