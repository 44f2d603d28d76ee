"""Typed network topology in the shape of ASTRA-Sim's analytical network backend.

A topology is a list of dimensions, dimension 0 innermost (its NPU coordinate varies fastest:
``npu_id = x0 + n0*x1 + n0*n1*x2 + ...``). Each dimension is one building block of the
congestion-unaware analytical backend:

* ``Ring``: bidirectional ring; a message between coordinates that differ by ``d`` crosses
  ``min(d mod n, n - d mod n)`` links.
* ``FullyConnected``: every pair directly linked; always 1 hop.
* ``Switch``: all NPUs hang off one switch; always 2 hops (up and down).

A message of ``m`` bytes over ``h`` hops takes ``floor(h*latency + m/beta)`` ns, where
``beta = bandwidth_GBps * 2**30 / 1e9`` bytes/ns (the network backend's GB is 2**30 bytes) and the
sum is formed in double precision before truncation. Messages never share bandwidth.

Also here: :class:`SystemConfig`, the system-layer knobs of an ASTRA-Sim ``system.json`` that
change collective timing, and loaders for ASTRA-Sim network (``.yml``) and system (``.json``)
files, so a user's own ASTRA-Sim configs are readable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import yaml

from engine.specs import ConfigError

NETWORK_GB = 2**30
"""Bytes in one network-backend GB (bandwidths in network configs are GB/s with GB = 2**30 B)."""


class DimKind(StrEnum):
    """Network building block of one dimension (names as in ASTRA-Sim network configs)."""

    RING = "Ring"
    FULLY_CONNECTED = "FullyConnected"
    SWITCH = "Switch"

    @classmethod
    def parse(cls, value: str | DimKind, where: str = "topology") -> DimKind:
        """Accept the ASTRA-Sim spelling (case-insensitive, ``_``/``-`` ignored)."""
        if isinstance(value, DimKind):
            return value
        key = str(value).replace("_", "").replace("-", "").lower()
        for kind in cls:
            if kind.value.lower() == key:
                return kind
        names = ", ".join(k.value for k in cls)
        raise ConfigError(f"{where}: unknown topology {value!r}; use one of {names}")


@dataclass(frozen=True, slots=True)
class Dimension:
    """One network dimension: building block, NPU count, link bandwidth and per-hop latency."""

    kind: DimKind
    npus: int
    bandwidth_gbps: float  # GB/s, GB = 2**30 B
    latency_ns: float  # per hop

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DimKind.parse(self.kind))
        if isinstance(self.npus, bool) or not isinstance(self.npus, int) or self.npus < 1:
            raise ConfigError(f"npus_count: {self.npus!r} is not a positive integer")
        if not math.isfinite(self.bandwidth_gbps) or self.bandwidth_gbps <= 0:
            raise ConfigError(f"bandwidth: {self.bandwidth_gbps!r} GB/s must be > 0")
        if not math.isfinite(self.latency_ns) or self.latency_ns < 0:
            raise ConfigError(f"latency: {self.latency_ns!r} ns must be >= 0")
        object.__setattr__(self, "bandwidth_gbps", float(self.bandwidth_gbps))
        object.__setattr__(self, "latency_ns", float(self.latency_ns))

    @property
    def bytes_per_ns(self) -> float:
        """Link bandwidth in bytes/ns (GB = 2**30 B), as the analytical backend computes it."""
        return self.bandwidth_gbps * NETWORK_GB / 1e9

    def hops(self, distance: int) -> int:
        """Links crossed between two NPUs whose coordinates in this dimension differ by ``distance``."""
        if self.kind is DimKind.RING:
            d = distance % self.npus
            return min(d, self.npus - d)
        if self.kind is DimKind.FULLY_CONNECTED:
            return 1
        return 2

    @property
    def max_hops(self) -> int:
        """Largest hop count between any two NPUs of the dimension."""
        if self.kind is DimKind.RING:
            return self.npus // 2
        return 1 if self.kind is DimKind.FULLY_CONNECTED else 2

    def message_ns(self, hops: int, nbytes: int) -> int:
        """``floor(hops*latency + nbytes/beta)``: one message, congestion-unaware."""
        return int(hops * self.latency_ns + nbytes / self.bytes_per_ns)


@dataclass(frozen=True, slots=True)
class Topology:
    """A multi-dimensional network; ``dims[0]`` is innermost (fastest-varying NPU coordinate)."""

    dims: tuple[Dimension, ...]

    def __post_init__(self) -> None:
        dims = tuple(self.dims)
        if not dims:
            raise ConfigError("topology: needs at least one dimension")
        for i, d in enumerate(dims):
            if not isinstance(d, Dimension):
                raise ConfigError(
                    f"topology dims[{i}]: expected a Dimension, got {type(d).__name__}"
                )
        object.__setattr__(self, "dims", dims)

    @property
    def num_npus(self) -> int:
        """Total NPUs: product of the per-dimension counts."""
        return math.prod(d.npus for d in self.dims)

    def coords(self, npu: int) -> tuple[int, ...]:
        """Per-dimension coordinates of an NPU id (dimension 0 varies fastest)."""
        if not 0 <= npu < self.num_npus:
            raise ConfigError(f"npu id {npu} is outside 0..{self.num_npus - 1} of this topology")
        out = []
        for d in self.dims:
            out.append(npu % d.npus)
            npu //= d.npus
        return tuple(out)

    @classmethod
    def from_lists(
        cls,
        kinds: Sequence[str | DimKind],
        npus: Sequence[int],
        bandwidth_gbps: Sequence[float],
        latency_ns: Sequence[float],
    ) -> Topology:
        """Build from the four parallel per-dimension lists of an ASTRA-Sim network config."""
        n = len(kinds)
        lens = {
            "npus_count": len(npus),
            "bandwidth": len(bandwidth_gbps),
            "latency": len(latency_ns),
        }
        bad = {k: v for k, v in lens.items() if v != n}
        if bad:
            raise ConfigError(
                f"network config: topology has {n} dimensions but {bad} differ; give one value "
                "per dimension"
            )
        return cls(
            tuple(
                Dimension(DimKind.parse(k, f"topology[{i}]"), int(c), float(b), float(lat))
                for i, (k, c, b, lat) in enumerate(
                    zip(kinds, npus, bandwidth_gbps, latency_ns, strict=True)
                )
            )
        )

    @classmethod
    def from_params(
        cls,
        npus_per_node: int,
        num_nodes: int = 1,
        *,
        intra_bandwidth_gbps: float,
        intra_latency_ns: float,
        inter_bandwidth_gbps: float | None = None,
        inter_latency_ns: float | None = None,
        intra_kind: str | DimKind = DimKind.FULLY_CONNECTED,
        inter_kind: str | DimKind = DimKind.SWITCH,
    ) -> Topology:
        """Two-level cluster: an NVLink-class dimension inside a node and a scale-out dimension.

        With ``num_nodes == 1`` only the intra-node dimension is built. The inter-node bandwidth
        and latency are required when ``num_nodes > 1``.
        """
        intra = Dimension(
            DimKind.parse(intra_kind), npus_per_node, intra_bandwidth_gbps, intra_latency_ns
        )
        if num_nodes == 1:
            return cls((intra,))
        if inter_bandwidth_gbps is None or inter_latency_ns is None:
            raise ConfigError(
                "inter_bandwidth_gbps / inter_latency_ns: required when num_nodes > 1"
            )
        inter = Dimension(
            DimKind.parse(inter_kind), num_nodes, inter_bandwidth_gbps, inter_latency_ns
        )
        return cls((intra, inter))


def read_config_mapping(
    path: Path, label: str, *, yaml_format: bool = False, expected: str = "a JSON object"
) -> Mapping:
    """The top-level mapping of an ASTRA-Sim config file (JSON, or YAML for the network
    config); unreadable files, bad syntax and a non-mapping top level are one ``ConfigError``
    that names the ``label`` and the file."""
    try:
        text = path.read_text()
        raw = yaml.safe_load(text) if yaml_format else json.loads(text)
    except OSError as exc:
        raise ConfigError(f"{label} {path}: cannot read ({exc})") from exc
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        kind = "YAML" if yaml_format else "JSON"
        raise ConfigError(f"{label} {path}: not valid {kind} ({exc})") from exc
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{label} {path}: expected {expected}")
    return raw


def load_network_config(path: str | Path) -> Topology:
    """Read an ASTRA-Sim analytical network config (YAML with per-dimension lists)."""
    p = Path(path)
    raw = read_config_mapping(p, "network config", yaml_format=True,
                              expected="a mapping with topology/npus_count/...")
    missing = [k for k in ("topology", "npus_count", "bandwidth", "latency") if k not in raw]
    if missing:
        raise ConfigError(f"network config {p}: missing keys {missing}")
    lists = {
        k: raw[k] if isinstance(raw[k], list) else [raw[k]]
        for k in ("topology", "npus_count", "bandwidth", "latency")
    }
    try:
        return Topology.from_lists(
            lists["topology"], lists["npus_count"], lists["bandwidth"], lists["latency"]
        )
    except ConfigError as exc:
        raise ConfigError(f"network config {p}: {exc}") from exc


COLLECTIVE_KEYS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
ALGORITHMS = ("ring", "direct", "halvingDoubling", "doubleBinaryTree")
OPTIMIZATIONS = ("localBWAware", "baseline")


def parse_algorithm(name: str, where: str = "algorithm") -> str:
    """Canonical ASTRA-Sim spelling of a collective implementation name (case-insensitive)."""
    key = str(name).replace("_", "").replace("-", "").lower()
    for algo in ALGORITHMS:
        if algo.lower() == key:
            return algo
    raise ConfigError(f"{where}: unknown collective algorithm {name!r}; use one of {ALGORITHMS}")


@dataclass(frozen=True, slots=True)
class SystemConfig:
    """System-layer knobs of an ASTRA-Sim ``system.json`` that change collective timing.

    Defaults are the LLMServingSim template (endpoint delay 10 ns, one active chunk, no dataset
    splitting, ``localBWAware``, ``ring`` on every dimension). ``local_mem_bw_gbps`` (GB = 1e9 B)
    prices the local reduction of received data and has no safe default: the reference sets it
    to the NPU's HBM bandwidth.

    ``implementations`` maps each collective key to one algorithm per dimension; a list shorter
    than the topology repeats its last entry, as a convenience.
    """

    local_mem_bw_gbps: float
    endpoint_delay_ns: int = 10
    active_chunks: int = 1
    dataset_splits: int = 1
    collective_optimization: str = "localBWAware"
    implementations: tuple[tuple[str, tuple[str, ...]], ...] = field(
        default=tuple((k, ("ring",)) for k in COLLECTIVE_KEYS)
    )

    def __post_init__(self) -> None:
        if not math.isfinite(self.local_mem_bw_gbps) or self.local_mem_bw_gbps <= 0:
            raise ConfigError(
                f"local-mem-bw: {self.local_mem_bw_gbps!r} must be > 0 GB/s (ASTRA-Sim divides by it; "
                "set it to the NPU's HBM bandwidth)"
            )
        for name in ("endpoint_delay_ns", "active_chunks", "dataset_splits"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{name}: {v!r} must be an integer")
        if self.endpoint_delay_ns < 0:
            raise ConfigError(f"endpoint-delay: {self.endpoint_delay_ns} must be >= 0 ns")
        if self.active_chunks < 1:
            raise ConfigError(f"active-chunks-per-dimension: {self.active_chunks} must be >= 1")
        if self.dataset_splits < 1:
            raise ConfigError(
                f"preferred-dataset-splits: {self.dataset_splits} must be >= 1 (0 divides by zero "
                "in ASTRA-Sim)"
            )
        if self.collective_optimization not in OPTIMIZATIONS:
            raise ConfigError(
                f"collective-optimization: {self.collective_optimization!r}; use one of {OPTIMIZATIONS}"
            )
        impl = dict(self.implementations)
        clean = []
        for key in COLLECTIVE_KEYS:
            algos = impl.pop(key, ("ring",))
            if isinstance(algos, str):
                algos = (algos,)
            if not algos:
                raise ConfigError(f"{key}-implementation: give at least one algorithm")
            clean.append((key, tuple(parse_algorithm(a, f"{key}-implementation") for a in algos)))
        if impl:
            raise ConfigError(
                f"implementations: unknown collective keys {sorted(impl)}; use {COLLECTIVE_KEYS}"
            )
        object.__setattr__(self, "implementations", tuple(clean))
        object.__setattr__(self, "local_mem_bw_gbps", float(self.local_mem_bw_gbps))

    def algorithms_for(self, collective: str, num_dims: int) -> tuple[str, ...]:
        """One algorithm per dimension for a collective key (last entry repeated if short)."""
        algos = dict(self.implementations)[collective]
        if len(algos) >= num_dims:
            return algos[:num_dims]
        return algos + (algos[-1],) * (num_dims - len(algos))

    def with_algorithms(self, algos: str | Sequence[str]) -> SystemConfig:
        """A copy with the same algorithm list for all four collective keys."""
        seq = (algos,) if isinstance(algos, str) else tuple(algos)
        return SystemConfig(
            local_mem_bw_gbps=self.local_mem_bw_gbps,
            endpoint_delay_ns=self.endpoint_delay_ns,
            active_chunks=self.active_chunks,
            dataset_splits=self.dataset_splits,
            collective_optimization=self.collective_optimization,
            implementations=tuple((k, seq) for k in COLLECTIVE_KEYS),
        )


def load_system_config(path: str | Path) -> SystemConfig:
    """Read an ASTRA-Sim ``system.json`` (keys other than the timing-relevant ones are ignored)."""
    p = Path(path)
    raw = read_config_mapping(p, "system config")
    return system_config_from_dict(raw, where=f"system config {p}")


def system_config_from_dict(
    raw: Mapping[str, object], where: str = "system config"
) -> SystemConfig:
    """Build a :class:`SystemConfig` from the key/value pairs of an ASTRA-Sim ``system.json``."""
    if "local-mem-bw" not in raw:
        raise ConfigError(
            f"{where}: 'local-mem-bw' is missing (ASTRA-Sim then divides by zero); add the NPU "
            "memory bandwidth in GB/s"
        )
    impls = []
    for key in COLLECTIVE_KEYS:
        v = raw.get(f"{key}-implementation", ["ring"])
        impls.append((key, tuple(v) if isinstance(v, list) else (str(v),)))
    try:
        return SystemConfig(
            local_mem_bw_gbps=float(raw["local-mem-bw"]),  # type: ignore[arg-type]
            endpoint_delay_ns=int(raw.get("endpoint-delay", 10)),  # type: ignore[arg-type]
            active_chunks=int(raw.get("active-chunks-per-dimension", 1)),  # type: ignore[arg-type]
            dataset_splits=int(raw.get("preferred-dataset-splits", 1)),  # type: ignore[arg-type]
            collective_optimization=str(raw.get("collective-optimization", "localBWAware")),
            implementations=tuple(impls),
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def system_config_to_dict(system: SystemConfig) -> dict[str, object]:
    """The ``system.json`` content ASTRA-Sim reads for this configuration."""
    out: dict[str, object] = {
        "scheduling-policy": "LIFO",
        "endpoint-delay": system.endpoint_delay_ns,
        "active-chunks-per-dimension": system.active_chunks,
        "preferred-dataset-splits": system.dataset_splits,
    }
    for key, algos in system.implementations:
        out[f"{key}-implementation"] = list(algos)
    out["collective-optimization"] = system.collective_optimization
    local_bw = system.local_mem_bw_gbps
    out["local-mem-bw"] = int(local_bw) if local_bw.is_integer() else local_bw
    out["boost-mode"] = 0
    return out


def network_config_to_yaml(topology: Topology) -> str:
    """The analytical-backend network ``.yml`` text for a topology."""

    def fmt(values: Sequence[object]) -> str:
        return "[" + ", ".join(str(v) for v in values) + "]"

    return (
        f"topology: {fmt([d.kind.value for d in topology.dims])}\n"
        f"npus_count: {fmt([d.npus for d in topology.dims])}\n"
        f"bandwidth: {fmt([d.bandwidth_gbps for d in topology.dims])}  # GB/s (1 GB = 2^30 B)\n"
        f"latency: {fmt([d.latency_ns for d in topology.dims])}  # ns\n"
    )
