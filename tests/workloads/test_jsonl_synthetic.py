"""Workload JSONL reader/writer and the synthetic generator."""

from __future__ import annotations

import json
import math
import time
import tracemalloc
from array import array

import numpy as np
import pytest

from engine.specs import ConfigError
from engine.workload import RequestSpec
from workloads import LengthDist, WorkloadError, read_jsonl, synthetic, write_jsonl
from workloads.jsonl import PLACEHOLDER_ID_BASE
from workloads.limits import (
    MAX_ARRIVAL_NS,
    MAX_TOTAL_TOKENS,
    MIN_FILE_TOKEN_BUDGET,
    TOKENS_PER_FILE_BYTE,
    file_token_budget,
)

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
    assert isinstance(first.prompt_ids, array) and first.prompt_ids.typecode == "q"
    assert len(first.output_ids) == 531
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
    # Lazy placeholders: a range per prompt, consecutive across the file in file order.
    assert all(isinstance(r.prompt_ids, range) for r in reqs)
    by_file = sorted(reqs, key=lambda r: int(r.request_id))
    assert all(a.prompt_ids.stop == b.prompt_ids.start for a, b in zip(by_file, by_file[1:], strict=False))


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
    assert [(r.request_id, r.arrival_ns, r.output_len) for r in back] == [
        (r.request_id, r.arrival_ns, r.output_len) for r in reqs
    ]
    assert [tuple(r.prompt_ids) for r in back] == [(1, 2, 3), (4,)]
    assert [r.output_ids and tuple(r.output_ids) for r in back] == [(7, 8), None]
    # Placeholder prompts (ranges) are written as their ids and read back as the same ids.
    lazy = read_jsonl(_write(tmp_path, ['{"input_toks": 4, "output_toks": 1, "arrival_time_ns": 0}']))
    again = read_jsonl(write_jsonl(tmp_path / "again.jsonl", lazy))
    assert tuple(again[0].prompt_ids) == tuple(lazy[0].prompt_ids)
    # New count-only lines next to written-back placeholder ids get ids above them.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text((tmp_path / "again.jsonl").read_text() + _line(input_toks=4) + "\n")
    a, b = read_jsonl(mixed)
    assert b.prompt_ids.start == a.prompt_ids[-1] + 1


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
    prefixes = {tuple(r.prompt_ids[:48]) for r in reqs}
    assert len(prefixes) == 4
    suffixes = {tuple(r.prompt_ids[48:]) for r in reqs}
    assert len(suffixes) == 200  # the rest is each request's own
    short = synthetic(10, 5, input_len=10, output_len=1, shared_prefix_len=48, num_prefix_groups=1)
    assert len({tuple(r.prompt_ids) for r in short}) == 1  # shorter than the prefix: all prefix
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
        ({"rate": float("nan"), "num_requests": 3}, "rate"),
        ({"rate": "10", "num_requests": 3}, "rate"),
        ({"rate": 1, "duration_s": float("inf")}, "duration_s must be finite"),
        ({"rate": 1, "num_requests": 3, "burstiness": float("inf")}, "burstiness"),
        ({"rate": 1, "num_requests": 3, "seed": -1}, r"seed must be an int in \[0, 4294967295\]"),
        ({"rate": 1, "num_requests": 3, "seed": 2**32}, "seed"),
        ({"rate": 1, "num_requests": 3, "vocab_size": 2**62 + 1}, "vocab_size"),
        ({"rate": 1, "num_requests": 2.5}, "num_requests"),
        ({"rate": 1, "num_requests": 10**12}, "cannot fit the token budget"),
        ({"rate": 1e9, "duration_s": 1e9}, "cannot fit the token budget"),
        (
            {"rate": 1, "num_requests": 3, "shared_prefix_len": 10**6, "num_prefix_groups": 10**6},
            "prefix groups",
        ),
        (
            {"rate": 1, "num_requests": 3, "input_len": {"kind": "lognormal", "mean": float("nan")}},
            "'mean' must be a finite number",
        ),
        (
            {"rate": 1, "num_requests": 3, "input_len": {"kind": "lognormal", "mean": 1e30}},
            "above 10000000",
        ),
        (
            {"rate": 1, "num_requests": 200, "input_len": {"kind": "lognormal", "mean": 5e6,
                                                            "sigma": 3.0}},
            "set 'high' to clip it",
        ),
        ({"rate": 1, "num_requests": 3, "input_len": {"kind": "fixed", "value": 1.5}}, "integer"),
        ({"rate": 1, "num_requests": 3, "input_len": 10**8}, "above 10000000"),
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


