"""``vllm bench serve``'s synthetic datasets ``random`` and ``prefix_repetition``, as token ids.

Both follow vLLM 0.19's ``vllm/benchmarks/datasets`` (``RandomDataset``,
``PrefixRepetitionRandomDataset``) draw for draw, so for the same ``--seed`` the lengths and
the prefix structure are vLLM's. What is left out is the tokenizer: vLLM decodes the ids to
text and re-encodes it (``gen_prompt_decode_to_target_len``), which can change a prompt by a
few tokens (it logs the mismatch); here the ids are the prompt. vLLM draws from the
tokenizer's non-special ids; here from ``[0, vocab_size)``. The request count comes from the
``Load`` (``--num-prompts`` with ``--request-rate`` / ``--burstiness``, or load stages).

``random`` (``--dataset-name random``; ``--random-input-len`` 1024, ``--random-output-len``
128, ``--random-range-ratio`` 0.0, ``--random-prefix-len`` 0): with ``r`` the range ratio and
``L = input_len - num_special_tokens`` (vLLM subtracts what the tokenizer adds, so the served
prompt has ``input_len`` tokens), input lengths are uniform integers in ``[floor(L(1-r)),
ceil(L(1+r))]``, output lengths in ``[max(1, floor(O(1-r))), max(1, ceil(O(1+r)))]``, and an
offset per request in ``[0, vocab)``, drawn in that order from ``default_rng(seed)``, then one
random prefix of ``prefix_len`` ids shared by every request. Request ``i``'s prompt is the
prefix followed by ``(offset_i + i + j) mod vocab`` for ``j < input_len_i``. The
``num_special_tokens`` the server would add (1 for Llama 3's BOS, 0 for Qwen3; vLLM's
``tokenizer.num_special_tokens_to_add()``) are put in front, as ids ``vocab_size + j`` that
nothing else uses.

``prefix_repetition`` (``--dataset-name prefix_repetition``; ``--prefix-repetition-prefix-len``
256, ``-suffix-len`` 256, ``-num-prefixes`` 10, ``-output-len`` 128): ``num_requests //
num_prefixes`` prompts per prefix (vLLM refuses fewer requests than prefixes and serves
``num_prefixes`` times that many, dropping the remainder); each prefix is ``prefix_len`` ids
and each prompt adds its own ``suffix_len`` ids, from numpy's legacy global generator seeded
with ``seed`` (``np.random.randint``), prefix by prefix; the list is then shuffled with
Python's ``random`` seeded with ``seed`` (``--disable-shuffle``: ``shuffle=False``). Every
request has ``output_len`` output tokens.
"""

from __future__ import annotations

import math
import random
from array import array

import numpy as np

from engine.workload import RequestSpec
from workloads.args import (
    check_int,
    check_model_len,
    check_number,
    check_seed,
    check_total,
    check_vocab,
    token_budget,
)
from workloads.arrivals import Load
from workloads.errors import WorkloadError
from workloads.limits import MAX_TOKENS_PER_FIELD, check_max_model_len_arg
from workloads.synthetic import DEFAULT_VOCAB_SIZE

RANDOM = "vllm_random"
PREFIX_REPETITION = "prefix_repetition"


def _bounds(real_input_len: int, output_len: int, r: float) -> tuple[int, int, int, int]:
    """vLLM's ``RandomDataset.get_sampling_params`` intervals (floor low, ceil high)."""
    in_low, in_high = math.floor(real_input_len * (1 - r)), math.ceil(real_input_len * (1 + r))
    out_low = max(math.floor(output_len * (1 - r)), 1)
    out_high = max(math.ceil(output_len * (1 + r)), 1)
    return in_low, in_high, out_low, out_high


