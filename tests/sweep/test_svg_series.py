"""The time-series chart written as SVG (sweep.svg_series)."""

from __future__ import annotations

import math
import random
import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from sweep.svg_series import (
    BOTTOM,
    GAP,
    LEFT,
    RIGHT,
    SWEEP_PANELS,
    TOP,
    _decimate,
    nice_ticks,
    series_svg,
)

NS = {"svg": "http://www.w3.org/2000/svg"}


def _series(n: int = 50) -> dict[str, list[float]]:
    return {
        "t_s": [float(i) for i in range(n)],
        "running": [float(i % 7) for i in range(n)],
        "waiting": [0.0] * n,
        "kv_usage_pct": [min(100.0, 2.0 * i) for i in range(n)],
        "prompt_throughput": [1000.0 * (i % 3) for i in range(n)],
        "gen_throughput": [250.0] * n,
    }


def _paths(svg: bytes) -> list[ET.Element]:
    """The data lines (the paths clipped to a panel)."""
    root = ET.fromstring(svg)
    return [p for p in root.iter(f"{{{NS['svg']}}}path") if p.get("clip-path")]


def _points(d: str) -> list[list[tuple[float, float]]]:
    """A path's subpaths as lists of (x, y)."""
    runs = []
    for part in d.split("M ")[1:]:
        pts = [tuple(map(float, p.split())) for p in part.strip().split(" L ")]
        runs.append(pts)
    return runs


def _texts(svg: bytes) -> list[str]:
    root = ET.fromstring(svg)
    return ["".join(t.itertext()) for t in root.iter(f"{{{NS['svg']}}}text")]


def _tick_labels(svg: bytes, anchor: str, y_range: tuple[float, float]) -> list[str]:
    """The tick labels with ``text-anchor: anchor`` (end: y ticks, middle: x ticks) whose
    baseline lies in ``y_range``, left to right / top to bottom."""
    root = ET.fromstring(svg)
    out = []
    for t in root.iter(f"{{{NS['svg']}}}text"):
        text = "".join(t.itertext())
        y = float(t.get("y"))
        if (f"text-anchor: {anchor}" in t.get("style") and y_range[0] <= y <= y_range[1]
                and re.fullmatch(r"-?[0-9.]+", text)):
            out.append((float(t.get("x")), y, text))
    out.sort(key=lambda p: (p[0], p[1]) if anchor == "middle" else (p[1], p[0]))
    return [p[2] for p in out]


def _panel_rows(i: int) -> tuple[float, float]:
    height = (BOTTOM - TOP - 2 * GAP) / 3
    top = TOP + i * (height + GAP)
    return top, top + height + 5


def test_well_formed_one_line_per_series_and_deterministic() -> None:
    svg = series_svg(_series(), "rate=1 & <util> 0.9")
    assert len(_paths(svg)) == sum(len(p.lines) for p in SWEEP_PANELS) == 5
    texts = _texts(svg)
    assert "rate=1 & <util> 0.9" in texts  # escaped in the file, the same text when read
    for label in ("requests", "KV cache %", "tokens/s", "simulated time (s)", "running",
                  "waiting", "prompt", "generation"):
        assert label in texts
    assert series_svg(_series(), "rate=1 & <util> 0.9") == svg


def test_line_ends_map_to_the_data_range_with_margins() -> None:
    s = _series(101)  # t from 0 to 100: 5 units of margin each side
    d = _paths(series_svg(s, "x"))[0].get("d")
    (run,) = _points(d)
    assert len(run) == 101
    width = RIGHT - LEFT
    assert run[0][0] == pytest.approx(LEFT + width * 5 / 110, abs=0.01)
    assert run[-1][0] == pytest.approx(LEFT + width * 105 / 110, abs=0.01)
    xs = [p[0] for p in run]
    assert xs == sorted(xs)


def test_nan_breaks_the_line() -> None:
    s = _series(20)
    s["running"][8] = math.nan
    s["running"][9] = math.nan
    d = _paths(series_svg(s, "x"))[0].get("d")
    runs = _points(d)
    assert [len(r) for r in runs] == [8, 10]


def test_missing_series_draws_no_line_and_empty_series_still_renders() -> None:
    s = _series(10)
    del s["waiting"]
    assert len(_paths(series_svg(s, "x"))) == 4
    empty = series_svg({"t_s": []}, "nothing")
    ET.fromstring(empty)
    assert _paths(empty) == []


def test_long_series_is_reduced_per_pixel_column_keeping_extremes() -> None:
    n = 200_000
    s = _series(n)
    s["running"] = [float((i * 7919) % 1000) for i in range(n)]
    s["running"][123_457] = 5000.0  # one spike: must stay visible
    d = _paths(series_svg(s, "x"))[0].get("d")
    (run,) = _points(d)
    assert len(run) <= 4 * int(RIGHT - LEFT) + 4
    ys = [p[1] for p in run]
    # The panel's y range is [0, 5000] plus 5 % margins: the spike is drawn 250 / 5500 of
    # the panel's height below its top (SVG y grows downwards), exactly once.
    height = (BOTTOM - TOP - 2 * GAP) / 3
    assert min(ys) == pytest.approx(TOP + height * 250 / 5500, abs=0.01)
    assert sum(1 for y in ys if y == min(ys)) == 1
    # and the lowest value (0) is kept too: 250 / 5500 above the panel's bottom
    assert max(ys) == pytest.approx(TOP + height - height * 250 / 5500, abs=0.01)


