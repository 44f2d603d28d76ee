"""One engine core: a scheduler (or a data-parallel group of schedulers stepping in lock-step)
with its KV cache and latency model, advanced by a global event clock.

Time is event-driven: a step starts the moment the previous one frees the GPU; an idle engine
does nothing until a request reaches it (vLLM's engine core blocks on its input queue, it does
not poll).

Async scheduling (vLLM 0.19 default, ``EngineCore.step_with_batch_queue`` with a batch queue of
depth 2): step k+1 is scheduled when step k is launched, i.e. at the end of step k−1, before
step k's output is processed. So a request arriving while step k runs is first seen by the
schedule of step k+2, and blocks freed by step k become visible to step k+2. With
``async_scheduling=False`` the engine schedules, executes and processes each step in turn.

Pipeline parallelism: up to ``pp`` batches are in flight (the batch queue is at least ``pp``
deep); a new batch starts ``latency.stage_ns`` after the previous one (its busiest stage's
time), and completes after ``latency.iteration_ns``.

Data parallelism (vLLM DP): the members of a group step together; an idle member runs a dummy
batch, the batches are padded as ``dp_pad`` says, and the group's step lasts as long as its
slowest member.

Steady decode spans: while only the requests' own progress changes the schedule (no request
reaches the engine or can be admitted, none is in prefill, the free blocks serve every block
boundary crossed), the steps are pure-decode batches of the running requests; one that
finishes drops out of them, nothing waiting to take its seat (with every seat taken and
requests queued, a span ends before the first finish). In async scheduling the step in flight
when a span starts may hold prefill chunks that end their prompts. :meth:`EngineUnit.poll`
runs such steps in bulk (:meth:`engine.scheduler.Scheduler.decode_span` for the requests and
the KV cache, the step latencies at once when the latency model offers ``decode_steps_ns``),
with the same result as step by step: one :class:`StepLog` entry and one token-log time per
step, the same KV calls (frees included) in the same order, each finish reported at its time.
The caller bounds the span with ``horizon_ns``, the earliest time anything
outside the unit may reach or read it; without it (or with ``fast_forward`` off, or a DP
group, pipeline parallelism, lower KV tiers, a P/D decode queue) every step is simulated.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.batch import BatchShape, LatencyModel, decode_advanced
from engine.deployment import DpPad
from engine.kv_cache import KVCacheManager
from engine.request import Request, RequestStatus
from engine.scheduler import ScheduledStep, Scheduler

FAST_FORWARD = True  # the default of EngineUnit.fast_forward
_MAX_CHUNK = 1 << 20  # decode-span steps priced at once, at most (C ints: no doubling overflow)


class StepLog:
    """Per-step samples for the time series, as compact arrays (8 bytes a value: a million
    requests take ten million steps); converted once at the end."""

    __slots__ = ("end_ns", "running", "waiting", "usage", "prompt_tokens", "gen_tokens")

    def __init__(self) -> None:
        self.end_ns = array("q")
        self.running = array("q")
        self.waiting = array("q")
        self.usage = array("d")
        self.prompt_tokens = array("q")
        self.gen_tokens = array("q")


@dataclass(slots=True)
class Member:
    """One serving instance (one vLLM engine / DP rank)."""

    name: str
    scheduler: Scheduler
    latency: LatencyModel
    role: str = "colocated"  # "colocated", "prefill" or "decode"
    log: StepLog = field(default_factory=StepLog)
    # P/D decode side: requests whose KV has arrived, waiting for a slot.
    arrived_kv: deque[Request] = field(default_factory=deque)
    num_steps: int = 0

    @property
    def kv(self) -> KVCacheManager:
        return self.scheduler.kv

    def load(self) -> float:
        """vLLM-router-style load score: (4·waiting + running) / max_num_seqs."""
        s = self.scheduler
        return (4 * (len(s.waiting) + len(self.arrived_kv)) + len(s.running)) / s.max_num_seqs


class EngineUnit:
    """Drives one engine core (``len(members) == 1``) or one DP group in lock-step."""

    def __init__(
        self,
        members: Sequence[Member],
        *,
        step_overhead_ns: int = 0,
        overhead_hidden_ns: int = 0,
        pp: int = 1,
        dp_pad: DpPad | None = None,
        on_finished: Callable[[Member, Request, int], None] | None = None,
    ) -> None:
        self.members = list(members)
        # Steady decode spans in bulk (see the module docstring); False simulates every step
        # (the reference the fast-forward tests compare against).
        self.fast_forward = FAST_FORWARD
        self.step_overhead_ns = step_overhead_ns
        self.overhead_hidden_ns = overhead_hidden_ns
        self.pp = pp
        self.dp_pad = dp_pad
        self.on_finished = on_finished
        async_ = self.members[0].scheduler.async_scheduling
        self.depth = max(pp, 2 if async_ else 1)
        self.inflight: deque[tuple[list[ScheduledStep], int]] = deque()
        self.gpu_free_at = 0
        self.num_finished = 0
        self.waiting_for: int | None = None
        self._span_step_ns = 0  # the first step's latency in the last decode span

    # -- helpers ---------------------------------------------------------------------------
    def _admit_arrived_kv(self, m: Member) -> None:
        """P/D decode side: start requests whose KV arrived, FIFO, while seats and blocks allow
        (the prompt's KV is external: no prefix lookup, no recompute)."""
        sched = m.scheduler
        q = m.arrived_kv
        while q and len(sched.running) < sched.max_num_seqs:
            req = q[0]
            computed = req.num_computed_tokens
            req.num_computed_tokens = 0
            if not sched.kv.allocate_slots(req, req.num_tokens - computed, computed):
                req.num_computed_tokens = computed
                break
            q.popleft()
            req.num_computed_tokens = computed
            req.status = RequestStatus.RUNNING
            sched.running.append(req)

    def _overhead(self, t_gpu: int) -> int:
        """Exposed host overhead of a step whose GPU work takes ``t_gpu`` ns."""
        c = self.step_overhead_ns
        h = self.overhead_hidden_ns
        if c == 0 or h == 0:
            return c
        return c * (h - t_gpu) // h if t_gpu < h else 0

    def _duration(self, steps: list[ScheduledStep]) -> tuple[int, int]:
        """(iteration ns, ns until the next launch may start) of a launch."""
        if len(steps) == 1:
            step = steps[0]
            assert step.shape is not None
            lat = self.members[0].latency
            it = int(lat.iteration_ns(step.shape))
            stage = int(lat.stage_ns(step.shape)) if self.pp > 1 else it
            extra = self._overhead(it) + step.extra_ns
            return it + extra, stage + extra
        shapes = [s.shape for s in steps]
        padded = self.dp_pad(shapes) if self.dp_pad else shapes
        it = stage = 0
        for m, shape, step in zip(self.members, padded, steps, strict=True):
            if shape is None:
                continue
            t_it = int(m.latency.iteration_ns(shape)) + step.extra_ns
            t_st = int(m.latency.stage_ns(shape)) + step.extra_ns if self.pp > 1 else t_it
            it, stage = max(it, t_it), max(stage, t_st)
        extra = self._overhead(it)
        return it + extra, stage + extra

    def _record(self, m: Member, step: ScheduledStep, end_ns: int) -> None:
        log = m.log
        sched = m.scheduler
        log.end_ns.append(end_ns)
        log.running.append(len(sched.running))
        log.waiting.append(len(sched.waiting) + len(m.arrived_kv))
        log.usage.append(sched.kv.pool.usage())
        log.prompt_tokens.append(step.prompt_tokens)
        log.gen_tokens.append(sum(step.samples))

    # -- the engine loop -----------------------------------------------------------------
    def _complete_oldest(self) -> None:
        steps, end = self.inflight.popleft()
        for m, step in zip(self.members, steps, strict=True):
            if not step.reqs:
                continue
            for req in m.scheduler.update_from_output(step, end):
                self.num_finished += 1
                if self.on_finished is not None:
                    self.on_finished(m, req, end)
            self._record(m, step, end)

    def poll(self, t: int, horizon_ns: int | None = None) -> int | None:
        """Do everything this engine does at time ``t`` and return when it next needs
        attention (the end of the in-flight step it waits for), or None when it is idle.

        Call it when an idle engine receives work, and at the time it returned.
        ``horizon_ns``: no request, KV hand-off or reader reaches this unit before that time,
        so steady decode steps scheduled before it may run in bulk (None: step by step)."""
        if self.waiting_for is not None:
            if t < self.waiting_for:
                return self.waiting_for
            self.waiting_for = None
            self._complete_oldest()
        members = self.members
        inflight = self.inflight
        span_ok = (
            horizon_ns is not None
            and self.fast_forward
            and len(members) == 1
            and self.pp == 1
            and members[0].scheduler.kv.tiers is None
        )
        while True:
            # A span whose next completion comes at or after the horizon would be one schedule
            # (S_0) only: an ordinary schedule is the same and cheaper.
            if (span_ok and t < horizon_ns  # type: ignore[operator]
                    and not (inflight and inflight[0][1] >= horizon_ns)
                    and not members[0].arrived_kv):
                done = self._decode_span(t, horizon_ns)  # type: ignore[arg-type]
                if done is not None:
                    t, full = done
                    if full:  # the span's last operation was a schedule: wait for a step
                        self.waiting_for = inflight[0][1]
                        return self.waiting_for
            if self._can_schedule():
                for m in members:
                    if m.arrived_kv:
                        self._admit_arrived_kv(m)
                steps = [m.scheduler.schedule(t) for m in members]
                busy = False  # any member with a batch (a loop: no generator in cpdef)
                for s in steps:
                    if s.reqs:
                        busy = True
                        break
                if busy:
                    it, stage = self._duration(steps)
                    start = t if t > self.gpu_free_at else self.gpu_free_at
                    self.gpu_free_at = start + stage
                    for m, s in zip(members, steps, strict=True):
                        if s.reqs:
                            m.num_steps += 1
                    inflight.append((steps, start + it))
                    if len(inflight) < self.depth:
                        continue  # async/PP: schedule the next step while this one runs
            if inflight:
                end = inflight[0][1]
                if end > t:
                    self.waiting_for = end
                    return end
                self._complete_oldest()
                continue
            return None

    def _decode_span(self, t: int, horizon: int) -> tuple[int, bool] | None:
        """Run the steady decode span starting at ``t`` (see the module docstring), bounded by
        ``horizon``. Returns (the time reached, whether its last operation was a schedule), or
        None when no span starts here. The operations are those of the polls at the span's
        step boundaries T_0 = t < T_1 < ... < horizon: at T_i the oldest step completes (i >= 1)
        and the next is scheduled."""
        m = self.members[0]
        sched = m.scheduler
        inflight = self.inflight
        span = sched.steady_decode([s[0][0] for s in inflight])
        if span is None:
            return None
        first_prompt_tokens = inflight[0][0][0].prompt_tokens if inflight else 0
        lat = m.latency
        # times[i] = T_i, the poll at which S_i (and C_i, i >= 1) happen, while before the
        # horizon; ends[i] / gpus[i]: S_i's end and when the GPU is free after it.
        times = [t]
        ends: list[int] = []
        gpus: list[int] = []
        queue = [e for _, e in inflight]  # in-flight step ends, oldest first
        gpu = self.gpu_free_at
        durs: list[int] = []
        last = span.max_completions  # S_0 .. S_last and C_1 .. C_last at most
        # Latencies are priced in chunks, each within one segment of schedules that hold the
        # same requests: first about as many steps as the last span's step length says fit
        # before the horizon.
        chunk = (horizon - t) // self._span_step_ns + 2 if self._span_step_ns else 8
        if chunk > _MAX_CHUNK:
            chunk = _MAX_CHUNK
        seg_end = 0  # the first schedule beyond the current segment
        seg_start = 0
        shape = None
        i = 0
        while True:
            if i == len(durs):
                if i >= seg_end:
                    shape, seg_end = sched.span_segment(span, i)
                    seg_start = i
                k = min(chunk, last + 1 - i, seg_end - i)
                if shape.num_seqs:
                    durs.extend(_decode_latencies(lat, shape, i - seg_start, k))
                else:  # async S_last with every request's final token in flight: it is never
                    durs.extend([0] * k)  # scheduled, and a model need not price an empty batch
                if chunk < _MAX_CHUNK:
                    chunk *= 2
            it = durs[i]
            start = times[i] if times[i] > gpu else gpu
            gpu = start + it + self._overhead(it)
            ends.append(gpu)  # pp = 1: the step ends when the GPU is free again
            gpus.append(gpu)
            queue.append(gpu)
            nxt = queue.pop(0)  # C_{i+1}: the oldest step in flight completes
            if i == last or nxt >= horizon:
                break
            times.append(nxt)
            i += 1
        self._span_step_ns = max(durs[0], 1)
        out = sched.decode_span(span, times)
        ops = out.ops
        if ops == 0:
            return None
        n_s = (ops + 1) // 2  # schedules S_0 .. S_{n_s - 1}
        n_c = ops // 2  # completions C_1 .. C_{n_c}
        self.gpu_free_at = gpus[n_s - 1]
        m.num_steps += n_s
        # Completed steps are only logged (as _complete_oldest / _record would log them).
        log = m.log
        tlog = sched.token_log.times
        waiting = len(sched.waiting) + len(m.arrived_kv)
        if n_c:  # (in bulk: one extend per column)
            done = times[1 : n_c + 1]
            tlog.extend(done)
            log.end_ns.extend(done)
            log.running.extend(out.running)
            log.waiting.extend([waiting] * n_c)
            log.usage.extend(out.usage)
            # C_1 completes the step in flight before the span (its prefill chunks, if any,
            # ended their prompts); every later one, a span step of decodes only.
            prompt = [0] * n_c
            prompt[0] = first_prompt_tokens
            log.prompt_tokens.extend(prompt)
            log.gen_tokens.extend(out.gen)
        for c, req in out.finished:  # as _complete_oldest reports them
            self.num_finished += 1
            if self.on_finished is not None:
                self.on_finished(m, req, times[c])
        # Still in flight: the steps before the span and the span's schedules, less the n_c
        # oldest (completed).
        for _ in range(min(n_c, len(inflight))):
            inflight.popleft()
        first = n_s - len(out.tail)
        for j, step in enumerate(out.tail):
            inflight.append(([step], ends[first + j]))
        return times[n_c], ops % 2 == 1

    def _can_schedule(self) -> bool:
        return any(m.scheduler.has_requests() or m.arrived_kv for m in self.members)

    def stuck_request(self) -> tuple[Member, Request] | None:
        for m in self.members:
            if m.scheduler.waiting:
                return m, m.scheduler.waiting[0]
            if m.arrived_kv:
                return m, m.arrived_kv[0]
        return None


def _decode_latencies(lat: LatencyModel, shape: BatchShape, first: int, k: int) -> list[int]:
    """Iteration ns of steps ``first .. first + k - 1`` of a decode span from ``shape``: the
    model's ``decode_steps_ns`` when it has one (the same integers), else one call per step."""
    bulk = getattr(lat, "decode_steps_ns", None)
    if bulk is not None:
        return bulk(decode_advanced(shape, first), k)
    return [int(lat.iteration_ns(decode_advanced(shape, first + i))) for i in range(k)]
