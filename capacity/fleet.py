"""Fleet sizing and the Pareto front, from the per-configuration answers of a capacity study.

Pure logic on plain numbers (no engine, Ray or MLflow); the cost is ``analysis.cost``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from analysis.cost import usd_per_m_output_tokens

FLEET_COLUMNS = (
    "rank", "config", "hardware", "gpus_per_replica", "replicas", "num_gpus", "usd_per_hour",
    "usd_per_m_output_tokens", "capacity_rps", "utilization",
)


def size_fleet(
    answers: pd.DataFrame, target_rate: float, max_replicas: int = 64, top: int = 5
) -> pd.DataFrame:
    """The cheapest ways to serve ``target_rate`` req/s, cheapest first (rank 1 = the answer).

    ``answers`` has one row per configuration with ``config``, ``hardware``, ``num_gpus``
    (per replica), ``max_rate`` (req/s one replica sustains within the SLO), ``usd_per_hour``
    (per replica) and ``good_output_tok_s`` (the SLO-meeting output tokens/s of the probe at
    ``max_rate``, ``analysis.cost``). Replicas are modelled as independent instances that
    each take ``target_rate / replicas`` (random routing of a Poisson stream gives each
    replica a Poisson stream of that rate), so ``ceil(target / max_rate)`` replicas serve it.
    Each replica is taken to yield the good output tokens per offered request measured at the
    answer (at a lighter load it yields no fewer), so the fleet serves
    ``good_output_tok_s x target / max_rate`` good tokens/s and its
    ``usd_per_m_output_tokens`` (``analysis.cost.usd_per_m_output_tokens``) is the
    configuration's own divided by the fleet's ``utilization``. Ties in cost go to fewer
    GPUs. Rows needing more than ``max_replicas`` replicas, or without an answer, are dropped.
    """
    if not target_rate > 0:
        raise ValueError(f"capacity.target_rate={target_rate!r}: give a rate > 0 (req/s)")
    rows = []
    for row in answers.itertuples(index=False):
        if not (row.max_rate > 0 and math.isfinite(row.max_rate)):
            continue
        replicas = math.ceil(target_rate / row.max_rate * (1 - 1e-12))
        if replicas > max_replicas:
            continue
        usd_h = replicas * row.usd_per_hour
        tok_s = row.good_output_tok_s * target_rate / row.max_rate
        rows.append({
            "config": row.config,
            "hardware": row.hardware,
            "gpus_per_replica": int(row.num_gpus),
            "replicas": replicas,
            "num_gpus": int(replicas * row.num_gpus),
            "usd_per_hour": usd_h,
            "usd_per_m_output_tokens": usd_per_m_output_tokens(usd_h, tok_s),
            "capacity_rps": replicas * row.max_rate,
            "utilization": target_rate / (replicas * row.max_rate),
        })
    table = pd.DataFrame(rows, columns=[c for c in FLEET_COLUMNS if c != "rank"])
    table = table.sort_values(["usd_per_hour", "num_gpus", "config"], kind="stable").head(top)
    table.insert(0, "rank", range(1, len(table) + 1))
    return table.reset_index(drop=True)


def pareto_front(x: Sequence[float], cost: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats: higher-or-equal ``x`` at lower-or-equal
    ``cost``, strictly better in one. Sorted by ``x``."""
    pts = [(xi, ci, i) for i, (xi, ci) in enumerate(zip(x, cost, strict=True))
           if math.isfinite(xi) and math.isfinite(ci)]
    front = []
    for xi, ci, i in pts:
        dominated = any(
            (xj >= xi and cj <= ci) and (xj > xi or cj < ci) for xj, cj, _ in pts
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: x[i])
