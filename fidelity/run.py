"""Run the differential cases and write the report (``docs/fidelity.md``).

    venv="$(bash scripts/install_fidelity.sh)" && "$venv/bin/python" -m fidelity.run

Options: ``--cases full|fast|NAME[,NAME...]`` (default ``full``), ``--jobs N`` (cases run in
parallel processes, default 2), ``--out PATH`` (default ``docs/fidelity.md``; ``-`` prints
the report instead), ``--save PATH`` (also pickle the results), ``--render PATH`` (write the
report from pickled results without running anything). Exits 1 when any case diverges or
stalls, 2 when vLLM is not importable.
"""

from __future__ import annotations

import argparse
import pickle
import platform
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from fidelity.cases import REPO_ROOT, Case, fast_cases, full_cases
from fidelity.diff import CaseResult, run_case
from fidelity.sides import OursSide, VllmSide, vllm_available

DEFAULT_OUT = REPO_ROOT / "docs" / "fidelity.md"


def run_one(case: Case) -> tuple[Case, CaseResult, int]:
    """Build the case's workload and drive both sides (runs in a worker process)."""
    specs = case.specs()
    res = run_case(
        case.name,
        case.cfg,
        specs,
        OursSide,
        VllmSide,
        step_ns=case.step_ns,
        free_queue_every=case.free_queue_every,
    )
    return case, res, len(specs)


def _settings(case: Case) -> str:
    c = case.cfg
    parts = [
        f"blocks {c.num_blocks}",
        f"seqs {c.max_num_seqs}",
        f"budget {c.max_num_batched_tokens}",
    ]
    if c.long_prefill_token_threshold:
        parts.append(f"lpt {c.long_prefill_token_threshold}")
    if not c.reserve_full_isl:
        parts.append("full-ISL off")
    if not c.enable_chunked_prefill:
        parts.append("chunked prefill off")
    if not c.enable_prefix_caching:
        parts.append("prefix caching off")
    if c.max_model_len not in (131072, 40960):
        parts.append(f"max_model_len {c.max_model_len}")
    if c.block_size != 16:
        parts.append(f"block {c.block_size}")
    parts.append("async" if c.async_scheduling else "sync")
    return ", ".join(parts)


def _short(value: object, limit: int = 700) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f" … ({len(text)} chars)"


def _git_head() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


METHOD = """\
## Method

Both schedulers get the same request stream, the same settings and the same fake model,
and are stepped in lockstep by one driver (`fidelity/diff.py`):

- **vLLM side**: the unmodified `vllm==0.19.1` wheel: `Scheduler` (sync) or `AsyncScheduler`
  (async) over its `KVCacheManager`/`BlockPool`, built from a `VllmConfig` whose model folder
  holds only a tiny Llama `config.json` (`skip_tokenizer_init`, no weights), a
  `KVCacheConfig` with one full-attention group of `num_blocks` blocks (block 0 = null),
  FCFS, prefix caching on (off where the settings say so), hash `sha256`. Requests are `vllm.v1.request.Request` with
  `SamplingParams(max_tokens=output_len, ignore_eos=True)` and vLLM's request block hasher.
- **Our side**: `engine.scheduler.Scheduler` over `engine.kv_cache.KVCacheManager`.
- **Fake model**: after each step, every scheduled request whose prefill is complete
  (`not is_prefill_chunk` / our `samples`) gets exactly one token: its next id from the
  workload (the replay files' `output_tok_ids`, or the engine's synthetic ids), so prefix
  hashing over generated tokens is the same on both sides.
- **Engine loop**: vLLM's `EngineCore.step` (sync, depth 1) or `step_with_batch_queue`
  (async, depth 2: step k+1 is scheduled before step k's output is applied), both sides
  with their own `has_requests()`. A tick is one GPU step: loop calls that return without
  waiting on the GPU (a schedule while the queue has room; popping a batch that ran
  nothing, such as vLLM's empty batch that flushes finished ids) repeat within the tick.
  Tick k stands for k · 30 ms; request i is added before the first call at or after its
  `arrival_time_ns`; idle stretches jump to the next arrival.
- **Compared on every tick**, field by field with `==`: the scheduled requests in schedule
  order with their token counts and computed-tokens-before-the-step; which of them sample a
  token; the preempted ids; for each admitted (new or resumed) request its prefix-hit
  tokens and `num_cached_tokens`; the block ids appended to each scheduled request's block
  table (its whole table on admission), so block tables are compared id for id; the
  free-block count and KV usage after `schedule()` and after `update_from_output()`;
  which requests finished; the running and waiting queues in order; and, every
  `free_queue_every` ticks and at the end, the whole free-block queue (LRU order), every
  block's ref count, and the prefix-cache index (which block ids carry a common hash, in
  lookup order; the hash functions differ, the grouping must not). Records of
  empty batches are dropped (vLLM schedules one empty batch after requests finish, to flush
  their ids). A tick is *compared* when either side did something, *identical* when every
  field matches. Totals (tokens, preemptions, prefix-cache queries/hits summed over every
  lookup, first and preempted) are compared at the end.
- **Workloads**: the three `sharegpt-*-300-sps10` replays; `prefix` = `workload_me2_01_mixed`'s
  arrivals and clipped lengths with explicit ids: 6 shared system prompts (300–3000 tokens)
  and 40 multi-turn sessions (next prompt = previous prompt + reply + new user message), see
  `fidelity/cases.py`.
"""


