"""Readers for the CSV production traces: Azure LLM inference traces and BurstGPT.

**Azure LLM inference traces** (Azure/AzurePublicDataset, ``AzureLLMInferenceDataset2023.md``
and ``2024.md``; files ``AzureLLMInferenceTrace_{code,conv}.csv`` and ``..._1week.csv``)::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

``TIMESTAMP`` is the invocation time, ``YYYY-MM-DD HH:MM:SS`` with up to 9 fractional digits
and an optional UTC offset (``+00:00``, ``Z``); it is parsed exactly to integer ns.
``ContextTokens`` / ``GeneratedTokens`` are the prompt and output lengths. The traces carry
no prompt content (customer privacy), so prompts get placeholder ids and share no prefix.

**BurstGPT** (HPMLL/BurstGPT, ``data/BurstGPT_{1,2}.csv`` and ``BurstGPT_without_fails_*.csv``)::

    Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
    5,ChatGPT,472,18,490,Conversation log

``Timestamp`` is the submission time in seconds from 0:00 of the first day (an integer or
decimal, parsed exactly to ns); ``Model`` is ``ChatGPT`` or ``GPT-4``; ``Total tokens``, when
present, must equal the sum of the two counts (a row where it does not is damaged);
``Log Type`` is not used. ``models`` keeps only rows of the named models (vLLM's own
``BurstGPTDataset`` keeps ``GPT-4``). Rows with ``Response tokens`` 0 are the trace's failed
requests and are skipped (:mod:`workloads.replay`).

Both: columns are found by header name (order free, extra columns ignored); window, scaling,
limits and the ``file:line`` errors are :mod:`workloads.replay`'s.
"""

from __future__ import annotations

import calendar
import csv
import re
from collections.abc import Iterable, Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import BinaryIO

from engine.workload import RequestSpec
from workloads.errors import WorkloadError
from workloads.limits import MAX_ARRIVAL_NS
from workloads.replay import (
    NS_PER_S,
    Replay,
    TraceBuilder,
    open_trace,
    parse_count,
    row_error,
)

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
BURSTGPT_LAYOUT = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"

_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"\s*(Z|[+-]\d{2}:?\d{2})?"
)
_DECIMAL = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def _rows(path: Path, fh: BinaryIO, required: Iterable[str], layout: str,
          optional: Iterable[str] = ()) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line, {column: text})`` per data row (the ``required`` columns and those of
    ``optional`` the header has), after checking the header."""
    reader = csv.reader(_text_lines(path, fh))
    try:
        header = next(reader, None)
        if header is None:
            raise WorkloadError(f"{path}: the file is empty; write the header '{layout}' and "
                                "one row per request")
        names = [h.strip() for h in header]
        missing = [c for c in required if c not in names]
        if missing:
            raise WorkloadError(
                f"{path}:1: missing column(s) {missing} in the header {names}; the published "
                f"layout is '{layout}'")
        index = {c: names.index(c) for c in (*required, *optional) if c in names}
        for row in reader:
            if not row or all(not cell.strip() for cell in row):
                continue  # blank line
            if len(row) < len(names):
                raise WorkloadError(
                    f"{path}:{reader.line_num}: the row has {len(row)} fields, the header "
                    f"{len(names)}; the line may be truncated: write one complete row per line")
            yield reader.line_num, {c: row[i] for c, i in index.items()}
    except csv.Error as exc:
        raise WorkloadError(f"{path}:{reader.line_num}: unreadable CSV ({exc}); write one "
                            "plain comma-separated row per line") from exc


def _text_lines(path: Path, fh: BinaryIO) -> Iterator[str]:
    """The file's lines as text, decoded one by one so a bad byte is named by its line."""
    for lineno, raw in enumerate(fh, start=1):
        try:
            yield raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise WorkloadError(f"{path}:{lineno}: not UTF-8 text ({exc.reason}); write the "
                                "trace as UTF-8 CSV") from exc


def parse_datetime_ns(text: str, path: Path, lineno: int, field: str) -> int:
    """``YYYY-MM-DD HH:MM:SS[.fffffffff][offset]`` as integer ns since the Unix epoch (UTC)."""
    m = _DATETIME.fullmatch(text.strip())
    fix = "write it as YYYY-MM-DD HH:MM:SS.fffffff (UTC), as the Azure traces do"
    if m is None:
        raise row_error(path, lineno, field, f"is not a date and time, got {text!r}", fix)
    y, mo, d, h, mi, s = (int(m.group(k)) for k in range(1, 7))
    frac, tz = m.group(7) or "", m.group(8)
    try:
        if not (1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1]
                and h < 24 and mi < 60 and s < 60):
            raise ValueError
    except (ValueError, calendar.IllegalMonthError):
        raise row_error(path, lineno, field, f"is not a valid date and time, got {text!r}",
                        fix) from None
    seconds = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        hh, mm = int(tz[1:3]), int(tz[-2:])
        seconds -= sign * (hh * 3600 + mm * 60)
    return seconds * NS_PER_S + int(frac.ljust(9, "0") or 0)


