"""One serving instance: scheduler + KV cache + latency model, driven by an event clock.

The clock is event-driven: a step starts the moment the previous one ends; when the engine
is idle the clock jumps straight to the next arrival (vLLM's engine core blocks on its input
queue, it does not poll).

Async scheduling (vLLM 0.19 default, ``EngineCore.step_with_batch_queue`` with a batch
queue of depth 2): step k+1 is scheduled when step k is launched, i.e. at the end of step
k−1, before step k's output is processed. So a request arriving while step k runs is first
seen by the schedule of step k+2, and blocks freed by step k become visible to step k+2.
With ``async_scheduling=False`` the engine schedules, executes and processes each step in
turn (schedule of step k+1 at the end of step k).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from engine.batch import LatencyModel
from engine.kv_cache import KVCacheManager
from engine.request import Request
from engine.scheduler import ScheduledStep, Scheduler
from engine.specs import ConfigError


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


class Instance:
    def __init__(
        self,
        scheduler: Scheduler,
        latency: LatencyModel,
        *,
        step_overhead_ns: int = 0,
    ) -> None:
        self.scheduler = scheduler
        self.kv: KVCacheManager = scheduler.kv
        self.latency = latency
        self.step_overhead_ns = step_overhead_ns
        self.log = StepLog()
        self.num_steps = 0
        self.busy_ns = 0

    def _duration(self, step: ScheduledStep) -> int:
        assert step.shape is not None
        return int(self.latency.iteration_ns(step.shape)) + self.step_overhead_ns + step.extra_ns

    def _record(self, step: ScheduledStep, end_ns: int) -> None:
        log = self.log
        sched = self.scheduler
        log.end_ns.append(end_ns)
        log.running.append(len(sched.running))
        log.waiting.append(len(sched.waiting))
        log.usage.append(self.kv.pool.usage())
        log.prompt_tokens.append(step.prompt_tokens)
        log.gen_tokens.append(sum(step.samples))

    def run(self, requests: Sequence[Request]) -> int:
        """Replay ``requests`` (sorted by arrival) to completion; returns the end time (ns)."""
        sched = self.scheduler
        n = len(requests)
        nxt = 0  # next request not yet handed to the scheduler
        t = requests[0].arrival_ns if n else 0
        inflight: deque[tuple[ScheduledStep, int]] = deque()
        depth = 2 if sched.async_scheduling else 1
        gpu_free_at = t
        while sched.num_finished < n:
            while nxt < n and requests[nxt].arrival_ns <= t:
                sched.add_request(requests[nxt])
                nxt += 1
            launched = False
            if sched.has_requests():
                step = sched.schedule(t)
                if step.reqs:
                    start = max(t, gpu_free_at)
                    d = self._duration(step)
                    gpu_free_at = start + d
                    self.busy_ns += d
                    self.num_steps += 1
                    inflight.append((step, gpu_free_at))
                    launched = True
                    if len(inflight) < depth:
                        continue  # async: schedule the next step while this one runs
            if inflight:
                step, end = inflight.popleft()
                if end > t:
                    t = end
                sched.update_from_output(step, t)
                self._record(step, t)
                continue
            if launched:
                continue
            if nxt < n:
                t = max(t, requests[nxt].arrival_ns)  # idle: jump to the next arrival
                continue
            stuck = sched.waiting[0] if sched.waiting else None
            raise ConfigError(
                "simulation cannot make progress: "
                + (
                    f"request {stuck.request_id!r} ({stuck.num_tokens} tokens) never fits in the "
                    f"KV cache of {self.kv.pool.num_blocks - 1} usable blocks; raise "
                    "gpu_memory_utilization / num_gpu_blocks_override or shorten the request"
                    if stuck is not None
                    else "no request can be scheduled"
                )
            )
        return t
