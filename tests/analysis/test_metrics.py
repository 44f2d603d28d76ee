"""Metrics as `vllm bench serve` defines them; comparison and formatting."""

from __future__ import annotations

import math
from unittest.mock import patch

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analysis.metrics as metrics_module
from analysis.metrics import (
    METRIC_KEYS,
    VALIDATION_METRICS,
    _itl_gaps,
    compare,
    compute_metrics,
    diff_pct,
    format_comparison,
    metric_label,
    statistic,
    summarize,
)
from engine.specs import ConfigError

MS = 1_000_000  # ns


def _frame(rows, token_times=None):
    df = pd.DataFrame(
        rows,
        columns=[
            "request_id",
            "arrival_ns",
            "first_token_ns",
            "finish_ns",
            "prompt_len",
            "output_len",
        ],
    )
    if token_times is not None:
        df["token_times_ns"] = token_times
    return df


def test_validation_metric_names_and_order():
    assert len(VALIDATION_METRICS) == 15
    assert VALIDATION_METRICS[:5] == (
        "ttft_ms_mean",
        "ttft_ms_median",
        "ttft_ms_p90",
        "ttft_ms_p95",
        "ttft_ms_p99",
    )
    assert VALIDATION_METRICS[5] == "tpot_ms_mean" and VALIDATION_METRICS[10] == "e2el_ms_mean"
    assert not any(k.startswith("itl") for k in VALIDATION_METRICS)


def test_hand_computed_example():
    # a: arrives 0, first token 100 ms, 3 tokens at 100/110/130, finish 130
    # b: arrives 50, first token 250, 2 tokens 250/300, finish 300
    # c: arrives 60, single token at 160 (excluded from TPOT, included in TTFT/E2EL)
    df = _frame(
        [
            ("a", 0, 100 * MS, 130 * MS, 10, 3),
            ("b", 50 * MS, 250 * MS, 300 * MS, 20, 2),
            ("c", 60 * MS, 160 * MS, 160 * MS, 30, 1),
        ],
        token_times=[[100 * MS, 110 * MS, 130 * MS], [250 * MS, 300 * MS], [160 * MS]],
    )
    m = compute_metrics(df)
    assert set(m) == set(METRIC_KEYS)
    ttft = [100.0, 200.0, 100.0]
    assert m["ttft_ms_mean"] == pytest.approx(np.mean(ttft))
    assert m["ttft_ms_median"] == pytest.approx(100.0)
    assert m["ttft_ms_p90"] == pytest.approx(np.percentile(ttft, 90))  # 180.0, linear
    assert m["ttft_ms_p90"] == pytest.approx(180.0)
    # TPOT: a -> (130 - 100) / 2 = 15; b -> 50 / 1 = 50; c excluded
    assert m["tpot_ms_mean"] == pytest.approx(32.5)
    assert m["tpot_ms_p99"] == pytest.approx(15 + 0.99 * 35)
    # ITL pooled over all gaps: [10, 20, 50] -> mean 26.67 (mean of per-request means: 32.5)
    assert m["itl_ms_mean"] == pytest.approx(80 / 3)
    assert m["itl_ms_median"] == pytest.approx(20.0)
    e2el = [130.0, 250.0, 100.0]
    assert m["e2el_ms_mean"] == pytest.approx(np.mean(e2el))
    assert m["e2el_ms_p95"] == pytest.approx(np.percentile(e2el, 95))
    # duration: first arrival (0) to last finish (300 ms)
    assert m["duration_s"] == pytest.approx(0.3)
    assert m["completed"] == 3
    assert m["request_throughput"] == pytest.approx(10.0)
    assert m["output_throughput"] == pytest.approx(6 / 0.3)
    assert m["total_token_throughput"] == pytest.approx(66 / 0.3)


def test_start_ns_and_incomplete_requests():
    df = _frame(
        [
            ("a", 1_000 * MS, 1_100 * MS, 1_500 * MS, 4, 5),
            ("b", 1_200 * MS, -1, -1, 4, 5),  # never finished (engine convention)
            ("c", 1_300 * MS, np.nan, np.nan, 4, 5),
        ]
    )
    m = compute_metrics(df)
    assert m["completed"] == 1
    assert m["duration_s"] == pytest.approx(0.5)
    m0 = compute_metrics(df, start_ns=0)
    assert m0["duration_s"] == pytest.approx(1.5)
    assert m0["output_throughput"] == pytest.approx(5 / 1.5)
    assert math.isnan(m["itl_ms_mean"])  # no token_times_ns column


def test_empty_frame():
    m = compute_metrics(_frame([]))
    assert m["completed"] == 0 and m["duration_s"] == 0.0
    assert math.isnan(m["ttft_ms_mean"]) and math.isnan(m["request_throughput"])


