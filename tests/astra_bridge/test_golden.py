"""Replay every row of the ASTRA-Sim golden table against the analytical model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from astra_bridge.golden import ReplayResult, read_golden, replay_all

pytestmark = pytest.mark.groundtruth


@pytest.fixture(scope="module")
def replayed(shared_data: Path) -> list[ReplayResult]:
    base = shared_data / "astra-sim"
    if not (base / "collectives.csv").is_file():
        pytest.skip(f"golden ASTRA-Sim table not found under {base}")
    return list(replay_all(base))


def test_table_shape(replayed: list[ReplayResult]) -> None:
    status = Counter(r.row.status for r in replayed)
    assert status == {"ok": 6333, "aborted": 16}


def test_every_completed_run_matches_to_the_nanosecond(replayed: list[ReplayResult]) -> None:
    bad = [
        (
            r.row.index,
            r.row.collective,
            r.row.network_config,
            r.row.system_config,
            r.row.nbytes,
            r.row.time_ns,
            r.ns,
            r.error,
        )
        for r in replayed
        if r.row.status == "ok" and r.ns != r.row.time_ns
    ]
    assert not bad, f"{len(bad)} mismatches, first: {bad[:5]}"


def test_first_npu_finish_times_match(replayed: list[ReplayResult]) -> None:
    bad = [
        (r.row.index, r.row.time_min_ns, r.min_ns)
        for r in replayed
        if r.row.status == "ok" and r.min_ns != r.row.time_min_ns
    ]
    assert not bad, f"{len(bad)} min-time mismatches, first: {bad[:5]}"


def test_every_aborted_run_is_rejected_with_a_reason(replayed: list[ReplayResult]) -> None:
    aborted = [r for r in replayed if r.row.status == "aborted"]
    assert len(aborted) == 16
    for r in aborted:
        assert r.ns is None
        assert r.error is not None
        assert "halvingDoubling" in r.error and "zero-byte" in r.error


def test_no_completed_run_is_rejected(replayed: list[ReplayResult]) -> None:
    assert not [r.row.index for r in replayed if r.row.status == "ok" and r.error]


def test_every_grid_is_covered(replayed: list[ReplayResult]) -> None:
    grids = Counter(r.row.grid for r in replayed)
    assert grids == {
        "main": 1800,
        "chunking": 1620,
        "chunking-16": 240,
        "odd-sizes": 900,
        "sysparam": 225,
        "2d": 390,
        "2d-chunking": 864,
        "p2p": 270,
        "p2p-2d": 40,
    }


def test_reader_parses_p2p_rows(shared_data: Path) -> None:
    rows = read_golden(shared_data / "astra-sim" / "collectives.csv")
    p2p = [r for r in rows if r.collective == "send-recv"]
    assert len(p2p) == 310
    assert all(r.p2p_src == 0 and r.p2p_dst is not None and r.p2p_dst > 0 for r in p2p)
