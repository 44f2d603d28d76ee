"""Plots of a capacity study, as PNG bytes: latency vs load, the cost Pareto front and
throughput per GPU vs per user. Inputs are the study's ``capacity.parquet`` (answers, one
row per configuration) and ``probes.parquet`` (one row per probe) tables."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence

import matplotlib
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from capacity.fleet import pareto_front

# Figures are ``Figure`` objects saved through the Agg canvas ``savefig`` picks for PNG,
# without ``matplotlib.pyplot`` (its import and backend set-up cost ~0.35 s, and nothing
# here is ever shown).

_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


def slug(text: str) -> str:
    """A file-name-safe form of a configuration label."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_") or "config"


def latency_file(config: str) -> str:
    """The file name of a configuration's latency-vs-load plot."""
    return f"latency_{slug(config)}.png"


def _plain_log(ax: Axes, axis: str) -> None:
    """Log scale with plain-number tick labels (``0.15``, not ``1.5 x 10^-1``)."""
    from matplotlib.ticker import FuncFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    lo, hi = (ax.get_xlim() if axis == "x" else ax.get_ylim())
    plain = FuncFormatter(lambda v, _: f"{v:.3g}")
    target.set_major_formatter(plain)
    # Label the minor ticks too when the axis spans less than two decades.
    target.set_minor_formatter(plain if hi / max(lo, 1e-300) < 100 else FuncFormatter(lambda v, _: ""))


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


def _bound_label(key: str) -> str:
    metric, _, stat = key.partition("_ms_")
    return f"{_LABELS.get(metric, metric)} {stat.replace('_', '.')} (ms)"


def latency_vs_load_png(probes: pd.DataFrame, bounds: dict[str, float], max_rate: float,
                        title: str) -> bytes:
    """One panel per SLO bound: the probe's value against its offered rate (pass = green
    dot, fail = red cross), the bound (dashed) and the answer (dotted vertical line). The
    saturation probe (all requests at t = 0) is left out: it has no finite rate."""
    rows = probes[probes["rate"].map(math.isfinite)].sort_values("rate")
    keys = sorted(bounds)
    fig = Figure(figsize=(4.2 * len(keys), 3.4))
    axes = fig.subplots(1, len(keys), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        col = key  # the observed statistic: the probe run's metric of the bound's name
        if col in rows and len(rows):
            ax.plot(rows["rate"], rows[col], color="0.6", lw=1, zorder=1)
            ok, bad = rows[rows["passed"]], rows[~rows["passed"]]
            ax.scatter(ok["rate"], ok[col], color="tab:green", marker="o", label="meets SLO", zorder=2)
            ax.scatter(bad["rate"], bad[col], color="tab:red", marker="x", label="misses SLO", zorder=2)
        ax.axhline(bounds[key], color="k", ls="--", lw=1, label=f"SLO {bounds[key]:g} ms")
        if max_rate > 0 and math.isfinite(max_rate):
            ax.axvline(max_rate, color="tab:blue", ls=":", lw=1.5, label=f"max {max_rate:.3g} req/s")
        ax.set_xlabel("offered load (req/s)")
        ax.set_ylabel(_bound_label(key))
        _plain_log(ax, "y")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _png(fig)


def pareto_png(answers: pd.DataFrame, title: str = "") -> bytes:
    """USD per million output tokens against the sustained rate (req/s within the SLO), one
    point per configuration; the Pareto front (no other point is both faster and cheaper)
    is joined by a line."""
    rows = answers[(answers["max_rate"] > 0)
                   & answers["usd_per_m_output_tokens"].map(math.isfinite)]
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    x, y = list(rows["max_rate"]), list(rows["usd_per_m_output_tokens"])
    front = set(pareto_front(x, y))
    for i, row in enumerate(rows.itertuples(index=False)):
        on = i in front
        ax.scatter(row.max_rate, row.usd_per_m_output_tokens, s=60 if on else 30,
                   color="tab:orange" if on else "tab:gray", zorder=3)
        ax.annotate(row.config, (row.max_rate, row.usd_per_m_output_tokens), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    if front:
        order = sorted(front, key=lambda i: x[i])
        ax.plot([x[i] for i in order], [y[i] for i in order], color="tab:orange", lw=1.2,
                label="Pareto front", zorder=2)
        ax.legend(fontsize=8)
    ax.set_xlabel("sustained rate within the SLO (req/s per replica)")
    ax.set_ylabel("USD per 1M output tokens within the SLO")
    _plain_log(ax, "x")
    _plain_log(ax, "y")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title or "cost vs sustained rate", fontsize=9)
    fig.tight_layout()
    return _png(fig)


def interactivity_png(probes: pd.DataFrame, configs: Sequence[str]) -> bytes:
    """Output tokens/s per GPU against output tokens/s per user (1000 / median TPOT) at each
    probed load, one line per configuration; filled markers meet the SLO."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    rows = probes[probes["rate"].map(math.isfinite) & (probes["tpot_ms_median"] > 0)]
    for i, name in enumerate(configs):
        part = rows[rows["config"] == name].sort_values("rate")
        if part.empty:
            continue
        color = matplotlib.colormaps["tab20"](i % 20)
        user = 1000.0 / part["tpot_ms_median"]
        gpu = part["output_throughput"] / part["num_gpus"]
        ax.plot(user, gpu, color=color, lw=1, label=name)
        ok = part["passed"].to_numpy()
        ax.scatter(user[ok], gpu[ok], color=color, s=25)
        ax.scatter(user[~ok], gpu[~ok], facecolors="none", edgecolors=color, s=25)
    ax.set_xlabel("output tokens/s per user (1000 / median TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("throughput vs interactivity (filled: meets the SLO)", fontsize=9)
    fig.tight_layout()
    return _png(fig)
