"""``sweep.tracking.chart_series``: a point's time series bounded for MLflow's charts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sweep.tracking import chart_series


def test_a_short_series_is_unchanged():
    series, steps = chart_series({"running": [1, 2, 3]}, [0, 1, 2], 3)
    assert series == {"running": [1.0, 2.0, 3.0]} and steps == [0, 1, 2]
    assert chart_series({"running": [1, 2, 3]}, [0, 1, 2], None)[1] == [0, 1, 2]


def test_a_long_series_is_binned_into_means_ending_at_each_bins_last_second():
    series, steps = chart_series({"gen": [1, 2, 3, 4, 5, 6, 7]}, list(range(7)), 3)
    assert steps == [2, 5, 6]  # bins of ceil(7 / 3) = 3 seconds, the last holds the rest
    assert series == {"gen": [2.0, 5.0, 7.0]}


def test_bad_bounds_and_ragged_columns_are_refused():
    with pytest.raises(ValueError, match="max_steps=0"):
        chart_series({"a": [1, 2]}, [0, 1], 0)
    with pytest.raises(ValueError, match="'a' has 1 values for 3 steps"):
        chart_series({"a": [1]}, [0, 1, 2], 2)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=400), st.integers(1, 400))
def test_bins_cover_every_second_once_and_keep_the_series_total(values, max_steps):
    steps = [10 + 2 * i for i in range(len(values))]  # any increasing steps
    series, out = chart_series({"v": values}, steps, max_steps)
    assert len(out) == len(series["v"]) <= max_steps
    assert out == sorted(set(out)) and out[-1] == steps[-1]
    if len(values) <= max_steps:
        assert out == steps and series["v"] == values
        return
    # each bin's mean times its width gives back the whole series' sum
    w = math.ceil(len(values) / max_steps)
    widths = [w] * (len(out) - 1) + [len(values) - w * (len(out) - 1)]
    assert 0 < widths[-1] <= w
    total = sum(m * n for m, n in zip(series["v"], widths, strict=True))
    assert total == pytest.approx(math.fsum(values), rel=1e-9, abs=1e-3)
