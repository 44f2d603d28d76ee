"""Workload JSONL reader/writer and the synthetic generator."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from engine.specs import ConfigError
from engine.workload import RequestSpec
from workloads import LengthDist, WorkloadError, read_jsonl, synthetic, write_jsonl
from workloads.jsonl import PLACEHOLDER_ID_BASE

SHAREGPT = "sharegpt-llama-3.1-8b-300-sps10.jsonl"


def _wl(shared_data, name):
    return shared_data / "llmservingsim" / "workloads" / name


# ---------------------------------------------------------------------------------------
# Reading the shared files


def test_read_sharegpt_fast_and_complete(shared_data):
    path = _wl(shared_data, SHAREGPT)
    read_jsonl(path)  # warm the file cache
    t0 = time.perf_counter()
    reqs = read_jsonl(path)
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, f"300-request file took {elapsed:.3f} s"
    assert len(reqs) == 300
    first = reqs[0]
    assert first.request_id == "0"
    assert (first.prompt_len, first.output_len, first.arrival_ns) == (2358, 531, 46_926_808)
    assert isinstance(first.prompt_ids, tuple) and len(first.output_ids) == 531
    assert sum(r.prompt_len for r in reqs) == 257_239
    assert sum(r.output_len for r in reqs) == 195_753
    assert reqs[-1].arrival_ns == 29_183_763_203


def test_read_limit_and_prefix(shared_data):
    reqs = read_jsonl(_wl(shared_data, SHAREGPT), limit=10, id_prefix="bench-")
    assert [r.request_id for r in reqs] == [f"bench-{i}" for i in range(10)]


def test_example_trace_has_shared_prefixes(shared_data):
    reqs = read_jsonl(_wl(shared_data, "example_trace.jsonl"))
    assert len(reqs) == 10
    assert [r.prompt_len for r in reqs][:2] == [10, 22]
    assert reqs[1].prompt_ids[:7] == reqs[0].prompt_ids[:7]  # deliberate shared prefix
    assert reqs[6].prompt_ids[:10] == reqs[5].prompt_ids[:10]


def test_mixed_workload_without_ids_gets_unique_placeholders(shared_data):
    reqs = read_jsonl(_wl(shared_data, "workload_me2_01_mixed.jsonl"))
    assert len(reqs) == 608
    assert all(r.output_ids is None for r in reqs)
    firsts = {r.prompt_ids[0] for r in reqs}
    assert len(firsts) == 608  # no two prompts share even their first token
    assert min(firsts) >= PLACEHOLDER_ID_BASE
    assert reqs[0].prompt_len == 27369


# ---------------------------------------------------------------------------------------
# Validation


def _write(tmp_path, lines):
    p = tmp_path / "w.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


GOOD = '{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 5, "input_tok_ids": [1,2,3]}'


@pytest.mark.parametrize(
    "line, needle",
    [
        ('{"output_toks": 2, "arrival_time_ns": 5}', "'input_toks' is missing"),
        ('{"input_toks": "3", "output_toks": 2, "arrival_time_ns": 5}', "'input_toks' must be"),
        ('{"input_toks": 3, "output_toks": 2.5, "arrival_time_ns": 5}', "'output_toks' must be"),
        (
            '{"input_toks": 3, "output_toks": 2, "arrival_time_ns": -1}',
            "'arrival_time_ns' must be >= 0",
        ),
        ('{"input_toks": 0, "output_toks": 2, "arrival_time_ns": 1}', "'input_toks' must be >= 1"),
        (
            '{"input_toks": true, "output_toks": 2, "arrival_time_ns": 1}',
            "'input_toks' must be an integer",
        ),
        (
            '{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 5, "input_tok_ids": [1,2]}',
            "has 2 ids but input_toks is 3",
        ),
        (
            '{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 5, "input_tok_ids": [1,"a",3]}',
            "non-integer id",
        ),
        (
            '{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 5, "output_tok_ids": [1]}',
            "'output_tok_ids' has 1 ids but output_toks is 2",
        ),
        ('{"input_toks": 3, "output_toks": 2, "arrival_t', "invalid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"arrival_time_ns": 0, "sub_requests": []}', "sub_requests"),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path, line, needle):
    p = _write(tmp_path, [GOOD, line])
    with pytest.raises(WorkloadError) as info:
        read_jsonl(p)
    msg = str(info.value)
    assert needle in msg
    assert f"{p}:2" in msg
    assert isinstance(info.value, ConfigError)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(WorkloadError, match="not found"):
        read_jsonl(tmp_path / "nope.jsonl")
    empty = _write(tmp_path, ["", "  "])
    with pytest.raises(WorkloadError, match="no requests"):
        read_jsonl(empty)
    with pytest.raises(WorkloadError, match="limit"):
        read_jsonl(_write(tmp_path, [GOOD]), limit=0)


def test_sorted_stably_by_arrival_and_integral_floats(tmp_path):
    rows = [
        {"input_toks": 1, "output_toks": 1, "arrival_time_ns": 30},
        {"input_toks": 2, "output_toks": 1, "arrival_time_ns": 10.0},
        {"input_toks": 3, "output_toks": 1, "arrival_time_ns": 30},
        {"input_toks": 4, "output_toks": 1, "arrival_time_ns": 10, "extra": "ignored"},
    ]
    p = _write(tmp_path, [json.dumps(r) for r in rows] + [""])
    reqs = read_jsonl(p)
    assert [r.request_id for r in reqs] == ["1", "3", "0", "2"]
    assert all(type(r.arrival_ns) is int for r in reqs)


def test_write_read_round_trip(tmp_path):
    reqs = [
        RequestSpec("0", 5, (1, 2, 3), 2, (7, 8)),
        RequestSpec("1", 9, (4,), 3, None),
    ]
    p = write_jsonl(tmp_path / "sub" / "out.jsonl", reqs)
    back = read_jsonl(p)
    assert back == reqs


# ---------------------------------------------------------------------------------------
# Synthetic


def test_synthetic_reproduces_reference_arrivals(shared_data):
    ref = read_jsonl(_wl(shared_data, SHAREGPT))
    syn = synthetic(rate=10, num_requests=300, seed=42)
    assert [r.arrival_ns for r in syn] == [r.arrival_ns for r in ref]


def test_synthetic_deterministic_and_seed_sensitive():
    a = synthetic(5, 50, seed=3, shared_prefix_len=32, num_prefix_groups=3)
    b = synthetic(5, 50, seed=3, shared_prefix_len=32, num_prefix_groups=3)
    c = synthetic(5, 50, seed=4, shared_prefix_len=32, num_prefix_groups=3)
    assert a == b
    assert a != c
    assert all(r.arrival_ns > 0 for r in a)
    arr = [r.arrival_ns for r in a]
    assert arr == sorted(arr)


def test_synthetic_rate_and_burstiness():
    n = 4000
    for burst in (1.0, 0.25, 4.0):
        reqs = synthetic(
            rate=20, num_requests=n, seed=1, burstiness=burst, input_len=8, output_len=8
        )
        gaps = np.diff([0] + [r.arrival_ns for r in reqs]) / 1e9
        assert gaps.mean() == pytest.approx(1 / 20, rel=0.08)
        cv = gaps.std() / gaps.mean()
        assert cv == pytest.approx(1 / math.sqrt(burst), rel=0.1)


def test_synthetic_duration_and_inf_rate():
    reqs = synthetic(rate=50, duration_s=4.0, seed=2, input_len=4, output_len=4)
    assert all(r.arrival_ns <= 4 * 10**9 for r in reqs)
    assert 150 < len(reqs) < 250
    burst = synthetic(rate=math.inf, num_requests=7, input_len=4, output_len=4)
    assert {r.arrival_ns for r in burst} == {0}
    with pytest.raises(WorkloadError, match="num_requests"):
        synthetic(rate=math.inf, duration_s=1)


def test_length_distributions():
    fixed = synthetic(10, 20, input_len=17, output_len={"dist": "fixed", "value": 3})
    assert {(r.prompt_len, r.output_len) for r in fixed} == {(17, 3)}
    uni = synthetic(10, 500, input_len={"kind": "uniform", "low": 5, "high": 9}, output_len=1)
    assert {r.prompt_len for r in uni} == set(range(5, 10))
    logn = synthetic(
        10, 5000, seed=7, input_len={"kind": "lognormal", "mean": 400, "sigma": 0.5}, output_len=1
    )
    lens = np.array([r.prompt_len for r in logn])
    assert lens.mean() == pytest.approx(400, rel=0.05)
    assert np.log(lens).std() == pytest.approx(0.5, rel=0.05)
    clipped = synthetic(
        10,
        2000,
        input_len={"kind": "lognormal", "mean": 400, "sigma": 1.0, "low": 100, "high": 800},
        output_len=1,
    )
    assert min(r.prompt_len for r in clipped) == 100
    assert max(r.prompt_len for r in clipped) == 800


def test_sharegpt_fit_resembles_shared_workloads(shared_data):
    ref = read_jsonl(_wl(shared_data, SHAREGPT))
    syn = synthetic(10, 3000, seed=5)  # sharegpt lengths by default
    for attr in ("prompt_len", "output_len"):
        r = np.array([getattr(x, attr) for x in ref])
        s = np.array([getattr(x, attr) for x in syn])
        assert np.median(s) == pytest.approx(np.median(r), rel=0.08), attr
        assert s.mean() == pytest.approx(r.mean(), rel=0.08), attr
    assert min(x.output_len for x in syn) >= 512


def test_shared_prefix_groups():
    reqs = synthetic(
        10,
        200,
        seed=9,
        input_len=64,
        output_len=4,
        shared_prefix_len=48,
        num_prefix_groups=4,
        vocab_size=50_000,
    )
    prefixes = {r.prompt_ids[:48] for r in reqs}
    assert len(prefixes) == 4
    suffixes = {r.prompt_ids[48:] for r in reqs}
    assert len(suffixes) == 200  # the rest is each request's own
    short = synthetic(10, 5, input_len=10, output_len=1, shared_prefix_len=48, num_prefix_groups=1)
    assert len({r.prompt_ids for r in short}) == 1  # prompt shorter than the prefix: all prefix
    assert all(0 <= t < 50_000 for r in reqs for t in r.prompt_ids)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"rate": 0, "num_requests": 3}, "rate"),
        ({"rate": 1}, "exactly one"),
        ({"rate": 1, "num_requests": 3, "duration_s": 1}, "exactly one"),
        ({"rate": 1, "num_requests": 0}, "num_requests"),
        ({"rate": 1, "num_requests": 3, "burstiness": 0}, "burstiness"),
        ({"rate": 1, "num_requests": 3, "input_len": "zipf"}, "zipf"),
        (
            {"rate": 1, "num_requests": 3, "input_len": {"kind": "uniform", "low": 5, "high": 2}},
            "high >= low",
        ),
        (
            {"rate": 1, "num_requests": 3, "input_len": {"kind": "lognormal", "mean": -1}},
            "mean > 0",
        ),
        ({"rate": 1, "num_requests": 3, "output_len": {"kind": "fixed", "valu": 3}}, "valu"),
        ({"rate": 1, "num_requests": 3, "shared_prefix_len": -1}, "shared_prefix_len"),
        ({"rate": 1e-6, "duration_s": 0.001}, "no arrival"),
    ],
)
def test_synthetic_bad_args(kwargs, needle):
    with pytest.raises(WorkloadError, match=needle):
        synthetic(**kwargs)


def test_length_dist_parse_passthrough():
    d = LengthDist("uniform", low=2, high=3)
    assert LengthDist.parse(d, "x") is d
    with pytest.raises(WorkloadError):
        LengthDist.parse(True, "x")


def test_streams_independent():
    a = synthetic(10, 100, seed=11, input_len="sharegpt", output_len="sharegpt")
    b = synthetic(10, 100, seed=11, input_len=64, output_len="sharegpt")
    assert [r.output_len for r in a] == [r.output_len for r in b]
    assert [r.arrival_ns for r in a] == [r.arrival_ns for r in b]
    assert [r.prompt_len for r in a] != [r.prompt_len for r in b]


def test_absurd_token_count_is_refused_before_allocating(tmp_path):
    from workloads import read_jsonl
    from workloads.errors import WorkloadError

    path = tmp_path / "w.jsonl"
    path.write_text('{"input_toks": 1000000000000, "output_toks": 2, "arrival_time_ns": 0}\n')
    with pytest.raises(WorkloadError, match=r"w.jsonl:1: field 'input_toks' is 1000000000000"):
        read_jsonl(path)
