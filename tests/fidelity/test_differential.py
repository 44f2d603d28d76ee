"""Step-for-step differential test: our scheduler + KV cache vs vLLM 0.19.1's own.

Skips when vLLM 0.19.1 is not importable (the default CI environment does not install it;
``bash scripts/install_fidelity.sh`` builds a venv that has it). The fast subset runs by
default; ``-m slow`` runs every case of the report. The comparator itself is tested without
vLLM: two sides that differ in one decision must be reported as diverging at that step.
"""

from __future__ import annotations

from array import array
from dataclasses import replace

import pytest

from engine.request import synthetic_output_ids
from engine.workload import RequestSpec
from fidelity import sides
from fidelity.cases import (
    Case,
    data_dir,
    fast_cases,
    full_cases,
)
from fidelity.diff import Lane, run_case
from fidelity.sides import (
    OursSide,
    SchedConfig,
    SchedRecord,
    vllm_available,
)

VLLM_OK, VLLM_WHY = vllm_available()
needs_vllm = pytest.mark.skipif(
    not VLLM_OK, reason=f"{VLLM_WHY}; install with `bash scripts/install_fidelity.sh`"
)
needs_data = pytest.mark.skipif(
    not (data_dir() / "llmservingsim" / "workloads").is_dir(),
    reason=f"shared workloads not found under {data_dir()} (set SERVESWEEP_DATA)",
)


def _specs(n: int, prompt: int, out: int, gap_ns: int = 10_000_000) -> list[RequestSpec]:
    """n requests sharing a 32-token prefix, one every ``gap_ns``."""
    shared = tuple(range(1000, 1032))
    return [
        RequestSpec(
            f"r{i}",
            i * gap_ns,
            shared + tuple(range(10_000 * (i + 1), 10_000 * (i + 1) + prompt - 32)),
            out,
            synthetic_output_ids(i, out),
        )
        for i in range(n)
    ]


class _Skewed(OursSide):
    """Our side with one deliberate bug: from its 3rd schedule on it reports one token more
    for the first scheduled request (a stand-in for a divergent decision)."""

    name = "skewed"

    def __init__(self, cfg: SchedConfig) -> None:
        super().__init__(cfg)
        self.calls = 0

    def schedule(self):  # type: ignore[override]
        step, rec = super().schedule()
        self.calls += 1
        if self.calls >= 3 and rec.scheduled:
            (rid, n, before), *rest = rec.scheduled
            rec = replace(rec, scheduled=((rid, n + 1, before), *rest))
        return step, rec


def test_identical_sides_compare_equal_on_every_tick():
    cfg = SchedConfig(num_blocks=40, max_num_batched_tokens=64, max_num_seqs=8)
    res = run_case("self", cfg, _specs(6, 100, 80), OursSide, OursSide, free_queue_every=1)
    assert res.divergence is None
    assert res.compared > 20 and res.compared == res.identical
    assert res.totals["preemptions"][0] > 0  # 39 usable blocks are too few: real pressure
    assert res.totals["requests finished"] == (6, 6)


def test_a_divergent_decision_is_reported_at_its_tick():
    cfg = SchedConfig(num_blocks=200, max_num_batched_tokens=64)
    res = run_case("skew", cfg, _specs(3, 100, 5), OursSide, _Skewed)
    assert res.divergence is not None
    assert res.divergence.fields == ["sched.scheduled"]
    assert res.identical == 2 and res.compared > res.identical
    (_, n_ours, _), *_ = res.divergence.ours["sched.scheduled"]
    (_, n_skew, _), *_ = res.divergence.vllm["sched.scheduled"]
    assert n_skew == n_ours + 1


def test_async_driver_schedules_ahead_without_adding_a_step():
    """Depth 2 (docs/reference-semantics.md §17): an idle engine schedules the prefill and, at
    once, the first decode; the prefill's output is applied in the same GPU step as in sync
    mode, and the 40-token request with 3 outputs finishes after three steps either way."""
    spec = _specs(1, 40, 3)
    for asyn in (False, True):
        lane = Lane(
            OursSide(SchedConfig(num_blocks=20, async_scheduling=asyn)), spec, 2 if asyn else 1
        )
        first = lane.tick(0, 0)
        expect = [(("r0", 40, 0),), (("r0", 1, 40),)] if asyn else [(("r0", 40, 0),)]
        assert [r.scheduled for r in first.sched] == expect
        assert first.update is not None and first.update.finished == ()
        k = 1
        while not lane.done:
            lane.tick(k, k)
            k += 1
        assert lane.first_token_tick == {"r0": 0}
        assert lane.finish_tick == {"r0": 2}
        assert lane.sched_tokens == 42 and lane.samples == 3


