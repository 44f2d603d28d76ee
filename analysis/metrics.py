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

A run too large to keep in memory streams its per-request table to Parquet
(``engine.simulate.simulate_cluster(..., stream_to=...)``); ``metrics_from_parquet`` computes
the same metric dict from the file, reading only the columns it needs: the scalar ones whole
(8 bytes a request each), so TTFT, TPOT, E2EL and the throughputs are exactly what
``compute_metrics`` gives, and the token times one row group at a time, pooled into the
count of each distinct ITL gap (``counted_statistic``: the same percentiles, exactly; the
mean from the exact integer sum, which may differ from ``np.mean``'s pairwise float sum in
the last bits).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

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
# Token times a batch of ``_itl_gaps`` differences at most (one request's may exceed it).
_GAP_BATCH = 1 << 16

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


def counted_statistic(values: np.ndarray, counts: np.ndarray, stat: str) -> float:
    """``statistic`` of the sample holding ``counts[i]`` copies of ``values[i]`` (``values``
    sorted ascending, distinct; ``counts`` > 0), without expanding it: the same order
    statistics and numpy's own arithmetic on them (``np.median``: the middle one or the mean
    of the two; ``np.percentile``, linear: virtual index ``(n - 1) q``, then numpy's lerp),
    so a percentile equals the expanded sample's bit for bit. The mean is the exact sum of
    ``values * counts`` (as Python numbers) over n, rounded once."""
    cum = np.cumsum(counts, dtype=np.int64)
    n = int(cum[-1]) if len(cum) else 0
    if n == 0:
        return math.nan

    def at(k: int) -> float:  # the k-th smallest (0-based) of the expanded sample
        return float(values[int(np.searchsorted(cum, k, side="right"))])

    if stat == "mean":
        if values.dtype.kind in "iu":
            total = sum(int(v) * int(c) for v, c in zip(values, counts, strict=True))
            return float(total / n)
        return float(np.dot(values.astype(np.float64), counts.astype(np.float64)) / n)
    return _order_statistic(n, at, stat)


def _order_indexes(n: int, stats: Sequence[str]) -> list[int]:
    """The order statistics (0-based ranks, ascending) that ``_order_statistic`` reads for
    each of ``stats`` (not ``mean``) of a sample of ``n`` > 0 values: what it asks ``at``
    for, so the ranks have one owner."""
    ranks: set[int] = set()

    def note(k: int) -> float:
        ranks.add(k)
        return 0.0

    for stat in stats:
        _order_statistic(n, note, stat)
    return sorted(ranks)


