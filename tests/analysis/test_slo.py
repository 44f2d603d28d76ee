"""The one SLO object: run-level bounds at named percentiles, per-request goodput bounds as
``vllm bench serve --goodput`` checks them, the verdict and its names."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.metrics import compute_metrics, per_request
from analysis.slo import SloSpec, evaluate, good_requests
from engine.specs import ConfigError

MS = 1_000_000


def _frame() -> pd.DataFrame:
    return pd.DataFrame({
        "request_id": ["a", "b", "c", "d"],
        "arrival_ns": [0, 0, 0, 0],
        "first_token_ns": [100 * MS, 200 * MS, 300 * MS, 400 * MS],
        "finish_ns": [1100 * MS, 1200 * MS, 2300 * MS, 400 * MS],
        "prompt_len": [10, 10, 10, 10],
        "output_len": [11, 11, 11, 1],
        "token_times_ns": [[100 * MS + i * 100 * MS for i in range(11)],
                           [200 * MS + i * 100 * MS for i in range(11)],
                           [300 * MS + i * 200 * MS for i in range(11)],
                           [400 * MS]],
    })


def test_evaluate_by_hand() -> None:
    spec = SloSpec.parse({"ttft_ms_p50": 260, "tpot_ms_mean": 150, "itl_ms_p99_9": 250,
                          "e2el_ms_median": 1200},
                         goodput={"ttft_ms": 260, "tpot_ms": 150, "e2el_ms": 1200})
    rep = evaluate(_frame(), spec)
    assert rep.observed["ttft_ms_p50"] == pytest.approx(250.0)
    assert rep.observed["tpot_ms_mean"] == pytest.approx((100 + 100 + 200) / 3)
    assert rep.observed["itl_ms_p99_9"] == pytest.approx(200.0)
    assert rep.observed["e2el_ms_median"] == pytest.approx(1150.0)
    assert rep.passed and rep.margin <= 0
    # Good requests: a and b (c: TPOT 200 > 150 and E2E 2300 > 1200; d: TTFT 400 > 260).
    assert list(rep.good) == [True, True, False, False] and rep.good_fraction == 0.5
    assert rep.goodput_rps == pytest.approx(2 / 2.3)  # vllm: good / benchmark duration
    strict = evaluate(_frame(), SloSpec.parse({"ttft_ms_p50": 260}, {"ttft_ms": 260}, 0.75))
    assert not strict.passed and strict.margins["goodput_fraction"] > 0
    assert not evaluate(_frame(), SloSpec.parse({"ttft_ms_p99": 300})).passed


def test_goodput_as_vllm_bench_serve_counts_it() -> None:
    """``value <= bound`` per request, a one-token request's TPOT counting as 0, and a request
    that never finished (first token -1, the engine's mark) is never good."""
    frame = pd.DataFrame({
        "request_id": ["a", "b", "c", "d", "e"],
        "arrival_ns": [0, 0, 0, 0, 0],
        "first_token_ns": [100 * MS, 300 * MS, 100 * MS, 50 * MS, -1],
        "finish_ns": [1100 * MS, 1300 * MS, 5100 * MS, 50 * MS, -1],
        "prompt_len": [1] * 5,
        "output_len": [11, 11, 11, 1, 11],
    })
    pm = per_request(frame)
    # TPOT 100, 100, 500 ms, then 0 for the one-token request (goodput's view).
    spec = SloSpec.parse({"ttft_ms_p99": 10_000}, {"ttft_ms": 200, "tpot_ms": 150})
    assert list(good_requests(pm, spec)) == [True, False, False, True, False]
    assert list(good_requests(pm, SloSpec.parse({"ttft_ms_p99": 1}, {"e2el_ms": 1000}))) == [
        False, False, False, True, False]
    # Without a per-request bound every finished request is good.
    assert list(good_requests(pm, SloSpec.parse({"ttft_ms_p99": 1}))) == [True] * 4 + [False]
    assert math.isnan(pm.tpot_ms[3]) and pm.goodput_value("tpot")[3] == 0.0


def test_unfinished_request_fails_the_run() -> None:
    frame = _frame()
    frame.loc[3, ["first_token_ns", "finish_ns"]] = -1
    rep = evaluate(frame, SloSpec.parse({"ttft_ms_p50": 1000}))
    assert not rep.passed and rep.margin > 0 and rep.good_fraction == 0.75


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9),
                          st.integers(1, 40)), min_size=1, max_size=30))
