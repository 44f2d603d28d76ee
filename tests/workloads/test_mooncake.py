"""Mooncake / FAST'25 traces (workloads.mooncake.read_mooncake): hash_ids become token-id
blocks, so the engine's prefix cache sees the sharing the trace records."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import EngineConfig, simulate
from engine.batch import BatchShape
from engine.specs import HardwareSpec
from profiles.catalog import load_model
from workloads import Replay, WorkloadError, read_mooncake

MS = 1_000_000


def _write(tmp_path, rows, name="conversation_trace.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


# The published layout (FAST25-release/traces/*.jsonl): ms timestamps, one hash id per
# 512-token block, the last block partial.
ROWS = [
    {"timestamp": 0, "input_length": 1200, "output_length": 8, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 3]},
    {"timestamp": 3000, "input_length": 700, "output_length": 6, "hash_ids": [0, 4]},
    {"timestamp": 5999, "input_length": 300, "output_length": 2, "hash_ids": [5]},
]


def test_reads_the_published_layout(tmp_path):
    reqs = read_mooncake(_write(tmp_path, ROWS))
    assert [r.arrival_ns for r in reqs] == [0, 0, 3000 * MS, 5999 * MS]
    assert [(r.prompt_len, r.output_len) for r in reqs] == [
        (1200, 8), (1100, 4), (700, 6), (300, 2)]
    a, b, c, d = (list(r.prompt_ids) for r in reqs)
    assert a[:1024] == b[:1024] == list(range(1024))  # hash ids 0, 1: the same two blocks
    assert a[1024:] == list(range(2 * 512, 2 * 512 + 176))  # block 2, partial
    assert b[1024:] == list(range(3 * 512, 3 * 512 + 76))
    assert c[:512] == a[:512] and c[512] == 4 * 512  # shares block 0 only
    assert not set(d) & (set(a) | set(b) | set(c))  # hash 5 shares nothing


class Flat:
    """1 ms + 10 us per scheduled token."""

    def iteration_ns(self, shape: BatchShape) -> int:
        return 1_000_000 + 10_000 * shape.total_tokens


def test_hash_sharing_shows_as_prefix_cache_hits(tmp_path):
    """vLLM's hits over queried tokens: request 2 finds blocks 0-1 of request 1 (1024
    tokens), request 3 finds block 0 (512); request 4 shares nothing. Without the rebuilt
    ids (placeholders, as for a trace without hashes) nothing would hit."""
    rows = [dict(r, timestamp=i * 1000) for i, r in enumerate(ROWS)]  # 1 s apart: cached
    reqs = read_mooncake(_write(tmp_path, rows))
    res = simulate(load_model("meta-llama/Llama-3.1-8B"), HardwareSpec("c", 96, 1000, 100, 200),
                   EngineConfig(step_overhead_us=0.0), reqs, Flat())
    assert res.prefix_cache_queries == 1200 + 1100 + 700 + 300
    assert res.prefix_cache_hits == 1024 + 512
    off = simulate(load_model("meta-llama/Llama-3.1-8B"), HardwareSpec("c", 96, 1000, 100, 200),
                   EngineConfig(step_overhead_us=0.0, enable_prefix_caching=False), reqs, Flat())
    assert off.prefix_cache_hits == 0


def test_time_rate_scaling_window_and_block_size(tmp_path):
    p = _write(tmp_path, ROWS)
    assert [r.arrival_ns for r in read_mooncake(p, Replay(rate_scale=3))] == [
        0, 0, 1000 * MS, 1_999_666_667]
    assert [r.arrival_ns for r in read_mooncake(p, Replay(time_scale=0.001))] == [
        0, 0, 3 * MS, 5_999_000]
    win = read_mooncake(p, Replay(start_s=1, duration_s=5))  # [1 s, 6 s) of the trace
    assert [(r.arrival_ns, r.prompt_len) for r in win] == [(2000 * MS, 700), (4999 * MS, 300)]
    small = read_mooncake(_write(tmp_path, [
        {"timestamp": 1.5, "input_length": 40, "output_length": 1, "hash_ids": [7, 8, 9]}],
        "b16.jsonl"), hash_block_size=16)
    assert list(small[0].prompt_ids) == list(range(112, 152)) and small[0].arrival_ns == 0


@pytest.mark.parametrize("row, needle", [
    ('{"timestamp": 9000, "input_length": 700, "output_length": 6, "hash_ids": [0]}',
     "field 'hash_ids' has 1 ids but input_length 700 spans 2 blocks of 512"),
    ('{"timestamp": 9000, "input_length": 10, "output_length": 6}', "field 'hash_ids' is missing"),
    ('{"timestamp": 9000, "input_length": 10, "output_length": 6, "hash_ids": [1.5]}',
     "field 'hash_ids' holds a non-integer id 1.5"),
    ('{"timestamp": 9000, "input_length": 10, "output_length": 6, "hash_ids": [-1]}',
     "field 'hash_ids' holds the id -1, outside"),
    ('{"timestamp": 9000, "input_length": 10, "output_length": 6, "hash_ids": "0"}',
     "field 'hash_ids' must be a list of ints"),
    ('{"timestamp": "9000", "input_length": 10, "output_length": 6, "hash_ids": [0]}',
     "field 'timestamp' must be a number of ms"),
    ('{"timestamp": -5, "input_length": 10, "output_length": 6, "hash_ids": [0]}',
     "field 'timestamp' must be >= 0"),
    ('{"input_length": 10, "output_length": 6, "hash_ids": [0]}', "field 'timestamp' is missing"),
    ('{"timestamp": 9000, "input_length": 2.5, "output_length": 6, "hash_ids": [0]}',
     "field 'input_length' must be an integer"),
    ('{"timestamp": 9000, "input_length": 10, "output_length": 1e12, "hash_ids": [0]}',
     "field 'output_length' is 1000000000000.0, above 10000000"),
    ('{"timestamp": 9000, "input_length": 10, "output_len', "invalid JSON at column"),
    ('[1, 2]', "expected a JSON object, got list"),
])
def test_bad_row_names_file_and_line(tmp_path, row, needle):
    p = _write(tmp_path, [*ROWS, row])
    with pytest.raises(WorkloadError, match=f"{p}:5: {needle}"):
        read_mooncake(p)


def test_zero_rows_budget_and_limits(tmp_path, caplog):
    rows = [*ROWS, {"timestamp": 7000, "input_length": 0, "output_length": 5, "hash_ids": []}]
    assert len(read_mooncake(_write(tmp_path, rows))) == 4
    p = _write(tmp_path, ROWS)
    with pytest.raises(WorkloadError, match=":2: the row brings the replay's total to 2312"):
        read_mooncake(p, max_total_tokens=2000)
    with pytest.raises(WorkloadError, match=":1: 1200 input \\+ 8 output tokens exceed "
                                            "max_model_len=1024"):
        read_mooncake(p, max_model_len=1024)
    assert len(read_mooncake(p, Replay(limit=3))) == 3
    with pytest.raises(WorkloadError, match="hash_block_size"):
        read_mooncake(p, hash_block_size=0)
    with pytest.raises(WorkloadError, match="no requests to replay"):
        read_mooncake(_write(tmp_path, ["", ""], "blank.jsonl"))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.integers(0, 6), min_size=1, max_size=5),
                          st.integers(0, 511)), min_size=2, max_size=6))
def test_shared_ids_are_exactly_the_shared_hash_blocks(tmp_path_factory, rows):
    """Two prompts agree on their first k * 512 ids exactly when their first k hash ids are
    equal (and on nothing after the first differing block)."""
    rows = [(hashes, 1 + (len(hashes) - 1) * 512 + cut) for hashes, cut in rows]
    p = tmp_path_factory.mktemp("mc") / "t.jsonl"
    p.write_text("".join(json.dumps({"timestamp": i, "input_length": n, "output_length": 1,
                                     "hash_ids": h}) + "\n" for i, (h, n) in enumerate(rows)))
    reqs = read_mooncake(p)
    for (ha, na), a in zip(rows, reqs, strict=True):
        assert a.prompt_len == na
        for (hb, nb), b in zip(rows, reqs, strict=True):
            pairs = enumerate(zip(ha, hb, strict=False))
            k = next((i for i, (x, y) in pairs if x != y), min(len(ha), len(hb)))
            ids = enumerate(zip(a.prompt_ids, b.prompt_ids, strict=False))
            common = next((i for i, (x, y) in ids if x != y), min(na, nb))
            assert common == min(k * 512, na, nb)
