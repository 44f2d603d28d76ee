"""Which source prices an instance's TP and EP collectives, and the measured one.

One owner for the choice (:func:`collective_source`):

1. **the cluster config's links**, when it sets them by hand (a reference cluster JSON's
   ``link_bw`` / ``link_latency``, as ``analysis.validate`` and the reference scenarios use):
   the analytical model (:mod:`astra_bridge`) over those figures, as before;
2. **an ASTRA-Sim binary**, when the deployment asks for one (``cluster.comm_backend``);
3. **aiconfigurator's measured tables** (optional extra ``[aiconfigurator]``), when the GPU has
   an aiconfigurator system: vLLM's all-reduce as its collector timed it
   (``custom_allreduce_perf.parquet``: the collector, ``collect_all_reduce.py``, times
   ``vllm.distributed.communication_op.tensor_model_parallel_all_reduce``, so vLLM's own
   choice between its custom kernel and NCCL by message size is in the numbers; vLLM 0.19.0
   where the system has it, the engine's vLLM version, else the system's own), the
   CUDA-graph timing for steps vLLM runs captured and the eager one above; NCCL's ``all_gather`` / ``reduce_scatter`` for the collectives
   around MoE (vLLM 0.19's default all2all backend, ``allgather_reducescatter``,
   ``vllm/distributed/device_communicators/all2all.py``). A collective over a GPU count the
   tables lack (beyond one node) falls back to the analytical model;
4. otherwise the analytical model over the hardware catalog's link.

:class:`MeasuredNetwork` wraps the analytical network (``astra_bridge.Network``), so
``profiles.parallel.latency`` prices collectives through the same interface whatever the
source; :attr:`CollectiveSource.label` is what reports and sweeps record (``comm_source``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from astra_bridge import CommBackend, Network
from astra_bridge.topology import Topology
from engine.specs import HardwareSpec

#: vLLM 0.19 captures CUDA graphs for batches up to ``max_cudagraph_capture_size``, by
#: default min(2 x max_num_seqs, 512) tokens (``vllm/config/compilation.py``); the
#: all-reduces of a captured step run inside the graph.
CUDA_GRAPH_MAX_TOKENS = 512
#: The vLLM version the engine models; its all-reduce tables are preferred where shipped.
ENGINE_VLLM = "0.19.0"

ANALYTICAL = "analytical"
MEASURED = "measured"


@dataclass(frozen=True, slots=True)
class CollectiveSource:
    """Where an instance's TP / EP collectives are priced from (``kind``: ``"analytical"``,
    ``"astra_sim"`` or ``"measured"``; ``system``: the aiconfigurator system when measured)."""

    kind: str
    label: str
    system: str | None = None
    allreduce_version: str | None = None


def collective_source(hardware: HardwareSpec, links_hand_set: bool,
                      backend: CommBackend) -> CollectiveSource:
    """The one rule (module docstring) choosing the source for an instance on ``hardware``."""
    if links_hand_set:
        return CollectiveSource(ANALYTICAL, f"{backend.name} (cluster config links)")
    if backend.name != ANALYTICAL:
        return CollectiveSource(backend.name, f"{backend.name} (catalog links)")
    measured = _measured_source(hardware.name)
    if measured is not None:
        return measured
    return CollectiveSource(ANALYTICAL, f"analytical (catalog links of {hardware.name})")


@cache
def _measured_source(hardware: str) -> CollectiveSource | None:
    from profiles.aiconfigurator.tables import (
        PINNED_VERSION,
        SYSTEMS,
        installed_version,
        load_system,
    )

    system = SYSTEMS.get(hardware)
    if system is None or installed_version() != PINNED_VERSION:
        return None
    spec = load_system(system)
    version = _allreduce_version(system)
    return CollectiveSource(
        MEASURED,
        f"aiconfigurator {PINNED_VERSION} {system} (vLLM {version} all-reduce, NCCL "
        f"{spec.nccl_version} all-gather / reduce-scatter)",
        system=system, allreduce_version=version)


def _allreduce_version(system: str) -> str:
    from profiles.aiconfigurator.tables import _newest_with, load_system

    spec = load_system(system)
    base = spec.data_dir / "comm" / "vllm"
    if (base / ENGINE_VLLM / "custom_allreduce_perf.parquet").is_file():
        return ENGINE_VLLM
    return _newest_with(spec, "comm", "custom_allreduce_perf.parquet")


class MeasuredNetwork:
    """``astra_bridge.Network`` pricing all-reduce, all-gather and reduce-scatter from
    aiconfigurator's tables of ``source.system`` (a GPU count they lack, and every other op
    and send, go to ``fallback``). ``graph_max_bytes``: the largest all-reduce message of a
    CUDA-graph captured step (:data:`CUDA_GRAPH_MAX_TOKENS` x hidden x dtype bytes)."""

    def __init__(self, source: CollectiveSource, fallback: Network, graph_max_bytes: int) -> None:
        from profiles.aiconfigurator.tables import custom_allreduce_table, nccl_table

        assert source.system is not None and source.allreduce_version is not None
        self.source, self.fallback = source, fallback
        self._graph_max = graph_max_bytes
        v = source.allreduce_version
        self._ar_graph = custom_allreduce_table(source.system, graph=True, version=v)
        self._ar_eager = custom_allreduce_table(source.system, graph=False, version=v)
        self._nccl = {op: nccl_table(source.system, op.replace("-", "_"))
                      for op in ("all-gather", "reduce-scatter")}
        self._memo: dict[tuple[str, int, int], int] = {}

    @property
    def topology(self) -> Topology:
        return self.fallback.topology

    def _gpus(self, involved_dims: Sequence[bool] | None) -> int:
        dims = self.topology.dims
        flags = involved_dims if involved_dims is not None else [True] * len(dims)
        n = 1
        for d, on in zip(dims, flags, strict=False):
            if on:
                n *= d.npus
        return n

    def collective_ns(self, op: str, nbytes: int, *,
                      involved_dims: Sequence[bool] | None = None) -> int:
        gpus = self._gpus(involved_dims)
        key = (op, gpus, nbytes)
        v = self._memo.get(key)
        if v is not None:
            return v
        if op == "all-reduce":
            table = self._ar_graph if nbytes <= self._graph_max else self._ar_eager
        else:
            table = self._nccl.get(op)
        if gpus <= 1:
            v = 0
        elif table is None or gpus not in table.by_gpus:
            v = self.fallback.collective_ns(op, nbytes, involved_dims=involved_dims)
        else:
            v = max(1, round(table(gpus, nbytes) * 1e3))
        self._memo[key] = v
        return v

    def p2p_ns(self, nbytes: int, src: int, dst: int) -> int:
        return self.fallback.p2p_ns(nbytes, src, dst)
