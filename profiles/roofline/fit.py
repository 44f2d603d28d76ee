"""Fit the roofline efficiency factors, one set per hardware type.

Usage::

    python -m profiles.roofline.fit [--data DIR] [--out profiles/roofline/factors.yaml]
        [--systems NAME ...]

Two sources of truth, one fitting method (:func:`fit_set`):

* **Measured bundles** (``MEASURED_HARDWARE``, the RTX PRO 6000): ``DIR`` is the shared data
  folder (default ``$SERVESWEEP_DATA`` or ``../shared/data``), the bundles are read from
  ``DIR/llmservingsim/profiles/<hardware>/``; every category is fitted on every measured row
  (all models, all TP folders; TP-invariant layers only from ``tp1`` since the other folders
  hold copies).
* **aiconfigurator-core's tables** (every other system of ``profiles.aiconfigurator.SYSTEMS``):
  the aiconfigurator bundle of each catalog model at TP 1 (``profiles.aiconfigurator``), on
  the rows that come from NVIDIA's measured vLLM operator tables alone (GEMM layers, the
  lm_head GEMM, MoE; attention without KV history and without mixing prefill and decodes:
  the other attention rows, and the norm / rotary / activation / embedding / sampler rows,
  are the roofline model's own and would fit the factors to themselves). Categories and
  parameters the tables cannot determine are inherited from the measured set
  (:data:`TABLE_FREE_PARAMS` lists what is fitted).

For every kernel category the parameters of :class:`profiles.roofline.factors.KernelFactors`
are chosen by least squares on ``log(predicted / truth)``. Categories are independent, so
each is a small separate fit (scipy ``least_squares``, soft-L1 loss, parameters in log space,
several starting points). ``--systems`` refits only the named table sets and keeps the
others of ``--out`` (inheriting from the measured set in that file); naming the measured
hardware refits every set.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from engine.specs import HardwareSpec, ModelSpec
from profiles.architecture import load_architecture
from profiles.catalog import list_models, load_hardware, load_model
from profiles.roofline.cost import (
    RankShape,
    Work,
    attention_work,
    dense_work,
    moe_work,
    parse_variant,
    per_sequence_work,
)
from profiles.roofline.factors import (
    CATEGORIES,
    CATEGORY_OF_LAYER,
    DEFAULT_FACTORS_PATH,
    KernelFactors,
    RooflineFactors,
    load_factors_file,
)
from profiles.roofline.generate import kernel_time_us

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The hardware with measured bundles: its factor set is fitted to them (measured truth wins).
MEASURED_HARDWARE = "RTXPRO6000"
#: (hardware, model) pairs with measured bundles in the shared data.
MEASURED: tuple[tuple[str, str], ...] = (
    ("RTXPRO6000", "meta-llama/Llama-3.1-8B"),
    ("RTXPRO6000", "Qwen/Qwen3-32B"),
    ("RTXPRO6000", "Qwen/Qwen3-30B-A3B-Instruct-2507"),
)
#: Parameters fitted per category (the rest keep their KernelFactors defaults / zero).
_CACHE = ("cache_boost", "cache_mb")
FREE_PARAMS: dict[str, tuple[str, ...]] = {
    "gemm": ("eff_compute", "eff_memory", "launch_us", "sharpness", "ramp_gflop", *_CACHE),
    "lm_head": ("eff_compute", "eff_memory", "launch_us", "sharpness"),
    "moe": ("eff_compute", "eff_memory", "launch_us", "sharpness", *_CACHE),
    "attention": (
        "eff_compute",
        "eff_memory",
        "launch_us",
        "sharpness",
        "per_seq_us",
        "serial_ns_per_key",
        "mixed_gqa_share",
        "decode_launch_us",
        "decode_per_seq_us",
        "mixed_cache_mb",
        "empty_block_ns",
    ),
    "norm": ("eff_memory", "launch_us", *_CACHE),
    "head_norm": ("eff_memory", "launch_us"),
    "rotary": ("eff_memory", "launch_us", *_CACHE),
    "activation": ("eff_memory", "launch_us", *_CACHE),
    "embedding": ("eff_memory", "launch_us"),
    "sampler": ("eff_memory", "launch_us", *_CACHE),
}


#: Parameters fitted to aiconfigurator's tables, per category they measure. The tables'
#: attention rows are batch-1 prefill without history and decode-only batches, so the
#: parameters of KV history and of mixed prefill + decode calls (per_seq_us,
#: mixed_gqa_share, mixed_cache_mb, empty_block_ns) keep the measured set's values.
TABLE_FREE_PARAMS: dict[str, tuple[str, ...]] = {
    "gemm": FREE_PARAMS["gemm"],
    "lm_head": FREE_PARAMS["lm_head"],
    "moe": FREE_PARAMS["moe"],
    "attention": ("eff_compute", "eff_memory", "launch_us", "sharpness", "serial_ns_per_key",
                  "decode_launch_us", "decode_per_seq_us"),
}
#: The set priced for hardware without its own: the one fitted to measured vLLM 0.19 kernels
#: in every category (the table sets inherit their norm / rotary / activation / embedding /
#: sampler factors from it anyway).
FALLBACK = MEASURED_HARDWARE
#: Catalog hardware without its own set that is closer to another set than to the fallback.
#: RTX 4090: Ada (sm_89) like the L40S, so the same kernels (FlashAttention 2, no FA3 /
#: TRT-LLM paths), GDDR6X on PCIe without NVLink.
HARDWARE_FALLBACK: dict[str, str] = {"RTX4090": "L40S"}


def table_systems() -> dict[str, str]:
    """Catalog hardware name -> aiconfigurator system, for the sets fitted to its tables."""
    from profiles.aiconfigurator import SYSTEMS

    return {hw: system for hw, system in SYSTEMS.items() if hw != MEASURED_HARDWARE}


def default_data_dir() -> Path:
    """``$SERVESWEEP_DATA`` or the ``shared/data`` folder beside the repository."""
    return Path(os.environ.get("SERVESWEEP_DATA", REPO_ROOT.parent / "shared" / "data"))


def measured_variant_dir(data: Path, hardware: str, model: str, variant: str = "bf16") -> Path:
    return data / "llmservingsim" / "profiles" / hardware / model / variant


@dataclass(frozen=True, slots=True)
class Sample:
    """Measured rows of one kernel category from one table, with their computed work."""

    category: str
    table: str  # dense / per_sequence / attention / moe
    label: str  # e.g. "meta-llama/Llama-3.1-8B tp1 qkv_proj"
    work: Work
    measured_us: np.ndarray
    fp8_compute: bool = False
    weight: np.ndarray | None = None  # per-row least-squares weight (default 1)


def attention_regime(prefill_chunk: np.ndarray, n_decode: np.ndarray) -> np.ndarray:
    """'decode' (no prefill chunk), 'prefill' (no decodes) or 'mixed', per attention row."""
    return np.where(prefill_chunk == 0, "decode", np.where(n_decode == 0, "prefill", "mixed"))


def regime_weights(prefill_chunk: np.ndarray, n_decode: np.ndarray) -> np.ndarray:
    """Row weights giving the three attention regimes equal total weight (mean weight 1).

    The grid holds ~170 pure-decode rows against ~19,000 others, yet pure-decode steps are
    most of a serving run; unweighted, the fit would sacrifice them.
    """
    regime = attention_regime(prefill_chunk, n_decode)
    names, inverse, counts = np.unique(regime, return_inverse=True, return_counts=True)
    return regime.size / (len(names) * counts[inverse])


def measured_tps(vdir: Path) -> list[int]:
    return sorted(int(p.name[2:]) for p in vdir.glob("tp*") if p.is_dir() and p.name[2:].isdigit())


def table_attention_rows(keys: np.ndarray) -> np.ndarray:
    """Attention rows (prefill_chunk, kv_prefill, n_decode, kv_decode) an aiconfigurator
    bundle takes from NVIDIA's tables alone: no KV history, and not prefill and decodes in
    one call (profiles.aiconfigurator.build adds roofline costs to the others)."""
    pc, kp, nd = keys[:, 0], keys[:, 1], keys[:, 2]
    return (kp == 0) & ((pc == 0) | (nd == 0))


def samples_for(
    model: ModelSpec, vdir: Path, tp: int, variant: str = "bf16", tables_only: bool = False
) -> Iterator[Sample]:
    """Every row of ``vdir/tp<tp>`` paired with the roofline work of its key (attention:
    only the :func:`table_attention_rows` when ``tables_only``)."""
    precision = parse_variant(variant)
    arch = load_architecture(model.model_type)
    folder = vdir / f"tp{tp}"
    tag = f"{model.name} tp{tp}"
    dense = pd.read_csv(folder / "dense.csv")
    for layer, rows in dense.groupby("layer", sort=True):
        rule = arch.layers.get(str(layer))
        if rule is None or (rule.tp_invariant and tp != 1):
            continue
        shape = RankShape.of(model, 1 if rule.tp_invariant else tp)
        work = dense_work(str(layer), shape, precision, rows["tokens"].to_numpy())
        yield Sample(CATEGORY_OF_LAYER[str(layer)], "dense", f"{tag} {layer}", work,
                     rows["time_us"].to_numpy(float), precision.fp8_compute)
    per_seq = pd.read_csv(folder / "per_sequence.csv")
    for layer, rows in per_seq.groupby("layer", sort=True):
        rule = arch.layers.get(str(layer))
        if rule is None or (rule.tp_invariant and tp != 1):
            continue
        shape = RankShape.of(model, 1 if rule.tp_invariant else tp)
        work = per_sequence_work(str(layer), shape, rows["sequences"].to_numpy())
        yield Sample(CATEGORY_OF_LAYER[str(layer)], "per_sequence", f"{tag} {layer}", work,
                     rows["time_us"].to_numpy(float))
    attn = pd.read_csv(folder / "attention.csv")
    keys = attn[["prefill_chunk", "kv_prefill", "n_decode", "kv_decode"]].to_numpy()
    if tables_only:
        keep = table_attention_rows(keys)
        attn, keys = attn[keep], keys[keep]
    work = attention_work(RankShape.of(model, tp), precision, *keys.T)
    yield Sample("attention", "attention", f"{tag} attention", work, attn["time_us"].to_numpy(float),
                 weight=regime_weights(keys[:, 0], keys[:, 2]))
    moe_path = folder / "moe.csv"
    if moe_path.is_file() and model.is_moe:
        moe = pd.read_csv(moe_path)
        work = moe_work(RankShape.of(model, 1), precision, moe["tokens"].to_numpy(),
                        moe["activated_experts"].to_numpy())
        yield Sample("moe", "moe", f"{tag} moe", work, moe["time_us"].to_numpy(float),
                     precision.fp8_compute)


def all_samples(data: Path) -> tuple[HardwareSpec, list[Sample]]:
    """Samples of every measured bundle (all of them are on one hardware type)."""
    hardware_names = {hw for hw, _ in MEASURED}
    if hardware_names != {MEASURED_HARDWARE}:
        raise ValueError("the fit assumes all measured bundles are on MEASURED_HARDWARE")
    hardware = load_hardware(MEASURED_HARDWARE)
    out: list[Sample] = []
    for hw, name in MEASURED:
        model = load_model(name)
        vdir = measured_variant_dir(data, hw, name)
        for tp in measured_tps(vdir):
            out.extend(samples_for(model, vdir, tp))
    return hardware, out


def table_samples(hardware_name: str, cache: Path) -> tuple[HardwareSpec, list[Sample]]:
    """Samples of the aiconfigurator bundles of every catalog model at TP 1 on
    ``hardware_name``'s system: the layers its meta.yaml sources from a table, and the
    :func:`table_attention_rows`."""
    from profiles.aiconfigurator import ensure_bundle

    hardware = load_hardware(hardware_name)
    out: list[Sample] = []
    for name in list_models():
        model = load_model(name)
        vdir = ensure_bundle(hardware, model, 1, cache=cache)
        sources = yaml.safe_load((vdir / "meta.yaml").read_text())["aiconfigurator"]["layers"]
        from_tables = {k for k, v in sources.items() if not str(v).startswith("roofline")}
        for s in samples_for(model, vdir, 1, tables_only=True):
            if s.label.rsplit(" ", 1)[1] in from_tables:
                out.append(s)
    return hardware, out


# ----------------------------------------------------------------------------- fitting

_LOWER = {"eff_compute": 1e-3, "eff_memory": 1e-3, "launch_us": 1e-3, "sharpness": 1.0,
          "per_seq_us": 1e-5, "serial_ns_per_key": 1e-3, "mixed_gqa_share": 1e-3,
          "decode_launch_us": 1e-3, "decode_per_seq_us": 1e-5,
          "cache_boost": 1e-3, "cache_mb": 1.0, "mixed_cache_mb": 1.0, "empty_block_ns": 1e-3,
          "ramp_gflop": 1e-3}
_UPPER = {"eff_compute": 1.0, "eff_memory": 4.0, "launch_us": 1e4, "sharpness": 50.0,
          "per_seq_us": 1e2, "serial_ns_per_key": 1e3, "mixed_gqa_share": 1.0,
          "decode_launch_us": 1e3, "decode_per_seq_us": 1e2,
          "cache_boost": 5.0, "cache_mb": 1e3, "mixed_cache_mb": 1e4, "empty_block_ns": 1e3,
          "ramp_gflop": 100.0}


def _to_factors(names: tuple[str, ...], x: np.ndarray, base: KernelFactors) -> KernelFactors:
    vals = {n: float(np.exp(v)) for n, v in zip(names, x, strict=True)}
    return dataclasses.replace(base, **vals)


def _log_residuals(
    samples: list[Sample], hardware: HardwareSpec
) -> Callable[[KernelFactors], np.ndarray]:
    logs = [np.log(s.measured_us) for s in samples]
    roots = [np.sqrt(s.weight) if s.weight is not None else 1.0 for s in samples]

    def residuals(f: KernelFactors, weighted: bool = True) -> np.ndarray:
        parts = []
        for s, lm, w in zip(samples, logs, roots, strict=True):
            pred = kernel_time_us(s.work, f, hardware, s.fp8_compute)
            r = np.log(np.maximum(pred, 1e-6)) - lm
            parts.append(r * w if weighted else r)
        return np.concatenate(parts)

    return residuals


def fit_category(
    category: str,
    samples: list[Sample],
    hardware: HardwareSpec,
    names: tuple[str, ...] | None = None,
    base: KernelFactors | None = None,
) -> KernelFactors:
    """Least-squares fit of one category's free parameters ``names`` (default
    ``FREE_PARAMS[category]``) on log time; the others keep ``base``'s values (default:
    the KernelFactors defaults)."""
    names = names if names is not None else FREE_PARAMS[category]
    base = base if base is not None else KernelFactors()
    res = _log_residuals(samples, hardware)
    lo = np.log([_LOWER[n] for n in names])
    hi = np.log([_UPPER[n] for n in names])
    best: tuple[float, np.ndarray] | None = None
    starts = {
        "eff_compute": (0.5, 0.8),
        "eff_memory": (0.5, 0.9),
        "launch_us": (2.0, 10.0),
        "sharpness": (2.0, 6.0),
        "per_seq_us": (0.1,),
        "serial_ns_per_key": (5.0, 20.0),
        "mixed_gqa_share": (0.5,),
        "decode_launch_us": (10.0,),
        "decode_per_seq_us": (0.1,),
        "cache_boost": (1.0,),
        "cache_mb": (30.0,),
        "mixed_cache_mb": (60.0,),
        "empty_block_ns": (3.0,),
        "ramp_gflop": (1.0,),
    }
    grids = np.array(np.meshgrid(*[np.log(starts[n]) for n in names])).reshape(len(names), -1).T
    for x0 in grids:
        r = least_squares(
            lambda x: res(_to_factors(names, x, base)),
            np.clip(x0, lo + 1e-9, hi - 1e-9),
            bounds=(lo, hi),
            loss="soft_l1",
            f_scale=0.1,
            max_nfev=400,
        )
        if best is None or r.cost < best[0]:
            best = (float(r.cost), r.x)
    assert best is not None
    return _to_factors(names, best[1], base)


Summary = dict[str, dict[str, float]]


@dataclass(frozen=True, slots=True)
class FittedSet:
    """One hardware's fitted factors, what they were fitted to, and the in-sample error."""

    hardware: str
    source: str
    factors: RooflineFactors
    free: Mapping[str, tuple[str, ...]]  # category -> fitted parameters
    inherited: tuple[str, ...]  # categories copied whole from the measured set
    summary: Summary


