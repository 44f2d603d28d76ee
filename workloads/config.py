"""A workload description as plain data (the sweep's ``workload`` node, resolved to a dict)
turned into requests: the one map from its keys to the generators and readers.

``KIND_KEYS`` says which keys each ``kind`` (and each trace ``format``) reads; the sweep's
validator refuses a key set for a kind that ignores it. ``build`` checks nothing the
generators do not check themselves (their ``WorkloadError`` names the argument; the sweep's
validator has named the config key before).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.workload import RequestSpec
from workloads.arrivals import Load
from workloads.csv_traces import read_azure, read_burstgpt
from workloads.errors import WorkloadError
from workloads.inference_perf import shared_prefix
from workloads.jsonl import read_jsonl
from workloads.mooncake import read_mooncake
from workloads.replay import Replay, scaled
from workloads.synthetic import synthetic_requests
from workloads.vllm_datasets import prefix_repetition, vllm_random

KINDS = ("synthetic", "shared_prefix", "vllm_random", "prefix_repetition", "trace")
FORMATS = ("jsonl", "azure", "burstgpt", "mooncake")
LOAD_KEYS = ("rate", "arrival", "cv", "num_requests", "duration_s", "stages")
REPLAY_KEYS = ("limit", "start_s", "duration_s", "time_scale", "rate_scale")
# The keys each kind reads besides ``kind`` and ``seed`` (the router's seed on every kind).
KIND_KEYS: dict[str, tuple[str, ...]] = {
    "synthetic": (*LOAD_KEYS, "input_len", "output_len", "shared_prefix_len",
                  "num_prefix_groups"),
    "shared_prefix": (*LOAD_KEYS, "num_groups", "num_prompts_per_group", "system_prompt_len",
                      "question_len", "output_len", "shuffle"),
    "vllm_random": (*LOAD_KEYS, "input_len", "output_len", "range_ratio", "prefix_len",
                    "num_special_tokens"),
    "prefix_repetition": (*LOAD_KEYS, "prefix_len", "suffix_len", "num_prefixes",
                          "output_len", "shuffle"),
    "trace": ("path", "format", *REPLAY_KEYS, "models", "hash_block_size"),
}
# Trace keys that only some formats read.
FORMAT_KEYS: dict[str, tuple[str, ...]] = {
    "jsonl": ("limit", "time_scale", "rate_scale"),
    "azure": REPLAY_KEYS,
    "burstgpt": (*REPLAY_KEYS, "models"),
    "mooncake": (*REPLAY_KEYS, "hash_block_size"),
}


def load_of(wl: Mapping[str, Any]) -> Load:
    """The arrival process a generator kind reads."""
    stages = tuple(wl.get("stages") or ())
    return Load(
        rate=None if stages else wl["rate"],
        arrival=wl["arrival"],
        cv=wl["cv"],
        num_requests=None if stages else wl["num_requests"],
        duration_s=None if stages else wl["duration_s"],
        stages=stages,
        who="workload",
    )


def replay_of(wl: Mapping[str, Any]) -> Replay:
    return Replay(limit=wl.get("limit"), start_s=wl.get("start_s", 0.0),
                  duration_s=wl.get("duration_s"), time_scale=wl.get("time_scale", 1.0),
                  rate_scale=wl.get("rate_scale", 1.0))


def build(wl: Mapping[str, Any], vocab_size: int) -> list[RequestSpec]:
    """The requests ``wl`` describes (``path`` already absolute); ``vocab_size`` is the
    model's, the range generated prompt ids are drawn from."""
    kind, seed = wl["kind"], wl["seed"]
    if kind == "trace":
        fmt, path = wl["format"], wl["path"]
        if fmt == "jsonl":
            replay = Replay(time_scale=wl["time_scale"], rate_scale=wl["rate_scale"])
            return scaled(read_jsonl(path, limit=wl["limit"]), replay)
        if fmt == "azure":
            return read_azure(path, replay_of(wl))
        if fmt == "burstgpt":
            return read_burstgpt(path, replay_of(wl), models=tuple(wl["models"]))
        if fmt == "mooncake":
            return read_mooncake(path, replay_of(wl), hash_block_size=wl["hash_block_size"])
        raise WorkloadError(f"workload.format={fmt!r}: use one of {list(FORMATS)}")
    load = load_of(wl)
    if kind == "synthetic":
        return synthetic_requests(
            load, wl["input_len"], wl["output_len"], seed, wl["shared_prefix_len"],
            wl["num_prefix_groups"], vocab_size)
    if kind == "shared_prefix":
        return shared_prefix(
            load, wl["num_groups"], wl["num_prompts_per_group"], wl["system_prompt_len"],
            wl["question_len"], wl["output_len"], seed, vocab_size, wl["shuffle"])
    if kind == "vllm_random":
        return vllm_random(
            load, wl["input_len"], wl["output_len"], wl["range_ratio"], wl["prefix_len"],
            wl["num_special_tokens"], seed, vocab_size)
    if kind == "prefix_repetition":
        return prefix_repetition(
            load, wl["prefix_len"], wl["suffix_len"], wl["num_prefixes"], wl["output_len"],
            seed, vocab_size, wl["shuffle"])
    raise WorkloadError(f"workload.kind={kind!r}: use one of {list(KINDS)}")
