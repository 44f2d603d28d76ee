"""What every production-trace reader shares: the replay window and scaling, the per-row
checks of :mod:`workloads.limits`, and turning kept rows into requests.

A trace's clock starts at its first data row (t = 0; a later row earlier than that is refused
by ``file:line``: sort the trace). :class:`Replay` picks and scales what is replayed:

- ``start_s`` / ``duration_s``: keep the rows with ``start_s <= t < start_s + duration_s``
  (trace seconds; ``duration_s = None``: to the end); replay time 0 is ``start_s``;
- ``limit``: keep at most the first ``limit`` such rows (file order); reading stops there;
- ``time_scale`` (stretch the trace's clock) and ``rate_scale`` (replay at ``k`` x its request
  rate): a kept row at trace time ``t`` arrives at ``(t - start_s) * time_scale / rate_scale``,
  rounded to integer ns. The two compose; ``rate_scale = 2`` and ``time_scale = 0.5`` are the
  same replay.

Every kept row is checked like a JSONL line (:mod:`workloads.jsonl`): counts at most
``MAX_TOKENS_PER_FIELD``, arrivals at most ``MAX_ARRIVAL_NS``, the optional ``max_model_len``,
and the running token total against the file's budget (``file_token_budget`` of its size, or
``max_total_tokens``), before the row's ids are allocated. Rows with a zero count (a failed
request in BurstGPT, whose README marks failures by ``Response tokens`` 0; vLLM serves neither
an empty prompt nor ``max_tokens = 0``) are skipped and counted; the reader logs how many and
the first line. Kept requests are numbered in file order and stably sorted by arrival; a
trace without token ids gets placeholder prompt ids unique across it (lazy ``range``\\ s from
``PLACEHOLDER_ID_BASE``), so its requests share no prefix-cache block.
"""

from __future__ import annotations

import logging
import math
import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from engine.workload import RequestSpec
from workloads.args import check_int, check_number
from workloads.errors import WorkloadError
from workloads.limits import (
    MAX_ARRIVAL_NS,
    MAX_TOKENS_PER_FIELD,
    PLACEHOLDER_ID_BASE,
    check_budget_arg,
    check_max_model_len_arg,
    file_token_budget,
)

NS_PER_S = 1_000_000_000
MAX_TRACE_S = MAX_ARRIVAL_NS / NS_PER_S
log = logging.getLogger(__name__)


def row_error(path: Path, lineno: int, field: str, problem: str, fix: str) -> WorkloadError:
    """The one message shape for a bad row: ``file:line: field 'x' <problem>; <fix>``."""
    return WorkloadError(f"{path}:{lineno}: field '{field}' {problem}; {fix}")


def parse_count(text: str, path: Path, lineno: int, field: str) -> int:
    """A token count written as text (``"512"``, or an integral ``"512.0"``), 0 included."""
    raw = text.strip()
    try:
        value = int(raw)
    except ValueError:
        try:
            f = float(raw)
        except ValueError:
            f = math.nan
        if not (math.isfinite(f) and f.is_integer()):
            raise row_error(path, lineno, field, f"must be an integer, got {text!r}",
                            "write a plain int") from None
        value = int(f)
    if value < 0:
        raise row_error(path, lineno, field, f"must be >= 0, got {text!r}", "fix the value")
    if value > MAX_TOKENS_PER_FIELD:
        raise row_error(path, lineno, field, f"is {value}, above {MAX_TOKENS_PER_FIELD}",
                        "fix the value (no model serves a request this long)")
    return value


@dataclass(frozen=True, slots=True)
class Replay:
    """Which rows of a trace are replayed and how fast (see the module docstring)."""

    limit: int | None = None
    start_s: float = 0.0
    duration_s: float | None = None
    time_scale: float = 1.0
    rate_scale: float = 1.0

    def __post_init__(self) -> None:
        who = "trace replay"
        if self.limit is not None:
            object.__setattr__(self, "limit", check_int(who, "limit", self.limit, 1, 2**62))
        object.__setattr__(self, "start_s",
                           check_number(who, "start_s", self.start_s, 0.0, MAX_TRACE_S))
        if self.duration_s is not None:
            object.__setattr__(self, "duration_s", check_number(
                who, "duration_s", self.duration_s, 0.0, MAX_TRACE_S, low_open=True))
        for name in ("time_scale", "rate_scale"):
            value = check_number(who, name, getattr(self, name), 0.0, 1e9, low_open=True)
            object.__setattr__(self, name, value)
        if self.time_scale / self.rate_scale < 1e-9:
            raise WorkloadError(f"{who}: time_scale / rate_scale = "
                                f"{self.time_scale / self.rate_scale:.3g} squeezes the trace "
                                "below 1 ns per second; use a factor >= 1e-9")

    @property
    def factor(self) -> float:
        """Replay seconds per trace second."""
        return self.time_scale / self.rate_scale


