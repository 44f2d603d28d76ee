"""Where capacity probes run: one probe = one simulated point checked against the SLO.

``run_probe`` is the unit of work (plain dicts in, plain dict out, so it crosses process
boundaries); ``run_fleet_check`` simulates a sized fleet as one cluster. ``RayProbePool`` runs
probes of many configurations at once on a pool of long-lived Ray actors (loaded profiles stay
warm in each actor), accepting new probes while others run, which the launcher's
batch-oriented ``ActorSet`` cannot; every wait on Ray has a timeout, an overdue probe kills and
replaces its actor. A probe goes to an idle worker that last ran its configuration when there
is one (its bundle and latency model are warm there), so each worker sees few configurations;
a worker whose memory grew past ``max_worker_rss_mib`` (the profiles and latency models of
every configuration it ran stay cached in it) is replaced after its probe, so a study over
many configurations keeps each worker bounded. ``LocalProbePool`` runs them one by one in
this process (tests, ``capacity.pool.num_actors=0``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

MAX_WORKER_RSS_MIB = 350.0  # a probe worker above this after a probe is replaced
_RSS_KEY = "_worker_rss_mib"  # what a worker adds to a probe's result; the pool removes it


def rss_mib() -> float:
    """This process's resident memory (Linux ``/proc``; 0 elsewhere)."""
    try:
        pages = int(open("/proc/self/statm").read().split()[1])  # noqa: SIM115
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def configuration_key(method: str, args: tuple[Any, ...]) -> str:
    """What a worker keeps warm for a job: the point without its workload (a probe of
    another rate reuses the configuration's bundle and latency model)."""
    point = args[0] if args and isinstance(args[0], dict) else {}
    return json.dumps({k: v for k, v in point.items() if k != "workload"}, sort_keys=True,
                      default=str)


#: Params of a probe's run naming where its numbers came from, kept with each probe and answer.
SOURCE_KEYS = ("bundle_source", "comm_source")


def run_probe(point: dict[str, Any]) -> dict[str, Any]:
    """Simulate ``point`` (a resolved sweep config as plain data, its ``slo`` the study's)
    with ``sweep.job.run_point``. Returns the verdict (``passed``, ``margin`` and each bound's
    ``margins``) and the run's scalar metrics: the same numbers, cost included, that a sweep
    of this point records in MLflow and ``results.parquet``."""
    from omegaconf import OmegaConf

    from sweep.job import run_point

    t0 = time.perf_counter()
    # Numbers only, and the workload not kept: no later probe has the same rate.
    result = run_point(OmegaConf.create(point), keep_tables=False, cache_workload=False)
    metrics = {k: float(v) for k, v in result["metrics"].items()}
    return {
        "passed": metrics["slo_met"] == 1.0,
        "margin": metrics["slo_margin"],
        "margins": dict(result["slo_margins"]),
        "metrics": metrics,
        # where the point's step latencies and collectives came from (sweep.job.run_point)
        "sources": {k: str(result["params"][k]) for k in SOURCE_KEYS if k in result["params"]},
        "probe_wall_s": time.perf_counter() - t0,
    }


@dataclass
class Done:
    """A finished probe: ``value`` (``run_probe``'s dict) or ``error`` text."""

    key: Any
    value: dict[str, Any] | None = None
    error: str | None = None


def run_fleet_check(point: dict[str, Any], replicas: int, rate: float,
                    router: str | None) -> dict[str, Any]:
    """``capacity.verify.verify_fleet`` (for the pool)."""
    from capacity.verify import verify_fleet

    return verify_fleet(point, replicas, rate, router)


class LocalProbePool:
    """Runs each submitted job at once, in this process (``run``: ``fn``, default
    ``run_probe``; ``check``: ``run_fleet_check``)."""

    size = 1

    def __init__(self, fn: Callable[..., dict[str, Any]] = run_probe) -> None:
        self._fns: dict[str, Callable[..., dict[str, Any]]] = {"run": fn, "check": run_fleet_check}
        self._done: deque[Done] = deque()

    def submit(self, key: Any, *args: Any, method: str = "run") -> None:
        try:
            self._done.append(Done(key, value=self._fns[method](*args)))
        except Exception as err:  # a probe's failure is reported, the study goes on
            self._done.append(Done(key, error=f"{type(err).__name__}: {err}"))

    def next_done(self) -> Done:
        return self._done.popleft()

    def close(self) -> None:
        self._done.clear()


class ProbeWorker:
    """The Ray actor body: runs one probe at a time."""

    def pid(self) -> int:
        return os.getpid()

    def run(self, point: dict[str, Any]) -> dict[str, Any]:
        return {**run_probe(point), _RSS_KEY: rss_mib()}

    def check(self, *args: Any) -> dict[str, Any]:
        return {**run_fleet_check(*args), _RSS_KEY: rss_mib()}


