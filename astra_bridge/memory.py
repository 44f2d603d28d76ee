"""Memory tiers and their access timing, as the reference simulator's analytical memory model.

Tiers: the NPU's own HBM (``npu``), host DRAM of a node (``cpu``, ASTRA-Sim's
``PER_NODE_MEMORY_EXPANSION`` "remote memory") and a CXL memory pool (``cxl``, ``MEMORY_POOL``).
Bandwidths are GB/s with GB = 1e9 B (unlike the network, whose GB is 2**30 B).

Formulas (integer ns):

* One access of ``m`` bytes to a lower tier (host DRAM or CXL), the reference's memory-load
  cost (docs/reference-semantics.md §11, ASTRA-Sim's analytical remote memory):
  ``latency + floor(m / (bw*1e9) * 1e9)``. The HBM side is not charged: reads and writes of
  local HBM are part of the profiled kernel times.
* A transfer between the NPU and a lower tier (KV recall, weight streaming) costs one such
  access on the lower tier (``MemoryTier.access_ns``).
* A KV recall loaded by every NPU of an instance at once queues on a serialised device (a
  node's host DRAM serves one request at a time, a CXL pool one at a time overall, FIFO;
  HBM does not queue): ``MemoryTier.serialised`` says which, and the engine's prefix-cache
  tiers (``engine.kv_tiers.KVTierPool.load_ns``) bill the recall that way, as the reference
  bills it on every NPU (docs/reference-semantics.md §11).
* The per-iteration host I/O term (the token ids' load) is part of the step price
  (``profiles.latency``, ``profiles.parallel.latency``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from engine.specs import ConfigError


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
