"""Reader for the Mooncake traces (kvcache-ai/Mooncake: ``mooncake_trace.jsonl`` and the
FAST'25 release ``FAST25-release/traces/{conversation,toolagent,synthetic}_trace.jsonl``).

One JSON object per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52,
     "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}

``timestamp`` is the arrival in ms (an integer, or a number with a fraction); ``input_length``
and ``output_length`` are token counts; ``hash_ids`` are the remapped hashes of the prompt's
consecutive 512-token blocks (the last one partial), so ``len(hash_ids) ==
ceil(input_length / 512)`` and two requests whose prompts start with the same hash ids
started with the same tokens. Other keys are ignored.

The prompt is rebuilt from the hashes: block ``h`` holds the ids ``h * B + k`` for ``k < B``
(``B = hash_block_size``, 512 in the published traces), truncated to ``input_length``, so equal
hash ids give equal token-id blocks and different ones share no id. The engine's prefix cache
(``block_size`` 16 by default, hashing chained over whole blocks as vLLM does) then finds the
sharing the trace records: two requests with ``k`` equal leading hash ids share their first
``k * B`` tokens. Ids are ``array('q')`` (8 bytes per token; the token budget of
:mod:`workloads.limits` applies before they are built). Window, scaling and row checks are
:mod:`workloads.replay`'s.
"""

from __future__ import annotations

import json
import math
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from engine.workload import RequestSpec
from workloads.args import check_int
from workloads.errors import WorkloadError
from workloads.jsonl import _count
from workloads.limits import MAX_ARRIVAL_NS, MAX_TOKEN_ID, MAX_TOKENS_PER_FIELD
from workloads.replay import Replay, TraceBuilder, open_trace, row_error

MOONCAKE_BLOCK = 512
NS_PER_MS = 1_000_000
_TOO_LONG = "fix the value (no model serves a request this long)"


def _timestamp_ns(obj: dict[str, Any], path: Path, lineno: int) -> int:
    if "timestamp" not in obj:
        raise row_error(path, lineno, "timestamp", "is missing", 'add "timestamp": <ms >= 0>')
    value = obj["timestamp"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise row_error(path, lineno, "timestamp", f"must be a number of ms, got {value!r}",
                        "write a plain number")
    if value < 0:
        raise row_error(path, lineno, "timestamp", f"must be >= 0, got {value!r}",
                        "fix the value")
    if value > MAX_ARRIVAL_NS // NS_PER_MS:
        raise row_error(path, lineno, "timestamp", f"is {value!r} ms, above "
                        f"{MAX_ARRIVAL_NS // NS_PER_MS}", "fix the value (ms from t = 0)")
    return value * NS_PER_MS if isinstance(value, int) else round(value * NS_PER_MS)


def _hash_ids(obj: dict[str, Any], n_in: int, block: int, path: Path, lineno: int
              ) -> np.ndarray:
    value = obj.get("hash_ids")
    if value is None:
        raise row_error(path, lineno, "hash_ids", "is missing",
                        'add "hash_ids": [<one int per prompt block>]')
    if not isinstance(value, list):
        raise row_error(path, lineno, "hash_ids", "must be a list of ints", "write a JSON array")
    need = -(-n_in // block)
    if len(value) != need:
        raise row_error(
            path, lineno, "hash_ids",
            f"has {len(value)} ids but input_length {n_in} spans {need} blocks of {block}",
            f"give one hash id per {block}-token block (or set hash_block_size)")
    if not all(type(h) is int for h in value):
        bad = next(h for h in value if type(h) is not int)
        raise row_error(path, lineno, "hash_ids", f"holds a non-integer id {bad!r}",
                        "use int block hashes")
    top = (MAX_TOKEN_ID + 1) // block - 1
    if value and (min(value) < 0 or max(value) > top):
        bad = min(value) if min(value) < 0 else max(value)
        raise row_error(path, lineno, "hash_ids", f"holds the id {bad}, outside [0, {top}]",
                        "use the trace's non-negative block ids")
    return np.asarray(value, dtype=np.int64)


def read_mooncake(
    path: str | Path,
    replay: Replay | None = None,
    hash_block_size: int = MOONCAKE_BLOCK,
    id_prefix: str = "",
    *,
    max_model_len: int | None = None,
    max_total_tokens: int | None = None,
) -> list[RequestSpec]:
    """A Mooncake trace (see the module docstring) as requests sorted by arrival."""
    block = check_int("read_mooncake", "hash_block_size", hash_block_size, 1, 1 << 20)
    p, fh, nbytes = open_trace(path)
    b = TraceBuilder(p, nbytes, "mooncake", replay or Replay(), max_model_len, max_total_tokens)
    offsets = np.arange(block, dtype=np.int64)
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if b.full:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(
                    f"{p}:{lineno}: invalid JSON at column {exc.colno} ({exc.msg}); the line "
                    "may be truncated: write one complete JSON object per line") from exc
            except (ValueError, RecursionError) as exc:  # bad UTF-8, huge ints, deep nesting
                raise WorkloadError(
                    f"{p}:{lineno}: cannot parse the line ({type(exc).__name__}: {exc}); write "
                    "one flat JSON object per line, UTF-8 encoded") from exc
            if not isinstance(obj, dict):
                raise WorkloadError(f"{p}:{lineno}: expected a JSON object, got "
                                    f"{type(obj).__name__}")
            t = _timestamp_ns(obj, p, lineno)
            b.observe(lineno, t, "timestamp")
            n_in = _count(obj, "input_length", p, lineno, 0, MAX_TOKENS_PER_FIELD, _TOO_LONG)
            n_out = _count(obj, "output_length", p, lineno, 0, MAX_TOKENS_PER_FIELD, _TOO_LONG)
            hashes = _hash_ids(obj, n_in, block, p, lineno)
            if n_in == 0 or n_out == 0:
                b.skip_zero(lineno)
            elif b.keep(lineno, t, n_in, n_out):
                ids = (hashes[:, None] * block + offsets).ravel()[:n_in]
                b.add(lineno, t, "timestamp", array("q", ids.tobytes()), n_out,
                      int(ids.max()))
    return b.finish(id_prefix)
