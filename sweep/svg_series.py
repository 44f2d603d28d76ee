"""A point's time series as an SVG line chart, written directly (no plotting library).

The sweep driver draws one chart per grid point while the jobs run, so its cost is part of
every point's: matplotlib took 40-50 ms a chart (and 0.3 s to import) where this takes about
one, for the same picture: stacked panels sharing the simulated-time axis, each with its
lines, "nice" ticks (1, 2, 2.5 or 5 times a power of ten), a power-of-ten offset above the
axis once values reach 10^4, a legend and the figure's title (measured side by side in
docs/sweep.md, "What the platform costs").

A line breaks where a sample is NaN. A series longer than about four points per horizontal
pixel is reduced per pixel column to its first, lowest, highest and last sample in time
order, which draws the same picture (long runs would otherwise write every second). The
output depends only on the input: the same series and title give the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 504, 432  # points (7 x 6 inches), as the matplotlib figure it replaced
LEFT, RIGHT, TOP, BOTTOM = 58.0, 488.0, 34.0, 397.0  # the panels' frame
GAP = 21.0  # between panels (room for the next panel's offset label)
FONT = "font-family: 'DejaVu Sans', Arial, Helvetica, sans-serif"
COLORS = ("#1f77b4", "#ff7f0e", "#d62728")  # matplotlib's tab:blue, tab:orange, tab:red
OFFSET_FROM = 1e4  # y values from here up are ticked with a power-of-ten offset
X_TICKS, Y_TICKS = 8, 6  # at most this many ticks on the time axis / a panel's y axis


@dataclass(frozen=True)
class Line:
    """One series in a panel: the key in the series mapping, its legend label, its colour."""

    key: str
    label: str
    color: str


@dataclass(frozen=True)
class Panel:
    """One stacked panel: its lines, the y label, and fixed y limits (None: from the data)."""

    lines: tuple[Line, ...]
    ylabel: str
    ylim: tuple[float, float] | None = None
    legend: bool = True


# The sweep's chart: requests in the engine, KV-cache use, token throughput (the series
# engine.results.timeseries_frame writes, one sample per simulated second at ``t_s``).
SWEEP_PANELS = (
    Panel((Line("running", "running", COLORS[0]), Line("waiting", "waiting", COLORS[1])),
          "requests"),
    Panel((Line("kv_usage_pct", "KV cache %", COLORS[2]),), "KV cache %", (0.0, 105.0),
          legend=False),
    Panel((Line("prompt_throughput", "prompt", COLORS[0]),
           Line("gen_throughput", "generation", COLORS[1])), "tokens/s"),
)


def nice_ticks(lo: float, hi: float, max_ticks: int) -> list[float]:
    """Ticks inside ``[lo, hi]`` at the smallest step of 1, 2, 2.5 or 5 times a power of ten
    that gives at least two and at most ``max_ticks`` of them; ``[lo, hi]`` itself when no
    such step exists (a range only a few float steps wide)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        raise ValueError(f"nice_ticks needs finite lo < hi, got {lo!r}, {hi!r}")
    raw = (hi - lo) / max(max_ticks - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    for mult in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = mult * power
        first = math.ceil(lo / step - 1e-9)
        last = math.floor(hi / step + 1e-9)
        if last - first + 1 <= max_ticks:
            # k * step rounded to three digits below the step (drops float noise: 0.6, not
            # 0.6000000000000001)
            digits = 3 - math.floor(math.log10(step))
            ticks = [round(k * step, digits) + 0.0 for k in range(first, last + 1)]
            if len(ticks) >= 2 and all(a < b for a, b in zip(ticks, ticks[1:], strict=False)):
                return ticks
            break
    return [lo, hi]


def axis_limits(lo: float, hi: float) -> tuple[float, float]:
    """An axis range from the data's: 5 % of the span beyond each end (matplotlib's default
    margins); a constant (or a span of float noise) +-5 % of its value, +-1 around 0."""
    if hi - lo <= 1e-12 * max(abs(lo), abs(hi)):
        pad = 0.05 * abs(lo) if lo != 0 else 1.0
        return lo - pad, hi + pad
    pad = 0.05 * (hi - lo)
    return lo - pad, hi + pad


def tick_label(v: float, step: float) -> str:
    """A tick label with as many decimals as the step needs."""
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else 0
    if abs(step * 10**decimals - round(step * 10**decimals)) > 1e-9:
        decimals += 1  # 2.5, 0.25, 2.5e-3: one digit more
    text = f"{v:.{decimals}f}"
    return "0" if float(text) == 0 else text


def _decimate(points: list[tuple[float, float]], x_of: float, x_scale: float,
              columns: int) -> list[tuple[float, float]]:
    """``points`` (in time order, finite) reduced to first/lowest/highest/last per pixel
    column when there are more than four a column (the same picture)."""
    if len(points) <= 4 * columns:
        return points
    out: list[tuple[float, float]] = []
    bucket: list[tuple[float, float]] = []
    col = None
    for p in points:
        c = int((p[0] - x_of) * x_scale)
        if c != col and bucket:
            out.extend(_extremes(bucket))
            bucket = []
        col = c
        bucket.append(p)
    out.extend(_extremes(bucket))
    return out


def _extremes(bucket: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(bucket) <= 4:
        return bucket
    lo = min(range(len(bucket)), key=lambda i: bucket[i][1])
    hi = max(range(len(bucket)), key=lambda i: bucket[i][1])
    keep = sorted({0, lo, hi, len(bucket) - 1})
    return [bucket[i] for i in keep]


def finite_runs(xs: list[float], ys: list[float]) -> list[list[tuple[float, float]]]:
    """The finite stretches of a series of floats (a NaN or infinite sample breaks the line)."""
    runs: list[list[tuple[float, float]]] = []
    cur: list[tuple[float, float]] = []
    for x, y in zip(xs, ys, strict=True):
        if math.isfinite(x) and math.isfinite(y):
            cur.append((x, y))
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def raised_power_text(x: float, y: float, head: str, exponent: int, anchor: str) -> str:
    """``head`` then 10 to the power ``exponent`` (raised, smaller) as one SVG text."""
    return (f'<text x="{x:.2f}" y="{y:.2f}" style="font-size: 10px; {FONT}; '
            f'text-anchor: {anchor}">{escape(head)}10<tspan dy="-4" '
            f'style="font-size: 7px">{exponent}</tspan></text>')


def linear_y_labels(ticks: Sequence[float], py: Callable[[float], float], left: float,
                    top: float) -> list[str]:
    """The labels of a linear y axis whose frame has its left edge at ``left`` and its top at
    ``top`` (``py`` places a value; ``ticks`` from ``nice_ticks``, two or more): each tick's
    value, with a ×10^k offset above the axis once the values reach ``OFFSET_FROM``."""
    top_abs = max(abs(ticks[0]), abs(ticks[-1]))
    power = int(math.floor(math.log10(top_abs))) if top_abs >= OFFSET_FROM else 0
    step = (ticks[1] - ticks[0]) / 10**power
    out = [svg_text(left - 6, py(t) + 3.5, tick_label(t / 10**power, step), anchor="end")
           for t in ticks]
    if power:
        out.append(raised_power_text(left, top - 4, "×", power, "start"))
    return out


def svg_open(width: float, height: float) -> list[str]:
    """The opening of a chart's SVG: the XML declaration, the ``svg`` element (``width`` by
    ``height`` points) and a white background."""
    return ['<?xml version="1.0" encoding="utf-8" standalone="no"?>',
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}pt" height="{height}pt" '
            f'viewBox="0 0 {width} {height}" version="1.1">',
            f'<rect x="0" y="0" width="{width}" height="{height}" style="fill: #ffffff"/>']


def axes_frame(left: float, top: float, width: float, height: float,
               x_marks: Sequence[float], y_marks: Sequence[float],
               group_id: str | None = None) -> list[str]:
    """A plot's frame (``width`` by ``height`` from ``(left, top)``) in black with its tick
    marks: one below the frame at each of ``x_marks`` and one left of it at each of
    ``y_marks`` (positions in SVG units), as one group (with ``group_id``, if given)."""
    bottom = top + height
    marks = "".join(f"M {x:.2f} {bottom:.2f} v 3.5 " for x in x_marks)
    marks += "".join(f"M {left:.2f} {y:.2f} h -3.5 " for y in y_marks)
    group = f' id="{group_id}"' if group_id else ""
    return [f'<g{group} style="stroke: #000000; stroke-width: 0.8">',
            f'<rect x="{left:.2f}" y="{top:.2f}" width="{width:.2f}" height="{height:.2f}" '
            'style="fill: none"/>',
            f'<path d="{marks.strip()}"/></g>']


def svg_text(x: float, y: float, s: str, *, anchor: str = "middle", size: float = 10,
          rotate: bool = False) -> str:
    transform = f' transform="rotate(-90 {x:.2f} {y:.2f})"' if rotate else ""
    return (f'<text x="{x:.2f}" y="{y:.2f}" style="font-size: {size:g}px; {FONT}; '
            f'text-anchor: {anchor}"{transform}>{escape(_xml_chars(s))}</text>')


def _xml_chars(s: str) -> str:
    """``s`` without the characters XML 1.0 does not allow (control characters, lone
    surrogates from undecodable command-line bytes): each becomes U+FFFD."""
    return "".join(c if c in "\t\n\r" or (" " <= c < "\ud800") or ("\ue000" <= c <= "\ufffd")
                   or c >= "\U00010000" else "\ufffd" for c in s)


def series_svg(series: Mapping[str, Sequence[float]], title: str,
               panels: Sequence[Panel] = SWEEP_PANELS, x_key: str = "t_s",
               xlabel: str = "simulated time (s)") -> bytes:
    """The panels of ``series`` against ``series[x_key]`` as SVG bytes (see the module
    docstring). A key the series lacks draws no line."""
    xs = [float(v) for v in series.get(x_key, [])]
    for panel in panels:
        for line in panel.lines:
            n = len(series.get(line.key, xs))
            if n != len(xs):
                raise ValueError(f"series {line.key!r} has {n} samples, {x_key!r} {len(xs)}")
    finite_x = [x for x in xs if math.isfinite(x)]
    x_lo, x_hi = axis_limits(min(finite_x, default=0.0), max(finite_x, default=0.0))
    x_scale = (RIGHT - LEFT) / (x_hi - x_lo)
    columns = int(RIGHT - LEFT)
    x_ticks = nice_ticks(x_lo, x_hi, X_TICKS)  # always two or more
    x_step = x_ticks[1] - x_ticks[0]

    def px(x: float) -> float:
        return LEFT + (x - x_lo) * x_scale

    n = len(panels)
    height = (BOTTOM - TOP - GAP * (n - 1)) / n
    out = [*svg_open(WIDTH, HEIGHT), '<defs>']
    tops = [TOP + i * (height + GAP) for i in range(n)]
    for i, top in enumerate(tops):
        out.append(f'<clipPath id="panel{i}"><rect x="{LEFT:.2f}" y="{top:.2f}" '
                   f'width="{RIGHT - LEFT:.2f}" height="{height:.2f}"/></clipPath>')
    out.append('</defs>')
    for i, (panel, top) in enumerate(zip(panels, tops, strict=True)):
        bottom = top + height
        # each line's samples as floats, once (None: the series lacks the key)
        line_ys = {line.key: [float(v) for v in series[line.key]] if line.key in series
                   else None for line in panel.lines}
        if panel.ylim is not None:
            y_lo, y_hi = panel.ylim
        else:
            finite = [v for ys in line_ys.values() if ys is not None for v in ys
                      if math.isfinite(v)]
            y_lo, y_hi = axis_limits(min(finite, default=0.0), max(finite, default=0.0))
        y_scale = height / (y_hi - y_lo)

        def py(y: float, y_lo: float = y_lo, y_scale: float = y_scale,
               bottom: float = bottom) -> float:
            return bottom - (y - y_lo) * y_scale

        y_ticks = nice_ticks(y_lo, y_hi, Y_TICKS)
        out.extend(axes_frame(LEFT, top, RIGHT - LEFT, height, [px(t) for t in x_ticks],
                              [py(t) for t in y_ticks], f"panel{i}_axes"))
        out.extend(linear_y_labels(y_ticks, py, LEFT, top))
        out.append(svg_text(16, top + height / 2, panel.ylabel, rotate=True))
        if i == n - 1:
            for t in x_ticks:
                out.append(svg_text(px(t), bottom + 14.5, tick_label(t, x_step)))
            out.append(svg_text((LEFT + RIGHT) / 2, bottom + 29, xlabel))
        for line in panel.lines:
            ys = line_ys[line.key]
            if ys is None:
                continue
            d = []
            for run in finite_runs(xs, ys):
                pts = _decimate(run, x_lo, x_scale, columns)
                d.append("M " + " L ".join(f"{px(x):.2f} {py(y):.2f}" for x, y in pts))
            if d:
                out.append(f'<path d="{" ".join(d)}" clip-path="url(#panel{i})" '
                           f'style="fill: none; stroke: {line.color}; stroke-width: 1.5; '
                           'stroke-linejoin: round"/>')
        if panel.legend:
            out.extend(legend_box(panel.lines, top))
    # the title in one line across the figure (about 0.55 em a character)
    out.append(svg_text(WIDTH / 2, 13.3, title, size=min(9.0, 0.95 * WIDTH / (0.55 * max(len(title), 1)))))
    out.append("</svg>\n")
    return "\n".join(out).encode()


def legend_size(lines: Sequence[Line], size: float = 10.0) -> tuple[float, float]:
    """Width and height of the legend box of ``lines`` at font ``size``."""
    return 36 + 0.62 * size * max(len(line.label) for line in lines), 8 + 1.5 * size * len(lines)


def legend_box(lines: Sequence[Line], top: float, right: float = RIGHT,
               marker: bool = False, size: float = 10.0) -> list[str]:
    """A legend box whose upper right corner is 5 units inside ``(right, top)``: a line
    sample (with a round marker when ``marker``) and a label per line, at font ``size``."""
    width, height = legend_size(lines, size)
    x = right - 5 - width
    out = [f'<rect x="{x:.2f}" y="{top + 5:.2f}" width="{width:.2f}" '
           f'height="{height:.2f}" rx="2" style="fill: #ffffff; opacity: 0.8; '
           'stroke: #cccccc"/>']
    for k, line in enumerate(lines):
        y = top + 5 + 1.1 * size + 1.5 * size * k
        out.append(f'<path d="M {x + 4:.2f} {y:.2f} h 20" style="stroke: {line.color}; '
                   'stroke-width: 1.5"/>')
        if marker:
            out.append(f'<circle cx="{x + 14:.2f}" cy="{y:.2f}" r="3" '
                       f'style="fill: {line.color}"/>')
        out.append(svg_text(x + 30, y + 0.35 * size, line.label, anchor="start", size=size))
    return out
