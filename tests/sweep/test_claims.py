"""Point claims in the tracking store (``sweep.claims``): one sweep runs a point, another
waits or reuses it, stale claims of dead drivers are closed and taken over."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from sweep import claims as claims_mod
from sweep.claims import HEARTBEAT_TAG, OWNER_TAG, Claims, Owner, PointClaim, claim_alive
from sweep.config_hash import HASH_KEY
from sweep.tracking import Tracker

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def kinds(decisions) -> list[str]:
    return [decisions[k].kind for k in sorted(decisions)]


def points(*hashes: str) -> list[PointClaim]:
    return [PointClaim(i, h, f"p{i}", {"kind": "point"}) for i, h in enumerate(hashes)]


@pytest.fixture
def tracker(store) -> Tracker:
    return Tracker(store, "claims")


def test_one_sweep_runs_a_point_the_other_waits_then_reuses(tracker):
    a, b = Claims(tracker), Claims(tracker)
    first = a.decide(points("h1", "h2"))
    assert kinds(first) == ["run", "run"]
    assert kinds(b.decide(points("h1", "h2", "h3"))) == ["wait", "wait", "run"]
    tracker.finish(first[0].run_id, "FINISHED")
    again = b.decide(points("h1"))
    assert again[0].kind == "finished" and again[0].finished.run_id == first[0].run_id
    # resume off: a finished point is claimed again, a live claim is still waited for
    assert kinds(b.decide(points("h1", "h2"), reuse_finished=False)) == ["run", "wait"]
    a.stop()
    b.stop()


def test_a_dead_drivers_claim_is_closed_and_taken_over(tracker):
    ghost = Claims(tracker, owner=Owner("localhost-ghost", dead_pid(), "ghost"))
    ghost.owner = Owner(Owner.this_process().host, ghost.owner.pid, "ghost")
    old = ghost.decide(points("h1"))[0].run_id
    ghost._stop.set()  # the driver is gone: no heartbeat, its pid is dead
    claims_mod._ACTIVE.discard("ghost")
    live = Claims(tracker)
    decision = live.decide(points("h1"))[0]
    assert decision.kind == "run" and decision.run_id != old
    run = tracker.client.get_run(old)
    assert run.info.status == "KILLED"
    assert run.data.tags["servesweep.closed_by"] == live.owner.tag
    live.stop()


def test_an_earlier_sweep_of_this_process_is_stale_once_stopped(tracker):
    first = Claims(tracker)
    run_id = first.decide(points("h1"))[0].run_id
    first.stop()
    second = Claims(tracker)
    assert second.decide(points("h1"))[0].kind == "run"
    assert tracker.client.get_run(run_id).info.status == "KILLED"
    second.stop()


def test_liveness_rules():
    me = Owner("here", 1, "me")
    now = time.time()
    fresh = f"{now - 5:.3f}"
    assert claim_alive({OWNER_TAG: "elsewhere:42:s", HEARTBEAT_TAG: fresh}, now, me)
    assert not claim_alive({OWNER_TAG: "elsewhere:42:s", HEARTBEAT_TAG: f"{now - 120}"}, now, me)
    assert not claim_alive({OWNER_TAG: f"here:{dead_pid()}:s", HEARTBEAT_TAG: fresh}, now, me)
    assert not claim_alive({HASH_KEY: "h"}, now, me)  # no owner: not a claim
    assert not claim_alive({OWNER_TAG: "elsewhere:42:s", HEARTBEAT_TAG: "junk"}, now, me)


def test_heartbeat_keeps_a_claim_fresh(tracker):
    c = Claims(tracker, heartbeat_s=0.2)
    run_id = c.decide(points("h1"))[0].run_id
    before = float(tracker.client.get_run(run_id).data.tags[HEARTBEAT_TAG])
    time.sleep(1.0)
    after = float(tracker.client.get_run(run_id).data.tags[HEARTBEAT_TAG])
    assert after > before
    c.release(run_id)
    c.stop()


@pytest.mark.parametrize("gap_ms", [0, 3])
def test_without_a_store_lock_two_claims_never_both_run(tracker, monkeypatch, gap_ms):
    """A server store has no flock: both sweeps create a claim, then look again. The later
    claim (or, on a tie in start time, both) backs off; never both keep it."""
    a, b = Claims(tracker), Claims(tracker)
    pa, pb = points("h1"), points("h1")
    ra = tracker.create_run("a", {HASH_KEY: "h1", **a.owner_tags()})
    a.hold(ra)
    time.sleep(gap_ms / 1000)
    rb = tracker.create_run("b", {HASH_KEY: "h1", **b.owner_tags()})
    b.hold(rb)
    if gap_ms == 0:  # force a tie in start time
        start = tracker.client.get_run(ra).info.start_time
        monkeypatch.setattr(tracker.client, "search_runs", _with_start(tracker.client.search_runs,
                                                                        {ra: start, rb: start}))
    da = a._confirm(pa, {0: ra})[0]
    db = b._confirm(pb, {0: rb})[0]
    kinds = sorted([da.kind, db.kind])
    assert kinds in (["run", "wait"], ["wait", "wait"])
    if gap_ms:
        assert da.kind == "run" and db.kind == "wait"
    a.stop()
    b.stop()


def _with_start(search, starts):
    def patched(*args, **kwargs):
        runs = search(*args, **kwargs)
        for run in runs:
            if run.info.run_id in starts:
                run.info._start_time = starts[run.info.run_id]
        return runs
    return patched