def vllm_random(
    load: Load,
    input_len: int = 1024,
    output_len: int = 128,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    num_special_tokens: int = 0,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    id_prefix: str = "",
    *,
    max_model_len: int | None = None,
    max_total_tokens: int | None = None,
) -> list[RequestSpec]:
    """``vllm bench serve --dataset-name random`` under ``load`` (see the module docstring)."""
    who = RANDOM
    check_max_model_len_arg(max_model_len, who)
    budget = token_budget(who, max_total_tokens)
    input_len = check_int(who, "input_len", input_len, 0, MAX_TOKENS_PER_FIELD)
    output_len = check_int(who, "output_len", output_len, 1, MAX_TOKENS_PER_FIELD)
    r = check_number(who, "range_ratio", range_ratio, 0.0, 1.0)
    if r >= 1.0:
        raise WorkloadError(f"{who}: range_ratio must be in [0, 1) (vLLM's rule), got {r!r}")
    prefix_len = check_int(who, "prefix_len", prefix_len, 0, MAX_TOKENS_PER_FIELD)
    n_special = check_int(who, "num_special_tokens", num_special_tokens, 0, 16)
    seed = check_seed(who, seed)
    vocab_size = check_vocab(who, vocab_size)
    real_input_len = max(0, input_len - n_special)
    in_low, in_high, out_low, out_high = _bounds(real_input_len, output_len, r)
    if prefix_len + in_low < 1:
        raise WorkloadError(
            f"{who}: input_len={input_len} is too small: with {n_special} special tokens and "
            f"range_ratio {r} the shortest prompt has prefix_len + {in_low} = "
            f"{prefix_len + in_low} tokens; raise input_len or prefix_len, or lower range_ratio "
            "(vLLM refuses this too)"
        )
    check_model_len(who, 0, n_special + prefix_len + in_high, out_high, max_model_len)
    shortest = n_special + prefix_len + in_low + out_low
    expected = load.expected_requests()
    check_total(who, round(expected), round(expected * shortest), budget)
    arrivals = load.times(seed)
    n = len(arrivals)
    if n == 0:
        raise WorkloadError(f"{who}: the load draws no arrival; raise the duration or the rate")

    rng = np.random.default_rng(seed)
    input_lens = rng.integers(in_low, in_high + 1, size=n)
    output_lens = rng.integers(out_low, out_high + 1, size=n)
    offsets = rng.integers(0, vocab_size, size=n)
    total = n * (n_special + prefix_len) + int(input_lens.sum()) + int(output_lens.sum())
    check_total(who, n, total, budget)
    head = array("q", range(vocab_size, vocab_size + n_special))
    if prefix_len > 0:
        head.frombytes(rng.integers(0, vocab_size, size=prefix_len, dtype=np.int64).tobytes())
    out: list[RequestSpec] = []
    for i in range(n):
        length = int(input_lens[i])
        inner = (int(offsets[i]) + i + np.arange(length, dtype=np.int64)) % vocab_size
        ids = array("q", head)
        ids.frombytes(inner.tobytes())
        out.append(RequestSpec(f"{id_prefix}{i}", int(arrivals[i]), ids, int(output_lens[i])))
    return out


def prefix_repetition(
    load: Load,
    prefix_len: int = 256,
    suffix_len: int = 256,
    num_prefixes: int = 10,
    output_len: int = 128,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    shuffle: bool = True,
    id_prefix: str = "",
    *,
    max_model_len: int | None = None,
    max_total_tokens: int | None = None,
) -> list[RequestSpec]:
    """``vllm bench serve --dataset-name prefix_repetition`` under ``load`` (see the module
    docstring): the first ``num_prefixes * (n // num_prefixes)`` of its ``n`` arrivals get a
    request."""
    who = PREFIX_REPETITION
    check_max_model_len_arg(max_model_len, who)
    budget = token_budget(who, max_total_tokens)
    prefix_len = check_int(who, "prefix_len", prefix_len, 0, MAX_TOKENS_PER_FIELD)
    suffix_len = check_int(who, "suffix_len", suffix_len, 0, MAX_TOKENS_PER_FIELD)
    num_prefixes = check_int(who, "num_prefixes", num_prefixes, 1, MAX_TOKENS_PER_FIELD)
    output_len = check_int(who, "output_len", output_len, 1, MAX_TOKENS_PER_FIELD)
    seed = check_seed(who, seed)
    vocab_size = check_vocab(who, vocab_size)
    if not isinstance(shuffle, bool):
        raise WorkloadError(f"{who}: shuffle must be true or false, got {shuffle!r}")
    if prefix_len + suffix_len < 1:
        raise WorkloadError(f"{who}: prefix_len + suffix_len must be >= 1 (vLLM rejects an "
                            "empty prompt)")
    check_model_len(who, 0, prefix_len + suffix_len, output_len, max_model_len)
    per_request = prefix_len + suffix_len + output_len
    expected = load.expected_requests()
    check_total(who, round(expected), round(expected * per_request), budget)
    arrivals = load.times(seed)
    per_prefix = len(arrivals) // num_prefixes
    if per_prefix == 0:
        raise WorkloadError(
            f"{who}: the load draws {len(arrivals)} requests, fewer than num_prefixes="
            f"{num_prefixes} (vLLM refuses this too); raise the request count or lower "
            "num_prefixes"
        )
    n = per_prefix * num_prefixes
    check_total(who, n, n * per_request, budget)

    rs = np.random.RandomState(seed)  # vLLM: np.random.seed(seed), then np.random.randint
    prompts: list[array] = []
    for _ in range(num_prefixes):
        prefix = rs.randint(0, vocab_size, size=prefix_len).astype(np.int64).tobytes()
        for _ in range(per_prefix):
            ids = array("q", prefix)
            ids.frombytes(rs.randint(0, vocab_size, size=suffix_len).astype(np.int64).tobytes())
            prompts.append(ids)
    if shuffle:
        random.Random(seed).shuffle(prompts)  # vLLM: random.seed(seed), then random.shuffle
    return [
        RequestSpec(f"{id_prefix}{i}", int(arrivals[i]), prompts[i], output_len)
        for i in range(n)
    ]