class RayProbePool:
    """Probes on ``num_actors`` Ray actors (``None``: one per CPU); starts a private local
    Ray unless ``address`` names a cluster (``auto`` or ``host:port``)."""

    def __init__(self, num_actors: int | None, probe_timeout_s: float = 600.0,
                 address: str | None = "local", ready_timeout_s: float = 120.0,
                 max_worker_rss_mib: float = MAX_WORKER_RSS_MIB) -> None:
        import ray

        from hydra_plugins.ray_actor_launcher.ray_cluster import is_local, start_ray

        self._ray = ray
        self._address = address
        self._started = False
        self._actors: list[Any] = []
        self._ray_pids: dict[int, Any] = {}
        if not ray.is_initialized():
            # "local" starts a private loopback-only Ray even if another one runs here.
            start_ray(ray, address, {"object_store_memory": 200 * 1024**2})
            self._started = True
        self._local = self._started and is_local(address)
        try:
            cpus = int(ray.cluster_resources().get("CPU", 1))
            self.size = max(1, min(num_actors or cpus, cpus))
            self._remote = ray.remote(ProbeWorker).options(num_cpus=1, max_concurrency=1)
            self.probe_timeout_s = probe_timeout_s
            self._actors = [self._remote.remote() for _ in range(self.size)]
            ray.get([a.pid.remote() for a in self._actors], timeout=ready_timeout_s)
        except BaseException:
            self.close()  # workers that never became ready: the Ray started here goes too
            raise
        self._remember_processes()
        self._idle: deque[Any] = deque(self._actors)
        self._queue: deque[tuple[Any, str, tuple[Any, ...]]] = deque()
        self._running: dict[Any, tuple[Any, Any, float]] = {}  # ref -> key, actor, start
        self._done: deque[Done] = deque()
        self.max_worker_rss_mib = max_worker_rss_mib
        self._warm: dict[Any, str] = {}  # actor -> the configuration it last ran
        self.recycled = 0

    def submit(self, key: Any, *args: Any, method: str = "run") -> None:
        """Queue ``method`` (``run``: a probe, ``check``: a fleet check) with ``args``."""
        self._queue.append((key, method, args))
        self._fill()

    def _fill(self) -> None:
        while self._queue and self._idle:
            key, method, args = self._queue.popleft()
            conf = configuration_key(method, args)
            actor = next((a for a in self._idle if self._warm.get(a) == conf), self._idle[0])
            self._idle.remove(actor)
            self._warm[actor] = conf
            ref = getattr(actor, method).remote(*args)
            self._running[ref] = (key, actor, time.monotonic())

    def _finished(self, actor: Any, value: dict[str, Any]) -> dict[str, Any]:
        """The probe's result without the worker's RSS; a worker past the budget is replaced."""
        value = dict(value)
        rss = float(value.pop(_RSS_KEY, 0.0))
        if rss > self.max_worker_rss_mib:
            log.info(f"probe worker at {rss:.0f} MiB (> {self.max_worker_rss_mib:g}): replaced")
            self._ray.kill(actor)
            self._replace(actor)
            self.recycled += 1
        else:
            self._idle.append(actor)
        return value

    def next_done(self) -> Done:
        """Block until a probe finishes (or times out) and return it."""
        ray = self._ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        while not self._done:
            if not self._running:
                raise RuntimeError("next_done() with no probe submitted")
            ready, _ = ray.wait(list(self._running), num_returns=1, timeout=0.5)
            for ref in ready:
                key, actor, _ = self._running.pop(ref)
                try:
                    value = ray.get(ref, timeout=60)
                except RayActorError as err:
                    self._replace(actor)
                    self._done.append(Done(key, error=f"actor died while probing: {err}"))
                except (RayTaskError, GetTimeoutError) as err:
                    self._idle.append(actor)
                    self._done.append(Done(key, error=f"{type(err).__name__}: {err}"))
                else:
                    self._done.append(Done(key, value=self._finished(actor, value)))
            now = time.monotonic()
            for ref, (key, actor, started) in list(self._running.items()):
                if now - started > self.probe_timeout_s:
                    self._running.pop(ref)
                    ray.kill(actor)
                    self._replace(actor)
                    self._done.append(Done(key, error=f"probe timed out after {self.probe_timeout_s:g} s"))
            self._fill()
        self._remember_processes()
        return self._done.popleft()

    def _remember_processes(self) -> None:
        """Record the local Ray's processes (each with its start time) as they run now, workers
        started since (replacements) included: close() also finds those a dead raylet
        orphaned."""
        if self._local:
            from hydra_plugins.ray_actor_launcher.ray_cluster import alive, ray_processes

            self._ray_pids = alive({**self._ray_pids, **ray_processes()})

    def _replace(self, dead: Any) -> None:
        self._actors.remove(dead)
        self._warm.pop(dead, None)
        fresh = self._remote.remote()
        self._actors.append(fresh)
        self._idle.append(fresh)

    def close(self) -> None:
        """Kill the workers and stop the Ray this pool started (``ray_cluster.release_ray``:
        a local one with every process of ours, a cluster only disconnected from)."""
        from hydra_plugins.ray_actor_launcher.ray_cluster import release_ray

        stop, self._started = self._started, False
        release_ray(self._ray, self._actors, stop=stop, address=self._address,
                    known=self._ray_pids)
        self._actors.clear()
