"""Dispatch jobs to a fixed set of Ray actors and collect results as they finish.

A small replacement for ``ray.util.ActorPool`` that knows which job each actor runs, so
that a dead actor (segfault, OOM kill, ``os._exit``, a lost node) or an overdue job is
attributed to its job, the actor is replaced, and the other jobs go on. A job whose actor
died (or whose result was lost with its node) is run again on another actor up to
``max_retries`` times; a job that raised, or ran past ``job_timeout_s``, is not retried
(it would fail the same way). A replacement actor receives jobs only once it is running,
so a replacement the cluster cannot place (its node is gone) never holds a job; when no
actor is left and none starts within ``ready_timeout_s``, the remaining jobs fail with
that reason instead of waiting forever. ``health``, when set, is called about once a second
while jobs run; a reason it returns (the local cluster's head died) ends ``run`` with
``ClusterLost`` at once instead of waiting for Ray to notice.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError, RayTaskError

from hydra_plugins.ray_actor_launcher.ray_cluster import ClusterLost


@dataclass
class Outcome:
    """What came back for one job: ``value`` on success, else ``error`` text."""

    key: int
    value: Any = None
    error: str | None = None
    attempts: int = 1


@dataclass
class _Running:
    key: int
    item: Any
    actor: Any
    started: float
    attempt: int


class ActorSet:
    """Runs ``submit(actor, item)`` calls on ``actors``, one job per actor at a time."""

    def __init__(
        self,
        actors: list[Any],
        new_actor: Callable[[], Any],
        job_timeout_s: float | None,
        poll_s: float = 0.5,
        max_retries: int = 0,
        ready_timeout_s: float = 120.0,
    ) -> None:
        self.actors = list(actors)
        self._idle: deque[Any] = deque(actors)
        self._starting: dict[Any, Any] = {}  # ready ref -> replacement actor not yet running
        self._new_actor = new_actor
        self._timeout = job_timeout_s
        self._poll = poll_s
        self._max_retries = max_retries
        self._ready_timeout = ready_timeout_s
        self.replaced = 0
        self.retried = 0
        self.health: Callable[[], str | None] | None = None
        self._checked = 0.0

    def run(
        self, items: list[tuple[int, Any]], submit: Callable[[Any, Any], Any]
    ) -> Iterator[Outcome]:
        """Yield one ``Outcome`` per ``(key, item)`` in completion order."""
        pending: deque[tuple[int, Any, int]] = deque((key, item, 0) for key, item in items)
        running: dict[Any, _Running] = {}

        def fill() -> None:
            while pending and self._idle:
                key, item, attempt = pending.popleft()
                actor = self._idle.popleft()
                running[submit(actor, item)] = _Running(key, item, actor, time.monotonic(), attempt)

        while pending or running:
            self._check_health()
            self._adopt_started(0)
            fill()
            if not running:  # jobs wait, every actor is dead or still starting
                if not self._wait_for_actor():
                    reason = (f"no actor available: none of {len(self._starting)} replacement "
                              f"actors started within {self._ready_timeout:g} s")
                    while pending:
                        key, _, attempt = pending.popleft()
                        yield Outcome(key, error=reason, attempts=attempt + 1)
                continue
            ready, rest = ray.wait(list(running), num_returns=1, timeout=self._poll)
            if ready and rest:  # take everything else that is already finished, too
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            done = []
            for ref in ready:
                job = running.pop(ref)
                out = self._collect(ref, job)
                if out is None:  # the actor was lost: run the job again
                    self.retried += 1
                    pending.appendleft((job.key, job.item, job.attempt + 1))
                else:
                    done.append(out)
            if self._timeout is not None:
                now = time.monotonic()
                for ref, job in list(running.items()):
                    if now - job.started > self._timeout:
                        running.pop(ref)
                        ray.kill(job.actor)
                        self._replace(job.actor)
                        done.append(Outcome(job.key, error=f"timed out after {self._timeout:g} s",
                                            attempts=job.attempt + 1))
            # Refill before handing results out: actors compute while the caller records.
            fill()
            yield from done

    def _wait_for_actor(self) -> bool:
        """Wait up to ``ready_timeout_s`` for a replacement actor, checking health."""
        deadline = time.monotonic() + self._ready_timeout
        while self._starting:
            self._check_health()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._adopt_started(min(1.0, left)):
                return True
        return False

    def _check_health(self) -> None:
        now = time.monotonic()
        if self.health is None or now - self._checked < 1.0:
            return
        self._checked = now
        reason = self.health()
        if reason:
            raise ClusterLost(reason)

    def _collect(self, ref: Any, job: _Running) -> Outcome | None:
        """The job's outcome, or None when its actor was lost and it may run again."""
        attempts = job.attempt + 1
        try:
            value = ray.get(ref, timeout=60)
        except (RayTaskError, GetTimeoutError) as err:
            self._idle.append(job.actor)
            return Outcome(job.key, error=f"{type(err).__name__}: {err}", attempts=attempts)
        except RayError as err:  # actor died, or its node and the result with it
            ray.kill(job.actor)
            self._replace(job.actor)
            if job.attempt < self._max_retries:
                return None
            return Outcome(
                job.key,
                error=f"actor died while running the job ({attempts} attempt"
                      f"{'s' if attempts > 1 else ''}): {type(err).__name__}: {err}",
                attempts=attempts,
            )
        self._idle.append(job.actor)
        return Outcome(job.key, value=value, attempts=attempts)

    def _replace(self, dead: Any) -> None:
        if dead in self.actors:
            self.actors.remove(dead)
        fresh = self._new_actor()
        self.actors.append(fresh)
        self._starting[fresh.pid.remote()] = fresh
        self.replaced += 1

    def _adopt_started(self, timeout: float) -> bool:
        """Move replacement actors that are running to the idle set; True if any moved."""
        if not self._starting:
            return False
        ready, _ = ray.wait(list(self._starting), num_returns=1, timeout=timeout)
        if ready:
            rest = [r for r in self._starting if r not in ready]
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0) if rest else ([], [])
            ready += more
        adopted = False
        for ref in ready:
            actor = self._starting.pop(ref)
            try:
                ray.get(ref, timeout=10)
            except RayError:  # it died while starting: forget it
                self.actors.remove(actor)
                continue
            self._idle.append(actor)
            adopted = True
        return adopted
