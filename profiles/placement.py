"""Weight placement: layers whose weights live in host DRAM or a CXL device stream in every step.

The reference cluster config's ``placement`` block (docs/reference-semantics.md §5) assigns
each layer's weights to ``npu`` (HBM, the default), ``cpu`` (the node's host DRAM) or
``cxl:<i>`` (one device of the CXL pool), by layer name (``embedding``, ``final_layernorm``,
``lm_head``) over per-block ranges (``"0-3,5"``) over a default. Weights that are not in HBM are
loaded for every step: each device serves its loads one after another in layer order
(``latency + bytes/bw``, GB = 1e9 B, as ``astra_bridge.memory``), all devices in parallel, and a
layer computes once its weights have arrived and the previous layer has finished.
:class:`WeightStreamingLatency` wraps a step-latency model with that schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from astra_bridge.memory import MemoryTier, TierKind
from engine.batch import BatchShape, LatencyModel
from engine.memory import dtype_bytes, weight_bytes_per_rank
from engine.specs import ConfigError, ModelSpec

_NAMED_LAYERS = ("embedding", "final_layernorm", "lm_head")


def _parse_blocks(spec: str, num_layers: int, where: str) -> list[int]:
    out: list[int] = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ConfigError(f"{where}: {spec!r} is not a block range like '0-3,5'") from None
    return [b for b in out if 0 <= b < num_layers]  # out-of-range ids are dropped


def _location(value: Any, where: str) -> str:
    v = str(value).strip().lower()
    if v.startswith("npu"):
        return "npu"
    if v.startswith("cpu"):
        return "cpu"
    if v.startswith("cxl"):
        idx = v.split(":", 1)[1] if ":" in v else "0"
        if not idx.isdigit():
            raise ConfigError(f"{where}: {value!r}; write cxl:<device index>")
        return f"cxl:{int(idx)}"
    raise ConfigError(f"{where}: weights location {value!r}; use npu, cpu or cxl:<i>")


@dataclass(frozen=True, slots=True)
class WeightPlacement:
    """Where each step-ordered weight segment lives: ``segments[i] = (location, bytes)`` for the
    embedding, the ``L`` blocks in order, the final norm and the lm_head (per rank)."""

    segments: tuple[tuple[str, int], ...]
    devices: dict[str, MemoryTier]

    @property
    def streams(self) -> bool:
        return any(loc != "npu" for loc, _ in self.segments)

    def describe(self) -> str:
        per: dict[str, int] = {}
        for loc, nbytes in self.segments:
            if loc != "npu":
                per[loc] = per.get(loc, 0) + nbytes
        parts = ", ".join(f"{k}: {v / 1e9:.2f} GB" for k, v in sorted(per.items()))
        return f"weights streamed every step from {parts}"

    def wrap(self, inner: RowLatency) -> WeightStreamingLatency:
        return WeightStreamingLatency(inner, self)


def placement_for_instance(
    placement: dict[str, Any] | None,
    cluster: Any,
    node_id: int,
    model: ModelSpec,
    *,
    tp: int = 1,
) -> WeightPlacement | None:
    """Resolve a reference ``placement`` block (None when absent)."""
    if not placement:
        return None
    where = "placement"
    L = model.num_layers
    default = placement.get("default") or {}
    loc_block = [_location(default.get("weights", "npu"), f"{where}.default.weights")] * L
    for i, rule in enumerate(placement.get("blocks") or []):
        w = f"{where}.blocks[{i}]"
        if "blocks" not in rule:
            raise ConfigError(f"{w}: missing 'blocks' (a range like '0-3,5')")
        loc = _location(rule.get("weights", "npu"), f"{w}.weights")
        for b in _parse_blocks(rule["blocks"], L, f"{w}.blocks"):
            loc_block[b] = loc
    named = {n: _location(default.get("weights", "npu"), f"{where}.default.weights") for n in _NAMED_LAYERS}
    for name, rule in (placement.get("layers") or {}).items():
        if name in _NAMED_LAYERS:
            named[name] = _location(rule.get("weights", "npu"), f"{where}.layers.{name}.weights")
    fp = dtype_bytes(model.dtype, "model.dtype")
    h = model.hidden_size
    vocab_rank = -(-model.vocab_size // tp)
    embed = vocab_rank * h * fp
    head = 0 if model.tie_word_embeddings else vocab_rank * h * fp
    norm = h * fp
    total = weight_bytes_per_rank(model, tp=tp, pp=1)
    block = (total - embed - head - norm) // L
    segments = (
        [(named["embedding"], embed)]
        + [(loc, block) for loc in loc_block]
        + [(named["final_layernorm"], norm), (named["lm_head"], head)]
    )
    devices: dict[str, MemoryTier] = {}
    for loc, _ in segments:
        if loc == "cpu" and loc not in devices:
            mem = cluster.nodes[node_id].cpu_mem
            devices[loc] = MemoryTier(TierKind.HOST_DRAM, float(mem.mem_bw), float(mem.mem_latency))
        elif loc.startswith("cxl") and loc not in devices:
            mem = cluster.cxl_mem
            if mem is None:
                raise ConfigError(f"{where}: weights on {loc} but the cluster has no cxl_mem")
            dev = int(loc.split(":")[1])
            if dev >= mem.num_devices:
                raise ConfigError(
                    f"{where}: {loc} but cxl_mem.num_devices = {mem.num_devices}; "
                    f"use cxl:0..cxl:{mem.num_devices - 1}"
                )
            devices[loc] = MemoryTier(TierKind.CXL, float(mem.mem_bw), float(mem.mem_latency))
    return WeightPlacement(tuple(segments), devices)


class RowLatency(LatencyModel, Protocol):
    """A step model that also splits the step by row (``ParallelLatencyModel``)."""

    def breakdown(self, shape: BatchShape) -> dict[str, int]: ...


class WeightStreamingLatency:
    """A step-latency model plus per-step streaming of the weights not held in HBM.

    Compute is split over the step's segments: the embedding, final norm and lm_head get their
    share from ``inner.breakdown``, the rest is divided evenly over the ``L`` blocks. Under
    pipeline parallelism the streaming delay of the step is added to the inner model's stage
    time as well (:meth:`stage_ns`)."""

    def __init__(self, inner: RowLatency, placement: WeightPlacement) -> None:
        self.inner = inner
        self.placement = placement
        self._cache: dict[BatchShape, int] = {}
        segs = placement.segments
        self._loads: list[tuple[str, int]] = []
        for loc, nbytes in segs:
            tier = placement.devices.get(loc)
            self._loads.append((loc, tier.access_ns(nbytes) if tier is not None else 0))

    def _compute_split(self, shape: BatchShape, total: int) -> Sequence[int]:
        n = len(self._loads)
        L = n - 3
        parts = {"embedding": 0, "final_layernorm": 0, "lm_head": 0}
        b = self.inner.breakdown(shape)
        for k in parts:
            parts[k] = int(b.get(k, 0))
        parts["lm_head"] += int(b.get("sampler", 0))
        rest = max(total - sum(parts.values()), 0)
        per_block = rest // L
        blocks = [per_block] * L
        blocks[-1] += rest - per_block * L
        return [parts["embedding"], *blocks, parts["final_layernorm"], parts["lm_head"]]

    def iteration_ns(self, shape: BatchShape) -> int:
        v = self._cache.get(shape)
        if v is not None:
            return v
        total = int(self.inner.iteration_ns(shape))
        compute = self._compute_split(shape, total)
        dev_free: dict[str, int] = {}
        t = 0
        for (loc, load), c in zip(self._loads, compute, strict=True):
            ready = 0
            if load:
                ready = dev_free.get(loc, 0) + load
                dev_free[loc] = ready
            t = max(t, ready) + c
        v = self._cache[shape] = t
        return v

    def stage_ns(self, shape: BatchShape) -> int:
        """The inner model's stage time plus this step's streaming delay (the whole step
        without pipeline parallelism)."""
        return self.inner.stage_ns(shape) + self.iteration_ns(shape) - self.inner.iteration_ns(shape)
