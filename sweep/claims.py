"""Exactly-once across sweeps: a point is claimed in the tracking store before it runs.

A claim is the point's own MLflow run, created ``RUNNING`` with the point's config hash and
two tags: ``servesweep.owner`` (``host:pid:sweep-id`` of the driver) and
``servesweep.heartbeat`` (Unix seconds, refreshed every ``HEARTBEAT_S`` while the driver
lives). When the result arrives the same run receives the params, metrics and artifacts
and is set ``FINISHED``; a sweep that ends without a result for it sets it ``KILLED``.

A ``RUNNING`` run is a live claim while its heartbeat is younger than ``CLAIM_TTL_S`` and,
on this host, its driver process exists; otherwise it is stale and whoever claims the point
next sets it ``KILLED`` (with ``servesweep.closed_by``). So two sweeps on one store run each
point once between them, and a rerun after a SIGKILLed driver takes over at once. Runs
without an owner tag (a capacity study's, an older version's) are neither claims nor closed.

Claims are taken under ``sweep.store_lock`` (an exclusive ``flock`` for a sqlite store).
A store without that lock (an MLflow server) is still safe: after creating its claims a
sweep looks again, and keeps a claim only if no other live claim of the same point started
at the same millisecond or earlier; each side creates before it looks, so at least one side
sees the other, and the later (or, on a tie, both) back off and wait.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hydra_plugins.ray_actor_launcher.ray_cluster import pid_alive
from sweep.config_hash import HASH_KEY
from sweep.resume import FinishedIndex, FinishedPoint
from sweep.store_lock import store_lock
from sweep.tracking import Tracker

log = logging.getLogger(__name__)

OWNER_TAG = "servesweep.owner"
HEARTBEAT_TAG = "servesweep.heartbeat"
CLOSED_BY_TAG = "servesweep.closed_by"
HEARTBEAT_S = 10.0
CLAIM_TTL_S = 60.0  # six missed heartbeats: the driver is gone (or cut off from the store)
PAGE = 1000
_ACTIVE: set[str] = set()  # sweep ids of this process whose claims are still held


@dataclass(frozen=True)
class Owner:
    """The driver that holds claims: host, process id and a fresh id per sweep."""

    host: str
    pid: int
    sweep_id: str

    @classmethod
    def this_process(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:12])

    @property
    def tag(self) -> str:
        return f"{self.host}:{self.pid}:{self.sweep_id}"


def claim_alive(tags: dict[str, str], now: float, me: Owner,
                ttl_s: float = CLAIM_TTL_S) -> bool:
    """Whether a ``RUNNING`` run with these tags is a live claim (see the module doc)."""
    owner = tags.get(OWNER_TAG)
    if owner is None:  # not a claim (a capacity study's run, an older version's run)
        return False
    try:
        beat = float(tags.get(HEARTBEAT_TAG, "0"))
    except ValueError:
        beat = 0.0
    if now - beat > ttl_s:
        return False
    host, _, rest = owner.partition(":")
    pid_text, _, sweep_id = rest.partition(":")
    if owner == me.tag:
        return True
    if host == me.host and pid_text.isdigit():
        if int(pid_text) == os.getpid():  # an earlier sweep of this very process
            return sweep_id in _ACTIVE
        return pid_alive(int(pid_text))
    return True


@dataclass(frozen=True)
class Decision:
    """What to do with one point: ``run`` it (``run_id`` is our claim), reuse a
    ``finished`` run of it, or ``wait`` for the live claim of another sweep."""

    kind: str
    run_id: str | None = None
    finished: FinishedPoint | None = None


@dataclass(frozen=True)
class PointClaim:
    """A point to claim: its config hash, run name, tags (parent included)."""

    key: Any
    config_hash: str
    name: str
    tags: dict[str, str]


class Claims:
    """The claims of one sweep driver, and the heartbeat that keeps them alive."""

    def __init__(self, tracker: Tracker, owner: Owner | None = None,
                 heartbeat_s: float = HEARTBEAT_S, ttl_s: float = CLAIM_TTL_S) -> None:
        self.tracker = tracker
        self.owner = owner or Owner.this_process()
        self.ttl_s = ttl_s
        self._heartbeat_s = heartbeat_s
        self._held: set[str] = set()  # run ids this driver keeps alive
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        _ACTIVE.add(self.owner.sweep_id)

    # ---------------------------------------------------------------- owner tags
    def owner_tags(self) -> dict[str, str]:
        return {OWNER_TAG: self.owner.tag, HEARTBEAT_TAG: f"{time.time():.3f}"}

    def hold(self, run_id: str) -> None:
        """Keep ``run_id`` alive with the heartbeat (its ``RUNNING`` state is a claim)."""
        with self._lock:
            self._held.add(run_id)
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="claims-heartbeat",
                                            daemon=True)
            self._thread.start()

    def release(self, run_id: str) -> None:
        with self._lock:
            self._held.discard(run_id)

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def stop(self) -> None:
        """End the heartbeat; this sweep's claims still ``RUNNING`` are stale from now on."""
        _ACTIVE.discard(self.owner.sweep_id)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _beat(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            for run_id in self.held():
                try:
                    self.tracker.client.set_tag(run_id, HEARTBEAT_TAG, f"{time.time():.3f}")
                except Exception as err:  # the store may be down for a while; claims age
                    log.debug(f"heartbeat of {run_id} failed: {err}")

    # ---------------------------------------------------------------- store reads
    def _running(self) -> list[Any]:
        runs: list[Any] = []
        token = None
        while True:
            page = self.tracker.retry.call("search running runs", lambda t=token: (
                self.tracker.client.search_runs(
                    [self.tracker.experiment_id], filter_string="attributes.status = 'RUNNING'",
                    max_results=PAGE, page_token=t)))
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def close_stale(self, runs: Iterable[Any] | None = None) -> int:
        """Set every stale ``RUNNING`` run of the experiment (a dead driver's sweep parent or
        point claims) ``KILLED``; how many were closed."""
        now = time.time()
        closed = 0
        for run in self._running() if runs is None else runs:
            if OWNER_TAG in run.data.tags and not claim_alive(run.data.tags, now, self.owner,
                                                              self.ttl_s):
                self._close(run.info.run_id)
                closed += 1
        return closed

    def _close(self, run_id: str) -> None:
        try:
            self.tracker.client.set_tag(run_id, CLOSED_BY_TAG, self.owner.tag)
            self.tracker.finish(run_id, "KILLED")
        except Exception as err:  # another sweep closed it first, or the store is down
            log.debug(f"closing stale run {run_id}: {err}")

    # ---------------------------------------------------------------- claiming
    def decide(self, points: list[PointClaim], reuse_finished: bool = True) -> dict[Any, Decision]:
        """Claim every point that is neither finished (when ``reuse_finished``) nor claimed
        by a live sweep; one decision per point key."""
        if not points:
            return {}
        with store_lock(self.tracker.uri):
            # RUNNING first, FINISHED second: a claim that finishes between the two reads is
            # seen as running (wait), never as neither (which would run the point again).
            running = self._running()
            finished = (FinishedIndex.load(self.tracker.client, self.tracker.experiment_id)
                        if reuse_finished else FinishedIndex({}))
            now = time.time()
            live: dict[str, list[Any]] = {}
            for run in running:
                key = run.data.tags.get(HASH_KEY)
                if key is None:
                    continue
                if claim_alive(run.data.tags, now, self.owner, self.ttl_s):
                    live.setdefault(key, []).append(run)
                elif OWNER_TAG in run.data.tags:
                    self._close(run.info.run_id)
            out: dict[Any, Decision] = {}
            claim: list[PointClaim] = []
            for p in points:
                done = finished.get(p.config_hash)
                if done is not None:
                    out[p.key] = Decision("finished", finished=done)
                elif p.config_hash in live:
                    out[p.key] = Decision("wait")
                else:
                    claim.append(p)
            mine: dict[Any, str] = {}
            if claim:  # every claim in one write (``Tracker.create_runs``)
                owner = self.owner_tags()
                run_ids = self.tracker.create_runs([
                    (p.name, {**p.tags, HASH_KEY: p.config_hash, **owner},
                     p.tags.get("mlflow.parentRunId")) for p in claim])
                for p, run_id in zip(claim, run_ids, strict=True):
                    self.hold(run_id)
                    mine[p.key] = run_id
            out.update(self._confirm(points, mine))
        return out

    def _confirm(self, points: list[PointClaim], mine: dict[Any, str]) -> dict[Any, Decision]:
        """Keep each new claim unless another live claim of its point is as old or older."""
        if not mine:
            return {}
        now = time.time()
        by_hash: dict[str, list[Any]] = {}
        for run in self._running():
            key = run.data.tags.get(HASH_KEY)
            if key is not None and claim_alive(run.data.tags, now, self.owner, self.ttl_s):
                by_hash.setdefault(key, []).append(run)
        out = {}
        for p in points:
            run_id = mine.get(p.key)
            if run_id is None:
                continue
            runs = by_hash.get(p.config_hash, [])
            me = next((r for r in runs if r.info.run_id == run_id), None)
            rivals = [r for r in runs if r.info.run_id != run_id]
            if me is not None and any(r.info.start_time <= me.info.start_time for r in rivals):
                self.release(run_id)
                self._close(run_id)
                out[p.key] = Decision("wait")
            else:
                out[p.key] = Decision("run", run_id=run_id)
        return out
