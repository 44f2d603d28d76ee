"""Hostile workload files and request lists: a clear error naming file, line and field, or a
run in which every request is served exactly as written.

A valid JSONL trace is generated, then one line is damaged (truncated, a field deleted or
given a wrong type, a negative or huge count or arrival, a zero-length prompt, a prompt
longer than the model's context, an id list of the wrong length or with an out-of-range id,
arrivals out of order). ``read_jsonl`` (half the time told ``max_model_len``) must raise
``WorkloadError`` citing ``<file>:<line>`` and the field, or return requests that
``engine.simulate`` either refuses with a ``ConfigError`` naming the request and the limit
or serves completely.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EngineConfig, RequestSpec, simulate
from engine.batch import BatchShape
from engine.specs import ConfigError, HardwareSpec
from profiles.catalog import load_model
from workloads import WorkloadError, read_jsonl

MODEL = load_model("meta-llama/Llama-3.1-8B")
HW = HardwareSpec("card", 96.0, 1000.0, 100.0, 200.0)
MAX_LEN = 512
CFG = EngineConfig(max_model_len=MAX_LEN, step_overhead_us=0.0, max_num_batched_tokens=512)
FIELDS = ("input_toks", "output_toks", "arrival_time_ns", "input_tok_ids", "output_tok_ids")
BAD_VALUES = ["x", None, True, 1.5, -1, 0, [], {}, [1, "a"], 10**12, "12", float("inf"),
              float("nan"), 1e30, 10**30, -1e30, 2**63]
BAD_IDS = [-1, 2**62, 10**30, -(2**63), 1.0, True, None, "7"]
COUNTS = {"fuzzed": 0, "refused_by_reader": 0, "refused_by_engine": 0, "served": 0}


class Flat:
    """1 ms + 10 us per scheduled token."""

    def iteration_ns(self, shape: BatchShape) -> int:
        return 1_000_000 + 10_000 * shape.total_tokens


def _line(i: int, n_in: int, n_out: int, arrival: int, ids: bool, out_ids: bool) -> dict:
    row: dict = {"input_toks": n_in, "output_toks": n_out, "arrival_time_ns": arrival}
    if ids:
        row["input_tok_ids"] = list(range(1000 * i, 1000 * i + n_in))
    if out_ids:
        row["output_tok_ids"] = list(range(7, 7 + n_out))
    return row


@st.composite
def traces(draw):
    n = draw(st.integers(1, 8))
    t = 0
    rows = []
    for i in range(n):
        t += draw(st.integers(0, 50_000_000))
        rows.append(_line(i, draw(st.integers(1, 200)), draw(st.integers(1, 40)), t,
                          draw(st.booleans()), draw(st.booleans())))
    victim = draw(st.integers(0, n - 1))
    kind = draw(st.sampled_from(
        ["truncate", "delete", "retype", "zero_prompt", "too_long", "ids_len", "unsorted",
         "negative_arrival", "not_object", "agentic", "blank", "bad_id"]))
    lines = [json.dumps(r) for r in rows]
    row = dict(rows[victim])
    field = draw(st.sampled_from(FIELDS))
    if kind == "truncate":
        text = lines[victim]
        lines[victim] = text[: draw(st.integers(1, len(text) - 1))]
    elif kind == "delete":
        row.pop(field, None)
        lines[victim] = json.dumps(row)
    elif kind == "retype":
        row[field] = draw(st.sampled_from(BAD_VALUES))
        lines[victim] = json.dumps(row)
    elif kind == "zero_prompt":
        row["input_toks"] = 0
        row["input_tok_ids"] = []
        lines[victim] = json.dumps(row)
    elif kind == "too_long":
        row["input_toks"] = MAX_LEN + draw(st.integers(0, 2000))
        row.pop("input_tok_ids", None)
        lines[victim] = json.dumps(row)
    elif kind == "ids_len":
        row["input_tok_ids"] = list(range(row["input_toks"] + draw(st.sampled_from([-1, 1, 5]))))
        lines[victim] = json.dumps(row)
    elif kind == "unsorted":
        row["arrival_time_ns"] = draw(st.integers(0, 10**9))
        lines[victim] = json.dumps(row)
    elif kind == "negative_arrival":
        row["arrival_time_ns"] = -draw(st.integers(1, 10**9))
        lines[victim] = json.dumps(row)
    elif kind == "not_object":
        lines[victim] = json.dumps(draw(st.sampled_from([[1, 2], 3, "text", None])))
    elif kind == "agentic":
        row["sub_requests"] = [{"input_toks": 3}]
        lines[victim] = json.dumps(row)
    elif kind == "bad_id":
        field = draw(st.sampled_from(["input_tok_ids", "output_tok_ids"]))
        count = row["input_toks" if field == "input_tok_ids" else "output_toks"]
        ids = list(range(3, 3 + count))
        ids[draw(st.integers(0, count - 1))] = draw(st.sampled_from(BAD_IDS))
        row[field] = ids
        lines[victim] = json.dumps(row)
    else:  # blank line: skipped, per the format
        lines[victim] = "   "
    return kind, field, victim + 1, "\n".join(lines) + "\n", draw(st.booleans())


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(traces())
def test_damaged_trace_is_refused_with_file_line_field_or_served(tmp_path, case):
    kind, field, lineno, text, tell_len = case
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    COUNTS["fuzzed"] += 1
    try:
        requests = read_jsonl(path, max_model_len=MAX_LEN if tell_len else None)
    except WorkloadError as err:
        msg = str(err)
        COUNTS["refused_by_reader"] += 1
        if "no requests found" in msg:  # the only request line was blanked
            assert f"{path}:" in msg or str(path) in msg
            return
        assert f"{path}:{lineno}:" in msg, (kind, field, msg)
        if kind in ("delete", "retype", "bad_id"):
            assert f"'{field}'" in msg, (kind, field, msg)
        if kind == "too_long" and tell_len:
            assert f"max_model_len={MAX_LEN}" in msg, msg
        return
    assert kind in ("delete", "retype", "unsorted", "too_long", "blank"), (kind, field, text)
    assert not (kind == "too_long" and tell_len), "an over-long line passed the reader"
    arrivals = [r.arrival_ns for r in requests]
    assert arrivals == sorted(arrivals)  # documented: stably sorted by arrival
    assert all(r.prompt_len >= 1 and r.output_len >= 1 for r in requests)
    try:
        result = simulate(MODEL, HW, CFG, requests, Flat())
    except ConfigError as err:
        COUNTS["refused_by_engine"] += 1
        assert "max_model_len" in str(err) and "workload request" in str(err), str(err)
        assert any(r.prompt_len + r.output_len > MAX_LEN for r in requests)
        return
    COUNTS["served"] += 1
    frame = result.requests
    assert len(frame) == len(requests)
    want = {r.request_id: r.output_len for r in requests}
    assert dict(zip(frame.request_id, frame.output_len, strict=True)) == want


@st.composite
def request_lists(draw):
    n = draw(st.integers(1, 6))
    out = []
    t = 0
    for i in range(n):
        t += draw(st.integers(-5_000_000, 20_000_000))
        plen = draw(st.integers(0, 700))
        out.append(RequestSpec(f"r{i}", t, tuple(range(i * 1000, i * 1000 + plen)),
                               draw(st.integers(-1, 30))))
    return out


@settings(max_examples=300, deadline=None)
@given(request_lists())
def test_engine_edge_refuses_bad_request_lists_by_index(workload):
    """Library callers skip the reader: ``simulate`` itself refuses negative or unsorted
    arrivals, empty prompts, non-positive outputs and over-long requests, naming the request."""
    problems = []
    prev = None
    for i, r in enumerate(workload):
        if (r.prompt_len < 1 or r.output_len < 1 or r.prompt_len + r.output_len > MAX_LEN
                or r.arrival_ns < 0 or (prev is not None and r.arrival_ns < prev)):
            problems.append(i)
        prev = r.arrival_ns
    try:
        result = simulate(MODEL, HW, CFG, workload, Flat())
    except ConfigError as err:
        assert problems, f"refused a valid workload: {err}"
        first = workload[problems[0]]
        assert f"workload request {problems[0]} ({first.request_id!r})" in str(err), str(err)
        return
    assert not problems, f"served a bad workload (requests {problems})"
    assert list(result.requests.output_len) == [r.output_len for r in workload]


def test_fuzz_counts_cover_both_outcomes():
    if not COUNTS["fuzzed"]:
        pytest.skip("runs only after the fuzz test in the same session")
    assert COUNTS["refused_by_reader"] and COUNTS["served"], COUNTS


def test_missing_trace_file_names_the_path(tmp_path: Path):
    with pytest.raises(WorkloadError, match="workload file not found"):
        read_jsonl(tmp_path / "nope.jsonl")
