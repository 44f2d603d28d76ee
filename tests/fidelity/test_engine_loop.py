"""The simulator's own engine loop makes the decisions the differential harness checks.

``fidelity`` drives our ``Scheduler`` with vLLM's engine-core loop (``Lane``) and
shows it decides exactly what vLLM 0.19.1 decides. The simulator itself runs the scheduler
from ``engine.instance.EngineUnit`` under ``engine.cluster.run_cluster``'s event clock. With
every step lasting one tick and arrivals on tick boundaries, the two loops must schedule the
same requests with the same token counts, preempt the same requests, and do it at the same
tick; otherwise the fidelity shown by the harness would not carry over to simulations. No
vLLM needed: this runs in the default CI.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.batch import BatchShape
from engine.cluster import Router, run_cluster
from engine.instance import EngineUnit, Member
from engine.request import Request
from engine.scheduler import ScheduledStep, Scheduler
from engine.workload import RequestSpec
from fidelity.cases import fuzz_workload, repeats
from fidelity.diff import Lane
from fidelity.sides import OursSide, SchedConfig

TICK = 30_000_000

Decision = tuple[int, tuple[tuple[str, int], ...], tuple[str, ...]]


class ConstantLatency:
    """Every step takes one tick."""

    def iteration_ns(self, shape: BatchShape) -> int:
        return TICK


class RecordingScheduler(Scheduler):
    """Our scheduler, noting each non-empty decision with the tick it was made at."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.decisions: list[Decision] = []

    def schedule(self, now_ns: int) -> ScheduledStep:
        step = super().schedule(now_ns)
        if step.reqs or step.preempted:
            assert now_ns % TICK == 0, f"a schedule off the tick grid at {now_ns} ns"
            self.decisions.append(
                (
                    now_ns // TICK,
                    tuple((r.request_id, n) for r, n in zip(step.reqs, step.num_tokens, strict=True)),
                    tuple(sorted(r.request_id for r in step.preempted)),
                )
            )
        return step


def _on_ticks(specs: list[RequestSpec]) -> list[RequestSpec]:
    """Move each arrival up to the next tick boundary (both loops then see it at once)."""
    return [replace(s, arrival_ns=-(-s.arrival_ns // TICK) * TICK) for s in specs]


def _engine_loop(cfg: SchedConfig, specs: list[RequestSpec]) -> list[Decision]:
    sched = RecordingScheduler(cfg.new_kv(), **cfg.scheduler_kwargs())
    unit = EngineUnit([Member("i0", sched, ConstantLatency())])
    # Every decision through schedule(), where it is recorded: steady decode spans run in bulk
    # bypass it, and tests/engine/test_fast_forward.py shows they decide exactly the same.
    unit.fast_forward = False
    reqs = [
        Request(s, i, cfg.block_size, cfg.enable_prefix_caching) for i, s in enumerate(specs)
    ]
    run_cluster([unit], reqs, Router("round_robin"))
    assert all(r.is_finished for r in reqs)
    return sched.decisions


def _harness_loop(cfg: SchedConfig, specs: list[RequestSpec]) -> list[Decision]:
    lane = Lane(OursSide(cfg), specs, 2 if cfg.async_scheduling else 1)
    out: list[Decision] = []
    k = 0
    while not lane.done:
        tick = lane.tick(k, k * TICK)
        for rec in tick.sched:
            out.append((k, tuple((rid, n) for rid, n, _ in rec.scheduled), rec.preempted))
        if tick.idle and lane.next < len(specs):
            k = max(k + 1, -(-specs[lane.next].arrival_ns // TICK))
        else:
            k += 1
        assert k < 1_000_000
    return out


def _first_difference(a: list[Decision], b: list[Decision]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"decision {i}: engine loop {x} vs harness loop {y}"
    return f"lengths differ: engine loop {len(a)} vs harness loop {len(b)}"


FUZZ_SEEDS = list(range(40))


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_engine_loop_matches_harness_loop_fuzz(seed: int) -> None:
    settings, specs = fuzz_workload(seed)
    cfg = SchedConfig(**settings)  # type: ignore[arg-type]
    specs = _on_ticks(specs)
    a, b = _engine_loop(cfg, specs), _harness_loop(cfg, specs)
    assert a == b, _first_difference(a, b)


@pytest.mark.parametrize("asyn", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("blocks", [80, 2000])
def test_engine_loop_matches_harness_loop_repeats(asyn: bool, blocks: int) -> None:
    cfg = SchedConfig(num_blocks=blocks, max_num_batched_tokens=256, async_scheduling=asyn)
    specs = _on_ticks(repeats(150))
    a, b = _engine_loop(cfg, specs), _harness_loop(cfg, specs)
    assert len(a) > 50
    assert a == b, _first_difference(a, b)
