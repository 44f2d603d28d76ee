"""Serving metrics as ``vllm bench serve`` defines them, and sim-vs-vLLM comparison.

This module owns the per-request latencies: ``per_request`` is the one function that turns
a per-request frame into TTFT, TPOT, ITL and E2E latency, and everything that judges a run
(``compute_metrics`` here, the SLO check and goodput in ``analysis.slo``, the cost in
``analysis.cost``) reads its result.

Input is a per-request DataFrame with columns ``request_id, arrival_ns, first_token_ns,
finish_ns, prompt_len, output_len`` and optionally ``token_times_ns`` (absolute ns of every
output token, the first included). A request counts as completed (``finished``) when
``first_token_ns`` and ``finish_ns`` are present and >= 0 (the engine writes -1 for requests
that never finished); only completed requests enter the statistics, as only successful
requests do in ``vllm bench serve`` (``vllm/benchmarks/serve.py``, ``calculate_metrics``).

Per request (ms): TTFT = first_token - arrival; E2EL = finish - arrival; TPOT =
(E2EL - TTFT) / (output_len - 1), only for output_len > 1 (``vllm bench serve``'s goodput
check counts the TPOT of a one-token request as 0); ITL = every gap between successive
output tokens, pooled over all requests (not per-request means). Each is summarised by mean,
median, p90, p95, p99 (``statistic``: ``np.mean``, ``np.median``, ``np.percentile`` with its
default linear interpolation). Throughputs divide by the benchmark duration: from
``start_ns`` (default: the earliest arrival) to the last completion.

``view`` says whose clock the latencies are read on (``VIEWS``):

- ``client``: from the client's send (``send_ns``) to the client's receipt of each token
  (``client_first_token_ns``, ``client_finish_ns``, ``client_token_times_ns``), what
  ``vllm bench serve`` measures and what sweeps, SLOs and capacity searches report. The
  simulator writes these columns (``engine.frontend`` models the API server in between).
- ``engine`` (default): from the instant the request reaches the engine core
  (``arrival_ns``) to the engine's token instants (``first_token_ns``, ``finish_ns``,
  ``token_times_ns``).
- ``queued``: as ``engine`` but from when the engine loop picked the request up
  (``queued_ns``, vLLM's ``queued_ts``; what the shared vLLM ground truth records).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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

# view -> (start, first token, finish, token times) columns
VIEWS = {
    "client": ("send_ns", "client_first_token_ns", "client_finish_ns", "client_token_times_ns"),
    "engine": ("arrival_ns", "first_token_ns", "finish_ns", "token_times_ns"),
    "queued": ("queued_ns", "first_token_ns", "finish_ns", "token_times_ns"),
}
_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "Latency"}
_STAT_LABELS = {"mean": "Mean", "median": "Median", "p90": "P90", "p95": "P95", "p99": "P99"}


def percentile_of(stat: str) -> float:
    """The percentile a statistic name stands for: ``median`` 50, ``p99`` 99, ``p99_9`` 99.9;
    NaN for ``mean``. Raises ``ValueError`` for any other name."""
    if stat == "mean":
        return math.nan
    if stat == "median":
        return 50.0
    whole, _, frac = stat[1:].partition("_")
    if not stat.startswith("p") or not whole.isdigit() or (frac and not frac.isdigit()):
        raise ValueError(f"{stat!r} is not a statistic; use mean, median or p<q> (p99, p99_9)")
    return float(f"{whole}.{frac}" if frac else whole)


def statistic(values: np.ndarray, stat: str) -> float:
    """One statistic of ``values`` by name (``mean``, ``median``, ``p<q>``); NaN when empty.
    The one place a latency sample becomes a number: metrics and SLO checks both call it."""
    if len(values) == 0:
        return math.nan
    if stat == "mean":
        return float(np.mean(values))
    if stat == "median":
        return float(np.median(values))
    return float(np.percentile(values, percentile_of(stat)))


def summarize(values: np.ndarray) -> dict[str, float]:
    """mean, median, p90, p95, p99 of ``values`` (NaN for each when empty)."""
    return {stat: statistic(values, stat) for stat in STATISTICS}


def _itl_gaps(token_times: pd.Series, finished: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each request's gaps between successive output tokens (ms); empty when it did not
    finish or its token times are unknown."""
    gaps = []
    for t, done in zip(token_times, finished, strict=True):
        known = t is not None and not (isinstance(t, float) and math.isnan(t)) and len(t) > 1
        gaps.append(np.diff(np.asarray(t, dtype=np.int64)) / _NS_PER_MS if done and known
                    else np.empty(0))
    return tuple(gaps)


def _check_columns(df: pd.DataFrame) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(
            f"requests DataFrame lacks column(s) {missing}; it needs {list(REQUIRED_COLUMNS)}"
        )


@dataclass(frozen=True, eq=False)
class RequestMetrics:
    """Per-request latencies of one run, row for row with its requests frame.

    ``finished`` marks the completed requests; ``ttft_ms``/``e2el_ms`` are NaN for the
    others, ``tpot_ms`` is NaN for them and for one-token requests (no TPOT, as in
    ``vllm bench serve``); ``itl_ms`` holds each request's token gaps. ``arrival_ns`` is the
    workload's arrival time, the client's send (``send_ns`` where the table has it) whatever
    the view; ``finish_ns`` the view's finish, NaN when unfinished.
    """

    request_id: np.ndarray
    finished: np.ndarray
    arrival_ns: np.ndarray
    finish_ns: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2el_ms: np.ndarray
    itl_ms: tuple[np.ndarray, ...]

    def __len__(self) -> int:
        return len(self.finished)

    def sample(self, metric: str) -> np.ndarray:
        """The run's sample of ``metric`` (``ttft``, ``tpot``, ``itl``, ``e2el``): finished
        requests only, TPOT of multi-token ones only, ITL pooled over every gap."""
        if metric == "itl":
            gaps = [g for g in self.itl_ms if len(g)]
            return np.concatenate(gaps) if gaps else np.empty(0)
        values = getattr(self, f"{metric}_ms")
        return values[~np.isnan(values)]

    def goodput_value(self, metric: str) -> np.ndarray:
        """Each request's own ``ttft``/``tpot``/``e2el`` as ``vllm bench serve --goodput``
        compares it with a bound: TPOT 0 for a finished one-token request, NaN unfinished."""
        values = getattr(self, f"{metric}_ms")
        if metric == "tpot":
            values = np.where(self.finished & (self.output_len <= 1), 0.0, values)
        return values


