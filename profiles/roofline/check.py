"""Compare a generated (roofline) bundle's tables with a measured bundle's, key by key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from profiles.roofline.fit import attention_regime

_KEYS = {
    "dense": ["layer", "tokens"],
    "per_sequence": ["layer", "sequences"],
    "attention": ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode"],
    "moe": ["tokens", "activated_experts"],
}

@dataclass(frozen=True, slots=True)
class ErrorRow:
    bundle: str  # "<model> tp<N>"
    table: str
    item: str  # layer name or attention regime
    rows: int
    median: float
    p90: float
    signed_median: float


def _summary(bundle: str, table: str, item: str, ratio: np.ndarray) -> ErrorRow:
    rel = ratio - 1.0
    return ErrorRow(bundle, table, item, int(rel.size), float(np.median(np.abs(rel))),
                    float(np.quantile(np.abs(rel), 0.9)), float(np.median(rel)))


def table_errors(measured_dir: Path, generated_dir: Path, label: str) -> list[ErrorRow]:
    """Per-table error rows of one TP folder (generated joined to measured on the keys)."""
    out: list[ErrorRow] = []
    for table, keys in _KEYS.items():
        mpath, gpath = measured_dir / f"{table}.csv", generated_dir / f"{table}.csv"
        if not mpath.is_file() or not gpath.is_file():
            continue
        joined = pd.read_csv(mpath).merge(pd.read_csv(gpath), on=keys, suffixes=("_m", "_g"))
        ratio = (joined["time_us_g"] / joined["time_us_m"]).to_numpy()
        if table in ("dense", "per_sequence"):
            for layer, idx in joined.groupby("layer").groups.items():
                out.append(_summary(label, table, str(layer), ratio[joined.index.get_indexer(idx)]))
        elif table == "attention":
            out.append(_summary(label, table, "all", ratio))
            regime = attention_regime(joined["prefill_chunk"].to_numpy(), joined["n_decode"].to_numpy())
            for name in ("decode", "prefill", "mixed"):
                out.append(_summary(label, table, name, ratio[regime == name]))
        else:
            out.append(_summary(label, table, "moe", ratio))
    return out




def attention_split_errors(measured_dir: Path, generated_dir: Path, label: str) -> list[ErrorRow]:
    """Attention error rows split by where an aiconfigurator bundle's row comes from:
    ``decode`` and ``prefill, no history`` are its tables' own rows; ``prefill, history`` and
    ``mixed`` are those rows plus roofline costs (profiles.aiconfigurator.build)."""
    keys = _KEYS["attention"]
    joined = pd.read_csv(measured_dir / "attention.csv").merge(
        pd.read_csv(generated_dir / "attention.csv"), on=keys, suffixes=("_m", "_g"))
    ratio = (joined["time_us_g"] / joined["time_us_m"]).to_numpy()
    pc, kp, nd = (joined[k].to_numpy() for k in ("prefill_chunk", "kv_prefill", "n_decode"))
    parts = {
        "decode": pc == 0,
        "prefill, no history": (pc > 0) & (nd == 0) & (kp == 0),
        "prefill, history": (pc > 0) & (nd == 0) & (kp > 0),
        "mixed": (pc > 0) & (nd > 0),
    }
    return [_summary(label, "attention", name, ratio[mask]) for name, mask in parts.items()]
