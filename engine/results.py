"""Simulation outputs: per-request records and a per-second time series."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from engine.instance import StepLog
from engine.memory import KVCapacity
from engine.request import Request, TokenLog

NS_PER_S = 1_000_000_000


@dataclass(slots=True)
class SimulationResult:
    """What one simulation produced. ``requests`` has one row per request; ``timeseries`` one
    row per simulated second (``t_s`` = end of the second, counted from the first arrival)."""

    requests: pd.DataFrame
    timeseries: pd.DataFrame
    num_preemptions: int
    # Tokens served from the prefix cache, summed over every admission (first and resumed,
    # lower tiers included): the reference simulator's count.
    prefix_hit_tokens: int
    # vLLM's prefix-cache counters over all instances (``vllm:prefix_cache_queries`` /
    # ``vllm:prefix_cache_hits``: NPU lookups of requests not preempted before), see
    # ``engine.kv_cache.PrefixCacheStats``.
    prefix_cache_queries: int
    prefix_cache_hits: int
    makespan_ns: int
    kv_capacity: KVCapacity
    wall_s: float
    num_steps: int
    # KV capacity of every instance by name (``kv_capacity`` is the first instance's).
    instance_capacity: dict[str, KVCapacity] = field(default_factory=dict)
    # Per instance: prefix-cache statistics per tier ("npu", "cpu", "cxl"), see
    # ``KVCacheManager.tier_stats``.
    tier_stats: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    @property
    def prefix_hit_rate(self) -> float:
        """vLLM's prefix-cache hit rate, hits / queried tokens (0 without lookups); in [0, 1]."""
        q = self.prefix_cache_queries
        return self.prefix_cache_hits / q if q else 0.0

    def write(self, directory: str | Path, fmt: str = "parquet") -> list[Path]:
        """Write ``requests`` and ``timeseries`` as Parquet (default) or CSV files."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, df in (("requests", self.requests), ("timeseries", self.timeseries)):
            if fmt == "parquet":
                p = out / f"{name}.parquet"
                df.to_parquet(p, index=False)
            elif fmt == "csv":
                p = out / f"{name}.csv"
                frame = df.copy()
                if "token_times_ns" in frame:
                    frame["token_times_ns"] = frame["token_times_ns"].map(
                        lambda v: " ".join(map(str, v))
                    )
                frame.to_csv(p, index=False)
            else:
                raise ValueError(f"fmt={fmt!r}: use 'parquet' or 'csv'")
            paths.append(p)
        return paths


def requests_frame(
    requests: list[Request],
    send_ns: np.ndarray | None = None,
    client_log_times: dict[int, np.ndarray] | None = None,
) -> pd.DataFrame:
    """One row per request, columns as ``analysis.metrics`` reads them.

    ``token_times_ns`` holds one read-only int64 array per request. A request whose tokens
    came at consecutive steps of one scheduler (nearly all) gets a view into a copy of that
    scheduler's step-time log, so the column costs 8 bytes per step of each instance rather
    than per token; an interrupted one (preempted, handed from prefill to decode, skipped a
    step) gets its runs concatenated.

    The client's view (``engine.frontend``): ``send_ns`` is when the client sent each request
    (default: its engine arrival), ``client_log_times`` maps ``id(TokenLog)`` to the client's
    delivery time of each step in that log; ``client_token_times_ns``,
    ``client_first_token_ns`` and ``client_finish_ns`` follow from it (-1 where the engine
    time is -1). Without it they are the engine's own columns (the same arrays).
    """
    n = len(requests)

    def col(values: Iterable[int]) -> np.ndarray:
        return np.fromiter(values, np.int64, n)

    arrival = col(r.arrival_ns for r in requests)
    first_sched = col(r.first_scheduled_ns for r in requests)
    first = col(r.first_token_ns for r in requests)
    finish = col(r.finish_ns for r in requests)
    tokens = token_times_column(requests)
    if client_log_times is None:
        client_tokens, client_first, client_finish = tokens, first, finish
    else:
        client_tokens = token_times_column(requests, client_log_times)
        client_first = np.fromiter(
            (c[0] if f >= 0 and len(c) else -1 for c, f in zip(client_tokens, first, strict=True)),
            np.int64, n)
        client_finish = np.fromiter(
            (c[-1] if f >= 0 and len(c) else -1
             for c, f in zip(client_tokens, finish, strict=True)),
            np.int64, n)
    return pd.DataFrame(
        {
            "request_id": [r.request_id for r in requests],
            "send_ns": arrival if send_ns is None else send_ns,
            "arrival_ns": arrival,
            "queued_ns": col(r.queued_ns for r in requests),
            "first_scheduled_ns": first_sched,
            "first_token_ns": first,
            "finish_ns": finish,
            "prompt_len": col(r.prompt_len for r in requests),
            "output_len": col(r.num_tokens - r.prompt_len for r in requests),
            "num_preemptions": col(r.num_preemptions for r in requests),
            "prefix_hit_tokens": col(r.prefix_hit_tokens for r in requests),
            "cached_tokens": col(max(r.num_cached_tokens, 0) for r in requests),
            "recomputed_tokens": col(r.recomputed_tokens for r in requests),
            "queueing_delay_ns": first_sched - arrival,
            "token_times_ns": tokens,
            "client_first_token_ns": client_first,
            "client_finish_ns": client_finish,
            "client_token_times_ns": client_tokens,
        }
    )


def token_times_column(
    requests: list[Request], log_times: dict[int, np.ndarray] | None = None
) -> np.ndarray:
    """Every request's output token times (object array of read-only int64 arrays): the
    engine's (each log's own step times), or with ``log_times`` the times it maps each log's
    steps to (``id(TokenLog)`` -> one int64 per step of that log)."""
    logs: dict[int, np.ndarray] = {}

    def times(log: TokenLog) -> np.ndarray:
        v = logs.get(id(log))
        if v is None:
            if log_times is None:
                v = np.array(log.times, dtype=np.int64)
            else:
                v = np.asarray(log_times[id(log)], dtype=np.int64)
                assert len(v) == len(log.times), "client times must cover every step"
            v.flags.writeable = False
            logs[id(log)] = v
        return v

    empty = np.empty(0, dtype=np.int64)
    empty.flags.writeable = False
    out = np.empty(len(requests), dtype=object)
    for i, r in enumerate(requests):
        runs = r.token_runs()
        if len(runs) == 1:
            log, a, b = runs[0]
            out[i] = times(log)[a:b]
        elif not runs:
            out[i] = empty
        else:
            t = np.concatenate([times(log)[a:b] for log, a, b in runs])
            t.flags.writeable = False
            out[i] = t
    return out


def timeseries_frame(logs: list[StepLog], start_ns: int) -> pd.DataFrame:
    """Per-second series over all instances: state sampled at the last step ending in each
    second (running and waiting summed over instances, KV usage % averaged), token counts
    summed over the steps ending in it (tokens/s)."""
    cols = ["t_s", "running", "waiting", "kv_usage_pct", "prompt_throughput", "gen_throughput"]
    per = [_one_series(log, start_ns) for log in logs if log.end_ns]
    if not per:
        return pd.DataFrame({c: [] for c in cols})
    n_sec = max(len(p[0]) for p in per)
    out = {c: np.zeros(n_sec) for c in cols[1:]}
    for running, waiting, usage, prompt, gen in per:
        k = len(running)
        # After an instance's last step it holds nothing: its state stays at the last sample.
        for name, arr, hold in (
            ("running", running, True),
            ("waiting", waiting, True),
            ("kv_usage_pct", usage, True),
            ("prompt_throughput", prompt, False),
            ("gen_throughput", gen, False),
        ):
            out[name][:k] += arr
            if hold and k < n_sec:
                out[name][k:] += arr[-1]
    out["kv_usage_pct"] /= len(per)
    frame = pd.DataFrame({"t_s": np.arange(1, n_sec + 1, dtype=float), **out})
    for c in ("running", "waiting"):
        frame[c] = frame[c].astype(np.int64)
    return frame[cols]


def _one_series(log: StepLog, start_ns: int) -> tuple[np.ndarray, ...]:
    end = np.asarray(log.end_ns, dtype=np.int64) - start_ns
    sec = end // NS_PER_S  # a step ending in [k, k+1) s belongs to second k+1
    n_sec = int(sec[-1]) + 1
    prompt = np.bincount(sec, weights=np.asarray(log.prompt_tokens, float), minlength=n_sec)
    gen = np.bincount(sec, weights=np.asarray(log.gen_tokens, float), minlength=n_sec)
    # Last sample in each second; seconds without a step carry the previous state.
    last_idx = np.full(n_sec, -1, dtype=np.int64)
    last_idx[sec] = np.arange(len(sec))
    last_idx = np.maximum.accumulate(last_idx)
    valid = last_idx >= 0
    running = np.where(valid, np.asarray(log.running)[last_idx], 0).astype(float)
    waiting = np.where(valid, np.asarray(log.waiting)[last_idx], 0).astype(float)
    usage = np.where(valid, np.asarray(log.usage)[last_idx] * 100.0, 0.0)
    return running, waiting, usage, prompt, gen
