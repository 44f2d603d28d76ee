"""Metrics from a streamed (Parquet) per-request table: the same as from the table in memory."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.metrics import (
    METRIC_KEYS,
    STATISTICS,
    compute_metrics,
    counted_statistic,
    metrics_from_parquet,
    statistic,
)
from engine.deployment import InstanceSpec
from engine.frontend import FrontEndSpec
from engine.memory import KVCapacity
from engine.simulate import simulate_cluster
from engine.specs import ConfigError, EngineConfig

# The streaming tests' model, card and KV-dependent step latency (steps of different lengths).
from tests.engine.test_results_stream import HW, MODEL, KvLatency
from workloads import synthetic


@settings(max_examples=300, deadline=None)
@given(
    sample=st.lists(st.integers(0, 3_000_000_000), min_size=1, max_size=400),
    dup=st.integers(1, 5),
)
def test_counted_statistic_is_numpy_on_the_expanded_sample(sample, dup) -> None:
    ns = np.array(sample * dup, dtype=np.int64)
    ms = ns / 1e6
    values, counts = np.unique(ns, return_counts=True)
    for stat in (*STATISTICS, "p99_9", "p0", "p100", "p37"):
        want = statistic(ms, stat)
        if stat == "mean":
            got = counted_statistic(values, counts, stat) / 1e6
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
        else:
            assert counted_statistic(values / 1e6, counts, stat) == want, stat


def test_counted_statistic_of_nothing_is_nan() -> None:
    empty = np.empty(0, dtype=np.int64)
    assert all(math.isnan(counted_statistic(empty, empty, s)) for s in STATISTICS)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    config = EngineConfig(step_overhead_us=0.0)
    cap = KVCapacity(num_blocks=1500, block_size=16, bytes_per_block=1, weight_bytes=0,
                     formula_num_blocks=1500)
    insts = [InstanceSpec("i0", MODEL, HW, config, KvLatency(), cap)]
    work = synthetic(40.0, num_requests=2000, seed=5)
    kept = simulate_cluster(insts, work, frontend=FrontEndSpec())
    path = tmp_path_factory.mktemp("stream") / "requests.parquet"
    simulate_cluster(insts, iter(work), frontend=FrontEndSpec(), stream_to=path, chunk_rows=300)
    return kept.requests, path


@pytest.mark.parametrize("view", ["engine", "client", "queued"])
def test_metrics_from_parquet_equal_the_in_memory_metrics(run, view) -> None:
    frame, path = run
    want = compute_metrics(frame, view=view)
    got = metrics_from_parquet(path, view=view, batch_rows=257)  # batches across row groups
    assert set(got) == set(METRIC_KEYS)
    for key in METRIC_KEYS:
        if key == "itl_ms_mean":  # the exact sum against np.mean's pairwise float sum
            assert got[key] == pytest.approx(want[key], rel=1e-12), key
        else:
            assert got[key] == want[key], key
    assert got["completed"] == 2000


def test_metrics_from_parquet_of_a_written_table(run, tmp_path) -> None:
    frame, _ = run
    part = frame.iloc[:500].copy()
    part.loc[part.index[:7], "finish_ns"] = -1  # unfinished rows leave the statistics
    part.to_parquet(tmp_path / "r.parquet", index=False)
    want = compute_metrics(part, start_ns=0)
    got = metrics_from_parquet(tmp_path / "r.parquet", start_ns=0)
    assert got["completed"] == 493
    for key in METRIC_KEYS:
        assert got[key] == pytest.approx(want[key], rel=1e-12), key


def test_metrics_from_parquet_refuses_a_file_that_is_not_parquet(tmp_path) -> None:
    bad = tmp_path / "r.parquet"
    bad.write_text("not parquet\n")
    with pytest.raises(ConfigError, match="not a readable Parquet table"):
        metrics_from_parquet(bad)
    with pytest.raises(ConfigError, match="view="):
        metrics_from_parquet(bad, view="nope")