def _order_statistic(n: int, at: Callable[[int], Any], stat: str) -> float:
    """``np.median`` or ``np.percentile`` (``stat``: ``median``, ``p<q>``) of a sample of
    ``n`` > 0 values whose k-th smallest (0-based) is ``at(k)``, with numpy's own arithmetic
    on those order statistics, so it equals numpy's call bit for bit: the median is the
    middle one or ``np.mean`` of the two; a percentile (numpy's default ``linear``) has the
    virtual index ``(n - 1) q`` and numpy's lerp, ``b - (b - a)(1 - g)`` when ``g >= 0.5``,
    else ``a + (b - a) g``, with ``b - a`` in the type ``at`` returns (numpy subtracts in the
    sample's dtype). The ranks it reads are ``_order_indexes``'."""
    if stat == "median":
        if n % 2:
            return float(at(n // 2))
        return float(np.mean(np.array([at(n // 2 - 1), at(n // 2)])))
    q = percentile_of(stat) / 100
    vi = (n - 1) * q
    lo = math.floor(vi)
    if vi >= n - 1:
        return float(at(n - 1))
    a, b = at(lo), at(lo + 1)
    g = vi - lo
    d = b - a
    return float(b - d * (1 - g) if g >= 0.5 else a + d * g)


_ORDER_STATISTICS = tuple(s for s in STATISTICS if s != "mean")


def summarize(values: np.ndarray) -> dict[str, float]:
    """mean, median, p90, p95, p99 of ``values`` (NaN for each when empty): ``statistic``'s
    numbers bit for bit for the samples this module builds (float64, or int64). The mean is
    ``np.mean`` of the sample as given; the median and the percentiles come from one
    ``np.partition`` copy holding every order statistic they read in place
    (``_order_statistic``: numpy's arithmetic on the same order statistics, which do not
    depend on how the rest of the copy is arranged; a NaN anywhere makes each of them NaN,
    as in numpy)."""
    n = len(values)
    if n == 0:
        return {stat: math.nan for stat in STATISTICS}
    out = {"mean": float(np.mean(values))}
    kth = _order_indexes(n, _ORDER_STATISTICS)
    inexact = values.dtype.kind in "fc"
    if inexact and kth[-1] != n - 1:
        kth.append(n - 1)  # np.partition sorts NaN last: the largest then says if any is
    part = np.partition(values, kth)
    if inexact and np.isnan(part[n - 1]):
        out.update((stat, math.nan) for stat in _ORDER_STATISTICS)
        return out
    out.update((stat, _order_statistic(n, part.__getitem__, stat)) for stat in _ORDER_STATISTICS)
    return out


def _itl_gaps(token_times: pd.Series, finished: np.ndarray,
              ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The pooled ITL sample (ms: every gap between successive output tokens of every
    finished request with known token times, in request order) and each request's own gaps
    as read-only views into it (empty when it did not finish or its token times are
    unknown). The gaps are int64 differences of the token times divided by 1e6, as a
    per-request ``np.diff`` gives them, computed for up to ``_GAP_BATCH`` token times at a
    time over their concatenation (the differences across two requests' boundary dropped)
    and written into the one pooled array: a few numpy calls a batch rather than a few a
    request, and no temporaries as large as the run's token times."""
    runs: list[np.ndarray] = []
    counts = np.zeros(len(finished), dtype=np.int64)  # each request's gaps
    for i, (t, done) in enumerate(zip(token_times, finished, strict=True)):
        known = t is not None and not (isinstance(t, float) and math.isnan(t)) and len(t) > 1
        if done and known:
            run = np.asarray(t, dtype=np.int64)
            runs.append(run)
            counts[i] = len(run) - 1
    pooled = np.empty(int(counts.sum()))
    start = 0
    lo = 0
    while lo < len(runs):
        hi, size = lo, 0
        while hi < len(runs) and (size == 0 or size + len(runs[hi]) <= _GAP_BATCH):
            size += len(runs[hi])
            hi += 1
        flat = np.concatenate(runs[lo:hi]) if hi - lo > 1 else runs[lo]
        gaps = np.subtract(flat[1:], flat[:-1])
        if hi - lo > 1:  # the differences across boundaries: at each run's last token
            ends = np.cumsum([len(r) for r in runs[lo : hi - 1]]) - 1
            gaps = np.delete(gaps, ends)
        np.true_divide(gaps, _NS_PER_MS, out=pooled[start : start + len(gaps)])
        start += len(gaps)
        lo = hi
    pooled.flags.writeable = False  # ``RequestMetrics.sample`` hands it out as is
    offsets = (np.cumsum(counts) - counts).tolist()
    # Views of a read-only array are read-only.
    views = tuple(pooled[o : o + c] for o, c in zip(offsets, counts.tolist(), strict=True))
    return pooled, views


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
    # The pooled ITL sample itself (``itl_ms`` are views into it), or None to pool ``itl_ms``.
    itl_pooled_ms: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.finished)

    def sample(self, metric: str) -> np.ndarray:
        """The run's sample of ``metric`` (``ttft``, ``tpot``, ``itl``, ``e2el``): finished
        requests only, TPOT of multi-token ones only, ITL pooled over every gap."""
        if metric == "itl":
            if self.itl_pooled_ms is not None:
                return self.itl_pooled_ms
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
    pooled, itl = (_itl_gaps(requests_df[tokens_col], finished)
                   if tokens_col in requests_df.columns
                   else (np.empty(0), (np.empty(0),) * len(finished)))
    sent = "send_ns" if "send_ns" in requests_df.columns else "arrival_ns"
    return RequestMetrics(
        request_id=ids, finished=finished,
        arrival_ns=requests_df[sent].to_numpy(dtype=np.float64),
        finish_ns=np.where(finished, finish, nan),
        prompt_len=requests_df["prompt_len"].to_numpy(dtype=np.int64), output_len=out_len,
        ttft_ms=ttft, tpot_ms=tpot, e2el_ms=e2el, itl_ms=itl, itl_pooled_ms=pooled,
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


def metrics_from_parquet(
    path: str | Path, start_ns: int | None = None, view: str = "engine",
    batch_rows: int = 4096,
) -> dict[str, float]:
    """``compute_metrics`` of the per-request table in the Parquet file ``path`` (a streamed
    run's ``requests.parquet``, or any table ``SimulationResult.write`` wrote), reading the
    scalar columns whole and the token times ``batch_rows`` rows at a time (module
    docstring). Raises ``ConfigError`` as ``per_request`` does, or for a file that is not a
    Parquet table."""
    if view not in VIEWS:
        raise ConfigError(f"view={view!r} is not known; use one of {sorted(VIEWS)}")
    try:
        names = pq.read_schema(path).names
    except (OSError, pa.ArrowInvalid) as err:
        raise ConfigError(f"{path}: not a readable Parquet table ({err}); give the "
                          "requests.parquet a run wrote") from err
    anchor, first_col, finish_col, tokens_col = VIEWS[view]
    wanted = dict.fromkeys((*REQUIRED_COLUMNS, "send_ns", anchor, first_col, finish_col))
    frame = pq.read_table(path, columns=[c for c in wanted if c in names]).to_pandas()
    pm = per_request(frame, view)  # ITL left out: no token column in the frame
    result = run_metrics(pm, start_ns)
    if tokens_col in names:
        values, counts = _itl_counts(path, tokens_col, pm.finished, batch_rows)
        ms = values / _NS_PER_MS  # the gaps as per_request has them
        for stat in STATISTICS:
            result[f"itl_ms_{stat}"] = (
                counted_statistic(values, counts, stat) / _NS_PER_MS  # the exact ns sum
                if stat == "mean" else counted_statistic(ms, counts, stat))
    return result


def _itl_counts(
    path: str | Path, column: str, finished: np.ndarray, batch_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every gap (ns) between successive output tokens of the finished requests in ``column``
    (a list<int64> column), as distinct values (ascending) and their counts."""
    values = np.empty(0, dtype=np.int64)
    counts = np.empty(0, dtype=np.int64)
    held_v: list[np.ndarray] = []  # per-batch counts not merged yet (merged once they
    held_c: list[np.ndarray] = []  # outgrow the merged ones: each value merged O(log) times)
    held = 0

    def merge() -> None:
        nonlocal values, counts, held
        values, inverse = np.unique(np.concatenate([values, *held_v]), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate([counts, *held_c]),
                             minlength=len(values)).astype(np.int64)
        held_v.clear()
        held_c.clear()
        held = 0

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=[column]):
        col = batch.column(0)
        nrows = len(col)
        offs = col.offsets.to_numpy().astype(np.int64)
        flat = col.values.to_numpy()[offs[0] : offs[-1]].astype(np.int64, copy=False)
        offs = offs - offs[0]
        lengths = np.diff(offs)
        ok = finished[row : row + nrows].copy()
        if col.null_count:
            ok &= ~col.is_null().to_numpy(zero_copy_only=False)
        row += nrows
        if len(flat) < 2:
            continue
        gaps = np.diff(flat)
        keep = np.repeat(ok, lengths)[:-1]  # gap p belongs to the request of token p ...
        ends = offs[1:] - 1
        keep[ends[(ends >= 0) & (ends < len(gaps))]] = False  # ... unless p is its last token
        u, c = np.unique(gaps[keep], return_counts=True)
        held_v.append(u)
        held_c.append(c)
        held += len(u)
        if held > max(len(values), 1 << 16):
            merge()
    merge()
    return values, counts


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