def test_token_times_as_arrays_and_missing_entries():
    df = _frame(
        [("a", 0, 10, 40, 1, 3), ("b", 0, 10, 20, 1, 2)],
        token_times=[np.array([10, 20, 40]), None],
    )
    m = compute_metrics(df)
    assert m["itl_ms_mean"] == pytest.approx(15 / MS)


@pytest.mark.parametrize(
    "row, needle",
    [
        (("x", 100, 50, 200, 1, 2), "first_token_ns < arrival_ns"),
        (("x", 0, 50, 40, 1, 2), "finish_ns < first_token_ns"),
        (("x", 0, 50, 60, 1, 0), "output_len < 1"),
    ],
)
def test_inconsistent_rows_rejected(row, needle):
    with pytest.raises(ConfigError, match=needle) as info:
        compute_metrics(_frame([("ok", 0, 1, 2, 1, 2), row]))
    assert "'x'" in str(info.value)


def test_missing_column_named():
    df = _frame([("a", 0, 1, 2, 1, 2)]).drop(columns=["finish_ns"])
    with pytest.raises(ConfigError, match="finish_ns"):
        compute_metrics(df)


def test_diff_pct():
    assert diff_pct(110.0, 100.0) == pytest.approx(10.0)
    assert diff_pct(6815.7, 7097.2) == pytest.approx(-3.966, abs=1e-3)
    assert math.isnan(diff_pct(1.0, 0.0))
    assert math.isnan(diff_pct(math.nan, 1.0))


def test_compare_and_format():
    ref = dict.fromkeys(VALIDATION_METRICS, 100.0)
    sim = dict.fromkeys(VALIDATION_METRICS, 95.0)
    sim["tpot_ms_p99"] = 100.5
    table = compare(sim, ref)
    assert list(table.columns) == ["metric", "vllm", "sim", "diff_pct"]
    assert list(table["metric"]) == list(VALIDATION_METRICS)
    assert table.loc[table.metric == "tpot_ms_p99", "diff_pct"].item() == pytest.approx(0.5)
    text = format_comparison(table, title="vLLM vs sim")
    lines = text.splitlines()
    assert lines[0] == "vLLM vs sim"
    assert any(line.startswith("TTFT Mean") and line.endswith("-5.0%") for line in lines)
    assert any(line.startswith("Latency P99") for line in lines)
    assert any(line.startswith("TPOT P99") and "+0.5%" in line for line in lines)
    del sim["e2el_ms_p99"]
    with pytest.raises(ConfigError, match="e2el_ms_p99"):
        compare(sim, ref)


def test_metric_label():
    assert metric_label("ttft_ms_p99") == "TTFT P99"
    assert metric_label("itl_ms_median") == "ITL Median"
    assert metric_label("request_throughput") == "request_throughput"


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9), st.integers(1, 50)
        ),
        min_size=1,
        max_size=40,
    )
)
def test_statistics_ordered_and_bounded(rows):
    df = _frame([(str(i), a, a + t, a + t + d, 7, n) for i, (a, t, d, n) in enumerate(rows)])
    m = compute_metrics(df)
    for name in ("ttft", "e2el"):
        vals = [m[f"{name}_ms_{s}"] for s in ("median", "p90", "p95", "p99")]
        assert vals == sorted(vals)
    e2el = [(t + d) / MS for _, t, d, _ in rows]
    assert min(e2el) - 1e-9 <= m["e2el_ms_mean"] <= max(e2el) + 1e-9
    assert m["e2el_ms_p99"] <= max(e2el) + 1e-9
    assert m["e2el_ms_mean"] >= m["ttft_ms_mean"] - 1e-9
    assert m["completed"] == len(rows)


def test_view_measures_ttft_and_e2el_from_its_start_column():
    df = _frame([("a", 0, 30 * MS, 100 * MS, 10, 8), ("b", 5 * MS, 50 * MS, 90 * MS, 10, 5)])
    df["queued_ns"] = [10 * MS, 20 * MS]
    by_arrival = compute_metrics(df)
    by_queue = compute_metrics(df, view="queued")
    assert by_arrival["ttft_ms_mean"] == pytest.approx((30 + 45) / 2)
    assert by_queue["ttft_ms_mean"] == pytest.approx((20 + 30) / 2)
    assert by_queue["e2el_ms_mean"] == pytest.approx((90 + 70) / 2)
    assert by_queue["tpot_ms_mean"] == by_arrival["tpot_ms_mean"]  # unaffected by the anchor
    with pytest.raises(ConfigError, match="view='picked' is not known"):
        compute_metrics(df, view="picked")
    with pytest.raises(ConfigError, match="no send_ns, client_first_token_ns, client_finish_ns "
                                          "for the 'client' view; use a view it records: "
                                          r"\['engine', 'queued'\]"):
        compute_metrics(df, view="client")
    df.loc[1, "queued_ns"] = -1
    with pytest.raises(ConfigError, match="queued_ns < 0 .never recorded"):
        compute_metrics(df, view="queued")
    # workload arrival times are taken as they are, even before zero
    shifted = df.assign(arrival_ns=df.arrival_ns - 3 * MS, first_token_ns=df.first_token_ns - 3 * MS,
                        finish_ns=df.finish_ns - 3 * MS)
    assert compute_metrics(shifted)["ttft_ms_mean"] == by_arrival["ttft_ms_mean"]


