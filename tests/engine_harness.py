"""Step-by-step drivers for the engine's scheduler in tests (no clock, no latency)."""

from __future__ import annotations

from engine.kv_cache import KVCacheManager
from engine.request import Request
from engine.scheduler import ScheduledStep, Scheduler
from engine.workload import RequestSpec


class Harness:
    """Scheduler + KV manager over a fixed block count, stepped by hand."""

    def __init__(
        self,
        num_blocks: int,
        *,
        budget: int = 128,
        max_num_seqs: int = 128,
        block_size: int = 16,
        max_model_len: int = 4096,
        threshold: int = 0,
        reserve_full_isl: bool = True,
        async_scheduling: bool = False,
        caching: bool = True,
    ) -> None:
        self.block_size = block_size
        self.caching = caching
        self.kv = KVCacheManager(num_blocks, block_size, max_model_len, caching)
        self.sched = Scheduler(
            self.kv,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            long_prefill_token_threshold=threshold,
            reserve_full_isl=reserve_full_isl,
            async_scheduling=async_scheduling,
        )
        self.requests: dict[str, Request] = {}
        self.t = 0
        self.inflight: list[ScheduledStep] = []

    def add(self, name: str, prompt: list[int] | tuple[int, ...], max_tokens: int) -> Request:
        spec = RequestSpec(name, self.t, tuple(prompt), max_tokens)
        req = Request(spec, len(self.requests), self.block_size, self.caching)
        self.requests[name] = req
        self.sched.add_request(req)
        return req

    def step(self) -> tuple[dict[str, int], list[str]]:
        """Synchronous step: schedule, then process the output. Returns ({name: n}, preempted)."""
        self.t += 1
        out = self.sched.schedule(self.t)
        self.sched.update_from_output(out, self.t)
        return (
            {r.request_id: n for r, n in zip(out.reqs, out.num_tokens, strict=True)},
            [r.request_id for r in out.preempted],
        )

    def async_step(self) -> dict[str, int]:
        """Async (batch queue depth 2): schedule step k, then process step k-1's output."""
        self.t += 1
        out = self.sched.schedule(self.t)
        self.inflight.append(out)
        if len(self.inflight) > 1:
            self.sched.update_from_output(self.inflight.pop(0), self.t)
        return {r.request_id: n for r, n in zip(out.reqs, out.num_tokens, strict=True)}

    def table(self, name: str) -> list[int]:
        return self.requests[name].block_ids()

    def check(self) -> None:
        self.kv.pool.check_invariants(list(self.kv.block_tables().values()))


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))
