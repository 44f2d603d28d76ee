"""``vllm bench serve`` result files: read one as ground truth, write one for any simulated run.

The format is vLLM 0.19's ``vllm/benchmarks/serve.py`` (``main`` builds ``result_json``,
``benchmark`` the result dict, ``--save-detailed`` keeps the per-request lists):

- run level: ``date``, ``backend``, ``model_id``, ``tokenizer_id``, ``num_prompts``,
  ``request_rate`` (a number or ``"inf"``), ``burstiness``, ``max_concurrency``, ``duration``
  (s), ``completed``, ``failed``, token totals, throughputs, and every ``--metadata KEY=VALUE``
  as a top-level key (``dataset_name`` is read from there when given);
- per request, in dataset order (``--save-detailed``): ``input_lens``, ``output_lens``,
  ``ttfts`` (s, from the send), ``itls`` (s, one list per request: the gaps between streamed
  chunks), ``latencies`` (s, send to last chunk), ``start_times`` (``time.perf_counter()`` at
  the send, s), ``generated_texts``, ``errors``;
- summaries ``mean_<m>_ms``, ``median_<m>_ms``, ``std_<m>_ms`` and ``p<q>_<m>_ms`` (``p99``,
  ``p99.9``) for ``m`` in ``--percentile-metrics`` (default ``ttft,tpot,itl``) and ``q`` in
  ``--metric-percentiles`` (default 99).

A failed request (``vllm/benchmarks/lib/endpoint_request_func.py``: ``success`` False) keeps
its ``start_time`` and ``prompt_len`` but has ``output_lens`` 0 (``calculate_metrics``
appends 0), ``ttft`` and ``latency`` 0, empty ``itls`` and text, and its error text in
``errors``; ``success`` itself is not saved. A request is read as failed when its ``errors``
entry is non-empty or its ``output_lens`` entry is 0. Failed requests are left out of the
truth and counted (``BenchResult.num_failed``).

Times in the truth frame are integer ns from the first send, in the client columns of
``analysis.metrics`` (view ``client``): ``send_ns`` the send time, ``client_first_token_ns`` =
send + TTFT, ``client_finish_ns`` = send + latency, ``client_token_times_ns`` the first chunk
and every later one (send + TTFT + the running sum of ITLs): what the client saw. The engine
columns (``arrival_ns``, ``first_token_ns``, ...) repeat them: the file has no other clock. Without ``latencies`` (older files), latency = TTFT + sum(ITLs), which is how vLLM
measures it (the last chunk's time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics import RequestMetrics, run_metrics, statistic
from engine.specs import ConfigError
from engine.workload import RequestSpec
from workloads.arrivals import Load
from workloads.limits import PLACEHOLDER_ID_BASE

NS_PER_S = 1_000_000_000
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors")
RUN_KEYS = ("model_id", "request_rate", "burstiness", "max_concurrency", "duration")
# The percentile metrics and percentiles the writer summarises: vLLM's key names for
# ``--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 90,95,99``.
WRITTEN_METRICS = ("ttft", "tpot", "itl", "e2el")
WRITTEN_PERCENTILES = (90.0, 95.0, 99.0)


@dataclass(frozen=True)
class BenchResult:
    """One ``vllm bench serve`` result file (see the module docstring).

    ``requests`` has one row per request of the file (file order; ``request_index`` is the
    position, ``request_id`` ``bench-<i>``), failed ones included (``failed``, ``error``);
    ``run`` holds the run-level keys as written."""

    path: Path
    run: dict[str, Any]
    requests: pd.DataFrame

    @property
    def num_failed(self) -> int:
        return int(self.requests["failed"].sum())

    @property
    def model_id(self) -> str | None:
        value = self.run.get("model_id")
        return None if value is None else str(value)

    @property
    def dataset_name(self) -> str | None:
        value = self.run.get("dataset_name")
        return None if value is None else str(value)

    def completed(self) -> pd.DataFrame:
        """The completed requests as a per-request truth frame (``analysis.metrics`` layout)."""
        done = self.requests[~self.requests["failed"]]
        return done.drop(columns=["failed", "error"]).reset_index(drop=True)


def _fail(path: Path, key: str, problem: str, fix: str = "") -> ConfigError:
    return ConfigError(f"{path}: {key} {problem}" + (f"; {fix}" if fix else ""))


def _number(path: Path, key: str, i: int, v: Any, *, minimum: float | None = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _fail(path, f"{key}[{i}]", f"must be a finite number, got {v!r}")
    if minimum is not None and v < minimum:
        raise _fail(path, f"{key}[{i}]", f"must be >= {minimum:g}, got {v!r}")
    return float(v)


def _count(path: Path, key: str, i: int, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _fail(path, f"{key}[{i}]", f"must be an integer >= 0, got {v!r}")
    return v


def _load_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: result file not found; check --truth") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            raise ConfigError(
                f"{path}: more than one JSON object (line {exc.lineno}): a file written with "
                "--append-result; keep one result per file"
            ) from None
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno} ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object (a vllm bench serve result)")
    return data


def read_result(path: str | Path) -> BenchResult:
    """Read a ``vllm bench serve --save-result --save-detailed`` file (module docstring).

    Raises ``ConfigError`` naming the file and the key (``ttfts[12]``) for missing per-request
    lists (a file saved without ``--save-detailed``), lists of unequal length, a value of the
    wrong type or range, a ``failed`` / ``completed`` count that disagrees with the lists, or a
    run where every request failed."""
    p = Path(path)
    data = _load_json(p)
    missing = [k for k in DETAILED_KEYS if k not in data]
    if missing:
        raise _fail(p, "per-request keys", f"missing: {missing}",
                    "rerun vllm bench serve with --save-result --save-detailed")
    n = None
    for key in (*DETAILED_KEYS, "latencies"):
        if key not in data:
            continue
        if not isinstance(data[key], list):
            raise _fail(p, key, f"must be a list, got {type(data[key]).__name__}")
        if n is None:
            n = len(data[key])
        elif len(data[key]) != n:
            raise _fail(p, key, f"has {len(data[key])} entries but input_lens has {n}",
                        "the lists of one result have one entry per request")
    assert n is not None
    if n == 0:
        raise _fail(p, "input_lens", "is empty: the result has no requests")
    latencies = data.get("latencies")
    starts = [_number(p, "start_times", i, v, minimum=None)
              for i, v in enumerate(data["start_times"])]
    t0 = min(starts)
    rows = []
    for i in range(n):
        err = data["errors"][i]
        if err is not None and not isinstance(err, str):
            raise _fail(p, f"errors[{i}]", f"must be a string, got {err!r}")
        n_in = _count(p, "input_lens", i, data["input_lens"][i])
        n_out = _count(p, "output_lens", i, data["output_lens"][i])
        ttft = _number(p, "ttfts", i, data["ttfts"][i])
        itl = data["itls"][i]
        if not isinstance(itl, list):
            raise _fail(p, f"itls[{i}]", f"must be a list of seconds, got {itl!r}")
        gaps = [_number(p, f"itls[{i}]", j, g) for j, g in enumerate(itl)]
        failed = bool(err) or n_out == 0
        rel = starts[i] - t0
        if failed:
            rows.append((i, rel, -1, -1, n_in, n_out, np.empty(0, np.int64), True, err or ""))
            continue
        if n_in < 1:
            raise _fail(p, f"input_lens[{i}]", "is 0 for a completed request",
                        "vLLM serves no empty prompt; check the file")
        latency = (ttft + math.fsum(gaps) if latencies is None
                   else _number(p, "latencies", i, latencies[i]))
        if latency < ttft - 1e-9:
            raise _fail(p, f"latencies[{i}]", f"{latency!r} is below ttfts[{i}] {ttft!r}",
                        "the last chunk cannot precede the first")
        times = np.rint((rel + ttft + np.concatenate([[0.0], np.cumsum(gaps)])) * NS_PER_S)
        first = int(times[0])
        finish = max(int(round((rel + latency) * NS_PER_S)), first)
        rows.append((i, rel, first, finish, n_in, n_out, times.astype(np.int64), False, ""))
    frame = pd.DataFrame(rows, columns=["request_index", "rel_s", "first_token_ns", "finish_ns",
                                        "prompt_len", "output_len", "token_times_ns", "failed",
                                        "error"])
    frame.insert(1, "request_id", [f"bench-{i}" for i in frame["request_index"]])
    frame.insert(2, "arrival_ns", np.rint(frame.pop("rel_s") * NS_PER_S).astype(np.int64))
    # The client's columns (analysis.metrics view "client"); the engine's repeat them, as a
    # bench result records only the client's clock.
    for client, own in (("send_ns", "arrival_ns"), ("client_first_token_ns", "first_token_ns"),
                        ("client_finish_ns", "finish_ns"),
                        ("client_token_times_ns", "token_times_ns")):
        frame[client] = frame[own]
    failed = int(frame["failed"].sum())
    for key, ours in (("failed", failed), ("completed", n - failed)):
        theirs = data.get(key)
        if isinstance(theirs, int) and not isinstance(theirs, bool) and theirs != ours:
            raise _fail(p, key, f"is {theirs} but the per-request lists give {ours} (a request "
                        "fails when its errors entry is set or its output_lens entry is 0)",
                        "check that the file is one unedited vllm bench serve result")
    if failed == n:
        raise _fail(p, "errors", f"every one of the {n} requests failed", "nothing to compare")
    run = {k: v for k, v in data.items() if not isinstance(v, list)}
    return BenchResult(p, run, frame)


# ---------------------------------------------------------------------------------------
# The workload a result implies


def _meta_int(bench: BenchResult, key: str, default: int) -> int:
    """A ``--metadata KEY=VALUE`` integer of the result (vLLM stores the value as text)."""
    value = bench.run.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise _fail(bench.path, key, f"must be an integer, got {value!r}") from None
    if isinstance(value, float) and not value.is_integer():
        raise _fail(bench.path, key, f"must be an integer, got {value!r}")
    return number


def _dataset_prompts(bench: BenchResult, times_ns: tuple[int, ...]) -> list[Sequence[int]] | None:
    """The prompts of a dataset whose name says they share prefixes, drawn as vLLM 0.19 draws
    them (``workloads.vllm_datasets``) from the result's ``--metadata`` (vLLM's flag names
    with underscores, its defaults when absent): ``prefix_repetition`` (``--prefix-repetition-*``,
    ``--seed``, ``--disable-shuffle``) or ``random`` with ``random_prefix_len`` > 0. ``None``
    for any other dataset (no sharing assumed)."""
    from workloads.vllm_datasets import prefix_repetition, vllm_random

    name = bench.dataset_name
    load = Load(times_ns=times_ns, who=f"{bench.path} start_times")
    seed = _meta_int(bench, "seed", 0)
    if name == "prefix_repetition":
        num = _meta_int(bench, "prefix_repetition_num_prefixes", 10)
        if len(times_ns) % num:
            raise _fail(bench.path, "prefix_repetition_num_prefixes",
                        f"is {num}, which does not divide the {len(times_ns)} requests (vLLM "
                        "serves num_prefixes x (num_prompts // num_prefixes))",
                        "give the --metadata the benchmark ran with")
        shuffle = str(bench.run.get("disable_shuffle", "false")).lower() not in ("true", "1")
        reqs = prefix_repetition(
            load, prefix_len=_meta_int(bench, "prefix_repetition_prefix_len", 256),
            suffix_len=_meta_int(bench, "prefix_repetition_suffix_len", 256), num_prefixes=num,
            output_len=_meta_int(bench, "prefix_repetition_output_len", 128), seed=seed,
            shuffle=shuffle)
    elif name == "random" and _meta_int(bench, "random_prefix_len", 0) > 0:
        reqs = vllm_random(
            load, input_len=_meta_int(bench, "random_input_len", 1024),
            output_len=_meta_int(bench, "random_output_len", 128),
            prefix_len=_meta_int(bench, "random_prefix_len", 0), seed=seed)
    else:
        return None
    return [r.prompt_ids for r in reqs]


def rebuild_workload(bench: BenchResult) -> list[RequestSpec]:
    """The completed requests of ``bench`` as a workload: each arrives at its send time
    (``start_times`` from the first send) with its input and output lengths. Prompt ids are
    placeholders unique across the run (``workloads.limits.PLACEHOLDER_ID_BASE``, the trace
    readers' convention), so no two requests share a prefix-cache block, unless the result's
    ``dataset_name`` (``--metadata dataset_name=...``) says its prompts share prefixes
    (``prefix_repetition``; ``random`` with ``random_prefix_len``): then request ``i`` gets
    the ``i``-th prompt of that dataset as vLLM draws it (``_dataset_prompts``), cut or
    extended with unique ids to its ``input_lens`` entry (vLLM's re-tokenisation can move a
    length by a few tokens)."""
    reqs = bench.requests
    # Every request, failed ones too, drew its prompt: the dataset is indexed in file order.
    times = np.maximum.accumulate(reqs["arrival_ns"].to_numpy())
    shared = _dataset_prompts(bench, tuple(int(t) for t in times))
    if shared is not None and len(shared) < len(reqs):
        raise _fail(bench.path, "dataset_name", f"{bench.dataset_name!r} draws {len(shared)} "
                    f"prompts for {len(reqs)} requests", "give the --metadata it ran with")
    base = PLACEHOLDER_ID_BASE
    out = []
    for row in reqs.itertuples(index=False):
        if row.failed:
            continue
        n_in = int(row.prompt_len)
        prompt: Sequence[int] = range(base, base + n_in)
        if shared is not None:
            head = list(shared[row.request_index][:n_in])
            prompt = head + list(range(base, base + n_in - len(head)))
        base += n_in
        out.append(RequestSpec(str(row.request_id), int(row.arrival_ns), prompt,
                               int(row.output_len)))
    out.sort(key=lambda r: r.arrival_ns)
    return out


def match_workload(bench: BenchResult, workload: Sequence[RequestSpec],
                   where: str) -> list[RequestSpec]:
    """``workload``'s token ids on ``bench``'s clock: request ``i`` of the result (dataset
    order, as vLLM sends them) is line ``i`` of the workload, sent at its ``start_times``
    entry and generating the ``output_lens`` it generated. A workload shorter than the
    result, a prompt whose length differs from ``input_lens[i]`` or an output longer than
    the workload's ``output_toks`` (its ``max_tokens``) is an error naming both files."""
    reqs = bench.requests
    if len(workload) < len(reqs):
        raise ConfigError(f"{where}: {len(workload)} requests but {bench.path} has "
                          f"{len(reqs)}; give the workload the benchmark sent")
    # The readers number requests by file line (request_id "<i>"); they may be sorted by
    # arrival, so look line i up by its number.
    by_line = {int(r.request_id): r for r in workload if str(r.request_id).isdigit()}
    if len(by_line) != len(workload):
        by_line = dict(enumerate(workload))
    out = []
    for row in reqs.itertuples(index=False):
        spec = by_line[row.request_index]
        if spec.prompt_len != row.prompt_len:
            raise ConfigError(
                f"{where}: request {row.request_index} has {spec.prompt_len} prompt tokens but "
                f"{bench.path} input_lens[{row.request_index}] is {row.prompt_len}; give the "
                "workload the benchmark sent"
            )
        if row.failed:
            continue
        if row.output_len > spec.output_len:
            raise ConfigError(
                f"{where}: request {row.request_index} allows {spec.output_len} output tokens "
                f"but {bench.path} output_lens[{row.request_index}] is {row.output_len}; give "
                "the workload the benchmark sent"
            )
        out.append(RequestSpec(row.request_id, int(row.arrival_ns), spec.prompt_ids,
                               int(row.output_len)))
    out.sort(key=lambda r: r.arrival_ns)
    return out


# ---------------------------------------------------------------------------------------
# Writing a simulated run as a result


def _peaks(pm: RequestMetrics) -> tuple[float, int]:
    """vLLM's ``max_output_tokens_per_s`` (the most chunks in one 1-s bucket from the first
    send) and ``max_concurrent_requests`` (peak of the half-open [send, end) intervals)."""
    done = pm.finished
    if not done.any():
        return 0.0, 0
    start = pm.arrival_ns[done] / NS_PER_S
    end = start + pm.e2el_ms[done] / 1e3
    t0 = float(start.min())
    buckets = np.zeros(int(np.ceil(end.max() - t0)) + 1)
    for s, ttft, gaps in zip(start, pm.ttft_ms[done], [pm.itl_ms[i] for i in np.flatnonzero(done)],
                             strict=True):
        times = s + ttft / 1e3 + np.concatenate([[0.0], np.cumsum(gaps) / 1e3])
        idx = (times - t0).astype(np.int64)
        idx = idx[(idx >= 0) & (idx < len(buckets))]
        np.add.at(buckets, idx, 1)
    events = sorted([(float(x), 1) for x in start] + [(float(x), -1) for x in end])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return float(buckets.max()), peak


def _stat(sample: np.ndarray, stat: str) -> float:
    return statistic(sample, stat) if len(sample) else 0.0


def result_dict(pm: RequestMetrics, *, model_id: str, request_rate: float | str = "inf",
                burstiness: float = 1.0, max_concurrency: int | None = None,
                extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A simulated run's per-request latencies ``pm`` (``analysis.metrics.per_request`` in
    the view to report: TTFT and latency from ``pm``'s anchor, sent at ``pm.arrival_ns``) as
    a ``vllm bench serve --save-result --save-detailed`` result (module docstring), with the
    summaries of ``WRITTEN_METRICS`` at ``WRITTEN_PERCENTILES``. ``extra`` adds top-level keys
    as ``--metadata`` does. Unfinished requests are written as vLLM writes failed ones."""
    done = pm.finished
    metrics = run_metrics(pm)
    n = len(pm)
    ttft_s = np.where(done, pm.ttft_ms / 1e3, 0.0)
    lat_s = np.where(done, pm.e2el_ms / 1e3, 0.0)
    rate = request_rate if isinstance(request_rate, str) or math.isfinite(request_rate) else "inf"
    out: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "servesweep",
        "backend": "servesweep",
        "label": "servesweep",
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": n,
        **dict(extra or {}),
        "request_rate": rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": metrics["duration_s"],
        "completed": int(done.sum()),
        "failed": int(n - done.sum()),
        "total_input_tokens": int(pm.prompt_len[done].sum()),
        "total_output_tokens": int(pm.output_len[done].sum()),
        "request_throughput": metrics["request_throughput"],
        "request_goodput": None,
        "output_throughput": metrics["output_throughput"],
        "total_token_throughput": metrics["total_token_throughput"],
        "input_lens": [int(x) for x in pm.prompt_len],
        "output_lens": [int(x) if d else 0 for x, d in zip(pm.output_len, done, strict=True)],
        "ttfts": [float(x) for x in ttft_s],
        "itls": [[float(g) / 1e3 for g in gaps] if d else []
                 for gaps, d in zip(pm.itl_ms, done, strict=True)],
        "latencies": [float(x) for x in lat_s],
        "start_times": [float(t) / NS_PER_S for t in pm.arrival_ns],
        "generated_texts": [""] * n,
        "errors": ["" if d else "servesweep: the request did not finish in the simulation"
                   for d in done],
    }
    peak_tokens, peak_requests = _peaks(pm)
    out["max_output_tokens_per_s"] = peak_tokens
    out["max_concurrent_requests"] = peak_requests
    for name in WRITTEN_METRICS:
        sample = pm.sample(name)
        # vLLM writes 0 for a metric without samples (np.mean(x or 0)).
        out[f"mean_{name}_ms"] = _stat(sample, "mean")
        out[f"median_{name}_ms"] = _stat(sample, "median")
        out[f"std_{name}_ms"] = float(np.std(sample)) if len(sample) else 0.0
        for q in WRITTEN_PERCENTILES:
            word = str(int(q)) if int(q) == q else str(q)  # vLLM's key: p99, p99.9
            out[f"p{word}_{name}_ms"] = _stat(sample, "p" + word.replace(".", "_"))
    return out


def write_result(path: str | Path, pm: RequestMetrics, **kwargs: Any) -> Path:
    """Write ``result_dict(pm, **kwargs)`` to ``path`` as vLLM does (one JSON object)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result_dict(pm, **kwargs)))
    return out
