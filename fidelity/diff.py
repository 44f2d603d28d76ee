"""Lockstep driver and step comparison.

Both sides are driven by the same engine-core protocol, vLLM 0.19.1's
``EngineCore.step_with_batch_queue`` (depth 2, async scheduling) or ``EngineCore.step``
(depth 1, sync), with the GPU always "still busy" when the next step is scheduled:

    add the requests due by this tick
    if side.has_requests():
        schedule a step and queue it
        if the step scheduled tokens and the queue is not full: call again (same tick)
    elif the queue is empty: idle tick
    apply the oldest queued step's output (the tick's GPU step; a batch that ran nothing
    on the GPU is ready at once, and the loop goes on)

Tick ``k`` stands for time ``k · step_ns``; request ``i`` is added before the first tick with
``k · step_ns >= arrival_ns``. When both sides are idle the tick jumps to the next arrival.

A tick is one GPU step: engine-loop calls repeat within it until one blocks on the oldest
in-flight step (in async mode, after an idle spell, the first two schedules share a tick, as
they share an instant in vLLM). Per tick each side yields its non-empty
:class:`SchedRecord` s (usually one) and an optional :class:`UpdateRecord`. Records of empty
batches (nothing scheduled or preempted) are dropped: vLLM schedules an empty batch once
more after requests finish, to flush their ids, which changes nothing our engine models. A tick is *compared* when either side has a record,
and *identical* when both sides' records (and, every ``free_queue_every`` ticks, their whole
free-block queues, per-block ref counts and prefix-cache indexes) are equal.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from engine.workload import RequestSpec
from fidelity.sides import SchedConfig, SchedRecord, UpdateRecord


class Side(Protocol):
    name: str

    def add(self, spec: RequestSpec) -> None: ...
    def has_requests(self) -> bool: ...
    def schedule(self) -> tuple[Any, SchedRecord]: ...
    def update(self, handle: Any) -> UpdateRecord: ...
    def free_queue(self) -> tuple[int, ...]: ...
    def ledger(self) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]: ...
    def prefix_stats(self) -> tuple[int, int]: ...
    def describe(self, limit: int = 12) -> str: ...


@dataclass(slots=True)
class Tick:
    sched: tuple[SchedRecord, ...] = ()
    update: UpdateRecord | None = None
    free_queue: tuple[int, ...] | None = None
    ledger: tuple[tuple[int, ...], tuple[tuple[int, ...], ...]] | None = None
    idle: bool = False

    @property
    def has_record(self) -> bool:
        return bool(self.sched) or self.update is not None


class Lane:
    """One side plus its in-flight batch queue and arrival cursor."""

    def __init__(self, side: Side, specs: Sequence[RequestSpec], depth: int) -> None:
        self.side = side
        self.specs = specs
        self.depth = depth
        self.queue: deque[tuple[Any, SchedRecord]] = deque()
        self.next = 0
        self.samples = 0
        self.sched_tokens = 0
        self.preemptions = 0
        self.finished = 0
        self.first_token_tick: dict[str, int] = {}
        self.finish_tick: dict[str, int] = {}

    def tick(self, k: int, now_ns: int) -> Tick:
        """One GPU step's worth of engine-loop calls at ``now_ns``.

        A call that schedules a batch while the queue still has room returns at once in
        vLLM, and the busy loop calls again straight away; so does a call that pops a batch
        that ran nothing on the GPU (its output is ready at once). Calls repeat within the
        tick until one blocks on the oldest in-flight step (and applies its output) or the
        engine is idle. In async mode after an idle spell the first two schedules thus share
        a tick, as they share an instant in vLLM."""
        specs = self.specs
        out = Tick()
        while True:
            while self.next < len(specs) and specs[self.next].arrival_ns <= now_ns:
                self.side.add(specs[self.next])
                self.next += 1
            rec: SchedRecord | None = None
            if self.side.has_requests():
                handle, rec = self.side.schedule()
                self.queue.append((handle, rec))
                if not rec.empty:
                    out.sched = (*out.sched, rec)
                    self.sched_tokens += sum(n for _, n, _ in rec.scheduled)
                    self.preemptions += len(rec.preempted)
                if rec.scheduled and len(self.queue) < self.depth:
                    continue  # vLLM returns without blocking; the loop calls again at once
            elif not self.queue:
                out.idle = not out.sched and out.update is None
                return out
            handle, done = self.queue.popleft()
            upd = self.side.update(handle)
            if not done.empty:
                out.update = upd
                for rid in done.samples:
                    self.samples += 1
                    self.first_token_tick.setdefault(rid, k)
                for rid in upd.finished:
                    self.finish_tick[rid] = k
                self.finished += len(upd.finished)
            if done.scheduled or rec is None or not rec.scheduled:
                return out  # waited for a GPU step (or nothing is left to do now)
            # The popped batch ran nothing on the GPU (vLLM's flush of finished ids, or a
            # step that only preempted): its output is there at once, so the loop goes on.

    @property
    def done(self) -> bool:
        return self.next >= len(self.specs) and not self.queue and not self.side.has_requests()


@dataclass(slots=True)
class Divergence:
    tick: int
    fields: list[str]
    ours: dict[str, Any]
    vllm: dict[str, Any]
    state_ours: str
    state_vllm: str


@dataclass(slots=True)
class CaseResult:
    name: str
    ticks: int = 0
    compared: int = 0
    identical: int = 0
    divergence: Divergence | None = None
    field_mismatches: dict[str, int] = field(default_factory=dict)
    totals: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    stalled: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)  # corner cases hit (our side)

    @property
    def all_identical(self) -> bool:
        """Every compared tick identical, the end state equal, nothing stalled."""
        return (
            self.compared > 0
            and self.compared == self.identical
            and not self.stalled
            and not self.field_mismatches
            and all(a == b for a, b in self.totals.values())
        )


def _fields_of(t: Tick) -> dict[str, Any]:
    """Flatten a tick into named comparable fields."""
    out: dict[str, Any] = {"schedules": len(t.sched)}
    named: list[tuple[str, SchedRecord | UpdateRecord | None]] = [
        ("sched" if len(t.sched) == 1 else f"sched{i}", rec) for i, rec in enumerate(t.sched)
    ]
    named.append(("update", t.update))
    for name, rec in named:
        if rec is None:
            out[name] = None
            continue
        for f in fields(rec):
            out[f"{name}.{f.name}"] = getattr(rec, f.name)
    out["free_queue"] = t.free_queue
    if t.ledger is not None:
        out["ledger.ref_cnt"], out["ledger.cache_index"] = t.ledger
    return out


def _diff(a: Tick, b: Tick) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    fa, fb = _fields_of(a), _fields_of(b)
    keys = list(dict.fromkeys([*fa, *fb]))
    bad = [k for k in keys if fa.get(k, "<absent>") != fb.get(k, "<absent>")]
    return bad, {k: fa.get(k, "<absent>") for k in bad}, {k: fb.get(k, "<absent>") for k in bad}


def run_case(
    name: str,
    cfg: SchedConfig,
    specs: Sequence[RequestSpec],
    make_ours: Callable[[SchedConfig], Side],
    make_vllm: Callable[[SchedConfig], Side],
    *,
    step_ns: int = 30_000_000,
    free_queue_every: int = 0,
    max_ticks: int = 500_000,
    stall_ticks: int = 2_000,
    stop_after_divergence: int | None = None,
) -> CaseResult:
    """Drive both sides over ``specs`` and compare every tick; see the module docstring.

    ``free_queue_every``: compare the whole free-block queue every that many ticks (0: only
    at the end). ``stop_after_divergence``: stop this many ticks after the first divergence
    (None: run both sides to completion). A run where no side records anything for
    ``stall_ticks`` ticks while requests remain is stopped and marked ``stalled``.
    """
    t0 = time.perf_counter()
    depth = 2 if cfg.async_scheduling else 1
    ours = Lane(make_ours(cfg), specs, depth)
    theirs = Lane(make_vllm(cfg), specs, depth)
    res = CaseResult(name)
    effective = getattr(theirs.side, "effective", None)
    if effective:
        wanted = {
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_model_len": cfg.max_model_len,
            "long_prefill_token_threshold": cfg.long_prefill_token_threshold,
            "reserve_full_isl": cfg.reserve_full_isl,
            "async": cfg.async_scheduling,
            "enable_chunked_prefill": cfg.enable_chunked_prefill,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "num_blocks": cfg.num_blocks,
        }
        for key, want in wanted.items():
            if effective.get(key) != want:
                res.notes.append(f"vLLM runs with {key}={effective.get(key)!r}, asked {want!r}")
    k = 0
    quiet = 0
    while k < max_ticks:
        if ours.done and theirs.done:
            break
        now = k * step_ns
        a = ours.tick(k, now)
        b = theirs.tick(k, now)
        if free_queue_every and k % free_queue_every == 0:
            a.free_queue = ours.side.free_queue()
            b.free_queue = theirs.side.free_queue()
            a.ledger = ours.side.ledger()
            b.ledger = theirs.side.ledger()
        res.ticks += 1
        if (
            a.has_record
            or b.has_record
            or a.free_queue != b.free_queue
            or a.ledger != b.ledger
        ):
            quiet = 0
            res.compared += 1
            bad, va, vb = _diff(a, b)
            if not bad:
                res.identical += 1
            else:
                for f in bad:
                    res.field_mismatches[f] = res.field_mismatches.get(f, 0) + 1
                if res.divergence is None:
                    res.divergence = Divergence(
                        k, bad, va, vb, ours.side.describe(), theirs.side.describe()
                    )
        elif not (a.idle and b.idle):
            quiet += 1
            if quiet >= stall_ticks:
                res.stalled = True
                res.notes.append(f"stalled: nothing scheduled for {stall_ticks} ticks at tick {k}")
                break
        if (
            res.divergence is not None
            and stop_after_divergence is not None
            and k - res.divergence.tick >= stop_after_divergence
        ):
            res.notes.append(f"stopped {stop_after_divergence} ticks after the first divergence")
            break
        if a.idle and b.idle and ours.next < len(specs) and ours.next == theirs.next:
            k = max(k + 1, math.ceil(specs[ours.next].arrival_ns / step_ns))
        else:
            k += 1
    else:
        res.notes.append(f"tick limit {max_ticks} reached")
    # End state: the whole free queue and cumulative prefix stats.
    fq_a, fq_b = ours.side.free_queue(), theirs.side.free_queue()
    if fq_a != fq_b:
        res.field_mismatches["final.free_queue"] = 1
        res.notes.append("final free-block queues differ")
    if ours.side.ledger() != theirs.side.ledger():
        res.field_mismatches["final.ledger"] = 1
        res.notes.append("final ref counts or prefix-cache index differ")
    res.totals = {
        "requests finished": (ours.finished, theirs.finished),
        "tokens scheduled": (ours.sched_tokens, theirs.sched_tokens),
        "tokens sampled": (ours.samples, theirs.samples),
        "preemptions": (ours.preemptions, theirs.preemptions),
        "prefix (queries, hits)": (ours.side.prefix_stats(), theirs.side.prefix_stats()),
        "final free blocks": (len(fq_a), len(fq_b)),
    }
    ttft_a = [ours.first_token_tick[r.request_id] - _arrival_tick(r, step_ns) for r in specs
              if r.request_id in ours.first_token_tick]
    ttft_b = [theirs.first_token_tick[r.request_id] - _arrival_tick(r, step_ns) for r in specs
              if r.request_id in theirs.first_token_tick]
    if ttft_a and ttft_b:
        res.totals["mean TTFT (ticks)"] = (
            round(sum(ttft_a) / len(ttft_a), 3),
            round(sum(ttft_b) / len(ttft_b), 3),
        )
    events = getattr(ours.side, "events", None)
    if events:
        res.events = dict(events)
    res.seconds = time.perf_counter() - t0
    return res


def _arrival_tick(spec: RequestSpec, step_ns: int) -> int:
    return math.ceil(spec.arrival_ns / step_ns)
