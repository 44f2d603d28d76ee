"""Load stages and arrival processes (workloads.arrivals) and synthetic_requests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads import Load, Stage, WorkloadError, synthetic, synthetic_requests
from workloads.arrivals import burstiness_of

S = 1_000_000_000


def test_constant_stages_space_arrivals_evenly_per_stage():
    load = Load(stages=[{"rate": 2, "duration_s": 3}, {"rate": 0, "duration_s": 2},
                        {"rate": 10, "duration_s": 1}], arrival="constant")
    t = load.times(0).tolist()
    assert t[:6] == [S // 2 * k for k in range(1, 7)]  # 0.5 s apart, the last at the stage end
    assert t[6:] == [5 * S + S // 10 * k for k in range(1, 11)]  # after the idle 2 s
    assert load.expected_requests() == len(t) == 16
    # floor(rate x duration) arrivals per stage, without drift: 0.1 req/s x 30 s is 3
    assert len(Load(rate=0.1, duration_s=30.0, arrival="constant").times(0)) == 3
    assert Load(rate=4, num_requests=3, arrival="constant").times(0).tolist() == [
        S // 4, S // 2, 3 * S // 4]


def test_poisson_stages_follow_each_rate():
    load = Load(stages=[Stage(20, 200), Stage(80, 100)])
    t = load.times(5) / S
    first, second = t[t <= 200], t[t > 200]
    assert len(first) == pytest.approx(4000, rel=0.05)
    assert len(second) == pytest.approx(8000, rel=0.05)
    gaps = np.diff(second)
    assert gaps.mean() == pytest.approx(1 / 80, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps
    assert (np.diff(t) >= 0).all() and t[-1] <= 300


def test_gamma_stage_has_the_cv_asked():
    t = Load(stages=[Stage(50, 200)], arrival="gamma", cv=3.0).times(1) / S
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)
    assert burstiness_of("gamma", 3.0) == pytest.approx(1 / 9)
    assert math.isinf(burstiness_of("constant", 1.0)) and burstiness_of("poisson", 7.0) == 1


def test_one_stage_is_the_same_load_as_its_rate_and_duration():
    for arrival, cv in (("poisson", 1.0), ("gamma", 2.0), ("constant", 1.0)):
        staged = Load(stages=[Stage(7.5, 40.0)], arrival=arrival, cv=cv).times(3)
        plain = Load(rate=7.5, duration_s=40.0, arrival=arrival, cv=cv).times(3)
        assert staged.tolist() == plain.tolist(), arrival


@pytest.mark.parametrize("arrival, cv", [("poisson", 1.0), ("gamma", 3.0), ("gamma", 0.5)])
@pytest.mark.parametrize("size", [{"num_requests": 60}, {"duration_s": 15.0}])
def test_synthetic_requests_equal_synthetic_for_rate_loads(arrival, cv, size):
    """The sweep's synthetic kind now goes through Load: the same requests, id for id."""
    b = burstiness_of(arrival, cv)
    old = synthetic(4.0, seed=3, burstiness=b, shared_prefix_len=32, num_prefix_groups=3,
                    vocab_size=128_256, **size)
    new = synthetic_requests(Load(rate=4.0, arrival=arrival, cv=cv, **size), "sharegpt",
                             "sharegpt", 3, 32, 3, 128_256)
    assert new == old


def test_staged_synthetic_requests():
    load = Load(stages=[Stage(5, 4), Stage(20, 2)], arrival="constant")
    reqs = synthetic_requests(load, input_len=16, output_len=4, seed=2)
    assert len(reqs) == 20 + 40
    assert [r.request_id for r in reqs] == [str(i) for i in range(60)]
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(16, 4)}
    with pytest.raises(WorkloadError, match="expected requests cannot fit the token budget 999"):
        synthetic_requests(load, input_len=16, output_len=4, max_total_tokens=999)