COVERAGE = """\
## What this covers, and what it does not

Covered (vLLM 0.19.1 paths exercised by the cases above): FCFS two-phase scheduling with
chunked prefill, and without it (a prompt that does not fit the remaining budget stops
admission); the token budget split and partial last chunks; prefix caching off; `max_num_seqs`;
`long_prefill_token_threshold` on running and waiting requests; `max_model_len` caps
(`max_model_len − 1 − num_computed_tokens` and LENGTH_CAPPED finishes); recompute
preemption from the tail of `running`, several victims per request and self-preemption; no
admission in a step that preempted; head-of-line blocking; the full-ISL admission gate on
and off; prefix caching with the `num_tokens − 1` cap, block-granular hits, hits on blocks
filled with output tokens (multi-turn), same-step sharing, duplicate cached blocks, hit
blocks on the free list counted against free capacity, LRU eviction on allocation,
tail-first frees; the null block; usage; prefix-cache query/hit statistics (including
repeated lookups of blocked requests); requests that finish on their first token; block
sizes 8, 16 and 32 (the `fuzz-*` cases: 200 random small configurations and streams);
`AsyncScheduler` with its placeholders, the max-tokens skip rule, outputs of requests
preempted in flight (and requests finishing while preempted), and the depth-2 batch queue.
Self-preemption, several victims for one allocation and same-step sharing were confirmed
present by instrumenting our engine's calls (e.g. `llama-tight400-sync`, `fuzz-3`,
`repeats-sync`); the other corner cases are counted in the table above.

Not covered (our engine does not model these, or the harness does not drive them):
the `priority` policy; speculative decoding; KV connectors (offloading, LMCache, P/D;
our `engine/kv_tiers.py` lower tiers); EOS or stop-token finishes (the replays use `ignore_eos`
semantics: every request runs to its recorded output length); aborts; structured output;
encoder/multimodal inputs; hybrid/sliding-window KV groups; pipeline and data parallelism
in the engine loop. Time does not enter: the step durations of the latency model are not
compared here.

The harness drives our `Scheduler` with vLLM's engine-core loop. The simulator's own loop
(`engine.instance.EngineUnit` under `engine.cluster.run_cluster`'s event clock) is checked
against the harness's by `tests/fidelity/test_engine_loop.py`, which needs no vLLM and runs
in the default CI: with every step lasting one tick and arrivals on tick boundaries, both
loops make the same decisions (requests, token counts, preemptions) at the same ticks, for
40 fuzz configurations and the repeats workload, sync and async.

Engine-loop note: vLLM's `has_requests()` stays true while ids of finished requests await
their flush, so after requests finish it schedules one empty batch; our scheduler does not
(`engine/instance.py` likewise launches no empty batch). Such a batch runs nothing on the
GPU and its output is ready at once, so vLLM's loop goes straight on; the harness models it
so, and the non-empty step sequences agree. (A first version of the harness that let an
empty batch end a tick reported four spurious async divergences in the fuzz set, all of this
kind.)

Self-checks (`tests/fidelity/test_differential.py`): a side compared with itself is
identical on every tick; a side that reports one token more from its third step on is
reported at exactly that step; and four bugs injected into our engine (head-first frees, no
`num_tokens − 1` hit cap, preempted requests requeued at the back, the full-ISL gate
ignored) are each caught against vLLM.
"""


