"""Dispatch jobs to a fixed set of Ray actors and collect results as they finish.

A small replacement for ``ray.util.ActorPool`` that knows which job each actor runs, so
that a dead actor (segfault, OOM kill, ``os._exit``) or an overdue job is attributed to its
job, the actor is replaced, and the other jobs go on.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError


@dataclass
class Outcome:
    """What came back for one job: ``value`` on success, else ``error`` text."""

    key: int
    value: Any = None
    error: str | None = None


@dataclass
class _Running:
    key: int
    actor: Any
    started: float


class ActorSet:
    """Runs ``submit(actor, item)`` calls on ``actors``, one job per actor at a time."""

    def __init__(
        self,
        actors: list[Any],
        new_actor: Callable[[], Any],
        job_timeout_s: float | None,
        poll_s: float = 0.5,
    ) -> None:
        self.actors = list(actors)
        self._idle: deque[Any] = deque(actors)
        self._new_actor = new_actor
        self._timeout = job_timeout_s
        self._poll = poll_s
        self.replaced = 0

    def run(
        self, items: list[tuple[int, Any]], submit: Callable[[Any, Any], Any]
    ) -> Iterator[Outcome]:
        """Yield one ``Outcome`` per ``(key, item)`` in completion order."""
        pending = deque(items)
        running: dict[Any, _Running] = {}

        def fill() -> None:
            while pending and self._idle:
                key, item = pending.popleft()
                actor = self._idle.popleft()
                running[submit(actor, item)] = _Running(key, actor, time.monotonic())

        while pending or running:
            fill()
            ready, rest = ray.wait(list(running), num_returns=1, timeout=self._poll)
            if ready and rest:  # take everything else that is already finished, too
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            done = [self._collect(ref, running.pop(ref)) for ref in ready]
            if self._timeout is not None:
                now = time.monotonic()
                for ref, job in list(running.items()):
                    if now - job.started > self._timeout:
                        running.pop(ref)
                        ray.kill(job.actor)
                        self._replace(job.actor)
                        done.append(Outcome(job.key, error=f"timed out after {self._timeout:g} s"))
            # Refill before handing results out: actors compute while the caller records.
            fill()
            yield from done

    def _collect(self, ref: Any, job: _Running) -> Outcome:
        try:
            value = ray.get(ref, timeout=60)
        except RayActorError as err:
            self._replace(job.actor)
            return Outcome(job.key, error=f"actor died while running the job: {err}")
        except (RayTaskError, GetTimeoutError) as err:
            self._idle.append(job.actor)
            return Outcome(job.key, error=f"{type(err).__name__}: {err}")
        self._idle.append(job.actor)
        return Outcome(job.key, value=value)

    def _replace(self, dead: Any) -> None:
        self.actors.remove(dead)
        fresh = self._new_actor()
        self.actors.append(fresh)
        self._idle.append(fresh)
        self.replaced += 1
