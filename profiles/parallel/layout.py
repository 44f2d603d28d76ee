"""The parallel layout of one instance and the network it spans.

* :class:`ParallelLayout`: TP / PP / EP degrees and the DP group size, with the reference's
  validation (docs/reference-semantics.md §3), vLLM's split of the blocks over pipeline
  stages, and the topology dimensions and collective masks the reference generates
  (docs/reference-semantics.md §4).
* :func:`layout_for_instance`: the reference cluster JSON's parallelism inference.
* :func:`build_network`: the reference's FullyConnected network of a layout, priced by a
  :class:`astra_bridge.CommBackend` (the analytical model by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from astra_bridge import CommBackend, Network
from astra_bridge.topology import Dimension, DimKind, SystemConfig, Topology
from engine.specs import ConfigError, ModelSpec


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
        """The reference's validation (docs/reference-semantics.md §3) for this model."""
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
        """Involved dimensions of an EP collective (docs/reference-semantics.md §4); never the
        PP dim."""
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
    """The reference's parallelism inference (docs/reference-semantics.md §3) for one instance.

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
    backend: CommBackend | None = None,
) -> Network:
    """The reference's network for this instance: FullyConnected dims (``dim_sizes``), per-dim
    link bandwidth (GB/s, GB = 2**30 B) / latency (ns), a scalar or a short list broadcast as the
    reference does (last value repeated), ring algorithms, ``local-mem-bw`` = HBM bandwidth;
    priced by ``backend`` (default: the analytical model)."""
    sizes = layout.dim_sizes()
    bws = per_dim(link_bw_gbs, len(sizes), "link_bw")
    lats = per_dim(link_latency_ns, len(sizes), "link_latency")
    topo = Topology(tuple(Dimension(DimKind.FULLY_CONNECTED, n, b, lat)
                          for n, b, lat in zip(sizes, bws, lats, strict=True)))
    return (backend or CommBackend()).network(
        topo, SystemConfig(local_mem_bw_gbps=float(local_mem_bw_gbs)))


def per_dim(value: float | Sequence[float], n: int, field: str) -> tuple[float, ...]:
    """``n`` per-dimension values from a scalar or a list (its last value repeated)."""
    vals = (value,) if isinstance(value, int | float) else tuple(value)
    if not vals:
        raise ConfigError(f"{field}: empty; give a number or one value per topology dimension")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"{field}: {v!r} is not a number")
    return tuple(float(vals[min(i, len(vals) - 1)]) for i in range(n))