def render(
    results: list[tuple[Case, CaseResult, int]], env: dict[str, str], selection: str
) -> str:
    lines: list[str] = []
    add = lines.append
    n_ok = sum(1 for _, r, _ in results if r.all_identical)
    add("# Scheduler fidelity: step-for-step differential against vLLM 0.19.1")
    add("")
    add(
        "Written by `fidelity/run.py` (issue 5). Reproduce with one command from the "
        "repository root:"
    )
    add("")
    add("```")
    add('venv="$(bash scripts/install_fidelity.sh)" && "$venv/bin/python" -m fidelity.run')
    add("```")
    add("")
    add(
        "`scripts/install_fidelity.sh` builds the venv outside the checkout, at "
        "`${FIDELITY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/servesweep/venv-fidelity-0.19.1}` "
        "(about 3.5 GB), reuses it while its stamp file matches the script's pins, installs "
        "this checkout into it (editable) and prints its path."
    )
    add("")
    add(
        "The fast subset also runs under pytest (`tests/fidelity/test_differential.py`, "
        "skipped when vLLM is not importable; `.ci/run` runs it), and `-m slow` adds the full set:"
    )
    add("`\"$venv/bin/python\" -m pytest -q -p no:cacheprovider tests/fidelity -m 'slow or not slow'`.")
    add("")
    add("## Last run")
    add("")
    for k, v in env.items():
        add(f"- {k}: {v}")
    add(f"- cases: {selection} ({len(results)}); identical on every tick: **{n_ok}/{len(results)}**")
    add("")
    add(
        "| case | workload | settings | requests | ticks compared | ticks identical | "
        "first divergence | preemptions (ours / vLLM) | prefix hit tokens, all lookups (ours / vLLM) | "
        "mean TTFT ticks (ours / vLLM) |"
    )
    add("|---|---|---|---:|---:|---:|---|---|---|---|")
    for case, r, n in results:
        first = "none" if r.divergence is None else f"tick {r.divergence.tick}"
        if r.stalled:
            first += " (stalled)"
        pre = r.totals.get("preemptions", ("?", "?"))
        pq = r.totals.get("prefix (queries, hits)", ((0, "?"), (0, "?")))
        tt = r.totals.get("mean TTFT (ticks)", ("?", "?"))
        add(
            f"| {case.name} | {case.workload}{'' if case.limit is None else f'[:{case.limit}]'} "
            f"| {_settings(case)} | {n} | {r.compared} | {r.identical} | {first} "
            f"| {pre[0]} / {pre[1]} | {pq[0][1]} / {pq[1][1]} | {tt[0]} / {tt[1]} |"
        )
    add("")
    add("## Divergences")
    add("")
    diverged = [(c, r) for c, r, _ in results if not r.all_identical or r.notes]
    if not diverged:
        add("None: every case was identical on every compared tick, and end totals agree.")
        add("")
    for case, r in diverged:
        add(f"### {case.name}")
        add("")
        add(f"{case.what}; {_settings(case)}.")
        add("")
        for note in r.notes:
            add(f"- note: {note}")
        if r.field_mismatches:
            add(
                "- ticks with a mismatch, per field: "
                + ", ".join(f"`{k}` {v}" for k, v in sorted(r.field_mismatches.items()))
            )
        d = r.divergence
        if d is not None:
            add(f"- first divergence at tick {d.tick}, fields: {', '.join(f'`{f}`' for f in d.fields)}")
            for f in d.fields:
                add(f"  - `{f}` ours: `{_short(d.ours[f])}`")
                add(f"  - `{f}` vLLM: `{_short(d.vllm[f])}`")
            add(f"- state after the tick, ours: `{_short(d.state_ours, 1500)}`")
            add(f"- state after the tick, vLLM: `{_short(d.state_vllm, 1500)}`")
        for key, (a, b) in r.totals.items():
            if a != b:
                add(f"- end total `{key}`: ours {a}, vLLM {b}")
        add("")
    add("## End totals")
    add("")
    add("| case | tokens scheduled | tokens sampled | prefix queries | finished | wall s |")
    add("|---|---|---|---|---|---:|")
    for case, r, _ in results:
        t = r.totals

        def pair(key: str, idx: int | None = None, t: dict = t) -> str:
            a, b = t.get(key, ("?", "?"))
            if idx is not None:
                a, b = a[idx], b[idx]
            return f"{a}" if a == b else f"{a} ≠ {b}"

        add(
            f"| {case.name} | {pair('tokens scheduled')} | {pair('tokens sampled')} "
            f"| {pair('prefix (queries, hits)', 0)} | {pair('requests finished')} "
            f"| {r.seconds:.1f} |"
        )
    add("")
    keys = list(dict.fromkeys(k for _, r, _ in results for k in r.events))
    if keys:
        add("## Corner cases exercised (counted on our side)")
        add("")
        add("| case | " + " | ".join(keys) + " |")
        add("|---|" + "---:|" * len(keys))
        for case, r, _ in results:
            add(f"| {case.name} | " + " | ".join(str(r.events.get(k, 0)) for k in keys) + " |")
        add("")
    add(_ttft_section(results))
    add(METHOD)
    add(COVERAGE)
    return "\n".join(lines).rstrip() + "\n"


