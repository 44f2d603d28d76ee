"""The prefill-to-decode KV hand-off, as the reference prices it (docs/reference-semantics.md §7).

A prefill instance's ranks each send their share of the request's K+V to a decode peer: the
reference models the peer as a shadow NPU one dimension away (``[tp*pp, 2]``, the second
dimension on the last link figures of the cluster config), and each rank sends over its own
link, all in parallel. Per layer and rank the K+V of ``N`` tokens is
``floor(2*n_kv*d*N*kv_bytes / tp)`` bytes (``kv_bytes`` = 1 for an fp8 KV cache).

* :class:`KvHandoff` prices one prefill instance's hand-off: whole (vLLM's disaggregation
  connectors move a finished prefill's blocks) or streamed layer by layer during the step (the
  reference, which then also sends the sampled ids instead of storing them);
* :class:`ClusterKvTransfer` is the engine's ``KvTransfer`` over a deployment's prefill
  instances (``engine.deployment.KvTransfer``);
* :func:`pd_handoff` builds the hand-off network of one prefill instance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from astra_bridge import CommBackend, Network
from astra_bridge.topology import Dimension, DimKind, SystemConfig, Topology
from engine.batch import BatchShape
from engine.memory import kv_dtype_bytes
from engine.specs import ConfigError
from profiles.parallel.latency import TP_ALLREDUCE_ROWS, ParallelLatencyModel
from profiles.parallel.layout import per_dim


class KvHandoff:
    """The P/D hand-off of one prefill instance priced with its step model ``latency``:
    ``network`` holds the instance's ``tp*pp`` NPUs and the decode peer NPU ``peer``."""

    def __init__(
        self,
        latency: ParallelLatencyModel,
        network: Network,
        peer: int,
        *,
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.latency = latency
        self.network = network
        self.peer = peer
        self._kv_bytes = kv_dtype_bytes(latency.model, kv_cache_dtype)

    def kv_bytes_per_layer(self, num_tokens: int) -> int:
        """K+V bytes of ``num_tokens`` for one layer on one TP rank (KV dtype aware)."""
        m, tp = self.latency.model, self.latency.layout.tp
        return (2 * m.num_kv_heads * m.head_dim * num_tokens * self._kv_bytes) // tp

    def kv_transfer_ns(self, num_tokens: int, *, streamed: bool = False) -> int:
        """Time to move ``num_tokens`` of KV from a prefill rank to its decode peer (ranks in
        parallel, each over its own link; integer ns).

        ``streamed=False`` (vLLM's disaggregation connectors, which move a finished prefill's
        blocks): one transfer of all ``L`` layers' K+V, ``L * kv_bytes_per_layer``.
        ``streamed=True`` (the reference): each layer's K+V is its own message sent right after
        that layer's ``qkv_proj``; the network is congestion-unaware (as ASTRA-Sim's analytical
        backend), so the messages travel concurrently and the hand-off takes one message time,
        mostly hidden behind the prefill step (see :meth:`pd_prefill_extra_ns`).
        """
        if num_tokens < 0:
            raise ConfigError(f"num_tokens = {num_tokens}: must be >= 0")
        if num_tokens == 0:
            return 0
        per_layer = self.kv_bytes_per_layer(num_tokens)
        nbytes = per_layer if streamed else self.latency.model.num_layers * per_layer
        return self.network.p2p_ns(nbytes, 0, self.peer)

    def pd_prefill_extra_ns(self, shape: BatchShape, send_tokens: int | None = None) -> int:
        """Time a P/D prefill step lasts beyond its ``iteration_ns`` (reference semantics).

        The sampled ids (``4*T`` bytes) are sent to the decode side instead of stored, and the
        last layer's KV message (sent after its ``qkv_proj``) may outlast the rest of the step:
        ``max(p2p(4*T), kv_transfer_ns(N, streamed=True) - tail)`` with ``tail`` the compute and
        collectives after the last ``qkv_proj`` (rest of the block, the head). ``send_tokens``
        N defaults to the step's scheduled tokens (the reference's effective value; pass the
        scheduled tokens plus the prefix-cache hit to ship the hit's KV too).
        """
        T = shape.total_tokens
        n = T if send_tokens is None else send_tokens
        out = self.network.p2p_ns(4 * T, 0, self.peer)
        kv = self.kv_transfer_ns(n, streamed=True)
        if kv <= out:
            return out
        return max(out, kv - self._tail_after_qkv(shape))

    def _tail_after_qkv(self, shape: BatchShape) -> int:
        lat = self.latency
        bd = lat.compute.breakdown(shape)
        L = lat.model.num_layers
        block = list(lat.arch.block)
        if "qkv_proj" not in block:
            return 0
        after = block[block.index("qkv_proj") + 1:]
        counts = {n: block.count(n) for n in block}
        T = shape.total_tokens
        rest = sum(bd.get(n, 0) // (L * counts[n]) for n in after)
        rest += sum(n in TP_ALLREDUCE_ROWS for n in after) * lat.tp_allreduce_ns(T)
        rest += lat.ep_collectives_ns(T)
        return rest + sum(bd.get(n, 0) for n in set(lat.arch.head))


def pd_handoff(
    latency: ParallelLatencyModel,
    link_bw_gbs: float | Sequence[float],
    link_latency_ns: float | Sequence[float],
    local_mem_bw_gbs: float,
    *,
    kv_cache_dtype: str = "auto",
    pd_link_bw_gbs: float | None = None,
    pd_link_latency_ns: float | None = None,
    backend: CommBackend | None = None,
) -> KvHandoff:
    """The hand-off of the prefill instance priced by ``latency``, as the reference's prefill
    shadow NPUs: the instance's ``tp*pp`` NPUs on the first link figures, the decode peer on a
    second dimension of ``pd_link_*`` (default: the last ``link_*`` value)."""
    bws = per_dim(link_bw_gbs, 2, "link_bw")
    lats = per_dim(link_latency_ns, 2, "link_latency")
    npus = latency.layout.tp * latency.layout.pp
    topo = Topology((
        Dimension(DimKind.FULLY_CONNECTED, npus, bws[0], lats[0]),
        Dimension(DimKind.FULLY_CONNECTED, 2,
                  bws[1] if pd_link_bw_gbs is None else pd_link_bw_gbs,
                  lats[1] if pd_link_latency_ns is None else pd_link_latency_ns),
    ))
    network = (backend or CommBackend()).network(
        topo, SystemConfig(local_mem_bw_gbps=float(local_mem_bw_gbs)))
    return KvHandoff(latency, network, npus, kv_cache_dtype=kv_cache_dtype)


class ClusterKvTransfer:
    """The engine's ``KvTransfer`` for a deployment: how long after a prefill step ends the
    decode side holds the request's KV, priced by the prefill instance's :class:`KvHandoff`.

    ``streamed=False``: vLLM's connectors, the whole KV after the step
    (:meth:`KvHandoff.kv_transfer_ns`). ``streamed=True``: the reference, which streams each
    layer's KV during the step and then sends the sampled ids; what is left is
    :meth:`KvHandoff.pd_prefill_extra_ns` of a prefill of ``tokens`` alone (the reference adds
    it to the prefill step, so its TTFT is that much later).
    """

    def __init__(self, handoffs: Mapping[str, KvHandoff], *, streamed: bool = False) -> None:
        self.handoffs = dict(handoffs)
        self.streamed = streamed

    def __call__(self, prefill: str, decode: str, tokens: int) -> int:
        handoff = self.handoffs.get(prefill)
        if handoff is None:
            raise ConfigError(
                f"P/D: instance {prefill!r} hands a request off but is not a prefill instance "
                f"of this deployment (prefill instances: {sorted(self.handoffs)})"
            )
        if self.streamed:
            return handoff.pd_prefill_extra_ns(BatchShape(tokens, 1, tokens, 0, 0, 0, 0, 0))
        return handoff.kv_transfer_ns(tokens)
