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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.batch import LatencyModel
from engine.deployment import DpPad
from engine.kv_cache import KVCacheManager
from engine.request import Request, RequestStatus
from engine.scheduler import ScheduledStep, Scheduler


class StepLog:
    """Per-step samples for the time series (plain lists; converted once at the end)."""

    __slots__ = ("end_ns", "running", "waiting", "usage", "prompt_tokens", "gen_tokens")

    def __init__(self) -> None:
        self.end_ns: list[int] = []
        self.running: list[int] = []
        self.waiting: list[int] = []
        self.usage: list[float] = []
        self.prompt_tokens: list[int] = []
        self.gen_tokens: list[int] = []


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

    def poll(self, t: int) -> int | None:
        """Do everything this engine does at time ``t`` and return when it next needs
        attention (the end of the in-flight step it waits for), or None when it is idle.

        Call it when an idle engine receives work, and at the time it returned."""
        if self.waiting_for is not None:
            if t < self.waiting_for:
                return self.waiting_for
            self.waiting_for = None
            self._complete_oldest()
        members = self.members
        inflight = self.inflight
        while True:
            if self._can_schedule():
                for m in members:
                    if m.arrived_kv:
                        self._admit_arrived_kv(m)
                steps = [m.scheduler.schedule(t) for m in members]
                if any(s.reqs for s in steps):
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

    def _can_schedule(self) -> bool:
        return any(m.scheduler.has_requests() or m.arrived_kv for m in self.members)

    def stuck_request(self) -> tuple[Member, Request] | None:
        for m in self.members:
            if m.scheduler.waiting:
                return m, m.scheduler.waiting[0]
            if m.arrived_kv:
                return m, m.arrived_kv[0]
        return None
