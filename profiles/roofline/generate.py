"""Roofline profile bundles: the default timing profile when no measured bundle exists.

:func:`generate_bundle` writes, for one (hardware, model, TP), a bundle in the LLMServingSim
layout that ``profiles.bundle`` reads::

    <root>/<hardware>/<org>/<model>/<variant>/meta.yaml
    <root>/<hardware>/<org>/<model>/<variant>/tp<N>/{dense,per_sequence,attention,moe}.csv

Each row's ``time_us`` is a roofline estimate (see ``profiles.roofline.factors`` for the
formula) from the layer's per-rank FLOPs and HBM bytes (``profiles.roofline.cost``) against
the hardware's peak tensor throughput and HBM bandwidth, with efficiency factors and launch
overheads fitted per hardware type (``factors.yaml``: the RTX PRO 6000's to its measured
bundles, the other aiconfigurator systems' to NVIDIA's measured vLLM operator tables; other
hardware takes the file's fallback set; ``profiles.roofline.factors.load_factors``). Rows
sit on the profiler's own grids (``profiles.roofline.grid``) so interpolation behaves as
with a measured bundle.

Layers flagged ``tp_invariant`` and the MoE block are priced from ``tp1`` by the simulator
(as in the reference), so for ``tp > 1`` the ``tp1`` folder is generated as well.
No ``skew_fit`` is produced (``skew_fit.enabled: false``, i.e. alpha = 0). Generating
clears the loader's in-process bundle cache (``profiles.bundle.clear_bundle_cache``) so a
bundle directory that gained a TP folder is re-read.

:func:`ensure_bundle` caches bundles under ``$SERVESWEEP_CACHE`` (default
``~/.cache/servesweep/bundles``), keyed by a hash of the hardware and model specs, the
factors (their values, the factor set's system and the factors file's version), the grid and
the generator version, so any change regenerates.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from engine.specs import ConfigError, HardwareSpec, ModelSpec
from profiles.architecture import load_architecture
from profiles.bundle import clear_bundle_cache
from profiles.roofline.cost import (
    Precision,
    RankShape,
    Work,
    attention_work,
    dense_work,
    moe_work,
    parse_variant,
    per_sequence_work,
)
from profiles.roofline.factors import KernelFactors, RooflineFactors, load_factors
from profiles.roofline.grid import (
    GridSpec,
    attention_keys,
    dense_tokens,
    moe_keys,
    per_sequence_counts,
)

GENERATOR_VERSION = 1
CACHE_ENV = "SERVESWEEP_CACHE"
DEFAULT_CACHE_DIR = Path("~/.cache/servesweep/bundles")


# --------------------------------------------------------------------------- timing


def kernel_time_us(
    work: Work, f: KernelFactors, hardware: HardwareSpec, fp8_compute: bool = False
) -> np.ndarray:
    """Roofline time (microseconds) of each row of ``work`` under factors ``f``."""
    peak = hardware.peak_bf16_tflops
    if fp8_compute and hardware.peak_fp8_tflops > 0:
        peak = hardware.peak_fp8_tflops
    if peak <= 0 or hardware.hbm_bw_gbs <= 0:
        raise ConfigError(f"hardware '{hardware.name}' needs peak_bf16_tflops and hbm_bw_gbs > 0")
    compute = work.flops / (peak * 1e6 * f.eff_compute)  # TFLOP/s -> FLOP/us
    if f.ramp_gflop > 0:
        compute = compute * (1.0 + f.ramp_gflop * 1e9 / np.maximum(work.flops, 1.0))
    nbytes = work.bytes
    if work.gqa_extra_bytes is not None:
        share = np.full_like(nbytes, f.mixed_gqa_share)
        if work.gqa_set_bytes is not None and f.mixed_cache_mb > 0:
            with np.errstate(divide="ignore"):
                spill = 1.0 - f.mixed_cache_mb * 1e6 / work.gqa_set_bytes
            share = np.maximum(share, np.clip(spill, 0.0, 1.0))
        nbytes = nbytes + share * work.gqa_extra_bytes
    bandwidth = hardware.hbm_bw_gbs * 1e3 * f.eff_memory  # GB/s -> B/us
    if f.cache_boost > 0:
        bandwidth = bandwidth * (1.0 + f.cache_boost * np.exp(-nbytes / (f.cache_mb * 1e6)))
    memory = nbytes / bandwidth
    terms = [compute, memory]
    if work.serial_keys is not None and f.serial_ns_per_key > 0:
        terms.append(work.serial_keys * f.serial_ns_per_key * 1e-3)
    p = f.sharpness
    scale = np.maximum.reduce(terms)
    safe = np.where(scale > 0, scale, 1.0)
    body = safe * sum((t / safe) ** p for t in terms) ** (1.0 / p)
    body = np.where(scale > 0, body, 0.0)
    launch: np.ndarray | float = f.launch_us
    per_seq: np.ndarray | float = f.per_seq_us
    if work.decode_only is not None:
        launch = np.where(work.decode_only, f.decode_launch_us, f.launch_us)
        per_seq = np.where(work.decode_only, f.decode_per_seq_us, f.per_seq_us)
    t = launch + body
    if work.sequences is not None:
        t = t + per_seq * work.sequences
    if work.empty_blocks is not None:
        t = t + f.empty_block_ns * 1e-3 * work.empty_blocks
    for part, mask in work.floors:
        t = np.where(mask, np.maximum(t, kernel_time_us(part, f, hardware, fp8_compute)), t)
    return t


# --------------------------------------------------------------------------- tables


def _layer_shape(model: ModelSpec, tp: int, tp_invariant: bool) -> RankShape:
    return RankShape.of(model, 1 if tp_invariant else tp)


def _layer_rows(
    model: ModelSpec,
    tp: int,
    table: str,
    axis: str,
    counts: np.ndarray,
    time_us: Callable[[str, RankShape], np.ndarray],
) -> pd.DataFrame:
    """Rows (layer, ``axis``, time_us) for every layer of the model's ``table`` (dense or
    per_sequence), each layer priced at ``counts`` on its rank shape (tp1 when tp-invariant)."""
    arch = load_architecture(model.model_type)
    frames = []
    for name in sorted(n for n, r in arch.layers.items() if r.table == table):
        shape = _layer_shape(model, tp, arch.layers[name].tp_invariant)
        frames.append(pd.DataFrame({"layer": name, axis: counts, "time_us": time_us(name, shape)}))
    return pd.concat(frames, ignore_index=True)


def dense_table(
    hardware: HardwareSpec,
    model: ModelSpec,
    tp: int,
    precision: Precision,
    factors: RooflineFactors,
    grid: GridSpec,
) -> pd.DataFrame:
    """dense.csv rows (layer, tokens, time_us) for every dense-table layer of the model."""
    tokens = dense_tokens(grid)
    return _layer_rows(
        model, tp, "dense", "tokens", tokens,
        lambda name, shape: kernel_time_us(dense_work(name, shape, precision, tokens),
                                           factors.for_layer(name), hardware,
                                           precision.fp8_compute),
    )


def per_sequence_table(
    hardware: HardwareSpec,
    model: ModelSpec,
    tp: int,
    factors: RooflineFactors,
    grid: GridSpec,
) -> pd.DataFrame:
    """per_sequence.csv rows (layer, sequences, time_us) for lm_head and sampler."""
    seqs = per_sequence_counts(grid)
    return _layer_rows(
        model, tp, "per_sequence", "sequences", seqs,
        lambda name, shape: kernel_time_us(per_sequence_work(name, shape, seqs),
                                           factors.for_layer(name), hardware),
    )


def attention_table(
    hardware: HardwareSpec,
    model: ModelSpec,
    tp: int,
    precision: Precision,
    factors: RooflineFactors,
    grid: GridSpec,
) -> pd.DataFrame:
    """attention.csv rows on the profiler's ragged 4-axis grid."""
    keys = attention_keys(grid)
    work = attention_work(RankShape.of(model, tp), precision, *keys.T)
    t = kernel_time_us(work, factors.for_layer("attention"), hardware)
    df = pd.DataFrame(keys, columns=["prefill_chunk", "kv_prefill", "n_decode", "kv_decode"])
    df["time_us"] = t
    return df


