"""Plots of sweep results: one point's time series, and a study's key plot."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def timeseries_png(series: Mapping[str, Sequence[float]], title: str) -> bytes:
    """Running/waiting requests, KV-cache usage and token throughput over simulated time,
    as PNG bytes (rendered where the job runs, so the driver only stores it)."""
    t = list(series.get("t_s", []))
    fig, axes = plt.subplots(3, 1, figsize=(7, 6), sharex=True)
    fig.subplots_adjust(left=0.11, right=0.97, top=0.94, bottom=0.08, hspace=0.12)
    axes[0].plot(t, series.get("running", []), label="running")
    axes[0].plot(t, series.get("waiting", []), label="waiting")
    axes[0].set_ylabel("requests")
    axes[0].legend(loc="upper right")
    axes[1].plot(t, series.get("kv_usage_pct", []), color="tab:red")
    axes[1].set_ylabel("KV cache %")
    axes[1].set_ylim(0, 105)
    axes[2].plot(t, series.get("prompt_throughput", []), label="prompt")
    axes[2].plot(t, series.get("gen_throughput", []), label="generation")
    axes[2].set_ylabel("tokens/s")
    axes[2].set_xlabel("simulated time (s)")
    axes[2].legend(loc="upper right")
    axes[0].set_title(title, fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72)
    plt.close(fig)
    return buf.getvalue()


def study_plot(
    table: pd.DataFrame, x: str, y: str, line: str | None, path: Path, title: str,
    logy: bool = False,
) -> Path:
    """``y`` against ``x`` over the finished points, one line per value of ``line``."""
    for col in [x, y] + ([line] if line else []):
        if col not in table.columns:
            raise KeyError(
                f"study.plot: column {col!r} is not in the results table; "
                f"available: {sorted(table.columns)}"
            )
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = table.groupby(line, sort=True) if line else [(None, table)]
    for value, part in groups:
        part = part.sort_values(x)
        label = f"{line}={value}" if line else y
        ax.plot(part[x], part[y], marker="o", label=label)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