def test_large_values_get_a_power_of_ten_offset() -> None:
    s = _series(30)
    s["prompt_throughput"] = [2.0e5 * (i % 2) for i in range(30)]
    svg = series_svg(s, "x")
    assert "×105" in _texts(svg)  # "×10" with the exponent as a superscript span
    # ticks 0, 50,000, ..., 200,000 labelled in units of 10^5; top to bottom
    assert _tick_labels(svg, "end", _panel_rows(2)) == ["2.0", "1.5", "1.0", "0.5", "0"]


def test_tick_labels_are_exact() -> None:
    s = _series(19)  # t 0..18: the time axis steps by 2.5
    svg = series_svg(s, "x")
    assert _tick_labels(svg, "middle", (BOTTOM, BOTTOM + 20)) == [
        "0", "2.5", "5.0", "7.5", "10.0", "12.5", "15.0", "17.5"]
    assert _tick_labels(svg, "end", _panel_rows(1)) == ["100", "80", "60", "40", "20", "0"]
    assert _tick_labels(svg, "end", _panel_rows(0)) == ["6", "4", "2", "0"]  # values 0..6


def test_constant_and_near_constant_panels_render() -> None:
    for a, b in ((0.0, 0.0), (1e12, 1e12), (3819.648, math.nextafter(3819.648, 1e9)),
                 (1.1 * 3, 3.3), (-5.0, -5.0)):
        s = _series(3)
        s["prompt_throughput"], s["gen_throughput"] = [a] * 3, [b] * 3
        svg = series_svg(s, "x")
        labels = _tick_labels(svg, "end", _panel_rows(2))
        assert len(labels) >= 2 and len(set(labels)) == len(labels)


def test_unequal_lengths_and_hostile_titles() -> None:
    s = _series(5)
    s["waiting"] = s["waiting"][:3]
    with pytest.raises(ValueError, match="'waiting' has 3 samples, 't_s' 5"):
        series_svg(s, "x")
    svg = series_svg(_series(5), "a\x1bb\udcffc")  # a control character, a lone surrogate
    assert "a\ufffdb\ufffdc" in _texts(svg)


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 5000), columns=st.integers(1, 50),
       levels=st.integers(1, 1000))
def test_decimation_keeps_each_columns_first_last_and_extremes(seed: int, n: int, columns: int,
                                                                levels: int) -> None:
    rng = random.Random(seed)  # few levels: ties between a column's extremes
    ys = [float(rng.randrange(levels)) for _ in range(n)]
    pts = [(float(i), y) for i, y in enumerate(ys)]
    scale = columns / len(ys)
    out = _decimate(pts, 0.0, scale, columns)
    assert [p[0] for p in out] == sorted(p[0] for p in out)  # time order
    assert set(out) <= set(pts)
    by_col: dict[int, list[tuple[float, float]]] = {}
    for p in pts:
        by_col.setdefault(int(p[0] * scale), []).append(p)
    kept: dict[int, list[tuple[float, float]]] = {}
    for p in out:
        kept.setdefault(int(p[0] * scale), []).append(p)
    assert kept.keys() == by_col.keys()
    for col, raw in by_col.items():
        got = kept[col]
        assert got[0] == raw[0] and got[-1] == raw[-1]
        assert min(p[1] for p in got) == min(p[1] for p in raw)
        assert max(p[1] for p in got) == max(p[1] for p in raw)
        assert len(got) <= 4


def test_nice_ticks_known_answers() -> None:
    assert nice_ticks(0, 31, 6) == [0, 10, 20, 30]
    assert nice_ticks(0, 105, 6) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(-16, 337, 8) == [0, 50, 100, 150, 200, 250, 300]
    assert nice_ticks(0.1, 0.9, 6) == [0.2, 0.4, 0.6, 0.8]
    assert nice_ticks(0, 1e-3, 6) == [0, 2e-4, 4e-4, 6e-4, 8e-4, 1e-3]
    with pytest.raises(ValueError):
        nice_ticks(1, 1, 6)
    with pytest.raises(ValueError):
        nice_ticks(0, math.inf, 6)


@given(
    lo=st.floats(-1e9, 1e9, allow_nan=False),
    span=st.floats(1e-6, 1e9, allow_nan=False),
    max_ticks=st.integers(3, 10),
)
def test_nice_ticks_properties(lo: float, span: float, max_ticks: int) -> None:
    hi = lo + span
    assume(span >= 1e-6 * max(1.0, abs(lo)))  # finer than a chart's ticks can be told apart
    ticks = nice_ticks(lo, hi, max_ticks)
    assert 2 <= len(ticks) <= max_ticks
    assert all(a < b for a, b in zip(ticks, ticks[1:], strict=False))
    tol = 1e-9 * max(abs(lo), abs(hi), span)
    assert lo - tol <= ticks[0] and ticks[-1] <= hi + tol
    steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:], strict=False)}
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5, 10))
    assert max(steps) - min(steps) <= 1e-6 * step + 1e-9
