"""Cost per 1M output tokens within the SLO, over the steady-state window; and the answers
of one run (``analysis.answers``) that sweeps, probes and the ground-truth run all log."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.answers import point_answers
from analysis.cost import (
    WARMUP_FRACTION,
    cost_metrics,
    steady_state_window,
    usd_per_m_output_tokens,
)
from analysis.metrics import per_request
from analysis.slo import SloSpec

MS = 1_000_000
S = 1_000_000_000


def _run(arrivals_s, ttft_ms, out_len=10, tpot_ms=10.0) -> pd.DataFrame:
    arrival = np.asarray(arrivals_s, dtype=float) * S
    first = arrival + np.asarray(ttft_ms, dtype=float) * MS
    finish = first + (out_len - 1) * tpot_ms * MS
    frame = pd.DataFrame({
        "request_id": [f"r{i}" for i in range(len(arrival))],
        "arrival_ns": arrival.astype(np.int64), "first_token_ns": first.astype(np.int64),
        "finish_ns": finish.astype(np.int64), "prompt_len": 5, "output_len": out_len,
    })
    # No front end: the client sees the engine's instants (point_answers reads its view).
    frame["send_ns"] = frame["arrival_ns"]
    frame["client_first_token_ns"] = frame["first_token_ns"]
    frame["client_finish_ns"] = frame["finish_ns"]
    return frame


SPEC = SloSpec.parse({"ttft_ms_p99": 1000}, {"ttft_ms": 1000})


def test_window_and_cost_by_hand() -> None:
    # 11 arrivals at 0..10 s: the window is [1, 10) s (the first tenth is warm-up, the last
    # arrival closes it), counting the 9 requests that arrived at 1..9 s.
    ttft = [100] * 11
    ttft[4] = 5000  # one slow request in the window: not good
    pm = per_request(_run(range(11), ttft))
    window = steady_state_window(pm)
    assert (window.start_ns, window.end_ns) == (WARMUP_FRACTION * 10 * S, 10 * S)
    assert list(np.flatnonzero(window.counted)) == list(range(1, 10))
    good = np.array([t <= 1000 for t in ttft])
    m = cost_metrics(pm, good, usd_per_hour=3.6, num_gpus=2)
    assert m["window_s"] == pytest.approx(9.0) and m["window_requests"] == 9
    assert m["good_output_tok_s"] == pytest.approx(8 * 10 / 9.0)
    assert m["usd_per_m_output_tokens"] == pytest.approx(3.6 / (80 / 9 * 3600) * 1e6)
    assert m["window_output_tok_s"] == pytest.approx(90 / 9.0)
    assert m["raw_usd_per_m_output_tokens"] == pytest.approx(3.6 / (10 * 3600) * 1e6)
    assert m["good_output_tok_s_per_gpu"] == pytest.approx(m["good_output_tok_s"] / 2)


def test_the_drain_does_not_dilute_the_cost() -> None:
    """Requests finishing after the last arrival (a longer drain: the one that arrived at 9 s
    now ends at 10.7 s) leave the cost unchanged, while the benchmark-duration throughput
    drops."""
    fast = point_answers(_run(range(11), [100] * 11), SPEC, 3.0, 1).metrics
    slow = point_answers(_run(range(11), [100] * 11, tpot_ms=180.0), SPEC, 3.0, 1).metrics
    assert slow["usd_per_m_output_tokens"] == fast["usd_per_m_output_tokens"]
    assert slow["output_throughput"] < fast["output_throughput"]


def test_no_good_request_is_nan_never_inf() -> None:
    m = point_answers(_run(range(5), [5000] * 5), SPEC, 3.0, 1).metrics
    assert m["slo_met"] == 0.0 and m["good_output_tok_s"] == 0.0
    assert math.isnan(m["usd_per_m_output_tokens"])
    assert math.isfinite(m["raw_usd_per_m_output_tokens"])
    assert math.isnan(usd_per_m_output_tokens(1.0, 0.0))
    assert math.isnan(usd_per_m_output_tokens(1.0, math.inf))


def test_a_burst_uses_the_benchmark_duration() -> None:
    """Every request at once (a saturation probe): no steady state, so the window is first
    arrival to last completion and every request counts."""
    pm = per_request(_run([0.0] * 4, [100, 200, 300, 400]))
    window = steady_state_window(pm)
    assert window.counted.all()
    assert window.seconds == pytest.approx((400 + 9 * 10) / 1000)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(1, 3000), st.integers(1, 50)),
                min_size=1, max_size=40), st.floats(0.1, 50))
def test_cost_is_never_below_the_raw_cost_and_never_inf(rows, usd) -> None:
    frame = pd.DataFrame({
        "request_id": [str(i) for i in range(len(rows))],
        "arrival_ns": [int(a * S) for a, _, _ in rows],
        "first_token_ns": [int(a * S + t * MS) for a, t, _ in rows],
        "finish_ns": [int(a * S + t * MS + n * MS) for a, t, n in rows],
        "prompt_len": 1, "output_len": [n for _, _, n in rows],
    })
    m = point_answers(frame, SPEC, usd, 1, view="engine").metrics
    assert not any(math.isinf(v) for v in m.values())
    if math.isfinite(m["usd_per_m_output_tokens"]):
        assert m["usd_per_m_output_tokens"] >= m["raw_usd_per_m_output_tokens"] * (1 - 1e-12)


def test_point_answers_carry_bounds_as_params_and_observations_as_metrics() -> None:
    answers = point_answers(_run(range(11), [100] * 11), SPEC, 2.0, 1)
    assert answers.params == {"slo.ttft_ms_p99.bound": 1000.0, "slo.goodput.ttft_ms.bound": 1000.0}
    assert answers.metrics["ttft_ms_p99"] == pytest.approx(100.0)
    assert answers.metrics["slo_met"] == 1.0 and answers.slo.passed
    assert not any(k.startswith("slo.") or k.startswith("slo_ttft") for k in answers.metrics)
    no_price = point_answers(_run(range(3), [100] * 3), SPEC)
    assert "usd_per_m_output_tokens" not in no_price.metrics
