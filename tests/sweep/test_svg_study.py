"""The study plot (``sweep.svg_study``): the lines it draws, where their points land, the
axes' ticks and labels, the legend's corner, and what it refuses."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from sweep.svg_study import (
    BOTTOM,
    LEFT,
    RIGHT,
    TOP,
    _log_ticks,
    study_plot,
    study_svg,
)
from sweep.svg_study import _log_y_labels as log_y_label_elements

SVG = "{http://www.w3.org/2000/svg}"


def _grid() -> pd.DataFrame:
    """Two utilisations x four rates, rows out of order, one NaN."""
    rows = []
    for util in (0.9, 0.5):
        for rate in (4, 1, 3, 2):
            rows.append({"util": util, "rate": rate, "ttft": 100.0 * rate**2 * (2 - util),
                         "name": f"m{rate}"})
    frame = pd.DataFrame(rows)
    frame.loc[(frame.util == 0.9) & (frame.rate == 3), "ttft"] = math.nan
    return frame


def _lines(svg: bytes) -> list[list[list[tuple[float, float]]]]:
    """Each data line's runs (the paths inside the clipped groups) as lists of (x, y)."""
    root = ET.fromstring(svg)
    out = []
    for group in root.iter(f"{SVG}g"):
        if group.get("clip-path"):
            (path,) = group.iter(f"{SVG}path")
            out.append([[tuple(map(float, p.split())) for p in part.strip().split(" L ")]
                        for part in path.get("d").split("M ")[1:]])
    return out


def _texts(svg: bytes) -> list[tuple[float, float, str]]:
    """Each text's place and content, a raised span written as ``^`` and its text."""
    root = ET.fromstring(svg)
    out = []
    for t in root.iter(f"{SVG}text"):
        text = (t.text or "") + "".join(f"^{span.text}{span.tail or ''}" for span in t)
        out.append((float(t.get("x")), float(t.get("y")), text))
    return out


def _y_labels(svg: bytes) -> list[str]:
    """The y tick labels, top to bottom."""
    found = [(y, s) for x, y, s in _texts(svg) if x == pytest.approx(LEFT - 6)]
    return [s for _, s in sorted(found)]


def test_one_line_per_value_sorted_by_x_with_nan_breaking_it():
    svg = study_svg(_grid(), "rate", "ttft", "util", "study & <t>")
    lines = _lines(svg)
    assert len(lines) == 2  # util 0.5 first (sorted), then 0.9
    (low,), high = lines[0], lines[1]
    assert [p[0] for p in low] == sorted(p[0] for p in low) and len(low) == 4
    assert [len(run) for run in high] == [2, 1]  # the NaN at rate 3 breaks the line
    texts = [s for _, _, s in _texts(svg)]
    assert "study & <t>" in texts and "rate" in texts and "ttft" in texts
    assert "util=0.5" in texts and "util=0.9" in texts
    assert study_svg(_grid(), "rate", "ttft", "util", "study & <t>") == svg  # deterministic


def test_points_land_on_the_linear_axes_with_margins():
    frame = pd.DataFrame({"x": [0.0, 10.0], "y": [0.0, 100.0]})
    ((run,),) = _lines(study_svg(frame, "x", "y", None, "t"))
    width, height = RIGHT - LEFT, BOTTOM - TOP
    assert run[0] == pytest.approx((LEFT + width * 0.5 / 11, BOTTOM - height * 5 / 110), abs=0.01)
    assert run[1] == pytest.approx((LEFT + width * 10.5 / 11, BOTTOM - height * 105 / 110),
                                   abs=0.01)
    assert _y_labels(study_svg(frame, "x", "y", None, "t")) == ["100", "80", "60", "40", "20",
                                                                 "0"]


def test_log_axis_places_decades_evenly_and_drops_nonpositive_values():
    frame = pd.DataFrame({"x": [1, 2, 3, 4], "y": [10.0, 100.0, 0.0, 10000.0]})
    svg = study_svg(frame, "x", "y", None, "t", logy=True)
    (runs,) = _lines(svg)
    assert [len(r) for r in runs] == [2, 1]  # 0 has no place on a log axis
    ys = [p[1] for r in runs for p in r]
    assert ys[0] - ys[1] == pytest.approx((ys[1] - ys[2]) / 2, abs=0.01)  # 1 and 2 decades
    assert _y_labels(svg) == ["10^4", "10^3", "10^2", "10^1"]