def per_request(requests_df: pd.DataFrame, view: str = "engine") -> RequestMetrics:
    """TTFT, TPOT, ITL and E2E latency (ms) of every request on ``view``'s clock; see the
    module docstring.

    Raises ``ConfigError`` for an unknown view, missing columns or a completed request whose
    first token precedes its start, whose finish precedes its first token, or whose
    output_len < 1.
    """
    _check_columns(requests_df)
    if view not in VIEWS:
        raise ConfigError(f"view={view!r} is not known; use one of {sorted(VIEWS)}")
    anchor, first_col, finish_col, tokens_col = VIEWS[view]
    missing = [c for c in (anchor, first_col, finish_col) if c not in requests_df.columns]
    if missing:
        have = [v for v, cols in VIEWS.items() if all(c in requests_df.columns for c in cols[:3])]
        raise ConfigError(f"the per-request table has no {', '.join(missing)} for the {view!r} "
                          f"view; use a view it records: {have}")
    first = pd.to_numeric(requests_df[first_col], errors="coerce").to_numpy(np.float64)
    finish = pd.to_numeric(requests_df[finish_col], errors="coerce").to_numpy(np.float64)
    finished = (first >= 0) & (finish >= 0)
    start = requests_df[anchor].to_numpy(dtype=np.float64)
    out_len = requests_df["output_len"].to_numpy(dtype=np.int64)
    ids = requests_df["request_id"].to_numpy()

    for bad, what in (
        # -1 marks an instant never recorded (queued_ns of a request no engine picked up);
        # arrival and send times are the workload's own and may be any value.
        (start < 0 if anchor == "queued_ns" else np.zeros(len(start), bool),
         f"{anchor} < 0 (never recorded)"),
        (first < start, f"{first_col} < {anchor}"),
        (finish < first, f"{finish_col} < {first_col}"),
        (out_len < 1, "output_len < 1"),
    ):
        bad = bad & finished
        if bad.any():
            raise ConfigError(f"request {ids[np.argmax(bad)]!r}: {what}; "
                              "check the per-request timestamps/lengths")

    nan = np.full(len(finished), math.nan)
    ttft = np.where(finished, (first - start) / _NS_PER_MS, nan)
    e2el = np.where(finished, (finish - start) / _NS_PER_MS, nan)
    multi = finished & (out_len > 1)
    tpot = np.where(multi, (e2el - ttft) / np.maximum(out_len - 1, 1), nan)
    itl = (_itl_gaps(requests_df[tokens_col], finished)
           if tokens_col in requests_df.columns else (np.empty(0),) * len(finished))
    sent = "send_ns" if "send_ns" in requests_df.columns else "arrival_ns"
    return RequestMetrics(
        request_id=ids, finished=finished,
        arrival_ns=requests_df[sent].to_numpy(dtype=np.float64),
        finish_ns=np.where(finished, finish, nan),
        prompt_len=requests_df["prompt_len"].to_numpy(dtype=np.int64), output_len=out_len,
        ttft_ms=ttft, tpot_ms=tpot, e2el_ms=e2el, itl_ms=itl,
    )


def benchmark_duration_s(pm: RequestMetrics, start_ns: float | None = None) -> float:
    """``vllm bench serve``'s benchmark duration: from ``start_ns`` (default: the earliest
    arrival) to the last completion; 0 when nothing completed."""
    if not pm.finished.any():
        return 0.0
    start = float(pm.arrival_ns.min()) if start_ns is None else float(start_ns)
    return (float(pm.finish_ns[pm.finished].max()) - start) / 1e9


def run_metrics(pm: RequestMetrics, start_ns: float | None = None) -> dict[str, float]:
    """The metric dict (keys ``METRIC_KEYS``) of one run's per-request latencies."""
    result: dict[str, float] = {}
    for name in LATENCY_METRICS:
        for stat, value in summarize(pm.sample(name)).items():
            result[f"{name}_ms_{stat}"] = value
    done = pm.finished
    n = int(done.sum())
    duration_s = benchmark_duration_s(pm, start_ns)
    out_tokens = float(pm.output_len[done].sum())
    if duration_s > 0:
        result["request_throughput"] = n / duration_s
        result["output_throughput"] = out_tokens / duration_s
        result["total_token_throughput"] = (out_tokens + float(pm.prompt_len[done].sum())
                                            ) / duration_s
    else:
        result["request_throughput"] = result["output_throughput"] = math.nan
        result["total_token_throughput"] = math.nan
    result["completed"] = n
    result["duration_s"] = duration_s
    return result


def compute_metrics(
    requests_df: pd.DataFrame, start_ns: int | None = None, view: str = "engine"
) -> dict[str, float]:
    """The metric dict (keys ``METRIC_KEYS``) for one run: ``run_metrics(per_request(...))``.

    Raises ``ConfigError`` as ``per_request`` does.
    """
    return run_metrics(per_request(requests_df, view), start_ns)


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