# ---------------------------------------------------------------------------------------
# Range checks and the token budget (issue 12: a tiny file must not exhaust memory)


def _write_bytes(tmp_path, data: bytes):
    p = tmp_path / "w.jsonl"
    p.write_bytes(GOOD.encode() + b"\n" + data + b"\n")
    return p


def _line(**fields) -> str:
    row = {"input_toks": 3, "output_toks": 2, "arrival_time_ns": 5, **fields}
    return json.dumps(row)


@pytest.mark.parametrize(
    "line, needle",
    [
        ('{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 1e30}',
         f"'arrival_time_ns' is 1e+30, above {MAX_ARRIVAL_NS}"),
        (_line(arrival_time_ns=10**30), f"'arrival_time_ns' is {10**30}, above {MAX_ARRIVAL_NS}"),
        (_line(arrival_time_ns=MAX_ARRIVAL_NS + 1), "'arrival_time_ns' is"),
        ('{"input_toks": 3, "output_toks": 2, "arrival_time_ns": Infinity}',
         "'arrival_time_ns' must be an integer, got inf"),
        ('{"input_toks": 3, "output_toks": 2, "arrival_time_ns": NaN}',
         "'arrival_time_ns' must be an integer, got nan"),
        ('{"input_toks": 1e30, "output_toks": 2, "arrival_time_ns": 5}',
         "'input_toks' is 1e+30, above 10000000"),
        (_line(output_toks=10**12), "'output_toks' is 1000000000000, above 10000000"),
        (_line(output_toks=-3), "'output_toks' must be >= 1, got -3"),
        (_line(output_toks=-1e30), "'output_toks' must be >= 1, got -1e+30"),
        (_line(input_tok_ids=[1, -2, 3]), "'input_tok_ids' holds the id -2, outside [0,"),
        (_line(input_tok_ids=[1, 2, 2**62]), f"'input_tok_ids' holds the id {2**62}, outside"),
        (_line(output_tok_ids=[5, 10**30]), f"'output_tok_ids' holds the id {10**30}, outside"),
        (_line(output_tok_ids=[5, True]), "'output_tok_ids' holds a non-integer id True"),
        (_line(output_tok_ids=[5, 6.0]), "'output_tok_ids' holds a non-integer id 6.0"),
        (_line(input_tok_ids="123"), "'input_tok_ids' must be a list of ints"),
        ('{"input_toks": 3, "output_toks": 2, "arrival_time_ns": ' + "9" * 5000 + "}",
         "cannot parse the line"),
        ("[" * 5000 + "]" * 5000, "cannot parse the line"),
    ],
)
def test_out_of_range_fields_name_file_line_and_field(tmp_path, line, needle):
    p = _write(tmp_path, [GOOD, line])
    with pytest.raises(WorkloadError) as info:
        read_jsonl(p)
    msg = str(info.value)
    assert f"{p}:2: " in msg, msg
    assert needle in msg, msg


def test_non_utf8_line_names_file_and_line(tmp_path):
    p = _write_bytes(tmp_path, b'{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 5, "x": "\xff"}')
    with pytest.raises(WorkloadError, match=rf"{p}:2: cannot parse the line \(UnicodeDecodeError"):
        read_jsonl(p)


def test_unreadable_path_is_a_workload_error(tmp_path):
    with pytest.raises(WorkloadError, match=rf"{tmp_path}: cannot read the workload file"):
        read_jsonl(tmp_path)  # a directory