class TraceBuilder:
    """Collects the kept rows of one trace file, checking each as it comes."""

    def __init__(self, path: Path, nbytes: int, fmt: str, replay: Replay,
                 max_model_len: int | None, max_total_tokens: int | None) -> None:
        check_max_model_len_arg(max_model_len, f"read_{fmt}")
        check_budget_arg(max_total_tokens, f"read_{fmt}")
        self.path, self.fmt, self.replay = path, fmt, replay
        self.max_model_len = max_model_len
        self.max_total_tokens = max_total_tokens
        self.nbytes = nbytes
        self.budget = file_token_budget(nbytes) if max_total_tokens is None else max_total_tokens
        self.total = 0
        self.t0: int | None = None
        self.t0_line = 0
        self.start_ns = round(replay.start_s * NS_PER_S)
        self.end_ns = (None if replay.duration_s is None
                       else self.start_ns + round(replay.duration_s * NS_PER_S))
        # (arrival ns, prompt ids or a placeholder count, output_len)
        self.rows: list[tuple[int, array | int, int]] = []
        self.max_id = -1
        self.zero_rows = 0
        self.zero_first = 0
        self.outside = 0

    @property
    def full(self) -> bool:
        """``limit`` rows kept: the reader may stop."""
        return self.replay.limit is not None and len(self.rows) >= self.replay.limit

    def skip_zero(self, lineno: int) -> None:
        self.zero_rows += 1
        self.zero_first = self.zero_first or lineno

    def observe(self, lineno: int, t_ns: int, time_field: str) -> None:
        """Every parsed row's time: the first sets the clock, none may precede it."""
        if self.t0 is None:
            self.t0, self.t0_line = t_ns, lineno
        elif t_ns < self.t0:
            raise row_error(
                self.path, lineno, time_field,
                f"is earlier than the first row's (line {self.t0_line}); the trace's clock "
                "starts at its first row", "sort the trace by time")

    def keep(self, lineno: int, t_ns: int, n_in: int, n_out: int) -> bool:
        """Window and check one observed row; True if it is replayed (then call ``add``)."""
        assert self.t0 is not None, "observe the row first"
        rel = t_ns - self.t0
        if rel < self.start_ns or (self.end_ns is not None and rel >= self.end_ns):
            self.outside += 1
            return False
        p = self.path
        if self.max_model_len is not None and n_in + n_out > self.max_model_len:
            raise WorkloadError(
                f"{p}:{lineno}: {n_in} input + {n_out} output tokens exceed max_model_len="
                f"{self.max_model_len} (vLLM rejects such a request); drop the row or raise "
                "max_model_len")
        self.total += n_in + n_out
        if self.total > self.budget:
            how = ("the max_total_tokens given" if self.max_total_tokens is not None
                   else f"the default for a {self.nbytes}-byte file (workloads.limits)")
            raise WorkloadError(
                f"{p}:{lineno}: the row brings the replay's total to {self.total} tokens, above "
                f"its budget of {self.budget} ({how}); a damaged count? Fix the counts, replay "
                f"fewer rows (limit, duration_s), or pass read_{self.fmt}(..., "
                "max_total_tokens=N) if the run really needs that many")
        return True

    def add(self, lineno: int, t_ns: int, time_field: str, prompt: array | int, n_out: int,
            max_id: int | None = None) -> None:
        """Keep a row ``keep`` accepted: its prompt ids (``max_id``, their largest, if the
        reader knows it) or a placeholder count."""
        assert self.t0 is not None
        rel = t_ns - self.t0 - self.start_ns
        factor = self.replay.factor
        arrival = rel if factor == 1.0 else round(rel * factor)
        if arrival > MAX_ARRIVAL_NS:
            raise row_error(self.path, lineno, time_field,
                            f"replays at {arrival} ns, above {MAX_ARRIVAL_NS} (31.7 years)",
                            "lower time_scale or raise rate_scale")
        if isinstance(prompt, array) and len(prompt):
            self.max_id = max(self.max_id, max(prompt) if max_id is None else max_id)
        self.rows.append((arrival, prompt, n_out))

    def finish(self, id_prefix: str) -> list[RequestSpec]:
        p = self.path
        if self.zero_rows:
            log.warning("%s: skipped %d rows with a zero token count (first at line %d): vLLM "
                        "serves neither an empty prompt nor max_tokens=0", p, self.zero_rows,
                        self.zero_first)
        if not self.rows:
            where = (f"; {self.outside} rows lie outside start_s={self.replay.start_s}, "
                     f"duration_s={self.replay.duration_s}" if self.outside else "")
            raise WorkloadError(f"{p}: no requests to replay{where}; the file needs at least one "
                                "row with non-zero token counts in the window")
        next_placeholder = max(PLACEHOLDER_ID_BASE, self.max_id + 1)
        requests: list[RequestSpec] = []
        for arrival, prompt_or_len, n_out in self.rows:
            if isinstance(prompt_or_len, int):
                prompt: Sequence[int] = range(next_placeholder, next_placeholder + prompt_or_len)
                next_placeholder += prompt_or_len
            else:
                prompt = prompt_or_len
            requests.append(RequestSpec(f"{id_prefix}{len(requests)}", arrival, prompt, n_out))
        requests.sort(key=lambda r: r.arrival_ns)  # stable
        return requests


def open_trace(path: str | Path) -> tuple[Path, BinaryIO, int]:
    """``(path, binary file, size)``, or the reader's ``WorkloadError`` for a missing or
    unreadable file."""
    p = Path(path)
    try:
        fh = p.open("rb")
    except FileNotFoundError as exc:
        raise WorkloadError(f"{p}: workload file not found; check the path") from exc
    except OSError as exc:
        raise WorkloadError(
            f"{p}: cannot read the workload file ({exc.strerror}); check the path and permissions"
        ) from exc
    return p, fh, os.fstat(fh.fileno()).st_size


def scaled(requests: list[RequestSpec], replay: Replay) -> list[RequestSpec]:
    """Requests already on a replay clock (the JSONL reader's) at ``replay``'s
    ``time_scale`` / ``rate_scale``; the window and limit are not applied here."""
    factor = replay.factor
    if factor == 1.0:
        return requests
    out = []
    for r in requests:
        arrival = round(r.arrival_ns * factor)
        if arrival > MAX_ARRIVAL_NS:
            raise WorkloadError(
                f"request {r.request_id} replays at {arrival} ns, above {MAX_ARRIVAL_NS} "
                "(31.7 years); lower time_scale or raise rate_scale")
        out.append(RequestSpec(r.request_id, arrival, r.prompt_ids, r.output_len, r.output_ids))
    return out
