"""Reader and writer for the reference JSONL replay format.

One JSON object per line (blank lines are skipped)::

    {"input_toks": 2358, "output_toks": 531, "arrival_time_ns": 46926808,
     "input_tok_ids": [...], "output_tok_ids": [...]}

``input_toks``, ``output_toks`` (ints >= 1) and ``arrival_time_ns`` (int >= 0, ns from
t = 0) are required (a float with an integral value, e.g. ``5.0``, is accepted as an int);
``input_tok_ids`` / ``output_tok_ids`` are optional lists of ints whose lengths must equal
the counts. Other keys are ignored. Agentic session lines (with ``sub_requests``) are
rejected: ``RequestSpec`` has no notion of tool calls. Every number is range-checked
(:mod:`workloads.limits`), and the file's token total against its budget, line by line
before anything is allocated for the line.

Requests are numbered in file order (``request_id`` = ``f"{id_prefix}{index}"``), the
first ``limit`` request lines are kept (like the reference ``--num-reqs``), then stably
sorted by arrival. A line without ``input_tok_ids`` gets placeholder prompt ids that are
unique across the file and above every id in it (from ``PLACEHOLDER_ID_BASE`` = 2**40, or
the file's largest id + 1 if higher), so such requests never share a prefix-cache block
(the reference simulator does not hash prompts it has no ids for). Placeholder ids are a ``range`` (lazy:
48 bytes whatever the count); ids read from the file are kept as ``array('q')`` (8 bytes
each). Both hold the same int values a tuple would, so block hashes are unchanged.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from engine.workload import RequestSpec
from workloads.errors import WorkloadError
from workloads.limits import (
    MAX_ARRIVAL_NS,
    MAX_TOKEN_ID,
    MAX_TOKENS_PER_FIELD,
    PLACEHOLDER_ID_BASE,
    check_budget_arg,
    check_max_model_len_arg,
    file_token_budget,
)
from workloads.replay import open_trace

__all__ = ["PLACEHOLDER_ID_BASE", "read_jsonl", "write_jsonl"]

_TOO_LONG = "fix the value (no model serves a request this long)"
_TOO_LATE = f"fix the value (ns from t = 0; at most {MAX_ARRIVAL_NS}, i.e. 31.7 years)"


def _fail(path: Path, lineno: int, field: str, problem: str, fix: str) -> WorkloadError:
    return WorkloadError(f"{path}:{lineno}: field '{field}' {problem}; {fix}")


def _count(
    obj: dict[str, Any], key: str, path: Path, lineno: int, minimum: int, maximum: int, fix: str
) -> int:
    if key not in obj:
        raise _fail(path, lineno, key, "is missing", f'add "{key}": <int >= {minimum}>')
    raw = value = obj[key]
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int:
        raise _fail(path, lineno, key, f"must be an integer, got {raw!r}", "write a plain int")
    if value < minimum:
        raise _fail(path, lineno, key, f"must be >= {minimum}, got {raw!r}", "fix the value")
    if value > maximum:
        raise _fail(path, lineno, key, f"is {raw!r}, above {maximum}", fix)
    return value


def _ids(
    obj: dict[str, Any], key: str, n: int, count_key: str, path: Path, lineno: int
) -> array | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _fail(path, lineno, key, "must be a list of ints", "write a JSON array")
    if len(value) != n:
        raise _fail(
            path,
            lineno,
            key,
            f"has {len(value)} ids but {count_key} is {n}",
            f"make the list length equal {count_key}",
        )
    if not all(type(t) is int for t in value):
        bad = next(t for t in value if type(t) is not int)
        raise _fail(path, lineno, key, f"holds a non-integer id {bad!r}", "use int token ids")
    low, high = min(value), max(value)
    if low < 0 or high > MAX_TOKEN_ID:
        bad = low if low < 0 else high
        raise _fail(
            path,
            lineno,
            key,
            f"holds the id {bad}, outside [0, {MAX_TOKEN_ID}]",
            "use the tokenizer's ids (non-negative int64)",
        )
    return array("q", value)


def read_jsonl(
    path: str | Path,
    limit: int | None = None,
    id_prefix: str = "",
    *,
    max_model_len: int | None = None,
    max_total_tokens: int | None = None,
) -> list[RequestSpec]:
    """Read a replay workload; see the module docstring for the format and rules.

    ``max_model_len``: when given, a line whose ``input_toks + output_toks`` exceeds it is
    refused here (the engine would refuse it later; vLLM rejects such a request).
    ``max_total_tokens``: the file's token budget (default
    :func:`workloads.limits.file_token_budget` of the file size).

    Raises ``WorkloadError`` (a ``ConfigError``) naming file, line, field and fix for a
    missing or unreadable file, truncated, non-UTF-8 or non-object JSON, missing, mistyped
    or out-of-range fields, id lists whose length differs from the count, a token total
    above the budget, or an empty workload.
    """
    p = Path(path)
    if limit is not None and (type(limit) is not int or limit < 1):
        raise WorkloadError(f"read_jsonl: limit must be None or an int >= 1, got {limit!r}")
    check_max_model_len_arg(max_model_len, "read_jsonl")
    check_budget_arg(max_total_tokens, "read_jsonl")
    p, fh, nbytes = open_trace(p)
    # (arrival, prompt ids or a placeholder count, output_len, output ids) in file order
    rows: list[tuple[int, array | int, int, array | None]] = []
    max_id = -1
    loads = json.loads
    with fh:
        budget = file_token_budget(nbytes) if max_total_tokens is None else max_total_tokens
        total = 0
        for lineno, line in enumerate(fh, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                obj = loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(
                    f"{p}:{lineno}: invalid JSON at column {exc.colno} ({exc.msg}); "
                    "the line may be truncated: write one complete JSON object per line"
                ) from exc
            except (ValueError, RecursionError) as exc:  # bad UTF-8, a 4300-digit int, nesting
                raise WorkloadError(
                    f"{p}:{lineno}: cannot parse the line ({type(exc).__name__}: {exc}); "
                    "write one flat JSON object per line, UTF-8 encoded"
                ) from exc
            if not isinstance(obj, dict):
                raise WorkloadError(
                    f"{p}:{lineno}: expected a JSON object, got {type(obj).__name__}"
                )
            if "sub_requests" in obj:
                raise _fail(
                    p,
                    lineno,
                    "sub_requests",
                    "marks an agentic session, which this reader does not support",
                    "flatten the session into independent request lines",
                )
            n_in = _count(obj, "input_toks", p, lineno, 1, MAX_TOKENS_PER_FIELD, _TOO_LONG)
            n_out = _count(obj, "output_toks", p, lineno, 1, MAX_TOKENS_PER_FIELD, _TOO_LONG)
            arrival = _count(obj, "arrival_time_ns", p, lineno, 0, MAX_ARRIVAL_NS, _TOO_LATE)
            if max_model_len is not None and n_in + n_out > max_model_len:
                raise WorkloadError(
                    f"{p}:{lineno}: fields 'input_toks' + 'output_toks' = {n_in} + {n_out} "
                    f"exceed max_model_len={max_model_len} (vLLM rejects such a request); "
                    "shorten the request, drop the line or raise max_model_len"
                )
            total += n_in + n_out
            if total > budget:
                how = (
                    "the max_total_tokens given"
                    if max_total_tokens is not None
                    else f"the default for a {nbytes}-byte file (workloads.limits)"
                )
                raise WorkloadError(
                    f"{p}:{lineno}: fields 'input_toks' + 'output_toks' bring the file's "
                    f"total to {total} tokens, above its budget of {budget} ({how}); a "
                    "damaged count? Fix the counts, keep fewer lines (limit), or pass "
                    "read_jsonl(..., max_total_tokens=N) if the run really needs that many"
                )
            prompt = _ids(obj, "input_tok_ids", n_in, "input_toks", p, lineno)
            output = _ids(obj, "output_tok_ids", n_out, "output_toks", p, lineno)
            for ids in (prompt, output):
                if ids is not None:
                    max_id = max(max_id, max(ids))
            rows.append((arrival, n_in if prompt is None else prompt, n_out, output))
    if not rows:
        raise WorkloadError(f"{p}: no requests found; the file needs at least one request line")
    requests: list[RequestSpec] = []
    next_placeholder = max(PLACEHOLDER_ID_BASE, max_id + 1)
    for arrival, prompt_or_len, n_out, output in rows:
        if isinstance(prompt_or_len, int):
            prompt: Sequence[int] = range(next_placeholder, next_placeholder + prompt_or_len)
            next_placeholder += prompt_or_len
        else:
            prompt = prompt_or_len
        requests.append(RequestSpec(f"{id_prefix}{len(requests)}", arrival, prompt, n_out, output))
    requests.sort(key=lambda r: r.arrival_ns)  # list.sort is stable
    return requests


def write_jsonl(path: str | Path, requests: Iterable[RequestSpec]) -> Path:
    """Write requests in the replay format (in the given order); returns the path.

    ``input_tok_ids`` is always written (``read_jsonl`` round-trips the values exactly, as
    an ``array('q')``); ``output_tok_ids`` only when the request has them.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w") as fh:
        for r in requests:
            row: dict[str, Any] = {
                "input_toks": r.prompt_len,
                "output_toks": r.output_len,
                "arrival_time_ns": r.arrival_ns,
                "input_tok_ids": list(r.prompt_ids),
            }
            if r.output_ids is not None:
                row["output_tok_ids"] = list(r.output_ids)
            fh.write(json.dumps(row, separators=(",", ":")))
            fh.write("\n")
    return p