@pytest.mark.parametrize("kwargs, needle", [
    ({"rate": 1}, "exactly one of num_requests, duration_s, stages or times_ns"),
    ({"times_ns": [0, 5], "num_requests": 2}, "exactly one"),
    ({"times_ns": [0, 5], "rate": 2}, "drop rate"),
    ({"times_ns": [3, 2]}, r"times_ns\[1\]=2 is earlier than times_ns\[0\]=3"),
    ({"times_ns": [0, -1]}, r"times_ns\[1\] must be an int"),
    ({"times_ns": [0.5]}, r"times_ns\[0\] must be an int"),
    ({"rate": 1, "num_requests": 3, "stages": [Stage(1, 1)]}, "exactly one"),
    ({"rate": 2, "stages": [Stage(1, 1)]}, "each stage has its own rate"),
    ({"stages": [{"rate": 1}]}, r"stages\[0\]: a stage is"),
    ({"stages": [{"rate": 1, "duration_s": 1, "ramp": 2}]}, r"stages\[0\]"),
    ({"stages": [{"rate": -1, "duration_s": 1}]}, r"stages\[0\]: rate .* >= 0"),
    ({"stages": [{"rate": 1, "duration_s": 0}]}, r"stages\[0\]: duration_s .* > 0"),
    ({"stages": [{"rate": float("nan"), "duration_s": 1}]}, "must be a number"),
    ({"stages": [Stage(1, 1), {"rate": 1, "duration_s": float("inf")}]}, r"stages\[1\]"),
    ({"stages": [Stage(0, 5)]}, "every stage has rate 0"),
    ({"stages": [Stage(1, 2e10)]}, "shorten them"),
    ({"stages": ["fast"]}, r"stages\[0\]: expected"),
    ({"rate": 1, "num_requests": 3, "arrival": "uniform"}, "use one of"),
    ({"rate": 1, "num_requests": 3, "arrival": "gamma", "cv": 0}, "cv"),
    ({"rate": math.inf, "duration_s": 1.0}, "rate=inf needs num_requests"),
    ({"rate": 0, "num_requests": 3}, "rate"),
    ({"rate": 1, "num_requests": 0}, "num_requests"),
    ({"rate": 1, "num_requests": True}, "num_requests"),
])
def test_bad_loads_are_refused_by_name(kwargs, needle):
    with pytest.raises(WorkloadError, match=needle):
        Load(**kwargs)


def test_given_send_times_drive_any_generator():
    """A vllm bench serve result's send times, refilled with that run's dataset."""
    from workloads import vllm_random

    sent = [0, 0, 250_000_000, 900_000_000]
    load = Load(times_ns=sent)
    assert load.times(0).tolist() == sent and load.expected_requests() == 4
    reqs = vllm_random(load, input_len=32, output_len=4)
    assert [r.arrival_ns for r in reqs] == sent and {r.prompt_len for r in reqs} == {32}


def test_a_rate_too_low_for_int64_is_refused_not_wrapped():
    """1e-12 req/s: gaps of ~1e21 ns used to wrap around int64 into negative arrivals."""
    with pytest.raises(WorkloadError, match="beyond 1000000000000000000 ns"):
        Load(rate=1e-12, num_requests=4).times(0)
    assert Load(rate=1e-12, duration_s=5.0).times(0).tolist() == []
    far = Load(rate=1e-9, duration_s=1e9).times(0)
    assert (far > 0).all() and (far <= 10**18).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40).map(float), st.floats(0.05, 5)), min_size=1, max_size=4),
       st.sampled_from(["poisson", "gamma", "constant"]), st.integers(0, 2**32 - 1))
def test_stage_invariants(stages, arrival, seed):
    """Arrivals never go back, stay inside their stage, and constant stages hold exactly
    floor(rate x duration) each."""
    if not any(r > 0 for r, _ in stages):
        stages = [*stages, (1.0, 1.0)]
    load = Load(stages=[Stage(r, d) for r, d in stages], arrival=arrival, cv=2.0)
    t = load.times(seed)
    assert (np.diff(t) >= 0).all()
    edges = np.cumsum([0] + [int(d * S) for _, d in stages])
    for k, (rate, _) in enumerate(stages):
        inside = ((t > edges[k]) | (k == 0)) & (t <= edges[k + 1])  # (T_k, T_k + d_k]
        if rate == 0:
            assert not inside.any()
        if arrival == "constant" and rate > 0:
            horizon = int(stages[k][1] * S)  # floor(rate x duration), on the ns grid
            assert inside.sum() == sum(1 for j in range(1, 400) if j * S // rate <= horizon)
    assert t.size == 0 or t[-1] <= edges[-1]
