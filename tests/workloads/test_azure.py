"""Azure LLM inference traces (workloads.csv_traces.read_azure) and the replay window and
scaling every trace reader shares (workloads.replay)."""

from __future__ import annotations

import logging

import pytest

from workloads import Replay, WorkloadError, read_azure
from workloads.limits import PLACEHOLDER_ID_BASE

# The published layout (AzureLLMInferenceTrace_conv.csv): header, then one row per request,
# timestamps with 7 fractional digits.
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:51.3910170,91,16
2023-11-16 18:15:52.5732450,2048,16
"""
T = [0, 4_314_579_000, 4_541_877_000, 4_710_427_000, 5_892_655_000]


def _write(tmp_path, text, name="AzureLLMInferenceTrace_conv.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_reads_the_published_layout(tmp_path):
    reqs = read_azure(_write(tmp_path, AZURE))
    assert [r.arrival_ns for r in reqs] == T  # exact to the ns, from the first row
    assert [(r.prompt_len, r.output_len) for r in reqs] == [
        (374, 44), (396, 109), (879, 55), (91, 16), (2048, 16)]
    assert [r.request_id for r in reqs] == ["0", "1", "2", "3", "4"]
    # no prompt content in the trace: placeholder ids, unique, so no prefix is shared
    assert isinstance(reqs[0].prompt_ids, range) and reqs[0].prompt_ids[0] == PLACEHOLDER_ID_BASE
    ids = [t for r in reqs for t in r.prompt_ids]
    assert len(ids) == len(set(ids))
    assert all(r.output_ids is None for r in reqs)


def test_2024_layout_with_utc_offset_and_column_order(tmp_path):
    text = ("ContextTokens,TIMESTAMP,GeneratedTokens\n"
            "100,2024-05-10 00:00:00.009930+00:00,5\n"
            "200,2024-05-10 02:00:01+02:00,6\n"      # = 00:00:01 UTC
            "300,2024-05-10T00:00:02Z,7\n")
    reqs = read_azure(_write(tmp_path, text, "AzureLLMInferenceTrace_code_1week.csv"))
    assert [r.arrival_ns for r in reqs] == [0, 990_070_000, 1_990_070_000]


def test_rate_and_time_scaling(tmp_path):
    p = _write(tmp_path, AZURE)
    assert [r.arrival_ns for r in read_azure(p, Replay(rate_scale=2))] == [t // 2 for t in T]
    assert [r.arrival_ns for r in read_azure(p, Replay(time_scale=3))] == [3 * t for t in T]
    same = read_azure(p, Replay(time_scale=0.5))
    assert [r.arrival_ns for r in same] == [r.arrival_ns for r in read_azure(p, Replay(
        rate_scale=2))]
    assert [r.arrival_ns for r in read_azure(p, Replay(time_scale=2, rate_scale=4))] == [
        t // 2 for t in T]


def test_window_and_limit(tmp_path):
    p = _write(tmp_path, AZURE)
    win = read_azure(p, Replay(start_s=4.5, duration_s=1.0))
    assert [r.prompt_len for r in win] == [879, 91]  # t in [4.5, 5.5)
    assert [r.arrival_ns for r in win] == [41_877_000, 210_427_000]  # from start_s
    assert [r.prompt_len for r in read_azure(p, Replay(limit=2))] == [374, 396]
    assert [r.prompt_len for r in read_azure(p, Replay(start_s=4.5, limit=1))] == [879]
    with pytest.raises(WorkloadError, match="no requests to replay; 5 rows lie outside"):
        read_azure(p, Replay(start_s=100))


def test_unsorted_rows_are_sorted_but_none_before_the_first(tmp_path):
    text = AZURE.replace("18:15:51.2224670,879", "18:15:53.2224670,879")
    reqs = read_azure(_write(tmp_path, text))
    assert [r.prompt_len for r in reqs] == [374, 396, 91, 2048, 879]
    assert [r.request_id for r in reqs] == ["0", "1", "3", "4", "2"]  # numbered in file order
    early = AZURE.replace("18:15:52.5732450", "18:15:40.0000000")
    with pytest.raises(WorkloadError, match=r":6: field 'TIMESTAMP' is earlier than the first "
                                            r"row's \(line 2\).*sort the trace"):
        read_azure(_write(tmp_path, early))


def test_zero_token_rows_are_skipped_and_counted(tmp_path, caplog):
    text = AZURE + "2023-11-16 18:15:53.0,0,12\n2023-11-16 18:15:54.0,33,0\n"
    with caplog.at_level(logging.WARNING, logger="workloads.replay"):
        reqs = read_azure(_write(tmp_path, text))
    assert len(reqs) == 5
    assert "skipped 2 rows with a zero token count (first at line 7)" in caplog.text


@pytest.mark.parametrize("row, needle", [
    ("2023-11-16 18:15:53,12", ":8: the row has 2 fields, the header 3"),
    ("2023-11-16 18:15:53,x,12", ":8: field 'ContextTokens' must be an integer, got 'x'"),
    ("2023-11-16 18:15:53,-4,12", ":8: field 'ContextTokens' must be >= 0"),
    ("2023-11-16 18:15:53,12,1e9", ":8: field 'GeneratedTokens' is 1000000000, above 10000000"),
    ("16/11/2023 18:15:53,12,3", ":8: field 'TIMESTAMP' is not a date and time"),
    ("2023-02-30 18:15:53,12,3", ":8: field 'TIMESTAMP' is not a valid date and time"),
    ("2023-11-16 25:15:53,12,3", ":8: field 'TIMESTAMP' is not a valid date and time"),
])
def test_bad_row_names_file_and_line(tmp_path, row, needle):
    p = _write(tmp_path, AZURE + "\n" + row + "\n")  # the blank line 7 is skipped
    with pytest.raises(WorkloadError, match=f"{p}{needle}"):
        read_azure(p)


def test_bad_files(tmp_path):
    with pytest.raises(WorkloadError, match="workload file not found"):
        read_azure(tmp_path / "missing.csv")
    with pytest.raises(WorkloadError, match="the file is empty"):
        read_azure(_write(tmp_path, ""))
    with pytest.raises(WorkloadError, match=r":1: missing column\(s\) \['GeneratedTokens'\]"):
        read_azure(_write(tmp_path, "TIMESTAMP,ContextTokens\n2023-11-16 18:15:53,1\n"))
    with pytest.raises(WorkloadError, match="no requests to replay"):
        read_azure(_write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"))
    p = tmp_path / "latin1.csv"
    p.write_bytes(AZURE.encode() + b"2023-11-16 18:15:53,\xff1,2\n")
    with pytest.raises(WorkloadError, match=":7: not UTF-8 text"):
        read_azure(p)


def test_token_budget_and_max_model_len(tmp_path):
    p = _write(tmp_path, AZURE)
    with pytest.raises(WorkloadError, match=r":3: the row brings the replay's total to 923 "
                                            r"tokens, above its budget of 922"):
        read_azure(p, Replay(limit=2), max_total_tokens=922)
    assert len(read_azure(p, Replay(limit=2), max_total_tokens=923)) == 2
    with pytest.raises(WorkloadError, match=":6: 2048 input \\+ 16 output tokens exceed "
                                            "max_model_len=2048"):
        read_azure(p, max_model_len=2048)
    huge = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:15:53,9000000,9000000\n", "huge.csv")
    with pytest.raises(WorkloadError, match=r"huge.csv:2: .*above its budget of 1048576 \(the "
                                            r"default for a \d+-byte file"):
        read_azure(huge)


@pytest.mark.parametrize("kwargs, needle", [
    ({"limit": 0}, "limit"),
    ({"start_s": -1}, "start_s"),
    ({"duration_s": 0}, "duration_s"),
    ({"time_scale": 0}, "time_scale"),
    ({"rate_scale": float("inf")}, "rate_scale"),
    ({"time_scale": 1e-6, "rate_scale": 1e6}, "squeezes the trace"),
])
def test_bad_replay_options(kwargs, needle):
    with pytest.raises(WorkloadError, match=needle):
        Replay(**kwargs)
