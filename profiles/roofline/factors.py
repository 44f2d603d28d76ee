"""Efficiency factors and fixed overheads of the roofline latency model, per kernel category.

The values live in ``profiles/roofline/factors.yaml`` (fitted by ``python -m
profiles.roofline.fit``). Every kernel category has one :class:`KernelFactors`; a
category's time is

    launch_us + per_seq_us * sequences
      + ( (flops / (peak * eff_compute))**p + (bytes / (bw * eff_memory))**p
          + serial**p ) ** (1/p),       p = sharpness,

i.e. a roofline whose corner is rounded by a finite ``sharpness`` (p -> infinity is the
plain ``max``; p = 1 is "no overlap", the sum). ``serial`` only exists for attention: the
time one thread block needs to walk the longest key sequence on its own
(``serial_ns_per_key`` per key at head_dim 128), which bounds varlen prefill kernels that
have too few blocks to fill the GPU. Also for attention, ``bytes`` includes a share of the
extra K/V traffic of decodes that share a varlen call with a prefill chunk and are then read
once per query head rather than once per KV head; the share paid is ``max(mixed_gqa_share, 1 - mixed_cache_mb / W)`` with W one KV head's decode K+V
bytes (beyond the on-chip cache the re-read comes from HBM). Mixed calls also pay
``empty_block_ns`` per thread block launched for a decode beyond its single query tile.
The compute term's efficiency ramps up with the kernel's size, ``eff_compute * F / (F +
ramp_gflop)`` for F GFLOP (small problems fill fewer waves of thread blocks).
The memory term's bandwidth is ``bw * eff_memory * (1 + cache_boost * exp(-bytes / cache_mb))``:
kernels whose whole working set is small run partly from the on-chip L2 cache (the profiler
times a one-layer model, so small weights and activations are often cache-resident).
Attention calls without a prefill chunk run a different (split-KV) kernel and use
``decode_launch_us`` / ``decode_per_seq_us`` in place of ``launch_us`` / ``per_seq_us``.

The factors file holds one set per hardware type (``systems: {<catalog name>: ...}``):
the RTX PRO 6000's fitted to its measured bundles, every other aiconfigurator system's
fitted to NVIDIA's measured vLLM operator tables (``profiles.roofline.fit`` gives both).
:func:`load_factors` picks the set of the hardware asked for; hardware without its own set
uses the file's ``hardware_fallback`` entry for it, else ``fallback`` (docs/roofline.md
gives the choice and its reason).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import yaml

from engine.specs import ConfigError
from profiles.yaml_load import safe_load

DEFAULT_FACTORS_PATH = Path(__file__).with_name("factors.yaml")

#: Kernel categories and the canonical layer names priced by each.
CATEGORY_OF_LAYER: dict[str, str] = {
    "embedding": "embedding",
    "layernorm": "norm",
    "final_layernorm": "norm",
    "qk_norm": "head_norm",
    "rotary_emb": "rotary",
    "qkv_proj": "gemm",
    "o_proj": "gemm",
    "gate_up_proj": "gemm",
    "down_proj": "gemm",
    "act_fn": "activation",
    "lm_head": "lm_head",
    "sampler": "sampler",
    "attention": "attention",
    "moe": "moe",
}
CATEGORIES: tuple[str, ...] = tuple(sorted(set(CATEGORY_OF_LAYER.values())))


@dataclass(frozen=True, slots=True)
class KernelFactors:
    """Calibration of one kernel category (see the module docstring for the formula)."""

    eff_compute: float = 1.0  # achieved fraction of the tensor-core peak
    eff_memory: float = 1.0  # achieved fraction of HBM bandwidth
    launch_us: float = 0.0  # fixed time per module invocation (kernel launches, tails)
    sharpness: float = 8.0  # p of the rounded max; large = plain roofline max
    per_seq_us: float = 0.0  # attention: extra time per sequence in the varlen batch
    serial_ns_per_key: float = 0.0  # attention: one block's time per key (head_dim 128)
    mixed_gqa_share: float = 0.0  # attention: share of the GQA re-read paid by mixed decodes
    decode_launch_us: float = 0.0  # attention: launch_us of pure-decode (split-KV) calls
    decode_per_seq_us: float = 0.0  # attention: per_seq_us of pure-decode calls
    mixed_cache_mb: float = 0.0  # attention: one KV head's decode K+V above this spills the GQA re-read
    empty_block_ns: float = 0.0  # attention: cost of one early-exit thread block (mixed calls)
    ramp_gflop: float = 0.0  # compute efficiency is eff_compute * F / (F + ramp) for F GFLOP
    cache_boost: float = 0.0  # small working sets see bandwidth x (1 + boost) (on-chip cache)
    cache_mb: float = 1.0  # working-set scale (MB) over which that boost decays

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"roofline factor {f.name} must be a finite number, got {v!r}")
        if self.eff_compute <= 0 or self.eff_memory <= 0:
            raise ConfigError("roofline eff_compute and eff_memory must be > 0")
        if self.sharpness < 1:
            raise ConfigError("roofline sharpness must be >= 1 (1 = sum, large = max)")
        nonneg = ("launch_us", "per_seq_us", "serial_ns_per_key", "mixed_gqa_share",
                  "decode_launch_us", "decode_per_seq_us", "cache_boost", "mixed_cache_mb",
                  "empty_block_ns", "ramp_gflop")
        if min(getattr(self, n) for n in nonneg) < 0:
            raise ConfigError(f"roofline factors {', '.join(nonneg)} must be >= 0")
        if self.cache_mb <= 0:
            raise ConfigError("roofline cache_mb must be > 0")


@dataclass(frozen=True, slots=True)
class RooflineFactors:
    """One :class:`KernelFactors` per category in :data:`CATEGORIES`, with where they come
    from: ``system`` (the factors file's set, a catalog hardware name; empty for factors
    built in code) and ``version`` (the factors file's ``version``). Both are part of the
    bundle cache key."""

    categories: Mapping[str, KernelFactors]
    system: str = ""
    version: int = 0

    def __post_init__(self) -> None:
        missing = [c for c in CATEGORIES if c not in self.categories]
        if missing:
            raise ConfigError(f"roofline factors lack categories {missing}")
        unknown = sorted(set(self.categories) - set(CATEGORIES))
        if unknown:
            raise ConfigError(f"unknown roofline categories {unknown}; known: {list(CATEGORIES)}")

    def for_layer(self, layer: str) -> KernelFactors:
        """Factors of the category that prices canonical layer ``layer``."""
        try:
            return self.categories[CATEGORY_OF_LAYER[layer]]
        except KeyError:
            raise ConfigError(
                f"the roofline model has no cost formula for layer '{layer}'; "
                f"known layers: {sorted(CATEGORY_OF_LAYER)}"
            ) from None

    def replace(self, category: str, factors: KernelFactors) -> RooflineFactors:
        """A copy with one category's factors swapped."""
        cats = dict(self.categories)
        cats[category] = factors
        return RooflineFactors(cats, self.system, self.version)

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {c: asdict(self.categories[c]) for c in CATEGORIES}

    def digest(self) -> str:
        """SHA-256 of the canonical JSON form (part of the bundle cache key)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def factors_from_dict(
    data: object, source: str = "<dict>", system: str = "", version: int = 0
) -> RooflineFactors:
    """Build factors from ``{"categories": {name: {field: value}}}``."""
    if not isinstance(data, dict) or not isinstance(data.get("categories"), dict):
        raise ConfigError(f"{source}: expected a mapping with a 'categories' mapping")
    allowed = {f.name for f in fields(KernelFactors)}
    cats: dict[str, KernelFactors] = {}
    for name, vals in data["categories"].items():
        if not isinstance(vals, dict):
            raise ConfigError(f"{source}: categories.{name} must be a mapping")
        bad = sorted(set(vals) - allowed)
        if bad:
            raise ConfigError(f"{source}: categories.{name} has unknown keys {bad}")
        cats[str(name)] = KernelFactors(**{k: float(v) for k, v in vals.items()})
    return RooflineFactors(cats, system, version)


@dataclass(frozen=True, slots=True)
class FactorsFile:
    """A parsed factors file: one factor set per hardware name, and the fallback rule."""

    version: int
    systems: Mapping[str, RooflineFactors]
    fallback: str  # the set used for hardware without its own (and without an alias)
    hardware_fallback: Mapping[str, str]  # hardware name -> set, for hardware without its own

    def system_for(self, hardware: str | None) -> str:
        """Name of the factor set that prices ``hardware``: a set of that name, or of the
        catalog hardware it is an alias of (``H100`` -> ``H100-SXM``, as front ends that keep
        the reference's names pass it), else its ``hardware_fallback`` entry, else the
        fallback. Case-insensitive; None: the fallback."""
        if hardware is None:
            return self.fallback
        by_lower = {k.lower(): k for k in self.systems}
        aliases = {k.lower(): v for k, v in self.hardware_fallback.items()}
        for name in (hardware, _catalog_name(hardware)):
            if name is not None and name.lower() in by_lower:
                return by_lower[name.lower()]
        for name in (hardware, _catalog_name(hardware)):
            if name is not None and name.lower() in aliases:
                return aliases[name.lower()]
        return self.fallback

    def for_hardware(self, hardware: str | None) -> RooflineFactors:
        return self.systems[self.system_for(hardware)]


def _catalog_name(hardware: str) -> str | None:
    """The catalog's canonical name for a hardware name or alias, None when not in it."""
    from profiles.catalog import load_hardware  # the catalog reads YAML files: import late

    try:
        return load_hardware(hardware).name
    except ConfigError:
        return None


def factors_file_from_dict(data: object, source: str = "<dict>") -> FactorsFile:
    """Parse a factors file: ``version: 2`` with ``systems``, ``fallback`` and optional
    ``hardware_fallback``; a ``version: 1`` file (one ``categories`` set) is its own
    fallback for every hardware."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping")
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ConfigError(f"{source}: version must be an integer, got {version!r}")
    if "systems" not in data:
        one = factors_from_dict(data, source, "", version)
        return FactorsFile(version, {"": one}, "", {})
    systems = data["systems"]
    if not isinstance(systems, dict) or not systems:
        raise ConfigError(f"{source}: systems must be a non-empty mapping of hardware names")
    sets = {str(name): factors_from_dict(block, f"{source}: systems.{name}", str(name), version)
            for name, block in systems.items()}
    fallback = data.get("fallback")
    if fallback not in sets:
        raise ConfigError(f"{source}: fallback must name one of the systems {sorted(sets)}, "
                          f"got {fallback!r}")
    aliases = data.get("hardware_fallback") or {}
    if not isinstance(aliases, dict):
        raise ConfigError(f"{source}: hardware_fallback must map hardware names to systems")
    for hw, target in aliases.items():
        if target not in sets:
            raise ConfigError(f"{source}: hardware_fallback.{hw} names unknown system "
                              f"{target!r}; known: {sorted(sets)}")
    return FactorsFile(version, sets, str(fallback), {str(k): str(v) for k, v in aliases.items()})


def load_factors_file(path: str | Path | None = None) -> FactorsFile:
    """The parsed factors file ``path`` (default ``profiles/roofline/factors.yaml``), parsed
    once per file version (every sweep point asks, and the YAML takes ~70 ms)."""
    p = Path(path) if path is not None else DEFAULT_FACTORS_PATH
    try:
        version = p.stat().st_mtime_ns
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read roofline factors ({exc})") from exc
    return _parsed_file(str(p), version)


def load_factors(path: str | Path | None = None, hardware: str | None = None) -> RooflineFactors:
    """The factors that price ``hardware`` (a catalog hardware name; its own fitted set, or
    the file's fallback for it; None: the fallback set) from ``path`` (default: the fitted
    ``profiles/roofline/factors.yaml``)."""
    return load_factors_file(path).for_hardware(hardware)


@functools.lru_cache(maxsize=8)
def _parsed_file(path: str, version: int) -> FactorsFile:
    p = Path(path)
    try:
        # libyaml's loader where PyYAML has it: the same data, ~9x faster on this 50 KB file
        # (every process that prices roofline hardware parses it once).
        data = safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read roofline factors ({exc})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: invalid YAML ({exc})") from exc
    return factors_file_from_dict(data, str(p))