def fit_set(
    hardware: HardwareSpec,
    samples: list[Sample],
    free: Mapping[str, tuple[str, ...]],
    base: RooflineFactors | None = None,
) -> tuple[RooflineFactors, Summary]:
    """The one fitting path: every category of ``free`` fitted on its samples (other
    parameters from ``base``), every other category copied from ``base``."""
    fitted: dict[str, KernelFactors] = {}
    summary: Summary = {}
    for cat in CATEGORIES:
        if cat not in free:
            if base is None:
                raise ValueError(f"roofline category '{cat}' is neither fitted nor inherited")
            fitted[cat] = base.categories[cat]
            continue
        cat_samples = [s for s in samples if s.category == cat]
        if not cat_samples:
            raise ValueError(f"{hardware.name}: no rows for roofline category '{cat}'")
        start = base.categories[cat] if base is not None else None
        f = fit_category(cat, cat_samples, hardware, free[cat], start)
        fitted[cat] = f
        r = _log_residuals(cat_samples, hardware)(f, weighted=False)
        rel = np.abs(np.expm1(r))
        summary[cat] = {
            "rows": int(r.size),
            "median_rel_err": round(float(np.median(rel)), 4),
            "p90_rel_err": round(float(np.quantile(rel, 0.9)), 4),
        }
    return RooflineFactors(fitted, hardware.name), summary