def test_max_model_len_checked_at_read_time(tmp_path):
    p = _write(tmp_path, [GOOD, _line(input_toks=500, output_toks=12), _line(input_toks=500,
                                                                             output_toks=13)])
    assert len(read_jsonl(p)) == 3  # unchecked without max_model_len (the engine checks it)
    with pytest.raises(WorkloadError) as info:
        read_jsonl(p, max_model_len=512)
    msg = str(info.value)
    assert f"{p}:3: fields 'input_toks' + 'output_toks' = 500 + 13 exceed max_model_len=512" in msg
    assert "raise max_model_len" in msg
    assert len(read_jsonl(p, max_model_len=513)) == 3
    assert len(read_jsonl(p, limit=2, max_model_len=512)) == 2  # 500 + 12 fits exactly
    for bad in (0, 1, 2.5, True, "512"):
        with pytest.raises(WorkloadError, match="max_model_len must be None or an int >= 2"):
            read_jsonl(p, max_model_len=bad)


def test_file_token_budget_rule():
    assert file_token_budget(0) == MIN_FILE_TOKEN_BUDGET
    assert file_token_budget(3072) == 3072 * TOKENS_PER_FILE_BYTE
    assert file_token_budget(10**12) == MAX_TOTAL_TOKENS
    # Every shipped trace fits its budget with room (the densest declares 166 tokens/byte).
    assert file_token_budget(44_843) > 3 * 7_441_405


def test_token_budget_refuses_by_file_and_line(tmp_path):
    rows = [_line(input_toks=400_000, output_toks=1, arrival_time_ns=i) for i in range(3)]
    p = _write(tmp_path, rows)
    budget = file_token_budget(p.stat().st_size)
    assert budget == MIN_FILE_TOKEN_BUDGET  # a tiny file gets the floor
    with pytest.raises(WorkloadError) as info:
        read_jsonl(p)
    msg = str(info.value)
    assert f"{p}:3: fields 'input_toks' + 'output_toks' bring the file's total to 1200003" in msg
    assert f"above its budget of {budget}" in msg and "max_total_tokens=N" in msg
    assert len(read_jsonl(p, limit=2)) == 2  # only kept lines count
    assert len(read_jsonl(p, max_total_tokens=1_200_003)) == 3
    with pytest.raises(WorkloadError, match=rf"{p}:1: .* above its budget of 10 \(the max_total"):
        read_jsonl(p, max_total_tokens=10)
    with pytest.raises(WorkloadError, match="max_total_tokens must be None or an int >= 2"):
        read_jsonl(p, max_total_tokens=-1)


