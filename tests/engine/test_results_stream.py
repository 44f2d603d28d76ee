"""Per-request records streamed to Parquet (``simulate_cluster(..., stream_to=...)``) and fed
lazily (a generator workload): the same table as the in-memory run, row for row."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from engine.batch import BatchShape
from engine.deployment import InstanceSpec
from engine.frontend import FrontEndSpec
from engine.memory import KVCapacity
from engine.results import RequestRecords
from engine.simulate import simulate_cluster
from engine.specs import ConfigError, EngineConfig, HardwareSpec
from engine.workload import RequestSpec
from profiles.catalog import load_model
from workloads import synthetic

MODEL = load_model("meta-llama/Llama-3.1-8B")
HW = HardwareSpec("card", 96.0, 1000.0, 100.0, 200.0)
N = 2000


class KvLatency:
    """1 ms + 10 us per token + a decode-KV term (steps of different lengths)."""

    def iteration_ns(self, shape: BatchShape) -> int:
        kv = shape.decode_kv_sum // shape.num_decode if shape.num_decode else 0
        return 1_000_000 + 10_000 * shape.total_tokens + 37 * kv

    def stage_ns(self, shape: BatchShape) -> int:
        return self.iteration_ns(shape)


def _instances(n: int = 1, num_blocks: int = 1500) -> list[InstanceSpec]:
    config = EngineConfig(step_overhead_us=0.0)
    # A small KV cache: requests get preempted, so some token times come in several runs.
    cap = KVCapacity(num_blocks=num_blocks, block_size=16, bytes_per_block=1, weight_bytes=0,
                     formula_num_blocks=num_blocks)
    return [InstanceSpec(f"i{k}", MODEL, HW, config, KvLatency(), cap) for k in range(n)]


def _workload(n: int = N, rate: float = 40.0) -> list[RequestSpec]:
    return synthetic(rate, num_requests=n, seed=3)


CASES = {
    "one instance": dict(instances=1, frontend=None),
    "api server, two instances": dict(instances=2, frontend=FrontEndSpec()),
}


def _assert_same_table(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b)
    for col in a.columns:
        assert a[col].dtype == b[col].dtype, col
        if col.endswith("token_times_ns"):
            for x, y, rid in zip(a[col], b[col], a["request_id"], strict=True):
                assert np.array_equal(np.asarray(x, np.int64), np.asarray(y, np.int64)), (col, rid)
        else:
            assert a[col].equals(b[col]), col


@pytest.fixture(scope="module", params=list(CASES))
def runs(request, tmp_path_factory):
    case = CASES[request.param]
    insts = _instances(case["instances"])
    work = _workload()
    kept = simulate_cluster(insts, work, frontend=case["frontend"])
    path = tmp_path_factory.mktemp("stream") / "requests.parquet"
    streamed = simulate_cluster(insts, iter(work), frontend=case["frontend"], stream_to=path,
                                chunk_rows=128)
    return kept, streamed, tmp_path_factory.mktemp("kept")


def test_the_run_exercises_interrupted_token_runs(runs) -> None:
    kept, _, _ = runs
    assert (kept.requests.num_preemptions > 0).sum() > 10


def test_streamed_file_equals_the_in_memory_table_column_by_column(runs) -> None:
    kept, streamed, out = runs
    assert streamed.requests is None and streamed.requests_path.is_file()
    assert not streamed.requests_path.with_name("requests.parquet.partial").exists()
    kept.write(out)
    _assert_same_table(pd.read_parquet(out / "requests.parquet"),
                       pd.read_parquet(streamed.requests_path))
    # ... and equals the frame the run returned (the table callers get in memory)
    _assert_same_table(kept.requests, pd.read_parquet(streamed.requests_path))
    assert pq.read_schema(streamed.requests_path).names == list(kept.requests.columns)


def test_streamed_file_is_written_in_row_groups_of_chunk_rows(runs) -> None:
    _, streamed, _ = runs
    meta = pq.ParquetFile(streamed.requests_path).metadata
    assert meta.num_rows == N
    assert meta.num_row_groups == math.ceil(N / 128)
    assert all(meta.row_group(i).num_rows == 128 for i in range(meta.num_row_groups - 1))


def test_lazy_streamed_run_has_the_same_totals(runs) -> None:
    kept, streamed, _ = runs
    for field in ("num_preemptions", "prefix_hit_tokens", "prefix_cache_queries",
                  "prefix_cache_hits", "makespan_ns", "num_steps"):
        assert getattr(kept, field) == getattr(streamed, field), field
    assert kept.timeseries.equals(streamed.timeseries)


def test_write_copies_a_streamed_table(runs, tmp_path) -> None:
    _, streamed, _ = runs
    paths = streamed.write(tmp_path)
    assert [p.name for p in paths] == ["requests.parquet", "timeseries.parquet"]
    assert pd.read_parquet(paths[0]).equals(pd.read_parquet(streamed.requests_path))
    with pytest.raises(ValueError, match="Parquet only"):
        streamed.write(tmp_path, fmt="csv")


def test_a_generator_workload_gives_the_list_workload_table() -> None:
    work = _workload(300)
    a = simulate_cluster(_instances(), work)
    b = simulate_cluster(_instances(), (s for s in work))
    _assert_same_table(a.requests, b.requests)


def test_a_generator_workload_is_checked_request_by_request() -> None:
    work = _workload(50)
    bad = work[:10] + [RequestSpec("late", work[9].arrival_ns - 1, (1, 2, 3), 4)] + work[10:]
    with pytest.raises(ConfigError, match=r"workload request 10 \('late'\) arrives before"):
        simulate_cluster(_instances(), iter(bad))
    with pytest.raises(ConfigError, match="workload is empty"):
        simulate_cluster(_instances(), iter([]))


def test_a_failed_streamed_run_leaves_no_file(tmp_path) -> None:
    # A request that never fits the KV cache: the run fails, and nothing claims to be written.
    work = [RequestSpec("big", 0, tuple(range(4000)), 10)]
    path = tmp_path / "requests.parquet"
    with pytest.raises(ConfigError, match="never fits"):
        simulate_cluster(_instances(num_blocks=64), iter(work), stream_to=path)
    assert list(tmp_path.iterdir()) == []


def test_chunk_rows_must_be_positive(tmp_path) -> None:
    with pytest.raises(ValueError, match="chunk_rows"):
        simulate_cluster(_instances(), _workload(5), stream_to=tmp_path / "r.parquet",
                         chunk_rows=0)


def test_record_tables_and_step_logs_pickle_with_their_rows(monkeypatch) -> None:
    """A run's record table and a step log survive pickling (compiled, their typed views are
    rebuilt): the same frame, the same columns, and a log keeps logging after the trip."""
    import importlib
    import pickle

    from engine.instance import StepLog

    monkeypatch.setattr(importlib.import_module("engine.simulate"), "RequestRecords",
                        _KeptRecords)
    _KeptRecords.kept.clear()
    simulate_cluster(_instances(), _workload(300))
    (records,) = _KeptRecords.kept
    back = pickle.loads(pickle.dumps(records))
    assert type(back) is type(records) and len(back) == len(records) == 300
    _assert_same_table(records.frame(), back.frame())
    back.add(back_req := _finished_request())
    assert len(back) == 301 and back.request_id[-1] == back_req.request_id

    log = StepLog()
    for k in range(700):  # past the pending rows' capacity: flushed and pending steps both
        log.add(10 * k, k % 7, k % 3, k / 1000, k % 5, k % 2)
    again = pickle.loads(pickle.dumps(log))
    for name in StepLog.COLUMNS:
        assert getattr(again, name) == getattr(log, name), name
    again.add(7000, 1, 2, 0.5, 3, 1)
    assert again.end_ns[-1] == 7000 and len(again.usage) == 701


class _KeptRecords(RequestRecords):
    """The record table a run makes, kept for the test (a module-level class: it pickles)."""

    kept: list[RequestRecords] = []

    def __init__(self, *args) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args)
        _KeptRecords.kept.append(self)


def _finished_request():  # type: ignore[no-untyped-def]
    """A request as the engine leaves it at its finish (one token run of a fresh log)."""
    from engine.request import Request, TokenLog

    spec = _workload(1)[0]
    r = Request(spec, 0, 16, False)
    log = TokenLog()
    log.times.extend([5, 6])
    r.tok_open = (log, 0, r.tok_next)
    r.tok_next += 2
    r.num_tokens += 2
    return r
