"""Communication-aware step latency for one serving instance with TP / PP / EP (and its DP group).

A :class:`ParallelLatencyModel` composes a per-rank compute model (a
:class:`~profiles.latency.ProfiledLatencyModel` built without host I/O, or any
:class:`RankCompute`) with a network (:class:`astra_bridge.Network`: the embedded analytical
model or an ASTRA-Sim binary), the way the reference simulator's trace + ASTRA-Sim graph do
(docs/reference-semantics.md §6-§8):

* **TP**: an all-reduce of the full output tensor (``T*H*fp`` bytes, T = total scheduled tokens)
  after every ``o_proj`` and ``down_proj`` row of a block when ``tp > 1`` (two per dense block,
  one per MoE block), over the TP dimension; compute and collectives are serialised.
* **EP** (MoE, ``ep > 1``): around each MoE block an all-gather of ``max(1, T//ep)*(H+E)*fp``
  bytes (hidden state + router logits) and a reduce-scatter of ``T*H*fp`` bytes over the EP
  dimensions (TP dimension only when ``ep <= tp``; the DP dimension, plus the TP dimension when
  ``tp > 1``, when EP spans the DP group). Under DP, T is the group's padded size.
* **PP**: blocks are cut as vLLM's ``get_pp_indices`` (``L//pp`` per stage, the remainder +1 to
  the stages just before the last); stage 0 runs the prologue, the last stage the head, and every
  non-last stage ends with a send of the hidden state (``T*H*fp``) to the next stage.
* **Host I/O**: the step's token ids (``T*2*fp`` bytes) are loaded from host DRAM by each of the
  ``tp`` first-stage NPUs; the reference charges ``(tp+1)*floor(B/bw)`` ns (observed, not
  derived: 2x at tp 1 on the Llama-3.1-8B run, 3x at tp 2 on every recoverable decode iteration
  of the Qwen3-32B run; ``bw`` in GB/s read as bytes/ns).

Which source prices the TP / EP collectives (the analytical model over the links, an
ASTRA-Sim binary, or aiconfigurator's measured tables) is :mod:`profiles.parallel.comm`'s.
The P/D hand-off of a prefill instance is :mod:`profiles.parallel.pd_transfer`'s. All results
are integer ns and memoised on the shape (or token count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from astra_bridge import CommBackend, Network
from engine.batch import BatchShape, decode_advanced
from engine.memory import dtype_bytes
from engine.specs import ConfigError, HardwareSpec, ModelSpec
from profiles.architecture import Architecture
from profiles.bundle import ProfileBundle, load_bundle, variant_name
from profiles.latency import ProfiledLatencyModel
from profiles.parallel.comm import (
    CUDA_GRAPH_MAX_TOKENS,
    MEASURED,
    CollectiveSource,
    MeasuredNetwork,
)
from profiles.parallel.layout import ParallelLayout, build_network

# The rows after which the reference attaches a TP all-reduce (docs/reference-semantics.md §6.2).
TP_ALLREDUCE_ROWS = ("o_proj", "down_proj")
_MAX_CACHE = 1 << 20


class RankCompute(Protocol):
    """One rank's kernels for a whole step, without collectives or host I/O
    (:class:`profiles.latency.ProfiledLatencyModel` built with ``host_mem_bw_gbs=None``)."""

    @property
    def arch(self) -> Architecture: ...

    def iteration_ns(self, shape: BatchShape) -> int: ...

    def breakdown(self, shape: BatchShape) -> dict[str, int]: ...


class ParallelLatencyModel:
    """Step latency of one instance (one DP replica) with collectives, PP sends and host I/O.

    ``compute`` prices one rank's kernels for a whole step (all ``L`` layers) *without* host
    I/O: a :class:`~profiles.latency.ProfiledLatencyModel` built with ``tp`` tables, ``ep`` =
    the group-wide EP degree and ``host_mem_bw_gbs=None``; its ``breakdown`` and ``arch`` cut
    the step into stages, MoE segments and the P/D overlap.
    ``network`` prices collectives on ``layout.dim_sizes()`` (see
    :func:`profiles.parallel.layout.build_network`). ``host_mem_bw_gbs`` (None drops the host
    I/O term) as the engine's. The engine calls :meth:`iteration_ns` and :meth:`stage_ns`
    (``engine.batch.LatencyModel``).
    """

    def __init__(
        self,
        compute: RankCompute,
        model: ModelSpec,
        layout: ParallelLayout,
        network: Network,
        *,
        host_mem_bw_gbs: float | None = 256.0,
    ) -> None:
        layout.check(model)
        if tuple(d.npus for d in network.topology.dims) != layout.dim_sizes():
            raise ConfigError(
                f"network: dimensions {[d.npus for d in network.topology.dims]} do not match the "
                f"layout {list(layout.dim_sizes())}; build it with "
                "profiles.parallel.layout.build_network"
            )
        if host_mem_bw_gbs is not None and not host_mem_bw_gbs > 0:
            raise ConfigError(f"host_mem_bw_gbs = {host_mem_bw_gbs}: must be > 0 (or None)")
        if compute.breakdown(BatchShape(1 << 16, 1, 1 << 16, 0, 0, 0, 0, 0)).get("host_io", 0) > 0:
            raise ConfigError(
                "compute: the per-rank model already charges host I/O; build it with "
                "host_mem_bw_gbs=None (this model prices host I/O for all loading ranks)"
            )
        self.compute = compute
        self.model = model
        self.layout = layout
        self.network = network
        self.arch = compute.arch
        self._fp = dtype_bytes(model.dtype, f"model {model.name} dtype")
        self._host_bw = host_mem_bw_gbs
        self._stage_layers = layout.stage_layers(model.num_layers)
        self._n_ar = 0 if layout.tp == 1 else sum(1 for n in self.arch.block
                                                  if n in TP_ALLREDUCE_ROWS)
        self._has_ep = model.is_moe and layout.ep > 1
        # A DP member's experts see the group's gathered tokens only when EP spans the group.
        self._gathers = model.is_moe and layout.ep_spans_group
        self._tp_flags = layout.tp_flags()
        self._ep_flags = layout.ep_flags() if self._has_ep else None
        self._cache: dict[BatchShape, int] = {}
        self._stage_cache: dict[BatchShape, tuple[int, ...]] = {}
        self._comm_cache: dict[int, int] = {}
        self._split_cache: dict[BatchShape, tuple[int, int, int]] = {}

    # ------------------------------------------------------------------ communication pieces

    def tp_allreduce_ns(self, tokens: int) -> int:
        """One TP all-reduce of the ``tokens x H`` output (0 when tp == 1)."""
        if self.layout.tp == 1:
            return 0
        return self.network.collective_ns("all-reduce", tokens * self.model.hidden_size * self._fp,
                                          involved_dims=self._tp_flags)

    def ep_collectives_ns(self, tokens: int) -> int:
        """EP all-gather (dispatch) + reduce-scatter (combine) around one MoE block."""
        if not self._has_ep:
            return 0
        m, ep, flags = self.model, self.layout.ep, self._ep_flags
        ag = max(1, tokens // ep) * (m.hidden_size + m.num_experts) * self._fp
        rs = tokens * m.hidden_size * self._fp
        return (self.network.collective_ns("all-gather", ag, involved_dims=flags)
                + self.network.collective_ns("reduce-scatter", rs, involved_dims=flags))

    def block_comm_ns(self, tokens: int) -> int:
        """Collectives of one transformer block for a step of ``tokens`` (memoised)."""
        v = self._comm_cache.get(tokens)
        if v is None:
            v = self._n_ar * self.tp_allreduce_ns(tokens) + self.ep_collectives_ns(tokens)
            if len(self._comm_cache) >= _MAX_CACHE:
                self._comm_cache.clear()
            self._comm_cache[tokens] = v
        return v

    def pp_send_ns(self, tokens: int) -> int:
        """Hidden-state send between two adjacent stages (0 when pp == 1)."""
        if self.layout.pp == 1:
            return 0
        lay = self.layout
        return self.network.p2p_ns(tokens * self.model.hidden_size * self._fp,
                                   lay.npu(0), lay.npu(1))

    def host_io_ns(self, tokens: int) -> int:
        """Load of the step's token ids by the first stage's ``tp`` NPUs from host DRAM."""
        if self._host_bw is None:
            return 0
        return (self.layout.tp + 1) * math.floor(tokens * 2 * self._fp / self._host_bw)

    # ------------------------------------------------------------------ compute split

    def _split(self, shape: BatchShape) -> tuple[int, int, int]:
        """(prologue, all blocks, head) compute ns of one rank for the whole step."""
        v = self._split_cache.get(shape)
        if v is None:
            bd = self.compute.breakdown(shape)
            arch = self.arch
            pro = sum(bd.get(n, 0) for n in set(arch.prologue))
            head = sum(bd.get(n, 0) for n in set(arch.head))
            total = self.compute.iteration_ns(shape)
            v = (pro, total - pro - head, head)
            if len(self._split_cache) >= _MAX_CACHE:
                self._split_cache.clear()
            self._split_cache[shape] = v
        return v

    def stage_times(self, shape: BatchShape) -> tuple[int, ...]:
        """Per stage: its compute, its collectives, its outgoing send (non-last stages) and, on
        stage 0, the host input load. They sum to :meth:`iteration_ns`."""
        shape = self._own(shape)
        if self.layout.pp == 1:
            return (self.iteration_ns(shape),)
        v = self._stage_cache.get(shape)
        if v is None:
            v = self._stages(shape)
            if len(self._stage_cache) >= _MAX_CACHE:
                self._stage_cache.clear()
            self._stage_cache[shape] = v
        return v

    def _stages(self, shape: BatchShape) -> tuple[int, ...]:
        T = shape.total_tokens
        comm = self.block_comm_ns(T)
        io = self.host_io_ns(T)
        L = self.model.num_layers
        pro, blocks, head = self._split(shape)
        send = self.pp_send_ns(T)
        out, done = [], 0
        last = len(self._stage_layers) - 1
        for k, n in enumerate(self._stage_layers):
            # integer split of the blocks' total that preserves it exactly
            part = blocks * (done + n) // L - blocks * done // L
            done += n
            t = part + n * comm
            if k == 0:
                t += pro + io
            if k == last:
                t += head
            else:
                t += send
            out.append(t)
        return tuple(out)

    # ------------------------------------------------------------------ LatencyModel API

    def iteration_ns(self, shape: BatchShape) -> int:
        """Latency a request sees for one step: through every stage (memoised on the shape)."""
        shape = self._own(shape)
        v = self._cache.get(shape)
        if v is None:
            if self.layout.pp == 1:
                T = shape.total_tokens
                v = (self.compute.iteration_ns(shape) + self.model.num_layers * self.block_comm_ns(T)
                     + self.host_io_ns(T))
            else:
                v = sum(self.stage_times(shape))
            if len(self._cache) >= _MAX_CACHE:
                self._cache.clear()
            self._cache[shape] = v
        return v

    def decode_steps_ns(self, shape: BatchShape, k: int) -> list[int]:
        """:meth:`iteration_ns` of ``k`` consecutive steps of the same decodes (step ``i`` has
        every decode ``i`` tokens further; the engine's decode spans): the same integers.
        With one stage the collectives and host I/O depend only on the step's token count,
        which a decode run keeps, so they are added to the rank's own bulk prices
        (``compute.decode_steps_ns`` when it has one); otherwise one call per step."""
        shape = self._own(shape)
        bulk = getattr(self.compute, "decode_steps_ns", None)
        if self.layout.pp != 1 or bulk is None:
            return [self.iteration_ns(decode_advanced(shape, i)) for i in range(k)]
        T = shape.total_tokens
        extra = self.model.num_layers * self.block_comm_ns(T) + self.host_io_ns(T)
        return [c + extra for c in bulk(shape, k)]

    def _own(self, shape: BatchShape) -> BatchShape:
        """Drop the group's gathered MoE token count where this layout's experts don't see it."""
        if shape.moe_tokens and not self._gathers:
            return shape._replace(moe_tokens=0)
        return shape

    def stage_ns(self, shape: BatchShape) -> int:
        """How long the busiest stage is occupied by this step (== iteration_ns when pp == 1)."""
        if self.layout.pp == 1:
            return self.iteration_ns(shape)
        return max(self.stage_times(shape))

    def breakdown(self, shape: BatchShape) -> dict[str, int]:
        """Compute rows (all stages, whole step) plus ``tp_allreduce``, ``ep_collectives``,
        ``pp_send`` and ``host_io``; the values sum to :meth:`iteration_ns`."""
        shape = self._own(shape)
        T = shape.total_tokens
        L = self.model.num_layers
        out = dict(self.compute.breakdown(shape))
        out.pop("host_io", None)
        out["tp_allreduce"] = L * self._n_ar * self.tp_allreduce_ns(T)
        out["ep_collectives"] = L * self.ep_collectives_ns(T)
        out["pp_send"] = (self.layout.pp - 1) * self.pp_send_ns(T)
        out["host_io"] = self.host_io_ns(T)
        return out

    # ------------------------------------------------------------------ DP groups

    def dp_group_ns(self, shapes: Sequence[BatchShape]) -> int:
        """Duration of one lock-step round of a DP group: its slowest member's finish time
        (see :meth:`dp_member_ns`); the next round starts only then."""
        return max(self.dp_member_ns(shapes))

    def dp_member_ns(self, shapes: Sequence[BatchShape]) -> list[int]:
        """When each member of a DP group finishes its batch within one lock-step round.

        ``shapes`` are the members' batches, already padded (:func:`pad_dp_group`), every member
        priced with this model. A member's tokens complete at its own finish time; the group's
        next round starts at the latest one (the reference's barrier, vLLM's lock-step).

        Without EP collectives spanning the group the members are independent: each finishes
        after its own :meth:`iteration_ns`. With them (MoE, ``ep > tp``, pp == 1) every MoE
        dispatch and combine is a barrier, so each segment between two collectives lasts as
        long as the slowest member's: prologue + host I/O + the first pre-MoE rows, then per
        block the MoE rows, then the post-MoE rows with the next block's pre-MoE rows; after
        the last combine each member runs its own post-MoE rows and head. (With pp > 1 the
        members are treated as independent.)
        """
        if not shapes:
            raise ConfigError("dp_member_ns: no member shapes; pass one padded shape per member")
        shapes = [self._own(s) for s in shapes]
        if not self.layout.ep_spans_group or self.layout.pp > 1 or len(shapes) == 1:
            return [self.iteration_ns(s) for s in shapes]
        T = {s.total_tokens for s in shapes}
        if len(T) != 1:
            raise ConfigError("dp_member_ns: member shapes differ in total_tokens; pad them with "
                              "pad_dp_group first")
        parts = [self._moe_segments(s) for s in shapes]
        L = self.model.num_layers
        first = max(p[0] + p[1] for p in parts)
        moe = max(p[2] for p in parts)
        between = max(p[3] + p[1] for p in parts)
        # pre/post already hold the TP all-reduces; add the EP collectives
        shared = first + L * moe + (L - 1) * between + L * self.ep_collectives_ns(T.pop())
        return [shared + p[3] + p[4] for p in parts]

    def _moe_segments(self, shape: BatchShape) -> tuple[int, int, int, int, int]:
        """(prologue + host I/O, per-block pre-MoE rows + TP all-reduces, per-block MoE rows,
        per-block post-MoE rows + TP all-reduces, head) of one member."""
        bd = self.compute.breakdown(shape)
        L = self.model.num_layers
        block = list(self.arch.block)
        if "moe" not in block:
            raise ConfigError(f"architecture {self.arch.family}: no 'moe' row in the block")
        cut = block.index("moe")
        counts = {n: block.count(n) for n in block}

        def per_block(names: Sequence[str]) -> int:
            return sum(bd.get(n, 0) // (L * counts[n]) for n in names)

        ar = self.tp_allreduce_ns(shape.total_tokens)
        pre = per_block(block[:cut]) + ar * sum(n in TP_ALLREDUCE_ROWS for n in block[:cut])
        post = per_block(block[cut + 1:]) + ar * sum(n in TP_ALLREDUCE_ROWS
                                                     for n in block[cut + 1:])
        pro = sum(bd.get(n, 0) for n in set(self.arch.prologue)) + self.host_io_ns(shape.total_tokens)
        head = sum(bd.get(n, 0) for n in set(self.arch.head))
        return pro, pre, bd.get("moe", 0) // L, post, head

    # ------------------------------------------------------------------ misc

    def cache_info(self) -> int:
        """Number of memoised shapes."""
        return len(self._cache)

    def clear_cache(self) -> None:
        """Forget this model's memoised step prices (the compute model keeps its own)."""
        self._cache.clear()
        self._stage_cache.clear()
        self._comm_cache.clear()
        self._split_cache.clear()


def latency_for_instance(
    bundle: ProfileBundle | str | Path,
    model: ModelSpec,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    dp: int = 1,
    link_bw_gbs: float | Sequence[float] = 16.0,
    link_latency_ns: float | Sequence[float] = 20000.0,
    hardware: HardwareSpec | str | None = None,
    local_mem_bw_gbs: float | None = None,
    host_mem_bw_gbs: float | None = 256.0,
    kv_cache_dtype: str = "auto",
    variant: str | None = None,
    reference_quirks: bool = True,
    backend: CommBackend | None = None,
    collectives: CollectiveSource | None = None,
) -> ParallelLatencyModel:
    """The step-latency model of one instance, as the reference prices it.

    ``bundle``: a loaded :class:`~profiles.bundle.ProfileBundle`, or a bundle root folder (then
    ``hardware`` names the hardware folder and ``variant`` defaults to the dtype/KV-dtype
    variant). ``ep`` is the group-wide EP degree (``ep_total``), ``dp`` the DP group size.
    ``link_bw_gbs`` / ``link_latency_ns``: the cluster's per-dimension link figures (scalar or
    list, as in the reference cluster JSON). ``local_mem_bw_gbs``: the NPU HBM bandwidth for the
    collectives' local reduction (defaults to ``hardware.hbm_bw_gbs``). ``backend`` prices the
    collectives (default: the embedded analytical model). ``collectives``: where TP / EP
    collectives are priced from (:func:`profiles.parallel.comm.collective_source`; None or an
    analytical source: ``backend`` over the links; a measured source: aiconfigurator's tables
    through :class:`~profiles.parallel.comm.MeasuredNetwork`, ``backend`` for the rest).
    """
    layout = ParallelLayout(tp=tp, pp=pp, ep=ep, dp=dp)
    layout.check(model)
    hw_name = hardware.name if isinstance(hardware, HardwareSpec) else hardware
    if isinstance(bundle, ProfileBundle):
        loaded = bundle
    elif isinstance(bundle, str | Path):
        if not hw_name:
            raise ConfigError("hardware: required to load a bundle from a folder; pass the "
                              "HardwareSpec or its name")
        loaded = load_bundle(bundle, hw_name, model.name,
                             variant or variant_name(model.dtype, kv_cache_dtype))
    else:
        raise ConfigError(f"bundle: expected a ProfileBundle or a folder, got {type(bundle).__name__}")
    if local_mem_bw_gbs is None:
        if not isinstance(hardware, HardwareSpec) or hardware.hbm_bw_gbs <= 0:
            raise ConfigError("local_mem_bw_gbs: not given and no HardwareSpec with hbm_bw_gbs; "
                              "pass the NPU memory bandwidth (GB/s)")
        local_mem_bw_gbs = hardware.hbm_bw_gbs
    compute = ProfiledLatencyModel(loaded, model, tp, ep=ep, host_mem_bw_gbs=None,
                                   reference_quirks=reference_quirks)
    network: Network = build_network(layout, link_bw_gbs, link_latency_ns, local_mem_bw_gbs,
                                     backend)
    if collectives is not None and collectives.kind == MEASURED:
        graph_max = CUDA_GRAPH_MAX_TOKENS * model.hidden_size * dtype_bytes(model.dtype, "dtype")
        network = MeasuredNetwork(collectives, network, graph_max)
    return ParallelLatencyModel(compute, model, layout, network, host_mem_bw_gbs=host_mem_bw_gbs)
