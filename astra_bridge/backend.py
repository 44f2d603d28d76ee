"""Which collective timing a deployment uses: the embedded analytical model or an ASTRA-Sim binary.

``CommBackend("analytical")`` (the default) prices collectives and sends with
:class:`astra_bridge.NetworkModel`, which reproduces ASTRA-Sim's analytical congestion-unaware
backend to the nanosecond. ``CommBackend("astra_sim", binary=<path>)`` runs a user's built
``AstraSim_Analytical_Congestion_Unaware`` instead (:class:`astra_bridge.binary.BinaryBackend`),
once per collective shape: one backend object per (binary, topology, system config) is kept
for the process, so every latency model on that network shares its memo.

A sweep selects it in the cluster config (``cluster.comm_backend``, ``cluster.astra_sim_binary``);
the reference-cluster runner with ``--comm-backend`` / ``--astra-sim-binary``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from astra_bridge.binary import BinaryBackend, find_binary, resolve_binary
from astra_bridge.topology import SystemConfig, Topology
from engine.specs import SettingError

COMM_BACKENDS = ("analytical", "astra_sim")


class Network(Protocol):
    """What a latency model asks of the network: collectives over some of the topology's
    dimensions and point-to-point sends (``NetworkModel`` and ``BinaryBackend`` implement it)."""

    @property
    def topology(self) -> Topology: ...

    def collective_ns(
        self, op: str, nbytes: int, *, involved_dims: Sequence[bool] | None = None
    ) -> int: ...

    def p2p_ns(self, nbytes: int, src: int, dst: int) -> int: ...


_BINARIES: dict[tuple[Path, Topology, SystemConfig], BinaryBackend] = {}


@dataclass(frozen=True, slots=True)
class CommBackend:
    """The collective backend of a deployment; building one checks it (``SettingError`` naming
    ``comm_backend`` or ``astra_sim_binary``; ``err.named("cluster.")`` as a front end names
    them)."""

    name: str = "analytical"
    binary: str | None = None

    def __post_init__(self) -> None:
        if self.name not in COMM_BACKENDS:
            raise SettingError("comm_backend", self.name, f"one of {list(COMM_BACKENDS)}",
                               "analytical is the embedded model (the default)")
        if self.name == "analytical":
            if self.binary is not None:
                raise SettingError("astra_sim_binary", self.binary,
                                   "null with {p}comm_backend=analytical",
                                   "set {p}comm_backend=astra_sim to use the binary")
            return
        if not self.binary:
            raise SettingError("astra_sim_binary", self.binary,
                               "the path of a built AstraSim_Analytical_Congestion_Unaware "
                               "binary when {p}comm_backend=astra_sim",
                               "give its path or set {p}comm_backend=analytical")
        path, problem = find_binary(self.binary)
        if path is None:
            raise SettingError("astra_sim_binary", self.binary,
                               "the path of a built AstraSim_Analytical_Congestion_Unaware",
                               f"{problem}; build ASTRA-Sim and give the binary's path, or set "
                               "{p}comm_backend=analytical")

    def network(self, topology: Topology, system: SystemConfig) -> Network:
        """The network pricing collectives on ``topology`` with ``system`` (one shared binary
        backend per (binary, topology, system) in this process)."""
        if self.name == "analytical":
            from astra_bridge import NetworkModel

            return NetworkModel(topology, system)
        assert self.binary is not None
        key = (resolve_binary(self.binary).resolve(), topology, system)
        backend = _BINARIES.get(key)
        if backend is None:
            backend = _BINARIES[key] = BinaryBackend(key[0], topology, system)
        return backend
