"""Serving metrics as ``vllm bench serve`` defines them, and sim-vs-vLLM comparison.

Input is a per-request DataFrame with columns ``request_id, arrival_ns, first_token_ns,
finish_ns, prompt_len, output_len`` and optionally ``token_times_ns`` (absolute ns of every
output token, the first included). A request counts as completed when ``first_token_ns``
and ``finish_ns`` are present and >= 0 (the engine writes -1 for requests that never
finished); only completed requests enter the statistics.

Per request (ms): TTFT = first_token - arrival; E2EL = finish - arrival; TPOT =
(E2EL - TTFT) / (output_len - 1), only for output_len > 1; ITL = every gap between
successive output tokens, pooled over all requests (not per-request means). Each is
summarised by mean, median, p90, p95, p99 with ``np.percentile``'s default linear
interpolation. Throughputs divide by the benchmark duration: from ``start_ns`` (default:
the earliest arrival) to the last completion.

``anchor`` names the column TTFT and E2EL are measured from: ``arrival_ns`` (default: the
instant the request reaches the engine, what a client sees) or ``queued_ns`` (when the engine
loop picked it up, vLLM's ``queued_ts``; what the vLLM ground truth records).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from engine.specs import ConfigError

REQUIRED_COLUMNS = (
    "request_id",
    "arrival_ns",
    "first_token_ns",
    "finish_ns",
    "prompt_len",
    "output_len",
)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
STATISTICS = ("mean", "median", "p90", "p95", "p99")
VALIDATION_METRICS = tuple(f"{m}_ms_{s}" for m in ("ttft", "tpot", "e2el") for s in STATISTICS)
THROUGHPUT_KEYS = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "completed",
    "duration_s",
)
METRIC_KEYS = tuple(f"{m}_ms_{s}" for m in LATENCY_METRICS for s in STATISTICS) + THROUGHPUT_KEYS

_NS_PER_MS = 1e6
_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "Latency"}
_STAT_LABELS = {"mean": "Mean", "median": "Median", "p90": "P90", "p95": "P95", "p99": "P99"}


def summarize(values: np.ndarray) -> dict[str, float]:
    """mean, median, p90, p95, p99 of ``values`` (NaN for each when empty)."""
    if len(values) == 0:
        return dict.fromkeys(STATISTICS, math.nan)
    p90, p95, p99 = np.percentile(values, [90, 95, 99])
    return {
        "mean": float(np.mean(values)),
        "median": float(np.median(values)),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
    }


def _itl_ms(token_times: pd.Series) -> np.ndarray:
    gaps = [
        np.diff(np.asarray(t, dtype=np.int64))
        for t in token_times
        if t is not None and not (isinstance(t, float) and math.isnan(t)) and len(t) > 1
    ]
    if not gaps:
        return np.empty(0)
    return np.concatenate(gaps) / _NS_PER_MS


def _check_columns(df: pd.DataFrame) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(
            f"requests DataFrame lacks column(s) {missing}; it needs {list(REQUIRED_COLUMNS)}"
        )


def compute_metrics(
    requests_df: pd.DataFrame, start_ns: int | None = None, anchor: str = "arrival_ns"
) -> dict[str, float]:
    """The metric dict (keys ``METRIC_KEYS``) for one run; see the module docstring.

    Raises ``ConfigError`` for missing columns or a completed request whose first token
    precedes its anchor, whose finish precedes its first token, or whose output_len < 1.
    """
    _check_columns(requests_df)
    if anchor not in requests_df.columns:
        raise ConfigError(
            f"anchor column {anchor!r} missing from the per-request table; "
            "use 'arrival_ns' or a table that records it"
        )
    first = pd.to_numeric(requests_df["first_token_ns"], errors="coerce")
    finish = pd.to_numeric(requests_df["finish_ns"], errors="coerce")
    done_mask = (first >= 0) & (finish >= 0)
    done = requests_df[done_mask.to_numpy()]

    arrival = done[anchor].to_numpy(dtype=np.float64)
    first_t = first[done_mask].to_numpy(dtype=np.float64)
    finish_t = finish[done_mask].to_numpy(dtype=np.float64)
    out_len = done["output_len"].to_numpy(dtype=np.int64)
    prompt_len = done["prompt_len"].to_numpy(dtype=np.int64)

    for bad, what in (
        # -1 marks an instant never recorded (queued_ns of a request no engine picked up);
        # arrival times are the workload's own and may be any value.
        (arrival < 0 if anchor != "arrival_ns" else np.zeros(len(arrival), bool),
         f"{anchor} < 0 (never recorded)"),
        (first_t < arrival, f"first_token_ns < {anchor}"),
        (finish_t < first_t, "finish_ns < first_token_ns"),
        (out_len < 1, "output_len < 1"),
    ):
        if bad.any():
            rid = done["request_id"].to_numpy()[np.argmax(bad)]
            raise ConfigError(f"request {rid!r}: {what}; check the per-request timestamps/lengths")

    ttft = (first_t - arrival) / _NS_PER_MS
    e2el = (finish_t - arrival) / _NS_PER_MS
    multi = out_len > 1
    tpot = (e2el[multi] - ttft[multi]) / (out_len[multi] - 1)
    itl = _itl_ms(done["token_times_ns"]) if "token_times_ns" in done.columns else np.empty(0)

    result: dict[str, float] = {}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        for stat, value in summarize(values).items():
            result[f"{name}_ms_{stat}"] = value

    n = len(done)
    if n:
        start = float(requests_df["arrival_ns"].min()) if start_ns is None else float(start_ns)
        duration_s = (float(finish_t.max()) - start) / 1e9
    else:
        duration_s = 0.0
    if duration_s > 0:
        result["request_throughput"] = n / duration_s
        result["output_throughput"] = float(out_len.sum()) / duration_s
        result["total_token_throughput"] = float(out_len.sum() + prompt_len.sum()) / duration_s
    else:
        result["request_throughput"] = result["output_throughput"] = math.nan
        result["total_token_throughput"] = math.nan
    result["completed"] = n
    result["duration_s"] = duration_s
    return result


def diff_pct(sim: float, ref: float) -> float:
    """(sim - ref) / ref x 100; NaN when ref is 0 or either value is NaN."""
    if ref == 0 or math.isnan(ref) or math.isnan(sim):
        return math.nan
    return (sim - ref) / ref * 100.0


def compare(
    sim_metrics: Mapping[str, float],
    ref_metrics: Mapping[str, float],
    metrics: Sequence[str] = VALIDATION_METRICS,
) -> pd.DataFrame:
    """One row per metric: ``metric, vllm, sim, diff_pct`` (vLLM is the reference)."""
    rows = []
    for key in metrics:
        for label, source in (("simulator", sim_metrics), ("reference (vLLM)", ref_metrics)):
            if key not in source:
                raise ConfigError(
                    f"{label} metrics lack '{key}'; compute them with compute_metrics"
                )
        ref, sim = float(ref_metrics[key]), float(sim_metrics[key])
        rows.append({"metric": key, "vllm": ref, "sim": sim, "diff_pct": diff_pct(sim, ref)})
    return pd.DataFrame(rows, columns=["metric", "vllm", "sim", "diff_pct"])


def metric_label(key: str) -> str:
    """Human label of a metric key: ``ttft_ms_p99`` -> ``TTFT P99``; other keys unchanged."""
    parts = key.split("_ms_")
    if len(parts) == 2 and parts[0] in _LABELS and parts[1] in _STAT_LABELS:
        return f"{_LABELS[parts[0]]} {_STAT_LABELS[parts[1]]}"
    return key


def format_comparison(table: pd.DataFrame, title: str | None = None) -> str:
    """A fixed-width text table of ``compare`` output (values in ms, one decimal)."""
    lines = [title, "=" * len(title)] if title else []
    header = f"{'Metric':<16}{'vLLM (ms)':>14}{'Sim (ms)':>14}{'Diff%':>10}"
    lines += [header, "-" * len(header)]
    for row in table.itertuples(index=False):
        diff = "n/a" if math.isnan(row.diff_pct) else f"{row.diff_pct:+.1f}%"
        lines.append(f"{metric_label(row.metric):<16}{row.vllm:>14.1f}{row.sim:>14.1f}{diff:>10}")
    return "\n".join(lines)
