"""The differential cases: workloads and scheduler settings.

Workloads come from the shared replay files (``$SERVESWEEP_DATA`` or ``../shared/data``):

- the three ``sharegpt-*-300-sps10`` replays (token ids for prompt and output) that the
  ground-truth vLLM runs replayed;
- a prefix-heavy stream built from ``workload_me2_01_mixed.jsonl``. That file holds lengths
  and arrivals only (no token ids), so its requests would never share a block; we keep its
  arrivals and (clipped) lengths and give the requests explicit ids: a few shared system
  prompts, and multi-turn sessions whose next prompt is the previous prompt + reply + a new
  user message, so later turns hit blocks filled by earlier outputs.

Every request carries explicit output ids (the file's, or ``synthetic_output_ids``) so both
sides hash the same generated tokens.

Block counts for the "recorded settings" cases are estimates of what vLLM 0.19 gets on the
96 GB RTX PRO 6000 at ``gpu_memory_utilization = 0.9`` (0.9 · 96 GiB − weights − about 2 GiB
of activations and context, divided by the per-block KV bytes of all layers of a rank):
Llama-3.1-8B ≈ 34 000, Qwen3-32B TP2 ≈ 26 000 per rank, Qwen3-30B-A3B ≈ 19 000 per rank. At
these sizes the 300-request replays never run short of blocks, so the exact count matters
little; the tight cases use a few hundred blocks.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace
from pathlib import Path

from engine.request import synthetic_output_ids
from engine.workload import RequestSpec
from fidelity.sides import SchedConfig
from workloads.jsonl import read_jsonl

REPO_ROOT = Path(__file__).resolve().parents[1]

LLAMA = "sharegpt-llama-3.1-8b-300-sps10.jsonl"
QWEN32 = "sharegpt-qwen3-32b-300-sps10.jsonl"
QWEN30 = "sharegpt-qwen3-30b-a3b-300-sps10.jsonl"
ME2 = "workload_me2_01_mixed.jsonl"


def data_dir() -> Path:
    """``$SERVESWEEP_DATA`` or ``../shared/data`` beside the repository."""
    return Path(os.environ.get("SERVESWEEP_DATA", REPO_ROOT.parent / "shared" / "data"))


def workload_path(name: str) -> Path:
    return data_dir() / "llmservingsim" / "workloads" / name


def with_output_ids(specs: list[RequestSpec]) -> list[RequestSpec]:
    """Give every request explicit output ids (the engine's synthetic ones when absent)."""
    out = []
    for i, s in enumerate(specs):
        if s.output_ids is None or len(s.output_ids) < s.output_len:
            s = replace(s, output_ids=synthetic_output_ids(i, s.output_len))
        out.append(s)
    return out


def replay(name: str, limit: int | None = None) -> list[RequestSpec]:
    """A shared replay file (first ``limit`` requests), sorted by arrival."""
    return with_output_ids(read_jsonl(workload_path(name), limit=limit))


def prefix_heavy(
    limit: int = 200,
    *,
    seed: int = 5,
    num_system_prompts: int = 6,
    num_sessions: int = 40,
    max_prompt: int = 6000,
) -> list[RequestSpec]:
    """Prefix-heavy traffic on ``workload_me2_01_mixed.jsonl``'s arrivals and lengths.

    Request ``i`` (in arrival order) belongs to session ``i % num_sessions``, which uses
    system prompt ``session % num_system_prompts`` (300–3000 tokens). Its prompt is the
    system prompt, then the session's history (earlier user messages and replies, ids
    included), then a new user message of ``clip(input_toks // 8, 16, 1024)`` tokens; the
    reply has ``clip(output_toks, 8, 512)`` tokens. A session whose prompt would exceed
    ``max_prompt`` tokens starts over (empty history). Deterministic for a given seed.
    """
    base = read_jsonl(workload_path(ME2), limit=limit)
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 32000) for _ in range(n)]

    sys_lens = [300, 600, 1000, 1500, 2000, 3000]
    systems = [ids(sys_lens[g % len(sys_lens)]) for g in range(num_system_prompts)]
    history: dict[int, list[int]] = {}
    out: list[RequestSpec] = []
    for i, spec in enumerate(base):
        sess = i % num_sessions
        user = ids(min(max(spec.prompt_len // 8, 16), 1024))
        reply = ids(min(max(spec.output_len, 8), 512))
        hist = history.get(sess, [])
        system = systems[sess % num_system_prompts]
        if len(system) + len(hist) + len(user) > max_prompt:
            hist = []
        prompt = system + hist + user
        history[sess] = hist + user + reply
        out.append(
            RequestSpec(f"p{i}", spec.arrival_ns, tuple(prompt), len(reply), tuple(reply))
        )
    return out


def repeats(limit: int = 150, *, seed: int = 7, num_prompts: int = 12) -> list[RequestSpec]:
    """Exact repeats: ``limit`` requests, one every 20 ms, each drawing one of
    ``num_prompts`` prompts whose lengths are multiples of the block size (16–1024 tokens),
    with 1–6 output tokens (the same ids for the same prompt). Exercises full-prompt hits
    (the last block is recomputed, and a duplicate cached block appears), same-step sharing,
    and requests that finish on their first token."""
    rng = random.Random(seed)
    prompts = [
        tuple(rng.randrange(100, 32000) for _ in range(16 * rng.randint(1, 64)))
        for _ in range(num_prompts)
    ]
    replies = [tuple(rng.randrange(100, 32000) for _ in range(6)) for _ in range(num_prompts)]
    out: list[RequestSpec] = []
    for i in range(limit):
        k = rng.randrange(num_prompts)
        n_out = rng.randint(1, 6)
        out.append(RequestSpec(f"d{i}", i * 20_000_000, prompts[k], n_out, replies[k][:n_out]))
    return out


def short_prompts(name: str, max_prompt: int, limit: int | None = None) -> list[RequestSpec]:
    """A replay file keeping only requests whose prompt has at most ``max_prompt`` tokens."""
    return [s for s in replay(name, limit) if s.prompt_len <= max_prompt]


def fuzz_workload(seed: int) -> tuple[dict[str, object], list[RequestSpec]]:
    """A small random scheduler configuration and request stream (deterministic per seed).

    Settings: block size 8/16/32, token budget 16–512, ``max_num_seqs`` 1–64 (at most the
    budget), ``long_prefill_token_threshold`` 0/8/24/100, full-ISL gate on/off, async on/off,
    ``max_model_len`` 4096 or 256, prefix caching off in ~15 % of seeds, chunked prefill off
    in ~20 % of seeds with a budget of 64 or more (``max_model_len`` = budget then). Requests (20–60) arrive in bursts; each prompt is one of
    a few shared prefixes (of any length, block-aligned or not) plus a random tail, or an
    exact repeat of an earlier prompt; outputs are 1–40 tokens. The block count lies between
    what the longest request needs alone and four times that, so pressure varies from none
    to constant preemption.
    """
    rng = random.Random(seed)
    bs = rng.choice([8, 16, 16, 32])
    budget = rng.choice([16, 32, 64, 128, 512])
    seqs = min(budget, rng.choice([1, 2, 4, 16, 64]))
    max_len = rng.choice([4096, 4096, 256])
    caching = rng.random() < 0.85
    chunked = not (budget >= 64 and rng.random() < 0.2)
    if not chunked:
        max_len = budget  # vLLM requires max_num_batched_tokens >= max_model_len then
    prefixes = [
        [rng.randrange(100, 32000) for _ in range(rng.randint(1, 200))]
        for _ in range(rng.randint(1, 4))
    ]
    specs: list[RequestSpec] = []
    t = 0
    for i in range(rng.randint(20, 60)):
        if rng.random() < 0.5:
            t += rng.randrange(0, 200_000_000)
        if specs and rng.random() < 0.15:
            prompt = list(rng.choice(specs).prompt_ids)
        else:
            prompt = list(rng.choice(prefixes)) + [
                rng.randrange(100, 32000) for _ in range(rng.randint(0, 300))
            ]
        prompt = prompt[: min(len(prompt), max_len - 2)] or [1]
        n_out = rng.randint(1, 40)
        specs.append(
            RequestSpec(
                f"f{i}",
                t,
                tuple(prompt),
                n_out,
                tuple(rng.randrange(100, 32000) for _ in range(n_out)),
            )
        )
    need = max(-(-min(s.prompt_len + s.output_len, max_len) // bs) for s in specs)
    settings: dict[str, object] = {
        "num_blocks": 1 + need + rng.randint(0, 3 * need),
        "block_size": bs,
        "max_num_batched_tokens": budget,
        "max_num_seqs": seqs,
        "max_model_len": max_len,
        "long_prefill_token_threshold": rng.choice([0, 0, 8, 24, 100]),
        "reserve_full_isl": rng.random() < 0.6,
        "async_scheduling": rng.random() < 0.5,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": caching,
    }
    return settings, specs


@dataclass(frozen=True, slots=True)
class Case:
    """One differential run: a workload (by builder name and size) and the settings."""

    name: str
    workload: str  # llama | qwen32 | qwen30 | prefix | repeats | llama-short | fuzz:<seed>
    cfg: SchedConfig
    limit: int | None = None
    step_ns: int = 30_000_000
    free_queue_every: int = 0
    what: str = ""

    def specs(self) -> list[RequestSpec]:
        if self.workload == "prefix":
            return prefix_heavy(self.limit or 200)
        if self.workload == "repeats":
            return repeats(self.limit or 150)
        if self.workload.startswith("fuzz:"):
            return fuzz_workload(int(self.workload[5:]))[1]
        if self.workload == "llama-short":
            return short_prompts(LLAMA, 1000, self.limit)
        files = {"llama": LLAMA, "qwen32": QWEN32, "qwen30": QWEN30}
        return replay(files[self.workload], self.limit)


def _cfg(num_blocks: int, **kw: object) -> SchedConfig:
    return SchedConfig(num_blocks=num_blocks, **kw)  # type: ignore[arg-type]


LLAMA_BLOCKS, QWEN32_BLOCKS, QWEN30_BLOCKS = 34_000, 26_000, 19_000
LLAMA_LEN, QWEN_LEN = 131_072, 40_960


def fuzz_case(seed: int) -> Case:
    settings, _ = fuzz_workload(seed)
    cfg = SchedConfig(**settings)  # type: ignore[arg-type]
    return Case(f"fuzz-{seed}", f"fuzz:{seed}", cfg, free_queue_every=1,
                what="random small configuration and stream")


FUZZ_SEEDS_FULL = range(200)
FUZZ_SEEDS_FAST = range(12)


def full_cases() -> list[Case]:
    """Every case of issue 5; the report runs these."""
    cases: list[Case] = []
    for wl, blocks, mlen in (
        ("llama", LLAMA_BLOCKS, LLAMA_LEN),
        ("qwen32", QWEN32_BLOCKS, QWEN_LEN),
        ("qwen30", QWEN30_BLOCKS, QWEN_LEN),
    ):
        for asyn in (False, True):
            cases.append(
                Case(
                    f"{wl}-recorded-{'async' if asyn else 'sync'}",
                    wl,
                    _cfg(blocks, max_model_len=mlen, async_scheduling=asyn),
                    free_queue_every=500,
                    what="300-request replay at the recorded settings (128 seqs, 2048 tokens)",
                )
            )
    for asyn in (False, True):
        tag = "async" if asyn else "sync"
        cases += [
            Case(f"llama-tight400-{tag}", "llama", _cfg(400, async_scheduling=asyn),
                 free_queue_every=1, what="400 blocks: preemption and recompute"),
            Case(f"qwen32-tight600-{tag}", "qwen32", _cfg(600, async_scheduling=asyn),
                 free_queue_every=1, what="600 blocks: preemption and recompute"),
            Case(f"llama-tight400-noisl-{tag}", "llama",
                 _cfg(400, reserve_full_isl=False, async_scheduling=asyn),
                 free_queue_every=1, what="400 blocks, reserve_full_isl off"),
            Case(f"prefix-{tag}", "prefix", _cfg(8000, async_scheduling=asyn),
                 free_queue_every=50, what="shared system prompts + multi-turn sessions"),
            Case(f"prefix-tight500-{tag}", "prefix", _cfg(500, async_scheduling=asyn),
                 free_queue_every=1, what="prefix-heavy, 500 blocks: eviction of cached blocks"),
            Case(f"prefix-tight500-noisl-{tag}", "prefix",
                 _cfg(500, reserve_full_isl=False, async_scheduling=asyn),
                 free_queue_every=1, what="prefix-heavy, 500 blocks, reserve_full_isl off"),
            Case(f"llama-budget256-{tag}", "llama",
                 _cfg(LLAMA_BLOCKS, max_num_batched_tokens=256, async_scheduling=asyn),
                 limit=120, free_queue_every=200, what="chunked prefill, 256-token budget"),
            Case(f"llama-budget64-seqs32-{tag}", "llama",
                 _cfg(2000, max_num_batched_tokens=64, max_num_seqs=32, async_scheduling=asyn),
                 limit=60, free_queue_every=20, what="64-token budget, 32 seqs, 2000 blocks"),
            Case(f"llama-lpt256-{tag}", "llama",
                 _cfg(LLAMA_BLOCKS, long_prefill_token_threshold=256, async_scheduling=asyn),
                 free_queue_every=200, what="long_prefill_token_threshold 256"),
            Case(f"prefix-lpt128-tight800-{tag}", "prefix",
                 _cfg(800, long_prefill_token_threshold=128, max_num_batched_tokens=512,
                      async_scheduling=asyn),
                 free_queue_every=1, what="prefix-heavy, threshold 128, budget 512, 800 blocks"),
            Case(f"llama-seqs8-{tag}", "llama", _cfg(LLAMA_BLOCKS, max_num_seqs=8,
                                                       async_scheduling=asyn),
                 limit=80, free_queue_every=200, what="max_num_seqs 8"),
            Case(f"repeats-{tag}", "repeats", _cfg(2000, max_num_batched_tokens=512,
                                                    async_scheduling=asyn),
                 free_queue_every=1, what="exact repeats, full-prompt hits, 1–6 outputs"),
            Case(f"repeats-tight80-{tag}", "repeats", _cfg(80, max_num_batched_tokens=256,
                                                            async_scheduling=asyn),
                 free_queue_every=1, what="exact repeats, 80 blocks"),
            Case(f"llama-maxlen1024-{tag}", "llama-short",
                 _cfg(3000, max_model_len=1024, async_scheduling=asyn),
                 free_queue_every=10, what="max_model_len 1024: outputs capped by the length"),
            Case(f"llama-nochunk-{tag}", "llama-short",
                 _cfg(3000, max_model_len=1024, max_num_batched_tokens=1024,
                      enable_chunked_prefill=False, async_scheduling=asyn),
                 free_queue_every=10, what="chunked prefill off (budget = max_model_len 1024)"),
            Case(f"llama-nocache-tight400-{tag}", "llama",
                 _cfg(400, enable_prefix_caching=False, async_scheduling=asyn),
                 free_queue_every=1, what="prefix caching off, 400 blocks"),
            Case(f"qwen32-seqs16-tight380-{tag}", "qwen32",
                 _cfg(380, max_num_seqs=16, max_num_batched_tokens=512, async_scheduling=asyn),
                 limit=100, free_queue_every=1, what="16 seqs, budget 512, 380 blocks"),
        ]
    cases += [fuzz_case(seed) for seed in FUZZ_SEEDS_FULL]
    return cases


def fast_cases() -> list[Case]:
    """A few-second subset for the default pytest run (when vLLM is installed)."""
    return [
        Case("fast-llama-tight320-sync", "llama", _cfg(320, max_num_batched_tokens=256),
             limit=40, free_queue_every=1, what="40 requests, 320 blocks, budget 256"),
        Case("fast-llama-tight320-async", "llama",
             _cfg(320, max_num_batched_tokens=256, async_scheduling=True),
             limit=40, free_queue_every=1, what="as above, async scheduling"),
        Case("fast-prefix-tight500-sync", "prefix",
             _cfg(500, max_num_batched_tokens=512, long_prefill_token_threshold=200),
             limit=60, free_queue_every=1, what="60 prefix-heavy requests, 500 blocks"),
        Case("fast-prefix-noisl-async", "prefix",
             _cfg(500, reserve_full_isl=False, async_scheduling=True),
             limit=60, free_queue_every=1, what="prefix-heavy, full-ISL gate off, async"),
        *(fuzz_case(seed) for seed in FUZZ_SEEDS_FAST),
    ]
