"""Reader and writer for the reference JSONL replay format.

One JSON object per line (blank lines are skipped)::

    {"input_toks": 2358, "output_toks": 531, "arrival_time_ns": 46926808,
     "input_tok_ids": [...], "output_tok_ids": [...]}

``input_toks``, ``output_toks`` (ints >= 1) and ``arrival_time_ns`` (int >= 0, ns from
t = 0) are required (a float with an integral value, e.g. ``5.0``, is accepted as an int); ``input_tok_ids`` / ``output_tok_ids`` are optional lists of ints whose
lengths must equal the counts. Other keys are ignored. Agentic session lines (with
``sub_requests``) are rejected: ``RequestSpec`` has no notion of tool calls.

Requests are numbered in file order (``request_id`` = ``f"{id_prefix}{index}"``), the
first ``limit`` request lines are kept (like the reference ``--num-reqs``), then stably
sorted by arrival. A line without ``input_tok_ids`` gets placeholder prompt ids that are
unique across the file, so such requests never share a prefix-cache block (the reference
simulator does not hash prompts it has no ids for).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.workload import RequestSpec
from workloads.errors import WorkloadError

# Placeholder prompt ids start here: far above any real vocabulary, so they never collide
# with a tokenizer's ids either.
PLACEHOLDER_ID_BASE = 1 << 40
# No model has a context anywhere near this; a larger count is a damaged line (and would make
# the reader allocate placeholder ids until memory runs out).
MAX_TOKENS_PER_FIELD = 10_000_000


def _fail(path: Path, lineno: int, field: str, problem: str, fix: str) -> WorkloadError:
    return WorkloadError(f"{path}:{lineno}: field '{field}' {problem}; {fix}")


def _count(
    obj: dict[str, Any], key: str, path: Path, lineno: int, minimum: int, maximum: int | None = None
) -> int:
    if key not in obj:
        raise _fail(path, lineno, key, "is missing", f'add "{key}": <int >= {minimum}>')
    value = obj[key]
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int:
        raise _fail(path, lineno, key, f"must be an integer, got {value!r}", "write a plain int")
    if value < minimum:
        raise _fail(path, lineno, key, f"must be >= {minimum}, got {value}", "fix the value")
    if maximum is not None and value > maximum:
        raise _fail(
            path, lineno, key, f"is {value}, above {maximum}",
            "fix the value (no model serves a request this long)",
        )
    return value


def _ids(obj: dict[str, Any], key: str, n: int, count_key: str, path: Path, lineno: int):
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
    ids = tuple(value)
    if not all(type(t) is int for t in ids):
        bad = next(t for t in ids if type(t) is not int)
        raise _fail(path, lineno, key, f"holds a non-integer id {bad!r}", "use int token ids")
    return ids


def read_jsonl(
    path: str | Path, limit: int | None = None, id_prefix: str = ""
) -> list[RequestSpec]:
    """Read a replay workload; see the module docstring for the format and rules.

    Raises ``WorkloadError`` (a ``ConfigError``) naming file, line, field and fix for a
    missing file, truncated or non-object JSON, missing or mistyped fields, negative
    arrivals, id lists whose length differs from the count, or an empty workload.
    """
    p = Path(path)
    if limit is not None and (type(limit) is not int or limit < 1):
        raise WorkloadError(f"read_jsonl: limit must be None or an int >= 1, got {limit!r}")
    try:
        text = p.read_text()
    except FileNotFoundError as exc:
        raise WorkloadError(f"{p}: workload file not found; check the path") from exc
    requests: list[RequestSpec] = []
    next_placeholder = PLACEHOLDER_ID_BASE
    loads = json.loads
    for lineno, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(requests) >= limit:
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
        if not isinstance(obj, dict):
            raise WorkloadError(f"{p}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        if "sub_requests" in obj:
            raise _fail(
                p,
                lineno,
                "sub_requests",
                "marks an agentic session, which this reader does not support",
                "flatten the session into independent request lines",
            )
        n_in = _count(obj, "input_toks", p, lineno, 1, MAX_TOKENS_PER_FIELD)
        n_out = _count(obj, "output_toks", p, lineno, 1, MAX_TOKENS_PER_FIELD)
        arrival = _count(obj, "arrival_time_ns", p, lineno, 0)
        prompt = _ids(obj, "input_tok_ids", n_in, "input_toks", p, lineno)
        if prompt is None:
            prompt = tuple(range(next_placeholder, next_placeholder + n_in))
            next_placeholder += n_in
        output = _ids(obj, "output_tok_ids", n_out, "output_toks", p, lineno)
        requests.append(RequestSpec(f"{id_prefix}{len(requests)}", arrival, prompt, n_out, output))
    if not requests:
        raise WorkloadError(f"{p}: no requests found; the file needs at least one request line")
    requests.sort(key=lambda r: r.arrival_ns)  # list.sort is stable
    return requests


def write_jsonl(path: str | Path, requests: Iterable[RequestSpec]) -> Path:
    """Write requests in the replay format (in the given order); returns the path.

    ``input_tok_ids`` is always written (``read_jsonl`` round-trips it exactly);
    ``output_tok_ids`` only when the request has them.
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
