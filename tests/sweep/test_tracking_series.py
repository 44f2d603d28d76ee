"""``sweep.tracking.chart_series``: a point's time series bounded for MLflow's charts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sweep.tracking import chart_series


def test_a_short_series_is_unchanged_as_floats_at_int_steps():
    series, steps = chart_series({"running": [1, 2, 3]}, [0, 1, 2], 3)
    assert series == {"running": [1.0, 2.0, 3.0]} and steps == [0, 1, 2]
    assert all(type(v) is float for v in series["running"])
    assert all(type(t) is int for t in steps)
    assert chart_series({"running": [1, 2, 3]}, [0, 1, 2], None)[1] == [0, 1, 2]


def test_a_long_series_is_cut_into_max_steps_runs_logged_as_means_at_their_last_step():
    # 7 samples into 3 runs as equal as whole samples allow: 3, 2, 2
    series, steps = chart_series({"gen": [1, 2, 3, 4, 5, 6, 7]}, list(range(7)), 3)
    assert steps == [2, 4, 6] and series == {"gen": [2.0, 4.5, 6.5]}
    assert all(type(v) is float for v in series["gen"]) and all(type(t) is int for t in steps)
    # one sample over the bound still gives the bound, not half of it
    assert len(chart_series({"a": list(range(321))}, list(range(321)), 320)[1]) == 320


def test_nan_samples_are_left_out_of_their_runs_mean():
    series, steps = chart_series({"kv": [1, math.nan, 3, math.nan, math.nan]}, list(range(5)), 2)
    assert steps == [2, 4] and series["kv"][0] == 2.0 and math.isnan(series["kv"][1])


def test_bad_bounds_ragged_columns_and_unordered_steps_are_refused():
    with pytest.raises(ValueError, match="max_steps=0"):
        chart_series({"a": [1, 2]}, [0, 1], 0)
    with pytest.raises(ValueError, match="'a' has 1 values for 3 steps"):
        chart_series({"a": [1]}, [0, 1, 2], 5)  # also when no binning is needed
    with pytest.raises(ValueError, match="strictly increasing"):
        chart_series({"a": [1, 2, 3]}, [0, 2, 1], 2)


@given(st.lists(st.tuples(st.integers(1, 5), st.floats(-1e6, 1e6)), min_size=1, max_size=400),
       st.integers(1, 400))
def test_runs_cover_every_sample_once_and_keep_the_series_total(samples, max_steps):
    gaps, values = zip(*samples, strict=True)
    steps = [sum(gaps[: i + 1]) for i in range(len(gaps))]  # increasing, with gaps
    series, out = chart_series({"v": list(values)}, steps, max_steps)
    n, m = len(values), min(len(values), max_steps)
    assert len(out) == len(series["v"]) == m
    if n <= max_steps:
        assert out == steps and series["v"] == list(values)
        return
    # the runs: the first n % m one sample longer; each ends at its last sample's step
    widths = [n // m + (i < n % m) for i in range(m)]
    ends = [sum(widths[: i + 1]) for i in range(m)]
    assert out == [steps[e - 1] for e in ends]
    starts = [0, *ends[:-1]]
    for mean, a, b in zip(series["v"], starts, ends, strict=True):
        assert mean == pytest.approx(math.fsum(values[a:b]) / (b - a), rel=1e-9, abs=1e-6)