def test_sched_record_empty():
    rec = SchedRecord((), (), (), (), (), 10, 0.0)
    assert rec.empty
    assert not replace(rec, preempted=("x",)).empty


def _check(case: Case) -> None:
    res = run_case(
        case.name,
        case.cfg,
        case.specs(),
        OursSide,
        _vllm_side(),
        step_ns=case.step_ns,
        free_queue_every=case.free_queue_every,
    )
    msg = ""
    if res.divergence is not None:
        d = res.divergence
        msg = (
            f"first divergence at tick {d.tick} in {d.fields}: ours {d.ours} vs vLLM {d.vllm}\n"
            f"ours: {d.state_ours}\nvLLM: {d.state_vllm}"
        )
    assert res.compared > 0
    assert res.all_identical, msg or res.notes
    assert res.notes == [], res.notes
    for key, (a, b) in res.totals.items():
        assert a == b, f"{key}: ours {a} vs vLLM {b}"


def _vllm_side():
    from fidelity.sides import VllmSide

    return VllmSide


@needs_vllm
@needs_data
@pytest.mark.parametrize("case", fast_cases(), ids=lambda c: c.name)
def test_fast_case_identical_to_vllm(case: Case) -> None:
    _check(case)


@needs_vllm
@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("case", full_cases(), ids=lambda c: c.name)
def test_full_case_identical_to_vllm(case: Case) -> None:
    _check(case)


# -- the harness must catch real scheduler bugs: inject known ones into our engine ----------


def _free_head_first(self, req):
    """Bug: free a request's blocks head-first (vLLM frees tail-first)."""
    from engine.kv_cache import KVCacheManager

    n = req.kv_num_blocks
    if n > 0:  # free() frees the table tail-first: reversed in place, now head-first
        req.kv_table[:n] = array("i", reversed(req.kv_table[:n]))
    KVCacheManager.free(self, req)


def _mutations():
    from engine.kv_cache import KVCacheManager
    from engine.scheduler import Scheduler

    lookup = KVCacheManager.get_computed_blocks
    preempt = Scheduler._preempt

    def hit_whole_prompt(self, req):
        """Bug: no ``num_tokens - 1`` cap, so a fully cached prompt hits its last block."""
        req.num_tokens += 1
        try:
            return lookup(self, req)
        finally:
            req.num_tokens -= 1

    def requeue_at_back(self, victim):
        """Bug: preempted requests go to the back of ``waiting`` instead of the front."""
        preempt(self, victim)
        self.waiting.remove(victim)
        self.waiting.append(victim)

    return {
        "free-head-first": (KVCacheManager, "free", _free_head_first),
        "hit-whole-prompt": (KVCacheManager, "get_computed_blocks", hit_whole_prompt),
        "preempted-to-back": (Scheduler, "_preempt", requeue_at_back),
        "no-full-isl-gate": (KVCacheManager, "can_fit_full_sequence", lambda s, r, h: True),
    }


@needs_vllm
@needs_data
@pytest.mark.parametrize(
    "mutation", ["free-head-first", "hit-whole-prompt", "preempted-to-back", "no-full-isl-gate"]
)
def test_injected_engine_bug_is_detected(mutation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cls, attr, fn = _mutations()[mutation]
    # The engine's classes are compiled (setup.py) and cannot be patched in place: our side
    # builds a subclass carrying the bug, whose override the compiled callers dispatch to.
    monkeypatch.setattr(sides, cls.__name__, type(f"Buggy{cls.__name__}", (cls,), {attr: fn}))
    case = next(c for c in full_cases() if c.name == "repeats-tight80-sync")
    res = run_case(
        case.name,
        case.cfg,
        case.specs(),
        OursSide,
        _vllm_side(),
        free_queue_every=1,
        stop_after_divergence=0,
    )
    assert res.divergence is not None, f"{mutation} went unnoticed"