def moe_table(
    hardware: HardwareSpec,
    model: ModelSpec,
    precision: Precision,
    factors: RooflineFactors,
    grid: GridSpec,
) -> pd.DataFrame:
    """moe.csv rows (tokens, activated_experts, time_us): one rank holding all experts."""
    keys = moe_keys(model.num_experts, model.num_experts_per_tok, grid)
    work = moe_work(RankShape.of(model, 1), precision, keys[:, 0], keys[:, 1])
    t = kernel_time_us(work, factors.for_layer("moe"), hardware, precision.fp8_compute)
    return pd.DataFrame({"tokens": keys[:, 0], "activated_experts": keys[:, 1], "time_us": t})


# --------------------------------------------------------------------------- writing


def variant_dir(root: Path, hardware: HardwareSpec, model: ModelSpec, variant: str) -> Path:
    """``<root>/<hardware>/<model name>/<variant>``, the loader's rule (``org/model`` names
    give the ``<org>/<model>`` levels of the LLMServingSim layout)."""
    parts = model.name.split("/")
    if not model.name or model.name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"model name '{model.name}' must look like '<org>/<model>'")
    return Path(root) / hardware.name / model.name / variant


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    out = df.copy()
    out["time_us"] = [float(f"{v:.6g}") for v in np.maximum(out["time_us"].to_numpy(), 1e-3)]
    out.to_csv(path, index=False)


