"""Communication and memory-transfer timing: the one place the engine asks "how long does it take".

* :class:`NetworkModel` prices collectives (all-reduce, all-gather, reduce-scatter, all-to-all)
  and point-to-point sends on a multi-dimensional topology, reproducing ASTRA-Sim's analytical
  congestion-unaware backend to the nanosecond (:mod:`astra_bridge.collectives`).
* :class:`MemoryTier` prices one access to a memory tier (NPU HBM, host DRAM, CXL) as the
  reference simulator's analytical memory model (:mod:`astra_bridge.memory`); the engine's
  prefix-cache tiers call it.
* :class:`BinaryBackend` runs a user-supplied ASTRA-Sim binary instead (:mod:`astra_bridge.binary`);
  :class:`CommBackend` is a deployment's choice between the two (:mod:`astra_bridge.backend`).

This package imports neither Ray, Hydra nor MLflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from astra_bridge.backend import COMM_BACKENDS, CommBackend, Network
from astra_bridge.binary import BinaryBackend, BinaryBackendError
from astra_bridge.collectives import (
    COLLECTIVES,
    CollectiveTime,
    Route,
    UnsupportedCollective,
    check_bytes,
    p2p_ns,
    parse_collective,
    route,
    time_on,
)
from astra_bridge.memory import MemoryTier, TierKind
from astra_bridge.topology import (
    Dimension,
    DimKind,
    SystemConfig,
    Topology,
    load_network_config,
    load_system_config,
)
from engine.specs import ConfigError, HardwareSpec

__all__ = [
    "COLLECTIVES",
    "COMM_BACKENDS",
    "BinaryBackend",
    "BinaryBackendError",
    "CollectiveTime",
    "CommBackend",
    "DimKind",
    "Dimension",
    "MemoryTier",
    "Network",
    "NetworkModel",
    "SystemConfig",
    "TierKind",
    "Topology",
    "UnsupportedCollective",
    "load_network_config",
    "load_system_config",
]

Group = int | Sequence[int] | None


class NetworkModel:
    """Analytical collective / send-recv timing on one topology with one system config.

    Groups of a collective (``group`` argument):

    * ``None``: every NPU of the topology (all dimensions take part);
    * an ``int`` k: the NPUs of the leading dimensions whose sizes multiply to k (e.g. a TP
      group inside a node is dimension 0);
    * a sequence of NPU ids: must be a whole sub-grid (all NPUs that differ only in some set of
      dimensions), because ASTRA-Sim runs a collective over whole dimensions.

    ``involved_dims`` (one flag per dimension, as the reference's ``involved_dim`` masks) can be
    given instead of ``group``. Results are memoised by shape.
    """

    def __init__(self, topology: Topology, system: SystemConfig) -> None:
        self._topology = topology
        self._system = system
        # (op as given, algorithm, flags) -> route: a collective's route is resolved once, so
        # pricing one hashes no topology or system config (astra_bridge.collectives.time_on).
        self._routes: dict[tuple[str, str | tuple[str, ...] | None, tuple[bool, ...]],
                           Route | None] = {}

    @property
    def topology(self) -> Topology:
        """The network (fixed: the model's resolved routes are built on it)."""
        return self._topology

    @property
    def system(self) -> SystemConfig:
        """The system layer's config (fixed, as ``topology``)."""
        return self._system

    @classmethod
    def from_params(
        cls,
        npus_per_node: int,
        num_nodes: int = 1,
        *,
        intra_bandwidth_gbps: float,
        intra_latency_ns: float,
        local_mem_bw_gbps: float,
        inter_bandwidth_gbps: float | None = None,
        inter_latency_ns: float | None = None,
        intra_kind: str | DimKind = DimKind.FULLY_CONNECTED,
        inter_kind: str | DimKind = DimKind.SWITCH,
        algorithm: str | Sequence[str] = "ring",
        endpoint_delay_ns: int = 10,
        active_chunks: int = 1,
        dataset_splits: int = 1,
        collective_optimization: str = "localBWAware",
    ) -> NetworkModel:
        """Intra-node dimension (+ optional inter-node dimension) with one algorithm list."""
        topo = Topology.from_params(
            npus_per_node,
            num_nodes,
            intra_bandwidth_gbps=intra_bandwidth_gbps,
            intra_latency_ns=intra_latency_ns,
            inter_bandwidth_gbps=inter_bandwidth_gbps,
            inter_latency_ns=inter_latency_ns,
            intra_kind=intra_kind,
            inter_kind=inter_kind,
        )
        system = SystemConfig(
            local_mem_bw_gbps=local_mem_bw_gbps,
            endpoint_delay_ns=endpoint_delay_ns,
            active_chunks=active_chunks,
            dataset_splits=dataset_splits,
            collective_optimization=collective_optimization,
        ).with_algorithms(algorithm)
        return cls(topo, system)

    @classmethod
    def for_hardware(
        cls,
        hardware: HardwareSpec,
        npus_per_node: int,
        num_nodes: int = 1,
        *,
        inter_bandwidth_gbps: float | None = None,
        inter_latency_ns: float | None = None,
    ) -> NetworkModel:
        """Reference-style model of nodes of ``hardware``: FullyConnected dimensions (as the
        reference generates), intra-node links at the accelerator's interconnect
        bandwidth/latency, ring algorithms, local reduction at its HBM bandwidth. The bandwidth number is used as the network's GB/s (GB = 2**30 B),
        as the reference passes ``link_bw`` to ASTRA-Sim unchanged."""
        if hardware.interconnect_bw_gbs <= 0:
            raise ConfigError(
                f"hardware {hardware.name!r}: interconnect_bw_gbs is {hardware.interconnect_bw_gbs}; "
                "set the intra-node link bandwidth to price collectives"
            )
        return cls.from_params(
            npus_per_node,
            num_nodes,
            intra_bandwidth_gbps=hardware.interconnect_bw_gbs,
            intra_latency_ns=hardware.interconnect_latency_ns,
            local_mem_bw_gbps=hardware.hbm_bw_gbs,
            inter_bandwidth_gbps=inter_bandwidth_gbps,
            inter_latency_ns=inter_latency_ns,
            inter_kind=DimKind.FULLY_CONNECTED,
        )

    @classmethod
    def from_astra_configs(cls, network_yml: str | Path, system_json: str | Path) -> NetworkModel:
        """Model of a user's ASTRA-Sim network ``.yml`` and ``system.json``."""
        return cls(load_network_config(network_yml), load_system_config(system_json))

    # ------------------------------------------------------------------ groups

    def involved_dims(self, group: Group) -> tuple[bool, ...]:
        """Per-dimension participation flags for a group (see the class docstring)."""
        dims = self.topology.dims
        if group is None:
            return (True,) * len(dims)
        if isinstance(group, int):
            if group < 1:
                raise ConfigError(f"group size {group} must be >= 1")
            size = 1
            for j, d in enumerate(dims):
                if size == group:
                    return tuple(i < j for i in range(len(dims)))
                size *= d.npus
            if size == group:
                return (True,) * len(dims)
            raise UnsupportedCollective(
                f"group size {group} is not a product of leading dimension sizes "
                f"{[d.npus for d in dims]}; pass NPU ids or involved_dims"
            )
        members = sorted(set(group))
        if not members:
            raise ConfigError("group: empty NPU list")
        coords = [self.topology.coords(m) for m in members]
        varying = [i for i in range(len(dims)) if len({c[i] for c in coords}) > 1]
        expected = 1
        for i in varying:
            expected *= dims[i].npus
        if len(members) != expected:
            raise UnsupportedCollective(
                f"group {members} is not a whole sub-grid of the topology (it varies in "
                f"dimensions {varying}, which hold {expected} NPUs); ASTRA-Sim runs collectives "
                "over whole dimensions"
            )
        return tuple(i in varying for i in range(len(dims)))

    # ------------------------------------------------------------------ timing

    def _system_for(self, algorithm: str | Sequence[str] | None) -> SystemConfig:
        return self.system if algorithm is None else self.system.with_algorithms(algorithm)

    def collective_time(
        self,
        op: str,
        nbytes: int,
        group: Group = None,
        *,
        algorithm: str | Sequence[str] | None = None,
        involved_dims: Sequence[bool] | None = None,
    ) -> CollectiveTime:
        """Max and min over NPUs of the finish time of one collective started at t = 0."""
        if involved_dims is not None and group is not None:
            raise ConfigError("give either group or involved_dims, not both")
        flags = (
            tuple(map(bool, involved_dims))
            if involved_dims is not None
            else self.involved_dims(group)
        )
        algos = algorithm if algorithm is None or isinstance(algorithm, str) else tuple(algorithm)
        key = (op, algos, flags)
        try:
            on = self._routes[key]
        except KeyError:
            # The checks in the order of a call to astra_bridge.collectives.collective_time
            # with this model's system config for ``algorithm``.
            system = self._system_for(algos)
            name = parse_collective(op)
            check_bytes(nbytes)
            on = self._routes[key] = route(name, self._topology, system, flags)
        else:
            check_bytes(nbytes)
        return time_on(on, nbytes)

    def collective_ns(
        self,
        op: str,
        nbytes: int,
        group: Group = None,
        *,
        algorithm: str | Sequence[str] | None = None,
        involved_dims: Sequence[bool] | None = None,
    ) -> int:
        """Completion time (ns, last NPU) of a collective of ``nbytes`` over ``group``.

        ``algorithm`` overrides the system config's implementation (one name, or one per
        dimension). Raises :class:`UnsupportedCollective` where ASTRA-Sim would abort.
        """
        return self.collective_time(
            op, nbytes, group, algorithm=algorithm, involved_dims=involved_dims
        ).ns

    def p2p_ns(self, nbytes: int, src: int, dst: int) -> int:
        """Send/recv of ``nbytes`` from NPU ``src`` to NPU ``dst`` (e.g. PP hidden states, P/D KV)."""
        return p2p_ns(nbytes, src, dst, self.topology)

    @staticmethod
    def cache_info() -> object:
        """Hit/miss statistics of the shared collective memo."""
        return time_on.cache_info()