def test_huge_counts_are_refused_without_allocating(tmp_path):
    """One 64-byte line asking for 10M tokens used to take 497 MB RSS; now it is refused
    before any id exists (measured with tracemalloc, not time)."""
    p = tmp_path / "w.jsonl"
    p.write_text("".join(
        f'{{"input_toks": 9999999, "output_toks": 9999999, "arrival_time_ns": {i}}}\n'
        for i in range(3)
    ))
    tracemalloc.start()
    try:
        with pytest.raises(WorkloadError, match=rf"{p}:1: .*above its budget"):
            read_jsonl(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"refusing a tiny file allocated {peak / 2**20:.1f} MiB"


def _dense_trace(tmp_path, size: int, extra_tokens: int = 0):
    """A count-only trace of at most ``size`` bytes declaring its whole budget (+ extra)."""
    p = tmp_path / "dense.jsonl"

    def text(n: int, total: int) -> str:
        per = total // n - 1
        counts = [per] * (n - 1) + [total - (n - 1) * (per + 1) - 1]
        return "".join(
            json.dumps({"input_toks": c, "output_toks": 1, "arrival_time_ns": i},
                       separators=(",", ":")) + "\n"
            for i, c in enumerate(counts)
        )

    n = 1
    while len(text(n + 1, size * TOKENS_PER_FILE_BYTE)) <= size:
        n += 1
    budget = file_token_budget(len(text(n, size * TOKENS_PER_FILE_BYTE)))
    p.write_text(text(n, budget + extra_tokens))
    assert file_token_budget(p.stat().st_size) == budget
    return p, budget


def test_3kb_trace_stays_within_its_budget(tmp_path):
    """Issue 12: a 3 KB trace cannot make a job use more than ~100 MB. The reader itself
    allocates almost nothing (placeholder ids are ranges); the whole replay of a 3 KB file
    declaring its full budget stays under 100 MiB of Python allocations."""
    from engine import EngineConfig, simulate
    from engine.specs import HardwareSpec
    from profiles.catalog import load_model

    p, budget = _dense_trace(tmp_path, 3072, extra_tokens=1)
    assert 2900 < p.stat().st_size <= 3200
    with pytest.raises(WorkloadError, match=rf"{p}:\d+: .*above its budget of {budget}"):
        read_jsonl(p)
    p, budget = _dense_trace(tmp_path, 3072)

    class Flat:
        def iteration_ns(self, shape) -> int:
            return 1_000_000 + 10 * shape.total_tokens

    model = load_model("meta-llama/Llama-3.1-8B")
    hw = HardwareSpec("card", 96.0, 1000.0, 100.0, 200.0)
    tracemalloc.start()
    try:
        reqs = read_jsonl(p)
        read_peak = tracemalloc.get_traced_memory()[1]
        result = simulate(model, hw, EngineConfig(step_overhead_us=0.0), reqs, Flat())
        run_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(r.prompt_len + r.output_len for r in reqs) == budget
    assert len(result.requests) == len(reqs)
    assert read_peak < 1 << 20, f"reading {p.stat().st_size} bytes took {read_peak / 2**20:.1f} MiB"
    assert run_peak < 100 << 20, f"replaying a 3 KB trace took {run_peak / 2**20:.1f} MiB"


def test_synthetic_budget_and_max_model_len():
    kw = {"rate": 10, "num_requests": 100, "seed": 1, "input_len": 300, "output_len": 50}
    assert len(synthetic(**kw, max_total_tokens=35_000)) == 100
    with pytest.raises(WorkloadError, match="num_requests=100 cannot fit the token budget 34999"):
        synthetic(**kw, max_total_tokens=34_999)  # checked before any arrival is drawn
    spread = {**kw, "input_len": {"kind": "uniform", "low": 100, "high": 500}}
    total = sum(r.prompt_len + r.output_len for r in synthetic(**spread))
    assert len(synthetic(**spread, max_total_tokens=total)) == 100
    with pytest.raises(WorkloadError, match=f"draw {total} tokens .* above the token budget"):
        synthetic(**spread, max_total_tokens=total - 1)  # checked before any id is drawn
    assert len(synthetic(**kw, max_model_len=350)) == 100
    with pytest.raises(WorkloadError) as info:
        synthetic(**{**kw, "input_len": {"kind": "uniform", "low": 250, "high": 350}},
                  max_model_len=350)
    msg = str(info.value)
    assert "output tokens > max_model_len=350" in msg and "clip input_len / output_len" in msg
    assert all(isinstance(r.prompt_ids, array) for r in synthetic(**kw))
    # Integral floats from a config are accepted as ints.
    assert LengthDist("uniform", low=2.0, high=3.0).high == 3


def test_synthetic_placeholder_ids_keep_arrivals_and_lengths():
    rand = synthetic(5.0, num_requests=300, seed=4, id_prefix="r")
    lean = synthetic(5.0, num_requests=300, seed=4, id_prefix="r", placeholder_ids=True)
    assert [(s.request_id, s.arrival_ns, s.prompt_len, s.output_len) for s in lean] == [
        (s.request_id, s.arrival_ns, s.prompt_len, s.output_len) for s in rand]
    assert all(isinstance(s.prompt_ids, range) for s in lean)
    ids = [i for s in lean for i in (s.prompt_ids.start, s.prompt_ids.stop - 1)]
    assert ids == sorted(ids) and ids[0] == PLACEHOLDER_ID_BASE  # unique, no shared prefix
    with pytest.raises(WorkloadError, match="placeholder_ids share no prefix"):
        synthetic(5.0, num_requests=3, shared_prefix_len=8, placeholder_ids=True)