def fit_all(data: Path) -> tuple[RooflineFactors, Summary]:
    """The measured hardware's factors (every category) and per-category residual summaries."""
    hardware, samples = all_samples(data)
    return fit_set(hardware, samples, FREE_PARAMS)


def fit_measured(data: Path) -> FittedSet:
    factors, summary = fit_all(data)
    models = ", ".join(m for _, m in MEASURED)
    return FittedSet(MEASURED_HARDWARE, f"measured bundles (LLMServingSim profiler, vLLM 0.19, "
                     f"bf16): {models}; tp1 and tp2", factors, FREE_PARAMS, (), summary)


def fit_tables(hardware_name: str, base: RooflineFactors, cache: Path) -> FittedSet:
    """``hardware_name``'s factors fitted to aiconfigurator's tables, inheriting from ``base``."""
    from profiles.aiconfigurator import source_label
    from profiles.aiconfigurator.tables import load_system

    system = table_systems()[hardware_name]
    hardware, samples = table_samples(hardware_name, cache)
    factors, summary = fit_set(hardware, samples, TABLE_FREE_PARAMS, base)
    source = (f"{source_label(system)} (vLLM {load_system(system).vllm_version} tables), "
              f"TP 1 bundles of {', '.join(list_models())}")
    inherited = tuple(c for c in CATEGORIES if c not in TABLE_FREE_PARAMS)
    return FittedSet(hardware_name, source, factors, TABLE_FREE_PARAMS, inherited, summary)


