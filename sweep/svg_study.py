"""The study's key plot as an SVG line chart, written directly (no plotting library).

``study_svg`` draws ``y`` against ``x`` over a sweep's finished points, one line with round
markers per value of ``line`` (sorted by value, a missing value last as ``line=nan``; each
line's points sorted by ``x``), in the look of the time-series chart (``sweep.svg_series``:
its ticks, labels and legend): a linear ``x`` axis (or, for a column that is not numeric,
its categories in sorted order, each labelled, or every k-th beyond eight), a linear or a
base-10 log ``y`` axis (spanning at least 0.2 decades), axis labels and the figure's title.
On the log axis a value that is not positive has no place and is left out, breaking its
line, as a NaN or infinite value is on either axis. The sweep driver draws it once a sweep, at the end; it
replaced a matplotlib figure whose import and drawing cost the driver about 0.75 CPU-s a
sweep (docs/sweep.md). The same table gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from sweep.svg_series import (
    Line,
    axes_frame,
    axis_limits,
    finite_runs,
    legend_box,
    legend_size,
    linear_y_labels,
    nice_ticks,
    raised_power_text,
    svg_open,
    svg_text,
    tick_label,
)

WIDTH, HEIGHT = 504, 324  # points (7 x 4.5 inches), as the matplotlib figure it replaced
LEFT, RIGHT, TOP, BOTTOM = 64.0, 490.0, 26.0, 282.0  # the plot's frame
# matplotlib's default colour cycle (tab10), so lines keep the colours they had
CYCLE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
         "#7f7f7f", "#bcbd22", "#17becf")
X_TICKS, Y_TICKS = 8, 7  # at most this many labelled ticks on each axis
LEGEND_FONT = 8.0
MIN_LOG_SPAN = 0.2  # decades: a log axis spans at least a factor of 1.58
PLAIN_DECADES = range(-3, 5)  # log-axis ticks between decades: plain from 0.001 to 99,999


def study_svg(table: pd.DataFrame, x: str, y: str, line: str | None, title: str,
              logy: bool = False) -> bytes:
    """``y`` against ``x`` over the rows of ``table``, one line per value of ``line`` (see the
    module docstring). Raises ``KeyError`` naming a column the table lacks and the ones it
    has, ``ValueError`` for a ``y`` column that is not numeric."""
    for col in [x, y] + ([line] if line else []):
        if col not in table.columns:
            raise KeyError(f"study.plot: column {col!r} is not in the results table; "
                           f"available: {sorted(table.columns)}")
    if not pd.api.types.is_numeric_dtype(table[y]) or pd.api.types.is_bool_dtype(table[y]):
        raise ValueError(f"study.plot.y: column {y!r} is not numeric ({table[y].dtype})")
    numeric_x = pd.api.types.is_numeric_dtype(table[x]) and not pd.api.types.is_bool_dtype(
        table[x])
    categories = [] if numeric_x else sorted({str(v) for v in table[x]})
    position = {c: float(i) for i, c in enumerate(categories)}

    def floats(column: pd.Series) -> list[float]:  # a missing value (NaN, None, pd.NA) is NaN
        return column.to_numpy(dtype=float, na_value=math.nan).tolist()  # type: ignore[no-any-return]

    def y_of(f: float) -> float:
        if logy:
            return math.log10(f) if f > 0 and math.isfinite(f) else math.nan
        return f

    # a row whose ``line`` value is missing is a line of its own (``line=nan``), not dropped
    groups = table.groupby(line, sort=True, dropna=False) if line else [(None, table)]
    lines: list[tuple[Line, list[float], list[float]]] = []
    for k, (value, part) in enumerate(groups):
        at = floats(part[x]) if numeric_x else [position[str(v)] for v in part[x]]
        order = sorted(range(len(at)), key=lambda i: (math.isnan(at[i]), at[i]))
        values = floats(part[y])
        label = f"{line}={value}" if line else y
        lines.append((Line(str(k), label, CYCLE[k % len(CYCLE)]),
                      [at[i] for i in order], [y_of(values[i]) for i in order]))

    xs = [v for _, line_x, _ in lines for v in line_x if math.isfinite(v)]
    ys = [v for _, _, line_y in lines for v in line_y if math.isfinite(v)]
    x_lo, x_hi = axis_limits(min(xs, default=0.0), max(xs, default=0.0))
    y_lo, y_hi = axis_limits(min(ys, default=0.0), max(ys, default=0.0))
    if logy and y_hi - y_lo < MIN_LOG_SPAN:  # a (nearly) constant value: a span to label
        mid = (y_lo + y_hi) / 2
        y_lo, y_hi = mid - MIN_LOG_SPAN / 2, mid + MIN_LOG_SPAN / 2
    x_scale = (RIGHT - LEFT) / (x_hi - x_lo)
    y_scale = (BOTTOM - TOP) / (y_hi - y_lo)

    def px(v: float) -> float:
        return LEFT + (v - x_lo) * x_scale

    def py(v: float) -> float:
        return BOTTOM - (v - y_lo) * y_scale

    out = [
        *svg_open(WIDTH, HEIGHT),
        f'<defs><clipPath id="frame"><rect x="{LEFT:.2f}" y="{TOP:.2f}" '
        f'width="{RIGHT - LEFT:.2f}" height="{BOTTOM - TOP:.2f}"/></clipPath></defs>',
    ]
    x_ticks = _category_ticks(len(categories)) if categories else nice_ticks(x_lo, x_hi, X_TICKS)
    y_ticks = _log_ticks(y_lo, y_hi) if logy else nice_ticks(y_lo, y_hi, Y_TICKS)
    grid = "".join(f"M {px(t):.2f} {TOP:.2f} V {BOTTOM:.2f} " for t in x_ticks)
    grid += "".join(f"M {LEFT:.2f} {py(t):.2f} H {RIGHT:.2f} " for t in y_ticks)
    out.append(f'<path d="{grid.strip()}" style="stroke: #b0b0b0; stroke-width: 0.8; '
               'opacity: 0.3"/>')
    out.extend(axes_frame(LEFT, TOP, RIGHT - LEFT, BOTTOM - TOP, [px(t) for t in x_ticks],
                          [py(t) for t in y_ticks]))
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    for t in x_ticks:
        text = categories[int(t)] if categories else tick_label(t, x_step)
        out.append(svg_text(px(t), BOTTOM + 14.5, text))
    out.extend(_log_y_labels(y_ticks, py) if logy else linear_y_labels(y_ticks, py, LEFT, TOP))
    out.append(svg_text((LEFT + RIGHT) / 2, BOTTOM + 31, x))
    out.append(svg_text(14, (TOP + BOTTOM) / 2, y, rotate=True))
    drawn: list[list[tuple[float, float]]] = []  # every line's finite runs, in frame units
    for spec, line_x, line_y in lines:
        runs = [[(px(a), py(b)) for a, b in run] for run in finite_runs(line_x, line_y)]
        if not runs:
            continue
        drawn += runs
        d = " ".join("M " + " L ".join(f"{a:.2f} {b:.2f}" for a, b in run) for run in runs)
        out.append(f'<g clip-path="url(#frame)" style="fill: {spec.color}">')
        out.append(f'<path d="{d}" style="fill: none; stroke: {spec.color}; '
                   'stroke-width: 1.5; stroke-linejoin: round"/>')
        out.extend(f'<circle cx="{a:.2f}" cy="{b:.2f}" r="3"/>' for run in runs for a, b in run)
        out.append("</g>")
    if lines:  # none for a table without rows
        top, right = _legend_corner([spec for spec, _, _ in lines], drawn)
        out.extend(legend_box([spec for spec, _, _ in lines], top, right, marker=True,
                              size=LEGEND_FONT))
    out.append(svg_text(WIDTH / 2, 15, title,
                        size=min(10.0, 0.95 * WIDTH / (0.55 * max(len(title), 1)))))
    out.append("</svg>\n")
    return "\n".join(out).encode()


def study_plot(table: pd.DataFrame, x: str, y: str, line: str | None, path: Path,
               title: str, logy: bool = False) -> Path:
    """``study_svg`` written to ``path`` (its directory must exist); returns ``path``."""
    path.write_bytes(study_svg(table, x, y, line, title, logy))
    return path


def _legend_corner(specs: Sequence[Line], drawn: Sequence[Sequence[tuple[float, float]]],
                   ) -> tuple[float, float]:
    """``(top, right)`` for ``legend_box``: the corner of the frame (upper right, upper left,
    lower left, lower right, in matplotlib's order of preference) where the legend box covers
    the fewest of the lines' points, each segment sampled at 16 points between its ends."""
    width, height = legend_size(specs, LEGEND_FONT)
    corners = [(TOP, RIGHT), (TOP, LEFT + 10 + width), (BOTTOM - 10 - height, LEFT + 10 + width),
               (BOTTOM - 10 - height, RIGHT)]
    points = [(a[0] + (b[0] - a[0]) * i / 16, a[1] + (b[1] - a[1]) * i / 16)
              for run in drawn for a, b in zip(run, run[1:], strict=False) for i in range(16)]
    points += [run[-1] for run in drawn if run]

    def covered(corner: tuple[float, float]) -> int:
        top, right = corner
        x0, y0 = right - 5 - width, top + 5
        return sum(x0 <= x <= x0 + width and y0 <= y <= y0 + height for x, y in points)

    return min(corners, key=covered)  # the first of equals


def _category_ticks(n: int) -> list[float]:
    """Category positions to label: each one, or every k-th when there are more than
    ``X_TICKS``."""
    step = max(1, math.ceil(n / X_TICKS))
    return [float(i) for i in range(0, n, step)]


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks (as log10 of the value) inside ``[lo, hi]`` (log10 limits): the powers of ten
    (every k-th when there are more than ``Y_TICKS``) when at least two fall inside, else
    1, 2 and 5 times them, else 1 to 9 times them, else the two limits."""
    first, last = math.ceil(lo - 1e-9), math.floor(hi + 1e-9)
    if last - first + 1 >= 2:
        step = max(1, math.ceil((last - first + 1) / Y_TICKS))
        return [float(k) for k in range(first, last + 1, step)]
    for mantissas in ((1, 2, 5), tuple(range(1, 10))):
        ticks = [k + math.log10(m) for k in range(first - 1, last + 1) for m in mantissas]
        inside = [t for t in ticks if lo - 1e-9 <= t <= hi + 1e-9]
        if len(inside) >= 2:
            return inside
    return [lo, hi]


def _log_y_labels(ticks: Sequence[float], py: Callable[[float], float]) -> list[str]:
    """The labels of a log y axis (``ticks`` are log10 of the values, ``py`` places them):
    powers of ten as 10^k, and ticks between them to three significant digits, as plain
    numbers when all lie from 0.001 to 99,999, else as a×10^k (the exponent raised)."""
    decades, mantissas = [], []
    for t in ticks:  # a×10^k with a to three significant digits, 1 <= a < 10
        k = math.floor(t + 1e-9)
        m = float(f"{10.0 ** (t - k):.3g}")
        if m >= 10:  # 9.9996 rounds to 10: the next decade
            k, m = k + 1, m / 10
        decades.append(k)
        mantissas.append(m)
    plain = any(m != 1 for m in mantissas) and all(k in PLAIN_DECADES for k in decades)
    out = []
    for t, k, m in zip(ticks, decades, mantissas, strict=True):
        if plain:  # three significant digits, no trailing zeros
            text = f"{float(f'{10.0**t:.3g}'):f}".rstrip("0").rstrip(".")
            out.append(svg_text(LEFT - 6, py(t) + 3.5, text, anchor="end"))
        else:
            out.append(raised_power_text(LEFT - 6, py(t) + 3.5, "" if m == 1 else f"{m:g}×",
                                         k, "end"))
    return out