def _write_tp_dir(
    dest: Path,
    hardware: HardwareSpec,
    model: ModelSpec,
    tp: int,
    precision: Precision,
    factors: RooflineFactors,
    grid: GridSpec,
) -> None:
    """Write ``dest`` (a ``tp<N>`` folder) atomically: build in a sibling temp dir, then rename."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        _write_csv(dense_table(hardware, model, tp, precision, factors, grid), tmp / "dense.csv")
        _write_csv(per_sequence_table(hardware, model, tp, factors, grid), tmp / "per_sequence.csv")
        _write_csv(attention_table(hardware, model, tp, precision, factors, grid), tmp / "attention.csv")
        if model.is_moe and tp == 1:
            _write_csv(moe_table(hardware, model, precision, factors, grid), tmp / "moe.csv")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _meta(
    hardware: HardwareSpec,
    model: ModelSpec,
    variant: str,
    tps: list[int],
    precision: Precision,
    factors: RooflineFactors,
    grid: GridSpec,
) -> dict[str, object]:
    return {
        "generator": "servesweep.profiles.roofline",
        "generator_version": GENERATOR_VERSION,
        "hardware": hardware.name,
        "architecture": model.model_type,
        "model": model.name,
        "variant": variant,
        "tp_degrees": tps,
        "engine_effective": {
            "max_num_batched_tokens": grid.max_num_batched_tokens,
            "max_num_seqs": grid.max_num_seqs,
            "block_size": 16,
        },
        "attention_grid": {
            "max_kv": grid.max_kv,
            "chunks": f"0, 16-{grid.max_num_batched_tokens} x2 and x1.5",
            "n_decode": f"0, 1-{grid.max_num_seqs} x2",
            "kv": f"0, 16-{grid.max_kv} x2 and 512-{grid.max_kv} x1.5",
        },
        "roofline": {
            "cache_key": bundle_key(hardware, model, factors, grid),
            "factors_sha256": factors.digest(),
            "factors_system": factors.system,
            "factors_version": factors.version,
            "weight_bytes": precision.weight_bytes,
            "kv_bytes": precision.kv_bytes,
            "fp8_compute": precision.fp8_compute,
            "hardware_spec": asdict(hardware),
        },
        "skew_fit": {"enabled": False},
    }


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _present_tps(vdir: Path) -> list[int]:
    return sorted(
        int(p.name[2:]) for p in vdir.glob("tp*") if p.is_dir() and p.name[2:].isdigit()
    )


def _write_meta(vdir: Path, meta: dict[str, object]) -> None:
    tmp = vdir / ".meta.yaml.tmp"
    tmp.write_text(yaml.safe_dump(meta, sort_keys=False))
    os.replace(tmp, vdir / "meta.yaml")


def generate_bundle(
    hardware: HardwareSpec,
    model: ModelSpec,
    tp: int,
    root: Path,
    variant: str = "bf16",
    factors: RooflineFactors | None = None,
    grid: GridSpec | None = None,
) -> Path:
    """Write the roofline bundle of (hardware, model, tp) under ``root``; return the variant dir.

    Writes ``tp<tp>/`` (and ``tp1/`` too when ``tp > 1``: the simulator prices TP-invariant
    layers and the MoE block from it) and (re)writes ``meta.yaml`` listing every ``tp*``
    folder present. Other TP folders already there are left alone.
    """
    factors = factors if factors is not None else load_factors(hardware=hardware.name)
    grid = grid if grid is not None else GridSpec()
    precision = parse_variant(variant)
    RankShape.of(model, tp)  # validate the split before writing anything
    vdir = variant_dir(root, hardware, model, variant)
    with _locked(vdir):
        _generate_locked(vdir, hardware, model, tp, variant, precision, factors, grid)
    return vdir


def _generate_locked(
    vdir: Path,
    hardware: HardwareSpec,
    model: ModelSpec,
    tp: int,
    variant: str,
    precision: Precision,
    factors: RooflineFactors,
    grid: GridSpec,
) -> None:
    for n in sorted({1, tp}):
        _write_tp_dir(vdir / f"tp{n}", hardware, model, n, precision, factors, grid)
    meta = _meta(hardware, model, variant, _present_tps(vdir), precision, factors, grid)
    _write_meta(vdir, meta)
    # The loader memoises bundles per directory; a folder that gained a tp<N>/ must be re-read.
    clear_bundle_cache()


def bundle_key(
    hardware: HardwareSpec,
    model: ModelSpec,
    factors: RooflineFactors,
    grid: GridSpec | None = None,
) -> str:
    """16-hex-digit cache key over everything that determines a bundle's numbers."""
    blob = json.dumps(
        {
            "generator_version": GENERATOR_VERSION,
            "hardware": asdict(hardware),
            "model": asdict(model),
            "factors": factors.to_dict(),
            "factors_system": factors.system,
            "factors_version": factors.version,
            "grid": asdict(grid if grid is not None else GridSpec()),
        },
        sort_keys=True,
        default=str,
    ).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_dir() -> Path:
    """Bundle cache root: ``$SERVESWEEP_CACHE`` or ``~/.cache/servesweep/bundles``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else DEFAULT_CACHE_DIR.expanduser()


def _complete(vdir: Path, tp: int, model: ModelSpec) -> bool:
    if not (vdir / "meta.yaml").is_file():
        return False
    for n in sorted({1, tp}):
        d = vdir / f"tp{n}"
        names = ["dense.csv", "per_sequence.csv", "attention.csv"]
        if model.is_moe and n == 1:
            names.append("moe.csv")
        if not all((d / f).is_file() for f in names):
            return False
    return True


def ensure_bundle(
    hardware: HardwareSpec,
    model: ModelSpec,
    tp: int,
    variant: str = "bf16",
    factors: RooflineFactors | None = None,
    grid: GridSpec | None = None,
    cache: Path | None = None,
) -> Path:
    """Variant dir of the cached roofline bundle, generating it on a miss.

    The bundle lives at ``<cache>/<bundle_key>/<hardware>/<org>/<model>/<variant>``; load it
    with ``load_bundle(returned_path)`` or with root ``<cache>/<bundle_key>``.
    """
    factors = factors if factors is not None else load_factors(hardware=hardware.name)
    grid = grid if grid is not None else GridSpec()
    root = (cache if cache is not None else cache_dir()) / bundle_key(hardware, model, factors, grid)
    vdir = variant_dir(root, hardware, model, variant)
    if _complete(vdir, tp, model):
        return vdir
    precision = parse_variant(variant)
    RankShape.of(model, tp)
    with _locked(vdir):
        if not _complete(vdir, tp, model):  # another process may have generated it meanwhile
            _generate_locked(vdir, hardware, model, tp, variant, precision, factors, grid)
    return vdir