def _round_sig(v: float, sig: int = 5) -> float:
    return float(f"{v:.{sig}g}")


_HEADER = """\
# Roofline efficiency factors, one set per hardware type (`systems`, by catalog name), one
# block per kernel category (profiles/roofline/factors.py gives the formula). GENERATED by
# `python -m profiles.roofline.fit` -- do not hand-edit.
# Every set is fitted the same way (profiles.roofline.fit.fit_set: scipy least_squares,
# soft-L1 loss, scale 0.1, on log(predicted/truth), against the catalog peak and bandwidth
# of its hardware), to its own truth (`source`):
# - RTXPRO6000: every row of the measured RTX PRO 6000 bundles (LLMServingSim profiler, vLLM
#   0.19, bf16): Llama-3.1-8B, Qwen3-32B, Qwen3-30B-A3B at tp1 and tp2 (TP-invariant layers
#   from tp1 only). Attention rows are weighted so pure-decode, pure-prefill and mixed calls
#   carry equal total weight. The measured truth wins where we have it.
# - every other system: the rows of its aiconfigurator-core bundles (NVIDIA's measured vLLM
#   operator tables) that come from the tables alone, for every catalog model at TP 1: GEMM
#   layers, lm_head, MoE, attention without KV history and without mixed calls (pure-decode
#   and pure-prefill weighted equally). What the tables do not measure (`inherited`
#   categories; the history / mixed-call attention parameters not listed in `fit`) is the
#   RTXPRO6000 set's.
# Hardware without its own set uses `hardware_fallback` for it, else `fallback`
# (docs/roofline.md: the choice and its reason). Parameters not listed under `fit` keep
# their inherited value or default. `fit` records each category's fitted parameters, rows
# and in-sample |relative error|. `version` is part of every roofline bundle's cache key.
"""
FACTORS_VERSION = 2


