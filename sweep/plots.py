"""The study's key plot (a point's time-series chart: ``sweep.svg_series``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

# The study plot is made as a matplotlib ``Figure`` and saved through the canvas ``savefig``
# picks for the format, without ``matplotlib.pyplot`` (its import and backend set-up cost the
# driver ~0.35 s, and no figure here is ever shown). A point's time-series chart is written
# directly as SVG by ``sweep.svg_series`` (the driver draws one per point).


def study_plot(
    table: pd.DataFrame, x: str, y: str, line: str | None, path: Path, title: str,
    logy: bool = False,
) -> Path:
    """``y`` against ``x`` over the finished points, one line per value of ``line``."""
    from matplotlib.figure import Figure

    for col in [x, y] + ([line] if line else []):
        if col not in table.columns:
            raise KeyError(
                f"study.plot: column {col!r} is not in the results table; "
                f"available: {sorted(table.columns)}"
            )
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
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
    return path
