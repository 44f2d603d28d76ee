"""Replay of the golden ASTRA-Sim table (``astra-sim/collectives.csv``) against the model.

Each row names its network and system config files; they are loaded with the same readers a user
would use (:func:`load_network_config`, :func:`load_system_config`), so the replay also exercises
the config loaders. Used by the test suite and by ``benchmarks/astra_replay.py``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from astra_bridge.collectives import UnsupportedCollective, collective_time, p2p_ns
from astra_bridge.topology import (
    SystemConfig,
    Topology,
    load_network_config,
    load_system_config,
)


@dataclass(frozen=True, slots=True)
class GoldenRow:
    """One simulator run of the golden table."""

    index: int
    collective: str
    grid: str
    nbytes: int
    status: str  # "ok" or "aborted"
    time_ns: int | None
    time_min_ns: int | None
    p2p_src: int | None
    p2p_dst: int | None
    network_config: str
    system_config: str


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Model outcome for one row: a time, or the reason the model rejected it."""

    row: GoldenRow
    ns: int | None
    min_ns: int | None
    error: str | None


def _opt_int(text: str) -> int | None:
    return int(text) if text.strip() else None


def read_golden(csv_path: str | Path) -> list[GoldenRow]:
    """Parse ``collectives.csv`` into :class:`GoldenRow` records, in file order."""
    rows = []
    with open(csv_path, newline="") as fh:
        for i, r in enumerate(csv.DictReader(fh)):
            rows.append(
                GoldenRow(
                    index=i,
                    collective=r["collective"],
                    grid=r["grid"],
                    nbytes=int(r["bytes"]),
                    status=r["status"],
                    time_ns=_opt_int(r["time_ns"]),
                    time_min_ns=_opt_int(r["time_min_ns"]),
                    p2p_src=_opt_int(r["p2p_src"]),
                    p2p_dst=_opt_int(r["p2p_dst"]),
                    network_config=r["network_config"],
                    system_config=r["system_config"],
                )
            )
    return rows


@cache
def _network(path: str) -> Topology:
    return load_network_config(path)


@cache
def _system(path: str) -> SystemConfig:
    return load_system_config(path)


def replay_row(row: GoldenRow, config_root: str | Path) -> ReplayResult:
    """Run the model on one golden row (configs resolved under ``config_root``)."""
    root = Path(config_root)
    topo = _network(str(root / row.network_config))
    if row.collective == "send-recv":
        assert row.p2p_src is not None and row.p2p_dst is not None
        t = p2p_ns(row.nbytes, row.p2p_src, row.p2p_dst, topo)
        return ReplayResult(row, t, t, None)
    system = _system(str(root / row.system_config))
    try:
        ct = collective_time(row.collective, row.nbytes, topo, system)
    except UnsupportedCollective as exc:
        return ReplayResult(row, None, None, str(exc))
    return ReplayResult(row, ct.ns, ct.min_ns, None)


def replay_all(data_dir: str | Path) -> Iterator[ReplayResult]:
    """Replay every row of ``<data_dir>/collectives.csv`` (``data_dir`` = the astra-sim folder)."""
    base = Path(data_dir)
    for row in read_golden(base / "collectives.csv"):
        yield replay_row(row, base / "configs")
