"""Simulation outputs: per-request records and a per-second time series.

A request's record is taken when it finishes (:class:`RequestRecords`: columnar arrays, its
token times as runs of its scheduler's step log), so the engine need not keep finished
``Request`` objects. The records become the per-request table at the end of the run
(:meth:`RequestRecords.frame`), or, for runs too large to keep, stream to a Parquet file in
row groups while the run goes on (:class:`RequestStream`); ``analysis.metrics.metrics_from_parquet``
computes the same metrics from that file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from engine.instance import StepLog
from engine.memory import KVCapacity
from engine.request import Request, TokenLog

if TYPE_CHECKING:
    import pyarrow.parquet as pq

NS_PER_S = 1_000_000_000


@dataclass(slots=True)
class SimulationResult:
    """What one simulation produced. ``requests`` has one row per request (None when the run
    streamed them to ``requests_path``, see ``engine.simulate.simulate_cluster``'s
    ``stream_to``); ``timeseries`` one row per simulated second (``t_s`` = end of the second,
    counted from the first arrival)."""

    requests: pd.DataFrame | None
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
    # The streamed per-request table (Parquet, the columns of ``requests``), or None.
    requests_path: Path | None = None

    @property
    def prefix_hit_rate(self) -> float:
        """vLLM's prefix-cache hit rate, hits / queried tokens (0 without lookups); in [0, 1]."""
        q = self.prefix_cache_queries
        return self.prefix_cache_hits / q if q else 0.0

    def write(self, directory: str | Path, fmt: str = "parquet") -> list[Path]:
        """Write ``requests`` and ``timeseries`` as Parquet (default) or CSV files (a streamed
        run's requests file is copied, Parquet only)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        if fmt not in ("parquet", "csv"):
            raise ValueError(f"fmt={fmt!r}: use 'parquet' or 'csv'")
        paths = []
        if self.requests is None:
            if self.requests_path is None:
                raise ValueError("the result holds no per-request table and no requests_path")
            if fmt != "parquet":
                raise ValueError(f"fmt={fmt!r}: a streamed run's requests are Parquet only "
                                 f"({self.requests_path}); use fmt='parquet'")
            p = out / "requests.parquet"
            if not (p.exists() and p.samefile(self.requests_path)):
                shutil.copyfile(self.requests_path, p)
            paths.append(p)
        frames = [("timeseries", self.timeseries)]
        if self.requests is not None:
            frames.insert(0, ("requests", self.requests))
        for name, df in frames:
            if fmt == "parquet":
                p = out / f"{name}.parquet"
                df.to_parquet(p, index=False)
            else:
                p = out / f"{name}.csv"
                frame = df.copy()
                if "token_times_ns" in frame:
                    frame["token_times_ns"] = frame["token_times_ns"].map(
                        lambda v: " ".join(map(str, v))
                    )
                frame.to_csv(p, index=False)
            paths.append(p)
        return paths


# The scalar columns of a record, int64 each (``instance``: position in the instance names).
_SCALARS = (
    "index",
    "send_ns",
    "arrival_ns",
    "queued_ns",
    "first_scheduled_ns",
    "first_token_ns",
    "finish_ns",
    "prompt_len",
    "output_len",
    "num_preemptions",
    "prefix_hit_tokens",
    "cached_tokens",
    "recomputed_tokens",
    "instance",
)

# A record's row: the scalars, then the end of its runs in the run table.
_RUN_END = len(_SCALARS)
_ROW_WIDTH = _RUN_END + 1
_INITIAL_ROWS = 256


def _doubled(table: np.ndarray, used: int) -> np.ndarray:
    """``table`` (its first ``used`` rows filled) copied into one twice as long."""
    out = np.zeros((2 * len(table), table.shape[1]), dtype=table.dtype)
    out[:used] = table[:used]
    return out


# Step times of log ``k`` over steps ``[lo, hi)``: an int64 array of length ``hi - lo``.
StepTimes = Callable[[int, int, int], np.ndarray]


class RequestRecords:
    """Finished requests' per-request records, columnar, so a finished ``Request`` can be
    dropped: a table of int64 rows (the scalar columns ``_SCALARS`` and the end of the
    request's runs), the request ids, and each request's output token times as runs of
    consecutive steps of one scheduler's token log (``TokenLog``): rows ``(log, first step,
    end step)`` of a run table, record ``i``'s runs being rows ``_rows[i - 1, _RUN_END] ..
    _rows[i, _RUN_END]``. Both tables are numpy buffers with room to grow (doubled when full),
    written in place through typed views when compiled. About 150 bytes per request (24 more
    per extra run; up to twice that while the tables are half full); the token times
    themselves stay in the logs (8 bytes per step of each scheduler).

    ``logs`` are the schedulers' token logs in member order (a run names its log by position;
    logs not listed are added as they appear)."""

    __slots__ = ("logs", "_log_pos", "_last_log", "_last_k", "request_id", "n", "n_runs",
                 "_rows", "_rv", "_runs", "_uv")

    def __init__(self, logs: Sequence[TokenLog] = ()) -> None:
        self.logs: list[TokenLog] = []
        self._log_pos: dict[int, int] = {}
        self._last_log: TokenLog | None = None  # the log of the last run added, and its position
        self._last_k = -1
        for log in logs:
            self._log(log)
        self.request_id: list[str] = []
        self.n = 0  # records held: rows 0 .. n - 1 of _rows
        self.n_runs = 0  # runs held: rows 0 .. n_runs - 1 of _runs
        self._set_rows(np.zeros((_INITIAL_ROWS, _ROW_WIDTH), dtype=np.int64))
        self._set_runs(np.zeros((_INITIAL_ROWS, 3), dtype=np.int64))

    def _set_rows(self, rows: np.ndarray) -> None:
        self._rows = rows
        self._rv = rows  # (compiled: a typed view of the same buffer)

    def _set_runs(self, runs: np.ndarray) -> None:
        self._runs = runs
        self._uv = runs

    def _log(self, log: TokenLog) -> int:
        if log is self._last_log:
            return self._last_k
        k = self._log_pos.get(id(log))
        if k is None:
            k = self._log_pos[id(log)] = len(self.logs)
            self.logs.append(log)
        self._last_log = log
        self._last_k = k
        return k

    def __len__(self) -> int:
        return self.n

    def __reduce__(self) -> tuple:
        """Pickled as its filled rows (a compiled record table's typed views cannot be
        pickled)."""
        return (_unpickled_records, (type(self), self.logs, self.request_id,
                                     self._rows[: self.n].copy(), self._runs[: self.n_runs].copy()))

    def add(self, req: Request, send_ns: int | None = None, instance: int = -1) -> None:
        """Record ``req`` (finished: nothing of it changes any more). ``send_ns``: when the
        client sent it (default its engine arrival); ``instance``: the position of the
        instance that finished it."""
        for log, a, b in req.token_runs():
            k = self._log(log)
            u = self.n_runs
            if u == len(self._runs):
                self._set_runs(_doubled(self._runs, u))
            uv = self._uv
            uv[u, 0] = k
            uv[u, 1] = a
            uv[u, 2] = b
            self.n_runs = u + 1
        n = self.n
        if n == len(self._rows):
            self._set_rows(_doubled(self._rows, n))
        v = self._rv
        # In _SCALARS' order, then the end of the request's runs.
        v[n, 0] = req.index
        v[n, 1] = req.arrival_ns if send_ns is None else send_ns
        v[n, 2] = req.arrival_ns
        v[n, 3] = req.queued_ns
        v[n, 4] = req.first_scheduled_ns
        v[n, 5] = req.first_token_ns
        v[n, 6] = req.finish_ns
        v[n, 7] = req.prompt_len
        v[n, 8] = req.num_tokens - req.prompt_len
        v[n, 9] = req.num_preemptions
        v[n, 10] = req.prefix_hit_tokens
        v[n, 11] = req.num_cached_tokens if req.num_cached_tokens > 0 else 0
        v[n, 12] = req.recomputed_tokens
        v[n, 13] = instance
        v[n, _RUN_END] = self.n_runs
        self.n = n + 1
        self.request_id.append(req.request_id)

    def column(self, name: str) -> np.ndarray:
        """A copy of scalar column ``name`` (int64, in the order records were added)."""
        return self._rows[: self.n, _SCALARS.index(name)].copy()

    def keep(self, rows: np.ndarray) -> None:
        """Keep only the records at positions ``rows`` (in that order)."""
        starts, ends = self._run_bounds()
        sel = _ranges(starts[rows], ends[rows])
        kept = np.zeros((max(len(rows), _INITIAL_ROWS), _ROW_WIDTH), dtype=np.int64)
        kept[: len(rows)] = self._rows[: self.n][rows]
        kept[: len(rows), _RUN_END] = np.cumsum(ends[rows] - starts[rows], dtype=np.int64)
        runs = np.zeros((max(len(sel), _INITIAL_ROWS), 3), dtype=np.int64)
        runs[: len(sel)] = self._runs[: self.n_runs][sel]
        ids = self.request_id
        self.request_id = [ids[i] for i in rows.tolist()]
        self._set_rows(kept)
        self._set_runs(runs)
        self.n = len(rows)
        self.n_runs = len(sel)

    def _run_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        ends = self._rows[: self.n, _RUN_END].copy()
        starts = np.empty_like(ends)
        if len(ends):
            starts[0] = 0
            starts[1:] = ends[:-1]
        return starts, ends

    def runs_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The runs of the records at ``rows``: per row its first run and end, per run its
        log, first and end step (positions into the returned run arrays)."""
        starts, ends = self._run_bounds()
        s, e = starts[rows], ends[rows]
        sel = _ranges(s, e)
        counts = e - s
        rs = np.cumsum(counts) - counts
        runs = self._runs[: self.n_runs][sel]
        logk, first, stop = runs[:, 0], runs[:, 1], runs[:, 2]
        return rs, rs + counts, logk, np.stack([first, stop])

    def token_times(self, rows: np.ndarray, source: StepTimes) -> np.ndarray:
        """The output token times of the records at ``rows`` (object array of read-only int64
        arrays), read from ``source``: the engine's log times or the client's per step. A
        request whose tokens came in one run (nearly all) gets a view into one copy of the
        steps the rows span; an interrupted one (preempted, handed from prefill to decode,
        skipped a step) its runs concatenated."""
        rs, re_, logk, bounds = self.runs_of(rows)
        first, stop = bounds
        windows: dict[int, tuple[np.ndarray, int]] = {}
        for k in np.unique(logk).tolist():
            mine = logk == k
            lo, hi = int(first[mine].min()), int(stop[mine].max())
            w = np.asarray(source(k, lo, hi), dtype=np.int64)
            assert len(w) == hi - lo, "step times must cover every step"
            w.flags.writeable = False
            windows[k] = (w, lo)
        empty = np.empty(0, dtype=np.int64)
        empty.flags.writeable = False
        out = np.empty(len(rows), dtype=object)
        lk, fs, st = logk.tolist(), first.tolist(), stop.tolist()
        for j, (a, b) in enumerate(zip(rs.tolist(), re_.tolist(), strict=True)):
            if b - a == 1:
                w, lo = windows[lk[a]]
                out[j] = w[fs[a] - lo : st[a] - lo]
            elif a == b:
                out[j] = empty
            else:
                parts = []
                for r in range(a, b):
                    w, lo = windows[lk[r]]
                    parts.append(w[fs[r] - lo : st[r] - lo])
                t = np.concatenate(parts)
                t.flags.writeable = False
                out[j] = t
        return out

    def client_ready(self, rows: np.ndarray, delivered: Callable[[int], Sequence[int]]) -> int:
        """How many of the records at ``rows``, from the first, have every token delivered to
        the client (``delivered(k)``: the client ns of each step of log ``k`` so far, -1 for
        a step not yet delivered; a step that gave a request a token is delivered once the
        API server has served its output message)."""
        rs, re_, logk, bounds = self.runs_of(rows)
        stop = bounds[1]
        lists = {k: delivered(k) for k in np.unique(logk).tolist()}
        lk, st = logk.tolist(), stop.tolist()
        for j, (a, b) in enumerate(zip(rs.tolist(), re_.tolist(), strict=True)):
            for r in range(a, b):
                d = lists[lk[r]]
                last = st[r] - 1
                if last >= len(d) or d[last] < 0:
                    return j
        return len(rows)

    def frame(
        self,
        rows: np.ndarray | None = None,
        *,
        client: StepTimes | None = None,
        instances: Sequence[str] | None = None,
    ) -> pd.DataFrame:
        """One row per record at ``rows`` (default: all, in the order added), columns as
        ``analysis.metrics`` reads them.

        ``client`` gives the client's delivery ns of each step of a log (``engine.frontend``);
        ``client_token_times_ns``, ``client_first_token_ns`` and ``client_finish_ns`` follow
        from it (-1 where the engine time is -1). Without it they are the engine's own
        columns (the same arrays). ``instances`` names the instances: an ``instance`` column
        then says which one finished each request."""
        if rows is None:
            rows = np.arange(len(self), dtype=np.int64)
        col = {name: self.column(name)[rows] for name in _SCALARS}
        logs = self.logs

        def engine(k: int, lo: int, hi: int) -> np.ndarray:
            return np.array(logs[k].times[lo:hi], dtype=np.int64)

        tokens = self.token_times(rows, engine)
        first, finish = col["first_token_ns"], col["finish_ns"]
        if client is None:
            client_tokens, client_first, client_finish = tokens, first, finish
        else:
            n = len(rows)
            client_tokens = self.token_times(rows, client)
            client_first = np.fromiter(
                (c[0] if f >= 0 and len(c) else -1
                 for c, f in zip(client_tokens, first, strict=True)), np.int64, n)
            client_finish = np.fromiter(
                (c[-1] if f >= 0 and len(c) else -1
                 for c, f in zip(client_tokens, finish, strict=True)), np.int64, n)
        ids = self.request_id
        data = {
            "request_id": [ids[i] for i in rows.tolist()],
            "send_ns": col["send_ns"],
            "arrival_ns": col["arrival_ns"],
            "queued_ns": col["queued_ns"],
            "first_scheduled_ns": col["first_scheduled_ns"],
            "first_token_ns": first,
            "finish_ns": finish,
            "prompt_len": col["prompt_len"],
            "output_len": col["output_len"],
            "num_preemptions": col["num_preemptions"],
            "prefix_hit_tokens": col["prefix_hit_tokens"],
            "cached_tokens": col["cached_tokens"],
            "recomputed_tokens": col["recomputed_tokens"],
            "queueing_delay_ns": col["first_scheduled_ns"] - col["arrival_ns"],
            "token_times_ns": tokens,
            "client_first_token_ns": client_first,
            "client_finish_ns": client_finish,
            "client_token_times_ns": client_tokens,
        }
        if instances is not None:
            data["instance"] = np.array(list(instances), dtype=object)[col["instance"]]
        return pd.DataFrame(data)