def test_log_ticks_between_decades():
    assert _log_ticks(0.9, 3.1) == [1.0, 2.0, 3.0]
    assert _log_ticks(0.0, 12.0) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    narrow = [round(10**t, 6) for t in _log_ticks(math.log10(40), math.log10(300))]
    assert narrow == [50.0, 100.0, 200.0]
    narrower = [round(10**t, 6) for t in _log_ticks(math.log10(42), math.log10(75))]
    assert narrower == [50.0, 60.0, 70.0]
    svg = study_svg(pd.DataFrame({"x": [1, 2], "y": [45.0, 72.0]}), "x", "y", None, "t",
                    logy=True)
    assert _y_labels(svg) == ["70", "60", "50"]


def test_categorical_x_gets_one_tick_per_category():
    svg = study_svg(_grid(), "name", "ttft", "util", "t")
    labels = sorted((x, s) for x, y, s in _texts(svg) if y == pytest.approx(BOTTOM + 14.5))
    assert [s for _, s in labels] == ["m1", "m2", "m3", "m4"]


def test_legend_takes_the_emptiest_corner():
    rising = pd.DataFrame({"x": [0, 1, 2, 3], "y": [0.0, 1.0, 2.0, 3.0]})
    falling = rising.assign(y=rising.y[::-1].to_numpy())

    def legend_x(frame: pd.DataFrame) -> float:
        root = ET.fromstring(study_svg(frame, "x", "y", None, "t"))
        (box,) = [r for r in root.iter(f"{SVG}rect") if r.get("rx")]
        return float(box.get("x")) + float(box.get("width")) / 2

    middle = (LEFT + RIGHT) / 2
    assert legend_x(rising) < middle  # the upper right holds the line's end: upper left
    assert legend_x(falling) > middle  # the upper left holds its start: upper right


def test_refuses_missing_columns_and_a_non_numeric_y(tmp_path):
    with pytest.raises(KeyError, match=r"'nope' is not in the results table; available"):
        study_svg(_grid(), "rate", "nope", None, "t")
    with pytest.raises(ValueError, match="'name' is not numeric"):
        study_svg(_grid(), "rate", "name", None, "t")
    out = study_plot(_grid(), "rate", "ttft", "util", tmp_path / "s.svg", "t", logy=True)
    assert out.read_bytes() == study_svg(_grid(), "rate", "ttft", "util", "t", logy=True)


def test_a_missing_line_value_is_its_own_line_and_no_rows_draw_no_legend():
    frame = _grid()
    frame.loc[frame.rate == 2, "util"] = math.nan
    svg = study_svg(frame, "rate", "ttft", "util", "t")
    assert len(_lines(svg)) == 3 and "util=nan" in [s for _, _, s in _texts(svg)]
    assert len(_lines(study_svg(frame.assign(util=math.nan), "rate", "ttft", "util", "t"))) == 1
    empty = study_svg(frame.iloc[:0], "rate", "ttft", "util", "t")
    assert _lines(empty) == [] and b"<rect" in empty  # axes, no legend, no error


def test_nullable_columns_read_missing_values_as_gaps():
    frame = pd.DataFrame({"x": pd.array([1, 2, 3], dtype="Int64"),
                          "y": pd.array([1.0, pd.NA, 3.0], dtype="Float64")})
    ((first, second),) = _lines(study_svg(frame, "x", "y", None, "t"))
    assert len(first) == len(second) == 1


def test_a_constant_on_a_log_axis_gets_distinct_labels():
    for value in (1.0, 1.0001, 1000.0, 3.3e-7, 9.9999e-6):
        svg = study_svg(pd.DataFrame({"x": [1, 2], "y": [value, value]}), "x", "y", None, "t",
                        logy=True)
        labels = _y_labels(svg)
        assert len(labels) >= 2 and len(set(labels)) == len(labels), (value, labels)
        assert not any(label.startswith("10×") for label in labels), (value, labels)


def test_a_mantissa_that_rounds_to_ten_is_the_next_decade():
    ticks = [math.log10(9.9996e-6), math.log10(1.3e5), math.log10(9.9996e5)]
    root = ET.fromstring("<svg xmlns='http://www.w3.org/2000/svg'>"
                         + "".join(log_y_label_elements(ticks, lambda t: 0.0)) + "</svg>")
    labels = [(t.text or "") + "".join(f"^{s.text}" for s in t) for t in root.iter(f"{SVG}text")]
    assert labels == ["10^-5", "1.3×10^5", "10^6"]
