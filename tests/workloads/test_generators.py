"""The generators people use: inference-perf's shared_prefix, vllm bench serve's random and
prefix_repetition (workloads.inference_perf, workloads.vllm_datasets)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from engine import EngineConfig, simulate
from engine.batch import BatchShape
from engine.specs import HardwareSpec
from profiles.catalog import load_model
from workloads import Load, Stage, WorkloadError, prefix_repetition, shared_prefix, vllm_random

V = 50_000


def _load(n: int) -> Load:
    return Load(rate=10.0, num_requests=n)


# ---------------------------------------------------------------------------------------
# inference-perf shared_prefix


def test_shared_prefix_groups_prompts_and_cycling():
    g, p, sys_len, q_len = 3, 4, 20, 6
    reqs = shared_prefix(_load(30), g, p, sys_len, q_len, output_len=7, seed=1, vocab_size=V)
    assert len(reqs) == 30 and {r.output_len for r in reqs} == {7}
    assert {r.prompt_len for r in reqs} == {sys_len + q_len}
    # request i sends prompt i mod (groups x prompts): the same ids, the same array
    for i in range(30 - g * p):
        assert reqs[i].prompt_ids is reqs[i + g * p].prompt_ids
    prompts = {tuple(r.prompt_ids) for r in reqs}
    assert len(prompts) == g * p  # every prompt used, none twice per cycle
    systems = {tuple(r.prompt_ids[:sys_len]) for r in reqs}
    assert len(systems) == g  # one system prompt per group ...
    for s in systems:  # ... followed by that group's own p questions
        assert sum(1 for q in prompts if q[:sys_len] == s) == p
    assert all(0 <= t < V for r in reqs for t in r.prompt_ids)


def test_shared_prefix_order_and_determinism():
    ordered = shared_prefix(_load(6), 2, 3, 8, 2, 4, seed=5, vocab_size=V, shuffle=False)
    # unshuffled: group 0's three prompts, then group 1's
    assert len({tuple(r.prompt_ids[:8]) for r in ordered[:3]}) == 1
    assert ordered[0].prompt_ids[:8] != ordered[3].prompt_ids[:8]
    shuffled = shared_prefix(_load(6), 2, 3, 8, 2, 4, seed=5, vocab_size=V)
    assert sorted(map(tuple, (r.prompt_ids for r in shuffled))) == sorted(
        map(tuple, (r.prompt_ids for r in ordered)))
    assert shared_prefix(_load(6), 2, 3, 8, 2, 4, seed=5, vocab_size=V) == shuffled
    assert shared_prefix(_load(6), 2, 3, 8, 2, 4, seed=6, vocab_size=V) != shuffled


def test_shared_prefix_defaults_are_inference_perfs():
    reqs = shared_prefix(Load(stages=[Stage(5, 10), Stage(50, 1)], arrival="constant"))
    assert len(reqs) == 100  # inference-perf's load stages: 50 + 50 requests
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(150, 50)}
    assert len({tuple(r.prompt_ids) for r in reqs}) == 100  # 10 groups x 10 prompts
    assert len({tuple(r.prompt_ids[:100]) for r in reqs}) == 10


class Flat:
    """1 ms + 10 us per scheduled token."""

    def iteration_ns(self, shape: BatchShape) -> int:
        return 1_000_000 + 10_000 * shape.total_tokens


def test_shared_prefix_sharing_reaches_the_prefix_cache():
    """One group, a 64-token system prompt (4 blocks of 16): every request after the first
    hits those blocks."""
    reqs = shared_prefix(Load(rate=5.0, num_requests=8), 1, 8, 64, 10, 4, vocab_size=V)
    res = simulate(load_model("meta-llama/Llama-3.1-8B"), HardwareSpec("c", 96, 1000, 100, 200),
                   EngineConfig(step_overhead_us=0.0), reqs, Flat())
    assert res.prefix_cache_hits == 7 * 64
    assert res.prefix_cache_queries == 8 * 74


@pytest.mark.parametrize("kwargs, needle", [
    ({"num_groups": 0}, "num_groups"),
    ({"num_prompts_per_group": 1.5}, "num_prompts_per_group"),
    ({"system_prompt_len": -1}, "system_prompt_len"),
    ({"system_prompt_len": 0, "question_len": 0}, "empty prompt"),
    ({"output_len": 0}, "output_len"),
    ({"shuffle": "yes"}, "shuffle"),
    ({"seed": -1}, "seed"),
    ({"max_model_len": 100}, "max_model_len=100"),
    ({"max_total_tokens": 1000}, "above the token budget 1000"),
])
def test_shared_prefix_bad_args(kwargs, needle):
    with pytest.raises(WorkloadError, match=needle):
        shared_prefix(_load(20), **kwargs)


# ---------------------------------------------------------------------------------------
# vllm bench serve --dataset-name random


def test_vllm_random_lengths_are_vllms_draws():
    """vLLM 0.19's RandomDataset.get_sampling_params: default_rng(seed), inputs uniform in
    [floor(L(1-r)), ceil(L(1+r))] with L = input_len - special tokens, then outputs, then the
    per-request offsets, then the shared prefix."""
    n, seed, r = 50, 7, 0.25
    reqs = vllm_random(_load(n), input_len=101, output_len=40, range_ratio=r, prefix_len=12,
                       num_special_tokens=1, seed=seed, vocab_size=V)
    rng = np.random.default_rng(seed)
    ins = rng.integers(math.floor(100 * 0.75), math.ceil(100 * 1.25) + 1, size=n)
    outs = rng.integers(30, 50 + 1, size=n)
    offsets = rng.integers(0, V, size=n)
    prefix = rng.integers(0, V, size=12)
    assert [r.output_len for r in reqs] == outs.tolist()
    assert [r.prompt_len for r in reqs] == (1 + 12 + ins).tolist()
    for i, req in enumerate(reqs):
        ids = list(req.prompt_ids)
        assert ids[0] == V  # the special token in front, an id nothing else uses
        assert ids[1:13] == prefix.tolist()  # one prefix shared by all
        assert ids[13:] == [(int(offsets[i]) + i + j) % V for j in range(int(ins[i]))]


def test_vllm_random_defaults_and_fixed_lengths():
    reqs = vllm_random(_load(5))
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(1024, 128)}
    assert len({tuple(r.prompt_ids[:16]) for r in reqs}) == 5  # no prefix: nothing shared


@pytest.mark.parametrize("kwargs, needle", [
    ({"range_ratio": 1.0}, r"range_ratio must be in \[0, 1\)"),
    ({"range_ratio": -0.1}, "range_ratio"),
    ({"input_len": 1, "num_special_tokens": 1}, "input_len=1 is too small"),
    ({"output_len": 0}, "output_len"),
    ({"prefix_len": -2}, "prefix_len"),
    ({"num_special_tokens": 17}, "num_special_tokens"),
    ({"vocab_size": 1}, "vocab_size"),
    ({"max_model_len": 1100}, "max_model_len=1100"),
    ({"max_total_tokens": 5000}, "above the token budget 5000"),
])
def test_vllm_random_bad_args(kwargs, needle):
    with pytest.raises(WorkloadError, match=needle):
        vllm_random(_load(10), **kwargs)


# ---------------------------------------------------------------------------------------
# vllm bench serve --dataset-name prefix_repetition


def test_prefix_repetition_matches_vllms_construction():
    n, k, seed = 23, 4, 3
    reqs = prefix_repetition(_load(n), prefix_len=10, suffix_len=5, num_prefixes=k,
                             output_len=9, seed=seed, vocab_size=V)
    per = n // k
    assert len(reqs) == k * per == 20  # vLLM serves num_prefixes x (n // num_prefixes)
    arrivals = _load(n).times(seed)[: k * per]
    assert [r.arrival_ns for r in reqs] == arrivals.tolist()
    # vLLM: np.random.seed(seed); randint prefix, then its suffixes; random.shuffle(seed)
    rs = np.random.RandomState(seed)
    built = []
    for _ in range(k):
        prefix = rs.randint(0, V, size=10).tolist()
        built += [prefix + rs.randint(0, V, size=5).tolist() for _ in range(per)]
    random.Random(seed).shuffle(built)
    assert [list(r.prompt_ids) for r in reqs] == built
    assert {r.output_len for r in reqs} == {9}
    heads = [tuple(r.prompt_ids[:10]) for r in reqs]
    assert sorted(heads.count(h) for h in set(heads)) == [per] * k


def test_prefix_repetition_unshuffled_keeps_prefix_order():
    reqs = prefix_repetition(_load(6), 4, 2, 2, 3, shuffle=False)
    heads = [tuple(r.prompt_ids[:4]) for r in reqs]
    assert heads[0] == heads[1] == heads[2] != heads[3] == heads[4] == heads[5]


@pytest.mark.parametrize("kwargs, needle", [
    ({"num_prefixes": 11}, "fewer than num_prefixes=11"),
    ({"prefix_len": 0, "suffix_len": 0}, "empty prompt"),
    ({"output_len": -1}, "output_len"),
    ({"suffix_len": 2.5}, "suffix_len"),
    ({"max_model_len": 600}, "max_model_len=600"),
    ({"max_total_tokens": 6000}, "above the token budget 6000"),
])
def test_prefix_repetition_bad_args(kwargs, needle):
    with pytest.raises(WorkloadError, match=needle):
        prefix_repetition(_load(10), **kwargs)