def parse_seconds_ns(text: str, path: Path, lineno: int, field: str) -> int:
    """Non-negative decimal seconds (``"5"``, ``"5.25"``) as integer ns, exactly (truncated
    below 1 ns)."""
    raw = text.strip()
    if not _DECIMAL.fullmatch(raw):
        raise row_error(path, lineno, field, f"must be seconds >= 0, got {text!r}",
                        "write a plain decimal number of seconds")
    try:
        ns = int(Decimal(raw) * NS_PER_S)
    except InvalidOperation:  # pragma: no cover - the pattern admits only plain decimals
        raise row_error(path, lineno, field, f"must be seconds >= 0, got {text!r}",
                        "write a plain decimal number of seconds") from None
    if ns > MAX_ARRIVAL_NS:
        raise row_error(path, lineno, field, f"is {raw} s, above {MAX_ARRIVAL_NS // NS_PER_S} s",
                        "fix the value")
    return ns


def read_azure(
    path: str | Path,
    replay: Replay | None = None,
    id_prefix: str = "",
    *,
    max_model_len: int | None = None,
    max_total_tokens: int | None = None,
) -> list[RequestSpec]:
    """An Azure LLM inference trace (see the module docstring) as requests sorted by arrival."""
    p, fh, nbytes = open_trace(path)
    b = TraceBuilder(p, nbytes, "azure", replay or Replay(), max_model_len, max_total_tokens)
    with fh:
        for line, row in _rows(p, fh, AZURE_COLUMNS, ",".join(AZURE_COLUMNS)):
            if b.full:
                break
            t = parse_datetime_ns(row["TIMESTAMP"], p, line, "TIMESTAMP")
            b.observe(line, t, "TIMESTAMP")
            n_in = parse_count(row["ContextTokens"], p, line, "ContextTokens")
            n_out = parse_count(row["GeneratedTokens"], p, line, "GeneratedTokens")
            if n_in == 0 or n_out == 0:
                b.skip_zero(line)
            elif b.keep(line, t, n_in, n_out):
                b.add(line, t, "TIMESTAMP", n_in, n_out)
    return b.finish(id_prefix)


def read_burstgpt(
    path: str | Path,
    replay: Replay | None = None,
    models: Iterable[str] = (),
    id_prefix: str = "",
    *,
    max_model_len: int | None = None,
    max_total_tokens: int | None = None,
) -> list[RequestSpec]:
    """A BurstGPT trace (see the module docstring) as requests sorted by arrival; ``models``
    (e.g. ``["GPT-4"]``) keeps only those models' rows, empty keeps all."""
    keep_models = set(models)
    if any(not isinstance(m, str) for m in keep_models):
        raise WorkloadError(f"read_burstgpt: models must be model names, got {sorted(models)!r}")
    p, fh, nbytes = open_trace(path)
    b = TraceBuilder(p, nbytes, "burstgpt", replay or Replay(), max_model_len,
                     max_total_tokens)
    with fh:
        for line, row in _rows(p, fh, BURSTGPT_COLUMNS, BURSTGPT_LAYOUT, ("Total tokens",)):
            if b.full:
                break
            t = parse_seconds_ns(row["Timestamp"], p, line, "Timestamp")
            b.observe(line, t, "Timestamp")
            n_in = parse_count(row["Request tokens"], p, line, "Request tokens")
            n_out = parse_count(row["Response tokens"], p, line, "Response tokens")
            total = row.get("Total tokens", "").strip()
            if total and parse_count(total, p, line, "Total tokens") != n_in + n_out:
                raise row_error(p, line, "Total tokens",
                                f"is {total}, not Request tokens + Response tokens = "
                                f"{n_in + n_out}", "the row is damaged: fix or drop it")
            if keep_models and row["Model"].strip() not in keep_models:
                continue
            if n_in == 0 or n_out == 0:
                b.skip_zero(line)
            elif b.keep(line, t, n_in, n_out):
                b.add(line, t, "Timestamp", n_in, n_out)
    return b.finish(id_prefix)
