"""inference-perf's ``shared_prefix`` data generator, as token ids.

inference-perf (kubernetes-sigs/inference-perf, ``datagen/shared_prefix_datagen.py``; config
``data.type: shared_prefix`` with ``shared_prefix: {num_groups, num_prompts_per_group,
system_prompt_len, question_len, output_len}``, defaults 10, 10, 100, 50, 50) builds
``num_groups x num_prompts_per_group`` prompts before the run: per group one random system
prompt of ``system_prompt_len`` tokens, per prompt its own random question of
``question_len`` tokens after it. The prompt list is shuffled once, and request ``i`` of the
run sends prompt ``i mod (num_groups * num_prompts_per_group)`` with ``max_tokens =
output_len``; the vLLM client sets ``ignore_eos``, so every request generates exactly
``output_len`` tokens, which is what the engine does with any ``RequestSpec``.

Here a prompt is the group's system-prompt ids followed by the question's ids, all uniform in
``[0, vocab_size)`` from ``numpy.random.default_rng(seed)`` (system prompts, then questions,
then the shuffle permutation). inference-perf draws random ids too, decodes them and joins
system prompt and question with a space; the tokenizer may merge or add a token at that seam,
which is not modelled (lengths are the configured ones exactly). Requests sending the same
prompt share one id array. When requests arrive is the ``Load``'s business (inference-perf's
``load.stages`` are ``Load(stages=...)``).
"""

from __future__ import annotations

from array import array

import numpy as np

from engine.workload import RequestSpec
from workloads.args import (
    check_int,
    check_model_len,
    check_seed,
    check_total,
    check_vocab,
    token_budget,
)
from workloads.arrivals import Load
from workloads.errors import WorkloadError
from workloads.limits import MAX_TOKENS_PER_FIELD, check_max_model_len_arg
from workloads.synthetic import DEFAULT_VOCAB_SIZE

WHO = "shared_prefix"


def shared_prefix(
    load: Load,
    num_groups: int = 10,
    num_prompts_per_group: int = 10,
    system_prompt_len: int = 100,
    question_len: int = 50,
    output_len: int = 50,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    shuffle: bool = True,
    id_prefix: str = "",
    *,
    max_model_len: int | None = None,
    max_total_tokens: int | None = None,
) -> list[RequestSpec]:
    """The requests of inference-perf's ``shared_prefix`` generator under ``load`` (see the
    module docstring); ``shuffle=False`` keeps the prompts in group order. ``max_model_len``
    and ``max_total_tokens`` as in ``workloads.synthetic``; both are checked before any id
    is drawn."""
    check_max_model_len_arg(max_model_len, WHO)
    budget = token_budget(WHO, max_total_tokens)
    groups = check_int(WHO, "num_groups", num_groups, 1, MAX_TOKENS_PER_FIELD)
    per_group = check_int(WHO, "num_prompts_per_group", num_prompts_per_group, 1,
                          MAX_TOKENS_PER_FIELD)
    sys_len = check_int(WHO, "system_prompt_len", system_prompt_len, 0, MAX_TOKENS_PER_FIELD)
    q_len = check_int(WHO, "question_len", question_len, 0, MAX_TOKENS_PER_FIELD)
    out_len = check_int(WHO, "output_len", output_len, 1, MAX_TOKENS_PER_FIELD)
    seed = check_seed(WHO, seed)
    vocab_size = check_vocab(WHO, vocab_size)
    if not isinstance(shuffle, bool):
        raise WorkloadError(f"{WHO}: shuffle must be true or false, got {shuffle!r}")
    if sys_len + q_len < 1:
        raise WorkloadError(f"{WHO}: system_prompt_len + question_len must be >= 1 (vLLM "
                            "rejects an empty prompt)")
    check_model_len(WHO, 0, sys_len + q_len, out_len, max_model_len)
    n_prompts = groups * per_group
    check_total(WHO, n_prompts, groups * sys_len + n_prompts * q_len, budget)  # distinct ids
    per_request = sys_len + q_len + out_len
    check_total(WHO, round(load.expected_requests()),
                round(load.expected_requests() * per_request), budget)
    arrivals = load.times(seed)
    if len(arrivals) == 0:
        raise WorkloadError(f"{WHO}: the load draws no arrival; raise the duration or the rate")
    check_total(WHO, len(arrivals), len(arrivals) * per_request, budget)

    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab_size, size=(groups, sys_len), dtype=np.int64)
    questions = rng.integers(0, vocab_size, size=(n_prompts, q_len), dtype=np.int64)
    order = rng.permutation(n_prompts) if shuffle else np.arange(n_prompts)
    prompts: dict[int, array] = {}  # built on first use: a short run needs few of them
    out: list[RequestSpec] = []
    for i, t in enumerate(arrivals.tolist()):
        k = int(order[i % n_prompts])
        ids = prompts.get(k)
        if ids is None:
            ids = array("q", system[k // per_group].tobytes())
            ids.frombytes(questions[k].tobytes())
            prompts[k] = ids
        out.append(RequestSpec(f"{id_prefix}{i}", t, ids, out_len))
    return out