def test_client_view_reads_the_client_columns_from_the_send_time():
    df = _frame([("a", 0, 30 * MS, 100 * MS, 10, 3), ("b", 5 * MS, 50 * MS, 90 * MS, 10, 2)])
    df["send_ns"] = [-2 * MS, 4 * MS]  # sent before the engine received them
    df["client_first_token_ns"] = [33 * MS, 52 * MS]
    df["client_finish_ns"] = [104 * MS, 93 * MS]
    df["client_token_times_ns"] = [np.array([33, 70, 104]) * MS, np.array([52, 93]) * MS]
    m = compute_metrics(df, view="client")
    assert m["ttft_ms_mean"] == pytest.approx((35 + 48) / 2)
    assert m["e2el_ms_mean"] == pytest.approx((106 + 89) / 2)
    assert m["itl_ms_mean"] == pytest.approx((37 + 34 + 41) / 3)
    assert m["duration_s"] == pytest.approx(106 * MS / 1e9)  # first send to last receipt
    engine = compute_metrics(df, view="engine")
    assert engine["ttft_ms_mean"] == pytest.approx((30 + 45) / 2)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.lists(st.floats(-1e9, 1e9, allow_nan=False), max_size=300),
                 st.lists(st.floats(), max_size=40),
                 st.lists(st.integers(-10**15, 10**15), max_size=100)))
def test_summarize_is_statistic_bit_for_bit(values):
    """summarize's shared partition gives the per-statistic numpy calls exactly (NaN, inf
    and int samples included), and leaves the sample as it was."""
    sample = np.array(values, dtype=np.float64 if all(isinstance(v, float) for v in values)
                      else np.int64)
    before = sample.copy()
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf in numpy's lerp
        got = summarize(sample)
        want_all = {stat: statistic(sample, stat) for stat in got}
    assert sample.tobytes() == before.tobytes()
    for stat in ("mean", "median", "p90", "p95", "p99"):
        want = want_all[stat]
        assert (math.isnan(got[stat]) and math.isnan(want)) or got[stat] == want, stat


@pytest.mark.parametrize("n", [50, 1001, 20_000])
@pytest.mark.parametrize("where", [0, 0.5, 0.95])
def test_summarize_of_a_sample_holding_nan_is_nan_as_numpy(n, where):
    """One NaN anywhere in a large sample (where numpy's partition does not sort it all)
    makes the median and every percentile NaN, as np.median and np.percentile give."""
    sample = np.random.default_rng(n).normal(100.0, 20.0, n)
    sample[int(where * (n - 1))] = math.nan
    got = summarize(sample)
    for stat in ("median", "p90", "p95", "p99"):
        assert math.isnan(got[stat]) and math.isnan(statistic(sample, stat)), stat


_token_run = st.one_of(
    st.none(),
    st.just(float("nan")),
    # epoch-like ns (a ground truth's clock): float64 subtraction would lose the last digits
    st.tuples(st.integers(0, 2 * 10**18), st.lists(st.integers(0, 10**6), max_size=12)).map(
        lambda bd: bd[0] + np.cumsum(bd[1], dtype=np.int64)),
    st.lists(st.integers(0, 10**6), max_size=6).map(lambda d: list(np.cumsum(d).tolist())),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_token_run, st.booleans()), max_size=30),
       st.sampled_from([1, 2, 5, 13, 1 << 16]))
def test_itl_gaps_equal_one_diff_per_request(rows, batch):
    """The pooled ITL sample and each request's gaps are those of a per-request np.diff
    (the definition), in request order, with unknown or unfinished requests empty, however
    the token times are batched (a batch smaller than a request, exactly one, several)."""
    times = pd.Series([t for t, _ in rows], dtype=object)
    finished = np.array([d for _, d in rows], dtype=bool)
    with patch.object(metrics_module, "_GAP_BATCH", batch):
        pooled, gaps = _itl_gaps(times, finished)
    want = []
    for (t, done), got in zip(rows, gaps, strict=True):
        known = t is not None and not (isinstance(t, float) and math.isnan(t)) and len(t) > 1
        expect = np.diff(np.asarray(t, dtype=np.int64)) / MS if done and known else np.empty(0)
        assert got.tobytes() == expect.tobytes()
        if len(expect):
            want.append(expect)
    expect_pooled = np.concatenate(want) if want else np.empty(0)
    assert pooled.tobytes() == expect_pooled.tobytes()
    assert not pooled.flags.writeable
    assert not any(g.flags.writeable for g in gaps if len(g))  # views of the pooled sample