def _unpickled_records(cls: type[RequestRecords], logs: list[TokenLog], request_id: list[str],
                       rows: np.ndarray, runs: np.ndarray) -> RequestRecords:
    records = cls(logs)
    records.request_id = request_id
    records._set_rows(_doubled(rows, len(rows)) if len(rows) else records._rows)
    records._set_runs(_doubled(runs, len(runs)) if len(runs) else records._runs)
    records.n = len(rows)
    records.n_runs = len(runs)
    return records


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The concatenation of ``range(s, e)`` for each pair (int64)."""
    counts = ends - starts
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    offsets = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(offsets - starts, counts)


def requests_frame(
    requests: Sequence[Request],
    send_ns: np.ndarray | None = None,
    client_log_times: dict[int, np.ndarray] | None = None,
) -> pd.DataFrame:
    """One row per request of ``requests`` (in order), columns as
    :meth:`RequestRecords.frame` makes them. ``send_ns``: when the client sent each request
    (default: its engine arrival); ``client_log_times`` maps ``id(TokenLog)`` to the client's
    delivery ns of each step in that log."""
    records = RequestRecords()
    for i, r in enumerate(requests):
        records.add(r, None if send_ns is None else int(send_ns[i]))
    client = None
    if client_log_times is not None:
        times = client_log_times
        logs = records.logs

        def client(k: int, lo: int, hi: int) -> np.ndarray:
            v = np.asarray(times[id(logs[k])], dtype=np.int64)
            assert len(v) == len(logs[k].times), "client times must cover every step"
            return v[lo:hi]

    return records.frame(client=client)


class RequestStream:
    """Writes finished requests' records to a Parquet file as they finish, in row groups of
    ``chunk_rows`` rows, in workload order (``Request.index``): the file holds exactly the
    table :meth:`SimulationResult.write` writes for the same run kept in memory.

    ``add`` records a finished request; rows wait until every request before them in the
    workload has finished (and, behind an API server, until the client has every token:
    ``delivered``), so only the requests in flight or finished out of order are held. The
    file is written as ``<path>.partial`` and renamed to ``path`` by :meth:`close`.
    """

    def __init__(
        self,
        path: str | Path,
        records: RequestRecords,
        *,
        chunk_rows: int = 4096,
        instances: Sequence[str] | None = None,
        client: StepTimes | None = None,
        delivered: Callable[[int], Sequence[int]] | None = None,
    ) -> None:
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ValueError(f"chunk_rows={chunk_rows!r}: give an int >= 1")
        if (client is None) != (delivered is None):
            raise ValueError("give both client and delivered, or neither")
        self.path = Path(path)
        self.records = records
        self.chunk_rows = chunk_rows
        self.instances = instances
        self.client = client
        self.delivered = delivered
        self.rows_written = 0  # every request index below this is in the file
        self._next_try = chunk_rows
        self._writer: pq.ParquetWriter | None = None  # the file, once the first rows are in
        self._partial = self.path.with_name(self.path.name + ".partial")

    def add(self, req: Request, send_ns: int | None = None, instance: int = -1) -> None:
        self.records.add(req, send_ns, instance)
        if len(self.records) >= self._next_try:
            self._flush(final=False)
            self._next_try = len(self.records) + max(self.chunk_rows // 4, 1)

    def _flush(self, final: bool) -> None:
        rec = self.records
        if not len(rec):
            return
        index = rec.column("index")
        order = np.argsort(index, kind="stable")
        # The rows that continue the file without a gap: index rows_written, +1, ...
        expect = self.rows_written + np.arange(len(order), dtype=np.int64)
        gap = np.flatnonzero(index[order] != expect)
        ready = order[: int(gap[0]) if len(gap) else len(order)]
        if self.delivered is not None and len(ready):
            ready = ready[: rec.client_ready(ready, self.delivered)]
        n = len(ready) if final else len(ready) // self.chunk_rows * self.chunk_rows
        if n == 0:
            return
        for start in range(0, n, self.chunk_rows):
            self._write(ready[start : min(start + self.chunk_rows, n)])
        self.rows_written += n
        rest = np.ones(len(index), dtype=bool)
        rest[ready[:n]] = False
        rec.keep(np.flatnonzero(rest))

    def _write(self, rows: np.ndarray) -> None:
        # pyarrow only here: a streamed run needs it, importing the engine does not (the
        # scheduler-fidelity venv has no pyarrow; it costs every other import ~0.2 s).
        import pyarrow as pa
        import pyarrow.parquet as pq

        frame = self.records.frame(rows, client=self.client, instances=self.instances)
        if self._writer is None:
            self._partial.parent.mkdir(parents=True, exist_ok=True)
            table = pa.Table.from_pandas(frame, preserve_index=False)
            # Dictionary pages only for the string columns: token times and instants are
            # nearly all distinct (the values written are the same either way).
            strings = [f.name for f in table.schema if pa.types.is_large_string(f.type)
                       or pa.types.is_string(f.type)]
            self._writer = pq.ParquetWriter(self._partial, table.schema, use_dictionary=strings)
        else:
            table = pa.Table.from_pandas(frame, schema=self._writer.schema, preserve_index=False)
        self._writer.write_table(table, row_group_size=len(frame))

    def close(self) -> Path:
        """Write every record still held and finish the file; returns its path. Raises
        ``RuntimeError`` if a record cannot be written (a request before it never finished,
        or a token the client never got)."""
        self._flush(final=True)
        if len(self.records):
            raise RuntimeError(
                f"{len(self.records)} finished request(s) could not be written to {self.path}: "
                f"request index {self.rows_written} never finished or was never delivered")
        if self._writer is None:
            raise RuntimeError(f"no request finished: nothing to write to {self.path}")
        self._writer.close()
        self._writer = None
        os.replace(self._partial, self.path)
        return self.path

    def abort(self) -> None:
        """Close and remove the partial file (the run failed)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._partial.unlink(missing_ok=True)


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
    for c in ("running", "waiting"):  # counts, summed as floats above
        out[c] = out[c].astype(np.int64)
    return pd.DataFrame({"t_s": np.arange(1, n_sec + 1, dtype=float),
                         **{c: out[c] for c in cols[1:]}})


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
