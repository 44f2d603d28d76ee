"""The limits every workload reader checks before it allocates anything large.

A trace line declares its token counts in a few bytes, but the engine keeps every token of
every request (prompt ids, output ids, block hashes, token timestamps): 55-65 bytes per
token today (peak RSS over the import baseline, a 3 KB trace of 1.57M tokens replayed through
``engine.simulate``: +80 MiB as prompt tokens, +105 MiB as output tokens). Without a limit,
one 64-byte line asking for 10M tokens took 497 MB.
So the readers refuse, by ``file:line`` and before any id is materialised:

- a count above ``MAX_TOKENS_PER_FIELD``, or a request longer than ``max_model_len`` when
  the caller knows it (vLLM rejects such a request);
- an arrival outside ``[0, MAX_ARRIVAL_NS]`` (int64 ns, with room left for the run itself);
- a token id outside ``[0, MAX_TOKEN_ID]`` (ids are stored as int64; tokenizer ids are
  never negative);
- a file whose token total exceeds its budget, :func:`file_token_budget`.

The file budget is ``TOKENS_PER_FILE_BYTE`` tokens per byte of the file, at least
``MIN_FILE_TOKEN_BUDGET`` and at most ``MAX_TOTAL_TOKENS``. The densest shipped trace
(``workload_me2_01_mixed.jsonl``, counts without ids) declares 166 tokens per byte
(7.44M tokens in 44,843 bytes); the ShareGPT replays, which carry their ids, 0.18. 512 per
byte leaves those 3x headroom and keeps a 3 KB file under 1.6M tokens (80-105 MiB in
the engine). The floor lets a small file hold a few full-context requests (eight of 128k). A
caller that really means a denser file passes ``max_total_tokens`` explicitly.
"""

from __future__ import annotations

from workloads.errors import WorkloadError

# Placeholder prompt ids start here, far above any real vocabulary, or just above the largest
# id in the file if that is higher (a trace written back by ``write_jsonl`` carries them), so
# they never collide with a file's ids.
PLACEHOLDER_ID_BASE = 1 << 40
# Ids are stored as int64; this leaves room above the largest for the placeholder ids.
MAX_TOKEN_ID = (1 << 62) - 1
# No model has a context anywhere near this; a larger count is a damaged line.
MAX_TOKENS_PER_FIELD = 10_000_000
# 10^18 ns is 31.7 years; int64 holds 9.2e18, so the simulated run keeps ample room.
MAX_ARRIVAL_NS = 10**18

TOKENS_PER_FILE_BYTE = 512
MIN_FILE_TOKEN_BUDGET = 1 << 20
# The absolute cap, also the synthetic generator's default: refuses absurd sizes by name
# instead of a MemoryError deep inside numpy (issue 15's largest run, 1M requests, needs
# about 1.5G tokens).
MAX_TOTAL_TOKENS = 1 << 31


def file_token_budget(nbytes: int) -> int:
    """Total tokens (prompt + output, over all requests kept) a file of ``nbytes`` may declare."""
    return min(MAX_TOTAL_TOKENS, max(MIN_FILE_TOKEN_BUDGET, TOKENS_PER_FILE_BYTE * nbytes))


def check_budget_arg(value: int | None, who: str) -> None:
    """``max_total_tokens`` must be None (the default budget) or an int >= 2."""
    if value is not None and (type(value) is not int or value < 2):
        raise WorkloadError(f"{who}: max_total_tokens must be None or an int >= 2, got {value!r}")


def check_max_model_len_arg(value: int | None, who: str) -> None:
    """``max_model_len`` must be None (not checked at read time) or an int >= 2."""
    if value is not None and (type(value) is not int or value < 2):
        raise WorkloadError(f"{who}: max_model_len must be None or an int >= 2, got {value!r}")
