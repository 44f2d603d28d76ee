"""Fit the roofline efficiency factors to measured profile bundles.

Usage::

    python -m profiles.roofline.fit [--data DIR] [--out profiles/roofline/factors.yaml]

``DIR`` is the shared data folder (default ``$SERVESWEEP_DATA`` or ``../shared/data``); the
measured bundles are read from ``DIR/llmservingsim/profiles/<hardware>/``. For every kernel
category the parameters of :class:`profiles.roofline.factors.KernelFactors` are chosen by
least squares on ``log(predicted / measured)`` over every measured row of that category
(all models, all TP folders; TP-invariant layers only from ``tp1`` since the other folders
hold copies). Categories are independent, so each is a small separate fit (scipy
``least_squares``, soft-L1 loss, parameters in log space, several starting points).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from engine.specs import HardwareSpec, ModelSpec
from profiles.architecture import load_architecture
from profiles.catalog import load_hardware, load_model
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
)
from profiles.roofline.generate import kernel_time_us

REPO_ROOT = Path(__file__).resolve().parents[2]
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


def samples_for(
    model: ModelSpec, vdir: Path, tp: int, variant: str = "bf16"
) -> Iterator[Sample]:
    """Every measured row of ``vdir/tp<tp>`` paired with the roofline work of its key."""
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
    if len(hardware_names) != 1:
        raise ValueError("the fit assumes all measured bundles share one hardware type")
    hardware = load_hardware(next(iter(hardware_names)))
    out: list[Sample] = []
    for hw, name in MEASURED:
        model = load_model(name)
        vdir = measured_variant_dir(data, hw, name)
        for tp in measured_tps(vdir):
            out.extend(samples_for(model, vdir, tp))
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


def _to_factors(names: tuple[str, ...], x: np.ndarray) -> KernelFactors:
    return KernelFactors(**{n: float(np.exp(v)) for n, v in zip(names, x, strict=True)})


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


def fit_category(category: str, samples: list[Sample], hardware: HardwareSpec) -> KernelFactors:
    """Least-squares fit of one category's free parameters on log time."""
    names = FREE_PARAMS[category]
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
            lambda x: res(_to_factors(names, x)),
            np.clip(x0, lo + 1e-9, hi - 1e-9),
            bounds=(lo, hi),
            loss="soft_l1",
            f_scale=0.1,
            max_nfev=400,
        )
        if best is None or r.cost < best[0]:
            best = (float(r.cost), r.x)
    assert best is not None
    return _to_factors(names, best[1])


def fit_all(data: Path) -> tuple[RooflineFactors, dict[str, dict[str, float]]]:
    """Fitted factors for every category, and per-category residual summaries."""
    hardware, samples = all_samples(data)
    fitted: dict[str, KernelFactors] = {}
    summary: dict[str, dict[str, float]] = {}
    for cat in CATEGORIES:
        cat_samples = [s for s in samples if s.category == cat]
        if not cat_samples:
            raise ValueError(f"no measured rows for roofline category '{cat}'")
        f = fit_category(cat, cat_samples, hardware)
        fitted[cat] = f
        r = _log_residuals(cat_samples, hardware)(f, weighted=False)
        rel = np.abs(np.expm1(r))
        summary[cat] = {
            "rows": int(r.size),
            "median_rel_err": round(float(np.median(rel)), 4),
            "p90_rel_err": round(float(np.quantile(rel, 0.9)), 4),
        }
    return RooflineFactors(fitted), summary


def _round_sig(v: float, sig: int = 5) -> float:
    return float(f"{v:.{sig}g}")


def write_factors(factors: RooflineFactors, summary: dict[str, dict[str, float]], out: Path) -> None:
    header = (
        "# Roofline efficiency factors, one block per kernel category (profiles/roofline/factors.py\n"
        "# gives the formula). GENERATED by `python -m profiles.roofline.fit` -- do not hand-edit.\n"
        "# Fitted by least squares (scipy least_squares, soft-L1 loss, scale 0.1) on\n"
        "# log(predicted/measured) over every row of the measured RTX PRO 6000 bundles\n"
        "# (LLMServingSim profiler, vLLM 0.19, bf16): Llama-3.1-8B, Qwen3-32B, Qwen3-30B-A3B, at\n"
        "# tp1 and tp2 (TP-invariant layers from tp1 only), against the catalog RTXPRO6000 peak\n"
        "# (503.8 bf16 TFLOPS, 1597 GB/s). Attention rows are weighted so pure-decode, pure-prefill\n"
        "# and mixed calls carry equal total weight. Parameters not listed under `fit` keep their\n"
        "# defaults.\n"
        "# `fit` records each category's fitted parameters, rows and in-sample |relative error|.\n"
    )
    cats = {}
    for c in CATEGORIES:
        d = asdict(factors.categories[c])
        cats[c] = {k: _round_sig(v) for k, v in d.items()}
    body = {
        "version": 1,
        "categories": cats,
        "fit": {c: {"params": list(FREE_PARAMS[c]), **summary[c]} for c in CATEGORIES},
    }
    out.write_text(header + yaml.safe_dump(body, sort_keys=False))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_data_dir(), help="shared data folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_FACTORS_PATH, help="factors YAML to write")
    args = ap.parse_args(argv)
    factors, summary = fit_all(args.data)
    write_factors(factors, summary, args.out)
    width = max(len(c) for c in CATEGORIES)
    for c in CATEGORIES:
        f = factors.categories[c]
        vals = ", ".join(f"{n}={getattr(f, n):.4g}" for n in FREE_PARAMS[c])
        s = summary[c]
        print(f"{c:<{width}}  rows={s['rows']:>6}  median={s['median_rel_err']:.3f}  "
              f"p90={s['p90_rel_err']:.3f}  {vals}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
