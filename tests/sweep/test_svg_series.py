"""The time-series chart written as SVG (sweep.svg_series)."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sweep.svg_series import (
    BOTTOM,
    GAP,
    LEFT,
    RIGHT,
    SWEEP_PANELS,
    TOP,
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
    texts = _texts(series_svg(s, "x"))
    assert "×105" in texts  # "×10" with the exponent as a superscript span
    labels = [t for t in texts if re.fullmatch(r"-?[0-9.]+", t)]
    assert all(len(t.replace("-", "").replace(".", "")) <= 4 for t in labels)


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
    if span < 1e-6 * max(1.0, abs(lo)):  # finer than a chart's ticks can be told apart
        return
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