def _round_sig(v: float, sig: int = 5) -> float:
    return float(f"{v:.{sig}g}")


def _set_body(fs: FittedSet) -> dict[str, object]:
    cats = {c: {k: _round_sig(v) for k, v in asdict(fs.factors.categories[c]).items()}
            for c in CATEGORIES}
    body: dict[str, object] = {"source": fs.source}
    if fs.inherited:
        body["inherited"] = {"from": MEASURED_HARDWARE, "categories": list(fs.inherited)}
    body["categories"] = cats
    body["fit"] = {c: {"params": list(fs.free[c]), **fs.summary[c]}
                   for c in CATEGORIES if c in fs.summary}
    return body


def write_factors(sets: list[FittedSet | tuple[str, dict]], out: Path) -> None:
    """Write the factors file: one block per fitted set (or an already-written block)."""
    systems: dict[str, object] = {}
    for item in sets:
        if isinstance(item, FittedSet):
            systems[item.hardware] = _set_body(item)
        else:
            systems[item[0]] = item[1]
    body = {
        "version": FACTORS_VERSION,
        "fallback": FALLBACK,
        "hardware_fallback": dict(HARDWARE_FALLBACK),
        "systems": systems,
    }
    out.write_text(_HEADER + yaml.safe_dump(body, sort_keys=False))