def _ttft_section(results: list[tuple[Case, CaseResult, int]]) -> str:
    """Sync vs async pairs: what vLLM's one-step lag does to TTFT (in steps, vLLM side)."""
    by_name = {c.name: r for c, r, _ in results}
    ttfts = [r.totals.get("mean TTFT (ticks)") for _, r, _ in results]
    same = (
        "identical in every case"
        if all(t is not None and t[0] == t[1] for t in ttfts)
        else "they differ where the cases diverge"
    )
    rows = []
    for c, r, _ in results:
        if not c.name.endswith("-sync"):
            continue
        other = by_name.get(c.name[: -len("-sync")] + "-async")
        if other is None:
            continue
        a = r.totals.get("mean TTFT (ticks)")
        b = other.totals.get("mean TTFT (ticks)")
        if a and b:
            rows.append(f"| {c.name[: -len('-sync')]} | {a[1]} | {b[1]} | {b[1] - a[1]:+.3f} |")
    if not rows:
        return ""
    head = [
        "## Async scheduling and TTFT",
        "",
        "Mean TTFT in steps (the tick whose `update_from_output` applies the first token, "
        "minus the arrival tick) on the vLLM side; our engine's numbers are in the summary "
        f"table ({same}). In this step-count model async scheduling costs no step on an idle "
        "engine: the prefill and the first decode are scheduled together, and the prefill's "
        "output is applied when that GPU step ends, as in sync mode. Under load it costs about "
        "one step: each schedule runs one step ahead of the GPU, so a request admitted while "
        "a step is in flight is prefilled after that step; and a request that finishes frees "
        "its slot and blocks for the schedule after the one already made, which delays "
        "admissions when the engine is full (more in the KV-bound cases). What async buys "
        "back, the host work of a step hidden behind the GPU, has no price here; it lives in "
        "the engine's timing model (`step_overhead_*`).",
        "",
        "| case | sync | async | async − sync |",
        "|---|---:|---:|---:|",
    ]
    return "\n".join(head + rows) + "\n"


def select(spec: str) -> list[Case]:
    if spec == "full":
        return full_cases()
    if spec == "fast":
        return fast_cases()
    known = {c.name: c for c in full_cases() + fast_cases()}
    names = [s for s in spec.split(",") if s]
    missing = [s for s in names if s not in known]
    if missing:
        raise SystemExit(f"unknown case(s) {missing}; known: {sorted(known)}")
    return [known[s] for s in names]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="full")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--save", default=None, help="pickle (results, env, selection) here")
    ap.add_argument("--render", default=None, help="render the report from a --save file")
    args = ap.parse_args(argv)
    if args.render:
        with open(args.render, "rb") as fh:
            results, env, selection = pickle.load(fh)
        return _write(render(results, env, selection), args.out, results)
    ok, why = vllm_available()
    if not ok:
        print(f"{why}; run `bash scripts/install_fidelity.sh` first", file=sys.stderr)
        return 2
    cases = select(args.cases)
    results: list[tuple[Case, CaseResult, int]] = []
    if args.jobs > 1 and len(cases) > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for case, res, n in pool.map(run_one, cases):
                results.append((case, res, n))
                print(_progress(case, res), flush=True)
    else:
        for case in cases:
            case, res, n = run_one(case)
            results.append((case, res, n))
            print(_progress(case, res), flush=True)
    import torch
    import vllm

    env = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "servesweep commit": _git_head(),
        "vLLM": vllm.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if args.save:
        with open(args.save, "wb") as fh:
            pickle.dump((results, env, args.cases), fh)
    return _write(render(results, env, args.cases), args.out, results)


def _write(report: str, out: str, results: list[tuple[Case, CaseResult, int]]) -> int:
    if out == "-":
        print(report)
    else:
        Path(out).write_text(report)
        print(f"wrote {out}")
    return 0 if all(r.all_identical for _, r, _ in results) else 1


def _progress(case: Case, r: CaseResult) -> str:
    first = "identical" if r.divergence is None else f"first divergence at tick {r.divergence.tick}"
    return f"{case.name}: {r.identical}/{r.compared} ticks identical, {first} ({r.seconds:.0f}s)"


if __name__ == "__main__":
    raise SystemExit(main())
