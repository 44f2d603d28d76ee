"""Communication-aware step latency for one serving instance with TP / PP / EP (and its DP group).

A :class:`ParallelLatencyModel` composes a per-rank compute model (a
:class:`~profiles.latency.ProfiledLatencyModel` built without host I/O, or any latency model
with ``breakdown`` and ``arch``) with an :class:`astra_bridge.NetworkModel`, the way the
reference simulator's trace + ASTRA-Sim graph do (timing model §2.8-2.14, §3.2, §3.6):

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
* **P/D**: a prefill instance streams each layer's K+V (``floor(2*n_kv*d*N*kv_bytes/tp)`` bytes
  per layer and rank, ``kv_bytes`` = 1 for an fp8 KV cache) to its decode peer right after that
  layer's ``qkv_proj``, overlapped with compute, and sends the sampled ids (``4*T`` bytes)
  instead of storing them (§2.12, serving core §11.9).

All results are integer ns and memoised on the shape (or token count).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astra_bridge import NetworkModel
from astra_bridge.topology import Dimension, DimKind, SystemConfig, Topology
from engine.batch import BatchShape, LatencyModel
from engine.memory import dtype_bytes
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec

_TP_ALLREDUCE_ROWS = ("o_proj", "down_proj")
_MAX_CACHE = 1 << 20


# ------------------------------------------------------------------------------------ layout


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """Parallel degrees of one instance: ``tp``, ``pp``, ``ep`` (group-wide EP degree, the
    reference's ``ep_total``) and ``dp`` (members of the DP group sharing the EP collectives)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "dp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} = {v!r}: parallel degree must be an integer >= 1")

    def check(self, model: ModelSpec) -> None:
        """The reference's validation (serving core §3.2) for this model."""
        if self.pp > model.num_layers:
            raise ConfigError(
                f"pp = {self.pp}: more pipeline stages than the {model.num_layers} layers of "
                f"{model.name}; use pp <= {model.num_layers}"
            )
        if not model.is_moe:
            if self.ep != 1:
                raise ConfigError(f"ep = {self.ep}: {model.name} is dense; set ep = 1")
            return
        if model.num_experts % self.ep:
            raise ConfigError(
                f"ep = {self.ep}: {model.name}'s {model.num_experts} experts are not divisible "
                "by it; use a divisor of the expert count"
            )
        if self.ep % self.dp:
            raise ConfigError(
                f"ep = {self.ep}: not divisible by the DP group size {self.dp}; the per-instance "
                "EP degree ep/dp must be an integer"
            )
        if self.ep // self.dp > self.tp:
            raise ConfigError(
                f"ep = {self.ep}: the per-instance EP degree ep/dp = {self.ep // self.dp} exceeds "
                f"tp = {self.tp}; raise tp or the DP group size, or lower ep"
            )

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Blocks per stage: ``L//pp`` each, remainder +1 to stages pp-2, pp-3, ... (vLLM)."""
        per, rem = divmod(num_layers, self.pp)
        out = [per] * self.pp
        for i in range(2, rem + 2):
            out[-i] += 1
        return tuple(out)

    def dim_sizes(self) -> tuple[int, ...]:
        """The reference's topology dimensions for this instance (innermost first).

        DP group: ``[tp, dp]`` or ``[tp, pp, dp]``; single instance: ``[tp, pp]``, ``[tp]`` or
        ``[pp]`` (size-1 dimensions dropped, at least one kept).
        """
        if self.dp > 1:
            return (self.tp, self.pp, self.dp) if self.pp > 1 else (self.tp, self.dp)
        dims = tuple(d for d in (self.tp, self.pp) if d > 1)
        return dims or (1,)

    def tp_flags(self) -> tuple[bool, ...]:
        """Involved dimensions of a TP collective: the TP dimension only."""
        n = len(self.dim_sizes())
        return (True,) + (False,) * (n - 1)

    def ep_flags(self) -> tuple[bool, ...]:
        """Involved dimensions of an EP collective (serving core §3.3); never the PP dim."""
        n = len(self.dim_sizes())
        if self.dp == 1 or self.ep <= self.tp:
            return (True,) + (False,) * (n - 1)
        flags = [self.tp > 1] + [False] * (n - 1)
        flags[-1] = True
        return tuple(flags)

    def npu(self, stage: int, rank: int = 0) -> int:
        """NPU id of a TP rank of a stage (stage-major, contiguous: ``rank + tp*stage``)."""
        return rank + self.tp * stage

    @property
    def ep_spans_group(self) -> bool:
        """True when EP collectives couple the DP members (each step's layers synchronise)."""
        return self.dp > 1 and self.ep > self.tp


def layout_for_instance(inst: Any, instances: Sequence[Any], model: ModelSpec) -> ParallelLayout:
    """The reference's parallelism inference (serving core §3.2) for one instance.

    ``inst`` has the reference cluster JSON's optional ``num_npus``, ``tp_size``, ``pp_size``,
    ``ep_size`` and ``dp_group`` fields (e.g. :class:`analysis.groundtruth.InstanceSpec`);
    ``instances`` are all instances of the cluster (for the DP group size). Returns the layout
    with ``ep`` the group-wide EP degree (default: tp for MoE, 1 for dense) and ``dp`` the
    number of instances sharing ``dp_group``; raises :class:`ConfigError` on inconsistencies.
    """
    n, t, p = inst.num_npus, inst.tp_size, inst.pp_size
    pp = p or 1
    if n and t:
        if n != t * pp:
            if n % t:
                raise ConfigError(f"num_npus = {n}: not a multiple of tp_size = {t}")
            if p not in (None, 1, n // t):
                raise ConfigError(f"pp_size = {p}: num_npus / tp_size = {n // t}; make them agree")
            pp = n // t
        tp = t
    elif n:
        if n % pp:
            raise ConfigError(f"num_npus = {n}: not a multiple of pp_size = {pp}")
        tp = n // pp
    else:
        tp = t or 1
    ep = inst.ep_size or (tp if model.is_moe else 1)
    dp = 1
    if inst.dp_group is not None:
        dp = sum(1 for i in instances if i.dp_group == inst.dp_group)
    elif ep > tp:
        raise ConfigError(f"ep_size = {ep}: exceeds tp_size = {tp} without a dp_group; "
                          "lower ep_size or put the instance in a DP group")
    layout = ParallelLayout(tp=tp, pp=pp, ep=ep, dp=dp)
    layout.check(model)
    return layout


def build_network(
    layout: ParallelLayout,
    link_bw_gbs: float | Sequence[float],
    link_latency_ns: float | Sequence[float],
    local_mem_bw_gbs: float,
) -> NetworkModel:
    """The reference's network for this instance: FullyConnected dims (``dim_sizes``), per-dim
    link bandwidth (GB/s, GB = 2**30 B) / latency (ns), a scalar or a short list broadcast as the
    reference does (last value repeated), ring algorithms, ``local-mem-bw`` = HBM bandwidth."""
    sizes = layout.dim_sizes()
    bws = _per_dim(link_bw_gbs, len(sizes), "link_bw")
    lats = _per_dim(link_latency_ns, len(sizes), "link_latency")
    topo = Topology(tuple(Dimension(DimKind.FULLY_CONNECTED, n, b, lat)
                          for n, b, lat in zip(sizes, bws, lats, strict=True)))
    return NetworkModel(topo, SystemConfig(local_mem_bw_gbps=float(local_mem_bw_gbs)))


def _per_dim(value: float | Sequence[float], n: int, field: str) -> tuple[float, ...]:
    vals = (value,) if isinstance(value, int | float) else tuple(value)
    if not vals:
        raise ConfigError(f"{field}: empty; give a number or one value per topology dimension")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"{field}: {v!r} is not a number")
    return tuple(float(vals[min(i, len(vals) - 1)]) for i in range(n))


# ------------------------------------------------------------------------------------ DP padding


def dummy_batch() -> BatchShape:
    """The batch an idle DP member runs: one decode of KV length 1 (reference / vLLM dummy run)."""
    return BatchShape(1, 1, 0, 0, 1, 1, 1, 1)


def pad_dp_group(shapes: Sequence[BatchShape | None]) -> list[BatchShape]:
    """Shapes the members of a DP group run in one lock-step round.

    ``None`` (an idle member) becomes :func:`dummy_batch`. Every batch is then padded to the
    group's largest ``total_tokens`` m as the reference does (timing model §2.8): the pad counts
    as dummy decodes, so ``total_tokens = m`` and ``num_seqs`` grows by the pad (dense rows, MoE,
    lm_head and sampler see it) while the attention fields (``num_decode`` and the decode KV
    statistics) keep only the real entries. An all-idle group yields no round (empty list).
    """
    real = _with_dummies(shapes, "pad_dp_group")
    return _pad_to(real, max(s.total_tokens for s in real), sampled=True) if real else []


def _with_dummies(shapes: Sequence[BatchShape | None], who: str) -> list[BatchShape]:
    """The group's batches with each idle member's dummy batch; [] when all are idle."""
    if not shapes:
        raise ConfigError(f"{who}: empty group; pass one entry (or None) per DP member")
    if all(s is None for s in shapes):
        return []
    return [dummy_batch() if s is None else s for s in shapes]


def _pad_to(shapes: list[BatchShape], m: int, *, sampled: bool) -> list[BatchShape]:
    """Each batch padded to ``m`` tokens with dummy decodes: dense rows and MoE see them,
    attention keeps the real decodes, and the per-sequence rows (lm_head, sampler) see them only
    when ``sampled``."""
    return [s if s.total_tokens == m else
            s._replace(total_tokens=m,
                       num_seqs=s.num_seqs + (m - s.total_tokens if sampled else 0))
            for s in shapes]


def cudagraph_max_tokens(max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """vLLM 0.19's default largest CUDA-graph batch: ``min(2*max_num_seqs, 512,
    max_num_batched_tokens)`` tokens (``VllmConfig`` capture sizes, no speculative decoding)."""
    return max(1, min(2 * max_num_seqs, 512, max_num_batched_tokens))


class VllmDpPad:
    """How vLLM 0.19 lines up the batches of a DP group for one lock-step round.

    An idle member runs a dummy batch of one token (``execute_dummy_batch``). Every member then
    takes part in ``coordinate_batch_across_dp``: the batches are padded to the group's largest
    token count only when every member's batch runs as a CUDA graph (at most ``cudagraph_max``
    tokens, see :func:`cudagraph_max_tokens`); otherwise each member runs its own size
    (``vllm/v1/worker/dp_utils.py``: DP padding follows the synced CUDA-graph mode). The pad
    runs through the model's layers but is never sampled (vLLM computes logits only at the real
    requests' ``logits_indices``), so unlike :func:`pad_dp_group` it leaves ``num_seqs`` alone.
    Every batch carries the group's token sum as
    ``moe_tokens``: when EP spans the DP group, vLLM's default ``allgather_reducescatter``
    dispatch all-gathers the batches before the experts run, so each member's experts see all
    of them (:class:`ParallelLatencyModel` ignores it for layouts whose EP stays inside the
    instance, and for dense models). The finer padding to each member's CUDA-graph bucket
    (125 -> 128 tokens) is not modelled.
    """

    def __init__(self, cudagraph_max: int) -> None:
        if cudagraph_max < 0:
            raise ConfigError(f"cudagraph_max = {cudagraph_max}: must be >= 0 (0: no CUDA graphs)")
        self.cudagraph_max = cudagraph_max

    def __call__(self, shapes: Sequence[BatchShape | None]) -> list[BatchShape]:
        real = _with_dummies(shapes, "VllmDpPad")
        if not real:
            return []
        m = max(s.total_tokens for s in real)
        if m <= self.cudagraph_max:
            real = _pad_to(real, m, sampled=False)
        if len(real) > 1:
            g = sum(s.total_tokens for s in real)
            real = [s._replace(moe_tokens=g) for s in real]
        return real


# ------------------------------------------------------------------------------------ the model


class ParallelLatencyModel:
    """Step latency of one instance (one DP replica) with collectives, PP sends and host I/O.

    ``compute`` prices one rank's kernels for a whole step (all ``L`` layers) *without* host
    I/O: a :class:`~profiles.latency.ProfiledLatencyModel` built with ``tp`` tables, ``ep`` =
    the group-wide EP degree and ``host_mem_bw_gbs=None``. PP, :meth:`breakdown`, the
    EP-coupled :meth:`dp_member_ns` and the P/D overlap need its ``breakdown(shape)`` and
    ``arch``.
    ``network`` prices collectives on ``layout.dim_sizes()`` (see :func:`build_network`);
    ``pd_network`` (optional) prices the P/D hand-off from NPU 0 to NPU ``pd_peer``.
    ``host_mem_bw_gbs`` (None drops the host I/O term) and ``kv_cache_dtype`` as the engine's.
    """

    def __init__(
        self,
        compute: LatencyModel,
        model: ModelSpec,
        layout: ParallelLayout,
        network: NetworkModel,
        *,
        host_mem_bw_gbs: float | None = 256.0,
        kv_cache_dtype: str = "auto",
        pd_network: NetworkModel | None = None,
        pd_peer: int | None = None,
    ) -> None:
        layout.check(model)
        if tuple(d.npus for d in network.topology.dims) != layout.dim_sizes():
            raise ConfigError(
                f"network: dimensions {[d.npus for d in network.topology.dims]} do not match the "
                f"layout {list(layout.dim_sizes())}; build it with profiles.parallel.build_network"
            )
        if host_mem_bw_gbs is not None and not host_mem_bw_gbs > 0:
            raise ConfigError(f"host_mem_bw_gbs = {host_mem_bw_gbs}: must be > 0 (or None)")
        probe = getattr(compute, "host_io_ns", None)
        if callable(probe) and probe(BatchShape(1 << 16, 1, 1 << 16, 0, 0, 0, 0, 0)) > 0:
            raise ConfigError(
                "compute: the per-rank model already charges host I/O; build it with "
                "host_mem_bw_gbs=None (this model prices host I/O for all loading ranks)"
            )
        self.compute = compute
        self.model = model
        self.layout = layout
        self.network = network
        self.arch = getattr(compute, "arch", None)
        self._fp = dtype_bytes(model.dtype, f"model {model.name} dtype")
        kv = model.dtype if kv_cache_dtype in ("auto", None) else kv_cache_dtype
        self._kv_bytes = dtype_bytes(kv, "kv_cache_dtype")
        self._host_bw = host_mem_bw_gbs
        self._stage_layers = layout.stage_layers(model.num_layers)
        if self.arch is not None:
            block = self.arch.block
            self._n_ar = sum(1 for n in block if n in _TP_ALLREDUCE_ROWS)
        else:
            self._n_ar = 1 if model.is_moe else 2
        if layout.tp == 1:
            self._n_ar = 0
        self._has_ep = model.is_moe and layout.ep > 1
        # A DP member's experts see the group's gathered tokens only when EP spans the group.
        self._gathers = model.is_moe and layout.ep_spans_group
        if layout.pp > 1 and not self._can_split():
            raise ConfigError(
                f"pp = {layout.pp}: the compute model {type(compute).__name__} has no per-row "
                "breakdown/arch to cut stages; use a ProfiledLatencyModel"
            )
        self.pd_network = pd_network
        self.pd_peer = pd_peer
        self._cache: dict[BatchShape, int] = {}
        self._stage_cache: dict[BatchShape, tuple[int, ...]] = {}
        self._comm_cache: dict[int, int] = {}
        self._split_cache: dict[BatchShape, tuple[int, int, int]] = {}

    def _can_split(self) -> bool:
        return self.arch is not None and callable(getattr(self.compute, "breakdown", None))

    # ------------------------------------------------------------------ communication pieces

    def tp_allreduce_ns(self, tokens: int) -> int:
        """One TP all-reduce of the ``tokens x H`` output (0 when tp == 1)."""
        if self.layout.tp == 1:
            return 0
        return self.network.collective_ns("all-reduce", tokens * self.model.hidden_size * self._fp,
                                          involved_dims=self.layout.tp_flags())

    def ep_collectives_ns(self, tokens: int) -> int:
        """EP all-gather (dispatch) + reduce-scatter (combine) around one MoE block."""
        if not self._has_ep:
            return 0
        m, ep, flags = self.model, self.layout.ep, self.layout.ep_flags()
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
        if not callable(getattr(self.compute, "breakdown", None)):
            raise ConfigError(f"{type(self.compute).__name__} has no breakdown(); use a "
                              "ProfiledLatencyModel as the compute model")
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
        if not self._can_split():
            raise ConfigError("dp_group_ns with EP across the group needs a compute model with "
                              "breakdown/arch")
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
        pre = per_block(block[:cut]) + ar * sum(n in _TP_ALLREDUCE_ROWS for n in block[:cut])
        post = per_block(block[cut + 1:]) + ar * sum(n in _TP_ALLREDUCE_ROWS
                                                     for n in block[cut + 1:])
        pro = sum(bd.get(n, 0) for n in set(self.arch.prologue)) + self.host_io_ns(shape.total_tokens)
        head = sum(bd.get(n, 0) for n in set(self.arch.head))
        return pro, pre, bd.get("moe", 0) // L, post, head

    # ------------------------------------------------------------------ P/D hand-off

    def kv_bytes_per_layer(self, num_tokens: int) -> int:
        """K+V bytes of ``num_tokens`` for one layer on one TP rank (KV dtype aware)."""
        m = self.model
        return (2 * m.num_kv_heads * m.head_dim * num_tokens * self._kv_bytes) // self.layout.tp

    def _pd_p2p(self, nbytes: int) -> int:
        if self.pd_network is None or self.pd_peer is None:
            raise ConfigError("P/D transfer: this model has no pd_network/pd_peer; build it with "
                              "latency_for_instance(..., pd=True)")
        return self.pd_network.p2p_ns(nbytes, 0, self.pd_peer)

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
        return self._pd_p2p(per_layer if streamed else self.model.num_layers * per_layer)

    def pd_prefill_extra_ns(self, shape: BatchShape, send_tokens: int | None = None) -> int:
        """Time a P/D prefill step lasts beyond :meth:`iteration_ns` (reference semantics).

        The sampled ids (``4*T`` bytes) are sent to the decode side instead of stored, and the
        last layer's KV message (sent after its ``qkv_proj``) may outlast the rest of the step:
        ``max(p2p(4*T), kv_transfer_ns(N, streamed=True) - tail)`` with ``tail`` the compute and
        collectives after the last ``qkv_proj`` (rest of the block, the head). ``send_tokens``
        N defaults to the step's scheduled tokens (the reference's effective value; pass the
        scheduled tokens plus the prefix-cache hit to ship the hit's KV too).
        """
        T = shape.total_tokens
        n = T if send_tokens is None else send_tokens
        out = self._pd_p2p(4 * T)
        kv = self.kv_transfer_ns(n, streamed=True)
        if kv <= out:
            return out
        return max(out, kv - self._tail_after_qkv(shape))

    def _tail_after_qkv(self, shape: BatchShape) -> int:
        if not self._can_split():
            return 0
        bd = self.compute.breakdown(shape)
        L = self.model.num_layers
        block = list(self.arch.block)
        if "qkv_proj" not in block:
            return 0
        after = block[block.index("qkv_proj") + 1:]
        counts = {n: block.count(n) for n in block}
        rest = sum(bd.get(n, 0) // (L * counts[n]) for n in after)
        rest += sum(n in _TP_ALLREDUCE_ROWS for n in after) * self.tp_allreduce_ns(shape.total_tokens)
        rest += self.ep_collectives_ns(shape.total_tokens)
        return rest + sum(bd.get(n, 0) for n in set(self.arch.head))

    # ------------------------------------------------------------------ misc

    def check_engine(self, engine: EngineConfig) -> list[str]:
        """Forward to the compute model's profiled-range check (empty when it has none)."""
        fn = getattr(self.compute, "check_engine", None)
        return fn(engine) if callable(fn) else []

    def cache_info(self) -> int:
        """Number of memoised shapes."""
        return len(self._cache)

    def clear_cache(self) -> None:
        """Forget memoised step prices (and the compute model's, when it has ``clear_cache``)."""
        self._cache.clear()
        self._stage_cache.clear()
        self._comm_cache.clear()
        self._split_cache.clear()
        fn = getattr(self.compute, "clear_cache", None)
        if callable(fn):
            fn()


def cluster_kv_transfer(*, streamed: bool = False) -> Callable[[Any, Any, int], int]:
    """A ``kv_transfer_ns(prefill_member, decode_member, tokens)`` for
    :func:`engine.simulate.simulate_cluster`: how long after the prefill step ends the decode
    side holds the request's KV, priced by the prefill member's latency model (a
    :class:`ParallelLatencyModel` built with ``pd=True``).

    ``streamed=False``: vLLM's connectors, the whole KV after the step
    (:meth:`ParallelLatencyModel.kv_transfer_ns`). ``streamed=True``: the reference, which
    streams each layer's KV during the step and then sends the sampled ids; what is left is
    :meth:`ParallelLatencyModel.pd_prefill_extra_ns` of a prefill of ``tokens`` alone (the
    reference adds it to the prefill step, so its TTFT is that much later).
    """

    def kv_transfer(prefill: Any, decode: Any, tokens: int) -> int:
        lat = getattr(prefill, "latency", None)
        if not isinstance(lat, ParallelLatencyModel):
            raise ConfigError(
                f"P/D: prefill instance {getattr(prefill, 'name', prefill)!r} has no "
                "ParallelLatencyModel; build it with profiles.parallel.latency_for_instance(..., "
                "pd=True)"
            )
        if streamed:
            return lat.pd_prefill_extra_ns(BatchShape(tokens, 1, tokens, 0, 0, 0, 0, 0))
        return lat.kv_transfer_ns(tokens)

    return kv_transfer


# ------------------------------------------------------------------------------------ factory


def latency_for_instance(
    bundle: Any,
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
    pd: bool = False,
    pd_link_bw_gbs: float | None = None,
    pd_link_latency_ns: float | None = None,
) -> ParallelLatencyModel:
    """The step-latency model of one instance, as the reference prices it.

    ``bundle``: a loaded :class:`~profiles.bundle.ProfileBundle`, or a bundle root folder (then
    ``hardware`` names the hardware folder and ``variant`` defaults to the dtype/KV-dtype
    variant). ``ep`` is the group-wide EP degree (``ep_total``), ``dp`` the DP group size.
    ``link_bw_gbs`` / ``link_latency_ns``: the cluster's per-dimension link figures (scalar or
    list, as in the reference cluster JSON). ``local_mem_bw_gbs``: the NPU HBM bandwidth for the
    collectives' local reduction (defaults to ``hardware.hbm_bw_gbs``). ``pd=True`` adds the
    P/D hand-off network: the decode peer on a dimension of ``pd_link_*`` (default: the last
    ``link_*`` value), as the reference's prefill shadow NPUs.
    """
    from profiles.bundle import ProfileBundle, load_bundle, variant_name
    from profiles.latency import ProfiledLatencyModel

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
    network = build_network(layout, link_bw_gbs, link_latency_ns, local_mem_bw_gbs)
    pd_net, peer = None, None
    if pd:
        bws = _per_dim(link_bw_gbs, 2, "link_bw")
        lats = _per_dim(link_latency_ns, 2, "link_latency")
        npus = tp * pp
        pd_net = NetworkModel(
            Topology((Dimension(DimKind.FULLY_CONNECTED, npus, bws[0], lats[0]),
                      Dimension(DimKind.FULLY_CONNECTED, 2,
                                bws[1] if pd_link_bw_gbs is None else pd_link_bw_gbs,
                                lats[1] if pd_link_latency_ns is None else pd_link_latency_ns))),
            SystemConfig(local_mem_bw_gbps=float(local_mem_bw_gbs)),
        )
        peer = npus
    return ParallelLatencyModel(compute, model, layout, network, host_mem_bw_gbs=host_mem_bw_gbs,
                                kv_cache_dtype=kv_cache_dtype, pd_network=pd_net, pd_peer=peer)
