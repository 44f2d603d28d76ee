"""Plots of sweep results: one point's time series, and a study's key plot."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from matplotlib import rc_context
from matplotlib.figure import Figure

# Figures are made as ``Figure`` objects and saved through the canvas ``savefig`` picks for the
# format, without ``matplotlib.pyplot`` (its import and backend set-up cost the driver ~0.35 s,
# and no figure here is ever shown).

# The per-point plot is SVG: the driver draws one per point, and an SVG with its text left as
# text (``svg.fonttype: none``) takes less than half the time of a 72-dpi PNG of the same
# figure at half the size (measured side by side in docs/sweep.md, "What the platform
# costs"). MLflow's artifact view shows .svg as an image. A fixed hash salt and no date make
# the same series give the same bytes.
_SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "servesweep"}


class _SeriesFigure:
    """The time-series figure, built once per process and refilled for each point: creating
    the figure, axes, legends and ticks costs about as much as rendering it, and the
    driver's recorder plots every point of a sweep."""

    PANELS = (("running", "waiting"), ("kv_usage_pct",), ("prompt_throughput", "gen_throughput"))

    def __init__(self) -> None:
        fig = Figure(figsize=(7, 6))
        axes = fig.subplots(3, 1, sharex=True)
        # room above each panel for its y axis's power-of-ten offset (below), the title above
        fig.subplots_adjust(left=0.11, right=0.97, top=0.92, bottom=0.08, hspace=0.2)
        self.fig, self.axes = fig, axes
        self.lines = [
            [axes[0].plot([], [], label="running")[0], axes[0].plot([], [], label="waiting")[0]],
            [axes[1].plot([], [], color="tab:red")[0]],
            [axes[2].plot([], [], label="prompt")[0], axes[2].plot([], [], label="generation")[0]],
        ]
        axes[0].set_ylabel("requests")
        axes[0].legend(loc="upper right")
        axes[1].set_ylabel("KV cache %")
        axes[2].set_ylabel("tokens/s")
        axes[2].set_xlabel("simulated time (s)")
        axes[2].legend(loc="upper right")
        # Axis labels at fixed places in their axes and the title the figure's (not an
        # axes' title): matplotlib otherwise places them anew at every save from the tick
        # labels' extents (a fifth of the figure's drawing time). Values from 10^4 up are
        # ticked with a power-of-ten offset, so no tick label is longer than four digits and
        # none reaches the y labels.
        for ax in axes:
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
            ax.yaxis.set_label_coords(-0.085, 0.5)
        axes[2].xaxis.set_label_coords(0.5, -0.2)

    def svg(self, series: Mapping[str, Sequence[float]], title: str) -> bytes:
        t = list(series.get("t_s", []))
        for ax, names, lines in zip(self.axes, self.PANELS, self.lines, strict=True):
            for name, line in zip(names, lines, strict=True):
                line.set_data(t, list(series.get(name, [])))
            ax.relim()
            ax.autoscale_view()
        self.axes[1].set_ylim(0, 105)
        self.fig.suptitle(title, fontsize=9, y=0.985)
        buf = io.BytesIO()
        with rc_context(_SVG_RC):
            self.fig.savefig(buf, format="svg", metadata={"Date": None})
        return buf.getvalue()


_FIGURE: _SeriesFigure | None = None


def timeseries_svg(series: Mapping[str, Sequence[float]], title: str) -> bytes:
    """Running/waiting requests, KV-cache usage and token throughput over simulated time,
    as SVG bytes. The sweep driver's recorder draws it (``SweepRecorder._plot``), so the
    actors never import matplotlib."""
    global _FIGURE
    if _FIGURE is None:
        _FIGURE = _SeriesFigure()
    return _FIGURE.svg(series, title)


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
