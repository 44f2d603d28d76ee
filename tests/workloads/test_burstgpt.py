"""BurstGPT traces (workloads.csv_traces.read_burstgpt)."""

from __future__ import annotations

import logging

import pytest

from workloads import Replay, WorkloadError, read_burstgpt

# The published layout (data/BurstGPT_1.csv): seconds from 0:00 of the first day, failures
# as Response tokens 0.
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,227,1314,Conversation log
118,GPT-4,417,0,417,Conversation log
118.25,GPT-4,261,138,399,API log
220,ChatGPT,29,221,250,API log
"""
S = 1_000_000_000


def _write(tmp_path, text, name="BurstGPT_1.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_reads_the_published_layout_and_skips_failures(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="workloads.replay"):
        reqs = read_burstgpt(_write(tmp_path, BURSTGPT))
    assert [r.arrival_ns for r in reqs] == [0, 40 * S, 113_250_000_000, 215 * S]
    assert [(r.prompt_len, r.output_len) for r in reqs] == [
        (472, 18), (1087, 227), (261, 138), (29, 221)]
    assert [r.request_id for r in reqs] == ["0", "1", "2", "3"]
    assert "skipped 1 rows with a zero token count (first at line 4)" in caplog.text
    ids = [t for r in reqs for t in r.prompt_ids]
    assert len(ids) == len(set(ids))  # placeholder ids: no prefix sharing assumed


def test_model_filter_keeps_the_trace_clock(tmp_path):
    reqs = read_burstgpt(_write(tmp_path, BURSTGPT), models=["GPT-4"])
    assert [(r.arrival_ns, r.prompt_len) for r in reqs] == [(113_250_000_000, 261)]
    assert len(read_burstgpt(_write(tmp_path, BURSTGPT), models=("ChatGPT", "GPT-4"))) == 4
    with pytest.raises(WorkloadError, match="no requests to replay"):
        read_burstgpt(_write(tmp_path, BURSTGPT), models=["Claude"])
    with pytest.raises(WorkloadError, match="models must be model names"):
        read_burstgpt(_write(tmp_path, BURSTGPT), models=[4])


def test_rate_scaling_window_and_limit(tmp_path):
    p = _write(tmp_path, BURSTGPT)
    fast = read_burstgpt(p, Replay(rate_scale=10))
    assert [r.arrival_ns for r in fast] == [0, 4 * S, 11_325_000_000, 21_500_000_000]
    slow = read_burstgpt(p, Replay(time_scale=2.5))
    assert [r.arrival_ns for r in slow] == [0, 100 * S, 283_125_000_000, 537_500_000_000]
    win = read_burstgpt(p, Replay(start_s=40, duration_s=100))
    assert [(r.arrival_ns, r.prompt_len) for r in win] == [(0, 1087), (73_250_000_000, 261)]
    assert [r.prompt_len for r in read_burstgpt(p, Replay(limit=2))] == [472, 1087]


def test_columns_by_name_and_total_optional(tmp_path):
    text = ("Log Type,Response tokens,Request tokens,Model,Timestamp\n"
            "API log,7,3,GPT-4,0.5\nAPI log,9,4,GPT-4,1.000000001\n")
    reqs = read_burstgpt(_write(tmp_path, text))
    assert [(r.arrival_ns, r.prompt_len, r.output_len) for r in reqs] == [
        (0, 3, 7), (500_000_001, 4, 9)]


@pytest.mark.parametrize("row, needle", [
    ("300,ChatGPT,10,20,31,API log", ":7: field 'Total tokens' is 31, not Request tokens \\+ "
                                     "Response tokens = 30; the row is damaged"),
    ("300,ChatGPT,ten,20,30,API log", ":7: field 'Request tokens' must be an integer"),
    ("300,ChatGPT,10,-20,-10,API log", ":7: field 'Response tokens' must be >= 0"),
    ("-3,ChatGPT,10,20,30,API log", ":7: field 'Timestamp' must be seconds >= 0"),
    ("nan,ChatGPT,10,20,30,API log", ":7: field 'Timestamp' must be seconds >= 0"),
    ("1e40,ChatGPT,10,20,30,API log", ":7: field 'Timestamp' must be seconds >= 0"),
    ("99999999999999,ChatGPT,10,20,30,API log", ":7: field 'Timestamp' is 99999999999999 s, "
                                                "above"),
    ("4,ChatGPT,10,20,30,API log", ":7: field 'Timestamp' is earlier than the first row's"),
    ("300,ChatGPT,10", ":7: the row has 3 fields, the header 6"),
])
def test_bad_row_names_file_and_line(tmp_path, row, needle):
    p = _write(tmp_path, BURSTGPT + row + "\n")
    with pytest.raises(WorkloadError, match=f"{p}{needle}"):
        read_burstgpt(p)


def test_missing_columns_and_budget(tmp_path):
    with pytest.raises(WorkloadError, match=r":1: missing column\(s\) \['Response tokens'\].*"
                                            "Timestamp,Model,Request tokens,Response tokens"):
        read_burstgpt(_write(tmp_path, "Timestamp,Model,Request tokens\n1,GPT-4,3\n"))
    p = _write(tmp_path, BURSTGPT)
    with pytest.raises(WorkloadError, match=":3: the row brings the replay's total to 1804"):
        read_burstgpt(p, max_total_tokens=1000)
    with pytest.raises(WorkloadError, match=":3: 1087 input \\+ 227 output tokens exceed "
                                            "max_model_len=1024"):
        read_burstgpt(p, max_model_len=1024)