def test_observed_is_the_runs_metric_bit_for_bit(rows) -> None:
    """The SLO check and the metrics read the same per-request latencies and statistics."""
    frame = pd.DataFrame(
        [(str(i), a, a + t, a + t + d, 3, n) for i, (a, t, d, n) in enumerate(rows)],
        columns=["request_id", "arrival_ns", "first_token_ns", "finish_ns", "prompt_len",
                 "output_len"])
    keys = [f"{m}_ms_{s}" for m in ("ttft", "tpot", "e2el")
            for s in ("mean", "median", "p90", "p95", "p99")]
    rep = evaluate(frame, SloSpec.parse(dict.fromkeys(keys, 1e9)))
    metrics = compute_metrics(frame)
    for key in keys:
        same = rep.observed[key] == metrics[key] or (
            math.isnan(rep.observed[key]) and math.isnan(metrics[key]))
        assert same, key


def test_bounds_and_observations_have_distinct_names() -> None:
    spec = SloSpec.parse({"ttft_ms_p99": 1000, "tpot_ms_p95": 50}, {"ttft_ms": 1000}, 0.9)
    assert spec.params() == {"slo.ttft_ms_p99.bound": 1000.0, "slo.tpot_ms_p95.bound": 50.0,
                             "slo.goodput.ttft_ms.bound": 1000.0,
                             "slo.goodput_fraction.bound": 0.9}
    metrics = evaluate(_frame(), spec).metrics()
    assert {"slo_met", "slo_margin", "slo_attainment_pct", "goodput_rps",
            "ttft_ms_p99", "tpot_ms_p95"} == set(metrics)
    assert not set(spec.params()) & set(metrics)
    assert SloSpec.from_config(spec.as_dict()) == spec


def test_from_config_reads_the_hydra_node() -> None:
    from omegaconf import OmegaConf

    node = OmegaConf.create({"bounds": {"ttft_ms_p99": 2000, "tpot_ms_p99": None},
                             "goodput": {"ttft_ms": 2000, "tpot_ms": None, "e2el_ms": None},
                             "goodput_fraction": None})
    spec = SloSpec.from_config(node)
    assert [b.key for b in spec.bounds] == ["ttft_ms_p99"] and spec.goodput == (("ttft", 2000.0),)


@pytest.mark.parametrize(("node", "needle"), [
    ({"bounds": {"ttft_p99": 1}}, "slo.bounds.ttft_p99=1 is not an SLO bound"),
    ({"bounds": {"ttft_ms_p0": 1}}, "percentile 0 is not in"),
    ({"bounds": {"tpot_ms_p99": -5}}, "slo.bounds.tpot_ms_p99=-5 is not allowed"),
    ({"bounds": {"tpot_ms_p99": float("nan")}}, "slo.bounds.tpot_ms_p99=nan is not allowed"),
    ({"bounds": {}}, "slo.bounds has no bound"),
    ({"bounds": {"ttft_ms_p99": 1}, "goodput": {"itl_ms": 5}}, "slo.goodput.itl_ms=5 is not a"),
    ({"bounds": {"ttft_ms_p99": 1}, "goodput": {"ttft_ms": 0}}, "slo.goodput.ttft_ms=0"),
    ({"bounds": {"ttft_ms_p99": 1}, "goodput_fraction": 1.5}, "slo.goodput_fraction=1.5"),
    ({"bounds": {"ttft_ms_p99": 1}, "ttft_ms": 5}, "slo.ttft_ms=5 is not an SLO setting"),
])
def test_bad_config_names_the_key(node, needle) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        SloSpec.from_config(node)


def test_margins_grow_with_load() -> None:
    spec = SloSpec.parse({"ttft_ms_p99": 250})
    light = evaluate(_frame(), spec)
    slow = _frame()
    slow[["first_token_ns", "finish_ns"]] *= 2
    slow["token_times_ns"] = slow["token_times_ns"].map(lambda t: [2 * x for x in t])
    heavy = evaluate(slow, spec)
    assert heavy.margin > light.margin
    assert heavy.margins["ttft_ms_p99"] == pytest.approx(
        math.log(np.percentile([200, 400, 600, 800], 99) / 250))