def _print(fs: FittedSet) -> None:
    width = max(len(c) for c in CATEGORIES)
    print(f"== {fs.hardware}: {fs.source}")
    for c in CATEGORIES:
        if c not in fs.summary:
            continue
        f = fs.factors.categories[c]
        vals = ", ".join(f"{n}={getattr(f, n):.4g}" for n in fs.free[c])
        s = fs.summary[c]
        print(f"{c:<{width}}  rows={s['rows']:>6}  median={s['median_rel_err']:.3f}  "
              f"p90={s['p90_rel_err']:.3f}  {vals}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_data_dir(), help="shared data folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_FACTORS_PATH, help="factors YAML to write")
    ap.add_argument("--systems", nargs="+", default=None, metavar="HARDWARE",
                    help="refit only these sets (catalog names), keep the others of --out")
    args = ap.parse_args(argv)
    names = [MEASURED_HARDWARE, *table_systems()]
    wanted = names if args.systems is None else args.systems
    if MEASURED_HARDWARE in wanted:  # every table set inherits from it: refit them all
        wanted = names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise SystemExit(f"--systems: unknown {unknown}; fitted sets: {names}")
    kept: dict[str, dict] = {}
    if set(wanted) != set(names):
        kept = yaml.safe_load(args.out.read_text())["systems"]
    results: dict[str, FittedSet | tuple[str, dict]] = {}
    if MEASURED_HARDWARE in wanted:
        fs = fit_measured(args.data)
        results[MEASURED_HARDWARE] = fs
        base = fs.factors
        _print(fs)
    else:
        results[MEASURED_HARDWARE] = (MEASURED_HARDWARE, kept[MEASURED_HARDWARE])
        base = load_factors_file(args.out).systems[MEASURED_HARDWARE]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names[1:]:
            if name in wanted:
                fs = fit_tables(name, base, Path(tmp))
                results[name] = fs
                _print(fs)
            elif name in kept:
                results[name] = (name, kept[name])
    write_factors([results[n] for n in names if n in results], args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
