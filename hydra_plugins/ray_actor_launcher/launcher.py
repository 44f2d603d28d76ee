"""``RayActorLauncher``: Hydra jobs on a pool of long-lived Ray actors.

The driver (this process) starts or attaches Ray and creates the actors in a background
thread as soon as a launch begins, while it composes and validates every job config and
opens the recorder (Ray's processes and the actors' imports use the other cores meanwhile);
then it sends each job to the next idle actor and hands each result to the recorder as it
arrives. Results go back to the sweeper in job order. At the end Ray is stopped while the
recorder writes its table and closes its runs.

A recorder that offers ``acquire`` decides per job, before it runs, whether to run it (it
claimed the job), reuse a stored result (``resume``, the default) or wait because another
live sweep runs the same point; waiting jobs are asked about again every ``wait_poll_s``
until they are finished elsewhere or theirs to run. A sweep with a failed job, a job whose
result could not be recorded, or a lost local Ray exits non-zero after recording what it
has. SIGTERM is handled like Ctrl-C: the recorder closes its runs as ``KILLED``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydra_plugins.ray_actor_launcher.hooks import Recorder, load_attr
from hydra_plugins.ray_actor_launcher.ray_cluster import ClusterLost

log = logging.getLogger(__name__)

# The launcher's two background threads import large package trees: Ray in the ``RayOwner``
# thread, the recorder (MLflow, pandas, pyarrow) in another. The trees share packages that
# import one another (protobuf, requests and urllib3, asyncio, tqdm, ...), and when two
# threads import such a cycle from both ends, CPython's per-module import locks give one of
# them a partially initialised module instead of waiting (a sweep failed so once:
# "partially initialized module 'ray' has no attribute '_private'"). So the two imports take
# turns under this lock; the main thread imports Ray only once the ``RayOwner`` has.
_IMPORTING = threading.Lock()
# What Ray's ``init`` imports on its own that the recorder's stack imports too (the modules
# new in ``sys.modules`` after ``ray.init``, intersected with the recorder's, Ray 2.x):
# imported with Ray, so that ``init`` finds them loaded.
_RAY_INIT_SHARED = ("click", "email.policy")

ON_FAILURE = ("continue", "return", "raise")


class _NoThreadSigtermWarning(logging.Filter):
    """``ray.init`` outside the main thread warns that it did not install its SIGTERM
    handler; the launcher installs its own (``_sigterm_as_interrupt``), so that is expected."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SIGTERM handler is not set")




class RayActorLauncher(Launcher):
    """See ``config.RayActorLauncherConf`` for the options."""

    def __init__(self, **params: Any) -> None:
        self.params = OmegaConf.create(params)
        problems = check_params(self.params)
        if problems:
            raise SystemExit("Invalid launcher settings; nothing was run.\n" + "\n".join(problems))
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self._started_ray = False
        self._ray_pids: dict[int, Any] = {}  # ray_cluster.RayProcess by pid
        self._startup: RayOwner | None = None
        self._actors: list[Any] = []
        self._remote_cls: Any = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    # ------------------------------------------------------------------ driver side
    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        from hydra_plugins.ray_actor_launcher.sweep_dir import release, reserve_in_config

        sweep_dir = reserve_in_config(self.config)
        try:
            return self._launch(job_overrides, initial_job_idx, sweep_dir)
        finally:
            release(sweep_dir)

    def _launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path
    ) -> Sequence[JobReturn]:
        assert self.config is not None
        # Ray and the actors start now, in the background, while this thread composes and
        # validates the jobs and opens the recorder; an invalid sweep stops them again.
        self._startup = RayOwner(lambda stopping: self._start_pool(len(job_overrides), stopping),
                                 self._stop_pool)
        try:
            jobs = self._compose(job_overrides, initial_job_idx, sweep_dir)
            infeasible = self._validate(jobs) if self.params.validator else {}
            log.info(f"Launching {len(jobs)} jobs on Ray actors, sweep dir {sweep_dir}")
            # The recorder is imported and opens its store (e.g. migrates an MLflow DB) while
            # the actors start.
            opened: dict[str, Recorder] = {}
            starting = (InBackground(lambda: self._open_recorder(sweep_dir, len(jobs), opened))
                        if self.params.recorder else None)
            status = "KILLED"
            results: dict[int, JobReturn] = {}
            lost: str | None = None
            problem: str | None = None
            with _sigterm_as_interrupt():
                try:
                    try:
                        self._run(jobs, job_overrides, initial_job_idx, opened, starting,
                                  results, infeasible)
                    except ClusterLost as err:
                        lost = str(err)
                    failed = sum(r.status == JobStatus.FAILED for r in results.values())
                    status = "FAILED" if failed or lost else "FINISHED"
                finally:
                    # Ray stops while the recorder writes its table and closes its runs.
                    self._startup.stop()
                    if starting is not None and starting.succeeded():
                        problem = opened["recorder"].close(status)
        finally:
            self._startup.stop()
            self._startup.join()
            self._startup = None
        missing = len(jobs) - len(results)
        if lost is not None:
            raise SystemExit(
                f"{lost}. {len(results)} of {len(jobs)} jobs finished and are recorded, "
                f"{missing} did not run; rerun the same command to run them."
                + (f" Also: {problem}" if problem else "")
            )
        ordered = [results[initial_job_idx + i] for i in range(len(jobs))]
        if failed:
            log.warning(f"{failed} of {len(ordered)} jobs failed")
        if self.params.on_failure in ("continue", "return"):
            for ret in ordered:
                if ret.status == JobStatus.FAILED:
                    error = str(ret._return_value)
                    ret.status = JobStatus.COMPLETED
                    ret.return_value = {"status": "failed", "error": error}
            if problem or (failed and self.params.on_failure == "continue"):
                raise SystemExit(
                    (f"{failed} of {len(ordered)} jobs failed (their errors are in the results "
                     "table and each job's error.txt). " if failed else "") + (problem or "")
                )
        elif problem:
            raise SystemExit(problem)
        return ordered

    def _open_recorder(self, sweep_dir: Path, num_jobs: int, opened: dict[str, Recorder]) -> None:
        """Import and start the recorder (in the background thread); ``opened["recorder"]``
        is set only once ``start`` succeeded, so only a started recorder is closed."""
        with _IMPORTING:  # its imports (and the store's, in ``start``) not beside Ray's
            recorder = self._make_recorder(sweep_dir, num_jobs)
            assert recorder is not None
            recorder.start()
        opened["recorder"] = recorder

    def _start_pool(self, num_jobs: int, stopping: threading.Event) -> None:
        """Start or attach Ray and create the pool's actors; return once every actor runs
        (it has imported ``preload``). Runs in the ``RayOwner`` thread ``self._startup``.
        Nothing is started once ``stopping`` is set: a sweep whose composition or validation
        fails while ``import ray`` runs (the usual case for a mistyped override) ends with
        its message at once, without a Ray to start and stop first."""
        with _IMPORTING:
            import ray

            for module in _RAY_INIT_SHARED:
                importlib.import_module(module)
        t_start = time.monotonic()
        logging.getLogger("ray._private.worker").addFilter(_NoThreadSigtermWarning())
        if stopping.is_set():
            return
        self._ensure_ray(ray)
        if stopping.is_set():
            return
        actor_options = dict(OmegaConf.to_container(self.params.actor_options, resolve=True))
        actor_options.setdefault("max_concurrency", 1)
        from hydra_plugins.ray_actor_launcher._actor import JobRunner

        self._remote_cls = ray.remote(JobRunner).options(**actor_options)
        size = self._pool_size(ray, actor_options, num_jobs)
        preload = tuple(self.params.preload or ())
        for _ in range(size):  # kept one by one: a failure below still stops those created
            self._actors.append(self._remote_cls.remote(preload))
        ray.get([a.pid.remote() for a in self._actors], timeout=self.params.ready_timeout_s)
        log.info(f"{size} actors ready {time.monotonic() - t_start:.1f} s after Ray was asked for")

    def _stop_pool(self) -> None:
        """Stop the actors (and the Ray started here); runs in the ``RayOwner`` thread."""
        import ray

        self._stop_ray(ray, self._actors)
        self._actors = []

    def _compose(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path
    ) -> list[tuple[int, DictConfig]]:
        """Every job's config, as ``load_sweep_config`` composes it; composed from the files
        once per distinct config choice (``compose.JobComposer``)."""
        assert self.config is not None and self.hydra_context is not None
        from hydra_plugins.ray_actor_launcher.compose import JobComposer

        composer = JobComposer(self.hydra_context.config_loader, self.config)
        jobs = []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            cfg = composer.compose(overrides)
            with open_dict(cfg):
                cfg.hydra.sweep.dir = str(sweep_dir)
                cfg.hydra.job.id = str(idx)
                cfg.hydra.job.num = idx
            jobs.append((idx, cfg))
        return jobs

    def _validate(self, jobs: list[tuple[int, DictConfig]]) -> dict[int, str]:
        """Run the validator on every job config before anything starts. Every problem is
        collected (one message each, with the jobs it concerns) and ends the process; a job
        the validator answers with a text is infeasible: returned ``{idx: reason}``."""
        validate = load_attr(self.params.validator, "validator")
        problems: dict[str, list[str]] = {}
        infeasible: dict[int, str] = {}
        for idx, cfg in jobs:
            try:
                reason = validate(task_view(cfg))
            except Exception as err:
                overrides = " ".join(filter_overrides(list(cfg.hydra.overrides.task)))
                problems.setdefault(str(err), []).append(f"#{idx} ({overrides})")
                continue
            if isinstance(reason, str) and reason:
                infeasible[idx] = reason
        if problems:
            lines = []
            for msg, where in problems.items():
                shown = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
                lines.append(f"- job {shown}: {msg}")
            raise SystemExit(f"Invalid config ({len(problems)} problem"
                             f"{'s' if len(problems) > 1 else ''}); no job was started.\n"
                             + "\n".join(lines))
        for idx, reason in infeasible.items():
            log.warning(f"job #{idx} is infeasible, recorded without running: {reason}")
        return infeasible

    def _make_recorder(self, sweep_dir: Path, num_jobs: int) -> Recorder | None:
        if not self.params.recorder:
            return None
        cls = load_attr(self.params.recorder, "recorder")
        assert self.config is not None
        return cls(self.config, sweep_dir, num_jobs)

    def _run(
        self,
        jobs: list[tuple[int, DictConfig]],
        job_overrides: Sequence[Sequence[str]],
        initial_job_idx: int,
        opened: dict[str, Recorder],
        starting: InBackground | None,
        results: dict[int, JobReturn],
        infeasible: dict[int, str],
    ) -> None:
        """Run the jobs; each result is put into ``results`` (and recorded) as it arrives. An
        infeasible job is recorded with its reason (``{"status": "infeasible", "reason"}``),
        never run. The actors are those ``_start_pool`` started; ``_launch`` stops them."""
        if starting is not None:
            starting.wait()  # the recorder's imports are done: none run beside this thread's
        from hydra_plugins.ray_actor_launcher._progress import Progress

        configs = dict(jobs)
        progress = Progress(len(jobs), bool(self.params.progress))
        try:
            recorder = opened.get("recorder")
            if len(infeasible) == len(jobs):  # nothing can run: record it all, no actor needed
                self._drive(jobs, job_overrides, initial_job_idx, recorder, results, infeasible,
                            configs, progress, None, None)
                return
            assert self._startup is not None
            self._startup.wait_started()  # re-raises a failed start, its import of Ray included
            import ray

            from hydra_plugins.ray_actor_launcher._actor import pickle_config
            from hydra_plugins.ray_actor_launcher._pool import ActorSet

            self._check_exposure()
            remote_cls = self._remote_cls
            preload = tuple(self.params.preload or ())
            t_jobs = time.monotonic()
            pool = ActorSet(
                self._actors, lambda: remote_cls.remote(preload), self.params.job_timeout_s,
                max_retries=int(self.params.max_retries),
                ready_timeout_s=float(self.params.ready_timeout_s),
            )
            # fetched by each actor once (``JobRunner.run``), not resolved with every call
            shared = [ray.put(self.hydra_context), ray.put(self.task_function),
                      ray.put(Singleton.get_state())]
            state_key = uuid.uuid4().hex

            def submit(actor: Any, item: tuple[int, DictConfig]) -> Any:
                return actor.run.remote(item[0], pickle_config(item[1]), shared, state_key)

            pool.health = self._cluster_health(ray)
            try:
                self._drive(jobs, job_overrides, initial_job_idx, recorder, results, infeasible,
                            configs, progress, pool, submit)
            finally:
                self._actors = pool.actors  # replacements included, for ``_stop_pool``
            log.info(f"{len(jobs)} jobs done in {time.monotonic() - t_jobs:.1f} s on "
                     f"{len(pool.actors)} actors" + (f" ({pool.replaced} replaced, "
                     f"{pool.retried} jobs retried)" if pool.replaced else ""))
        finally:
            progress.close()

    def _drive(
        self,
        jobs: list[tuple[int, DictConfig]],
        job_overrides: Sequence[Sequence[str]],
        initial_job_idx: int,
        recorder: Recorder | None,
        results: dict[int, JobReturn],
        infeasible: dict[int, str],
        configs: dict[int, DictConfig],
        progress: Any,
        pool: Any,
        submit: Callable[[Any, Any], Any] | None,
    ) -> None:
        """Decide every job (run / reuse a stored result / wait for another sweep), record
        the reused and infeasible ones, run the rest on ``pool`` and record each result."""
        from hydra_plugins.ray_actor_launcher._actor import JobFailure

        waiting = list(jobs)
        while waiting:
            decisions = self._acquire(waiting, recorder)
            for idx, _ in waiting:
                if decisions[idx][0] == "run" and idx in infeasible:
                    decisions[idx] = ("done", {"status": "infeasible", "reason": infeasible[idx]})
            reused = [idx for idx, _ in waiting if decisions[idx][0] == "done"]
            for idx in reused:
                ret = JobReturn(status=JobStatus.COMPLETED, _return_value=decisions[idx][1])
                ret.overrides = list(job_overrides[idx - initial_job_idx])
                results[idx] = ret
                if recorder is not None:
                    recorder.job_done(idx, configs[idx], ret)
                progress.update(False)
            todo = [(idx, (idx, cfg)) for idx, cfg in waiting if decisions[idx][0] == "run"]
            waiting = [(idx, cfg) for idx, cfg in waiting if decisions[idx][0] == "wait"]
            if reused or waiting:
                log.info(f"{len(reused)} jobs already have a finished result (or are infeasible), "
                         f"{len(waiting)} are being run by another sweep; running {len(todo)}")
            if todo:
                assert pool is not None and submit is not None
                for out in pool.run(todo, submit):
                    if out.error is None:
                        _, ret = out.value
                    else:
                        ret = JobReturn(status=JobStatus.FAILED,
                                        _return_value=JobFailure(out.error))
                        ret.overrides = list(job_overrides[out.key - initial_job_idx])
                    results[out.key] = ret
                    if recorder is not None:
                        recorder.job_done(out.key, configs[out.key], ret)
                    progress.update(ret.status == JobStatus.FAILED)
            elif waiting:
                reason = pool.health() if pool is not None and pool.health is not None else None
                if reason:
                    raise ClusterLost(reason)
                time.sleep(float(self.params.wait_poll_s))

    def _acquire(
        self, jobs: list[tuple[int, DictConfig]], recorder: Recorder | None
    ) -> dict[int, tuple[str, Any]]:
        """The recorder's decision per job (``run`` / ``done`` / ``wait``; see
        ``hooks.Recorder.acquire``); every job runs without a recorder that decides."""
        acquire = getattr(recorder, "acquire", None)
        if acquire is None:
            return {idx: ("run", None) for idx, _ in jobs}
        return acquire(jobs, reuse_finished=bool(self.params.resume))

    def _cluster_health(self, ray: Any) -> Callable[[], str | None] | None:
        """For a local Ray started here: a check that names the dead head process (raylet
        or GCS) once one has exited, else None. It also keeps ``self._ray_pids`` current
        (the processes still running, by name and start time), so teardown can find workers
        a dead raylet orphaned and never takes a reused pid for one of them."""
        from hydra_plugins.ray_actor_launcher.ray_cluster import (
            RAY_HEADS,
            alive,
            is_local,
            ray_processes,
            same_process,
        )

        if not (self._started_ray and is_local(self.params.address)):
            return None
        self._ray_pids = ray_processes()
        heads = {pid: p for pid, p in self._ray_pids.items() if p.name in RAY_HEADS}

        def check() -> str | None:
            for pid, head in heads.items():
                if not same_process(pid, head):  # (a reused pid is not the head)
                    return f"the local Ray cluster is gone: its {head.name} (pid {pid}) exited"
            self._ray_pids = alive({**self._ray_pids, **ray_processes()})
            return None

        return check

    def _stop_ray(self, ray: Any, actors: list[Any]) -> None:
        """Kill the actors and, if this launcher started Ray (``shutdown_ray``), stop it: a
        local one with every process of ours (``ray_cluster.release_ray``), a cluster
        attached to only disconnected from."""
        from hydra_plugins.ray_actor_launcher.ray_cluster import release_ray

        stop = self._started_ray and bool(self.params.shutdown_ray)
        if stop:
            self._started_ray = False
        release_ray(ray, actors, stop=stop, address=self.params.address, known=self._ray_pids)

    def _ensure_ray(self, ray: Any) -> None:
        if ray.is_initialized():
            return
        from hydra_plugins.ray_actor_launcher.ray_cluster import start_ray

        address = self.params.address or "local"
        runtime_env = OmegaConf.to_container(self.params.runtime_env, resolve=True) or None
        init = OmegaConf.to_container(self.params.init, resolve=True)
        log.info(f"Starting Ray (address={address})")
        start_ray(ray, address, init, runtime_env)
        self._started_ray = True

    def _check_exposure(self) -> None:
        """A local Ray started here must listen on loopback only (sockets checked once the
        actors run); otherwise stop before any job is sent."""
        from hydra_plugins.ray_actor_launcher.ray_cluster import (
            RayExposedError,
            describe,
            is_local,
            non_loopback_listeners,
        )

        if not (self._started_ray and is_local(self.params.address)):
            return
        exposed = non_loopback_listeners()
        if exposed:
            raise RayExposedError(
                f"the local Ray listens beyond loopback: {describe(exposed)}; no job was run"
            )

    def _pool_size(self, ray: Any, actor_options: dict[str, Any], num_jobs: int) -> int:
        """Actors wanted, capped to what the cluster can schedule (never more than jobs)."""
        cpus = float(ray.cluster_resources().get("CPU", 0))
        per_actor = float(actor_options.get("num_cpus", 1) or 0)
        fits = int(cpus // per_actor) if per_actor > 0 else num_jobs
        if fits < 1:
            raise RuntimeError(
                f"hydra.launcher.actor_options.num_cpus={per_actor:g} but the Ray cluster has "
                f"{cpus:g} CPUs: no actor can be scheduled"
            )
        wanted = self.params.num_actors or fits
        if wanted > fits:
            log.warning(f"hydra.launcher.num_actors={wanted} capped to {fits} (cluster CPUs)")
        return max(1, min(wanted, fits, num_jobs))


class InBackground:
    """Run ``fn`` in a thread; ``wait`` joins it and re-raises its exception."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._call, args=(fn,), daemon=True)
        self._thread.start()

    def _call(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as err:  # handed to the waiting thread
            self._error = err

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error

    def succeeded(self) -> bool:
        self._thread.join()
        return self._error is None


class RayOwner:
    """The thread that starts Ray and the actors (``start``, given the event ``stop`` sets, so
    that it can give up early) and, once told to, stops them (``stop``). One thread owns them for the whole launch because Ray ties the processes it
    starts to the thread that started them (Linux ``PR_SET_PDEATHSIG`` acts when the parent
    *thread* exits): a local Ray started in a short-lived thread would die with it."""

    def __init__(self, start: Callable[[threading.Event], None],
                 stop: Callable[[], None]) -> None:
        self._started = threading.Event()
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(start, stop), daemon=True,
                                        name="ray-owner")
        self._thread.start()

    def _main(self, start: Callable[[threading.Event], None], stop: Callable[[], None]) -> None:
        try:
            start(self._stopping)  # may return early, having started less, once stopping
        except BaseException as err:  # handed to ``wait_started``
            self._error = err
        finally:
            self._started.set()
        self._stopping.wait()
        try:
            stop()
        except Exception as err:  # the sweep's results are recorded; a stop failure is not one
            log.warning(f"stopping Ray: {type(err).__name__}: {err}")

    def wait_started(self) -> None:
        """Block until Ray and every actor run; re-raise the start-up's error."""
        self._started.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Ask the owner to stop the actors and Ray (once start-up has ended)."""
        self._stopping.set()

    def join(self) -> None:
        self._thread.join()


def task_view(cfg: DictConfig) -> DictConfig:
    """The job config without its ``hydra`` node, typed, as the task function will see it
    (Hydra's ``run_job`` deletes the node from a deep copy the same way)."""
    from hydra_plugins.ray_actor_launcher.compose import copy_config

    view = copy_config(cfg)
    with read_write(view), open_dict(view):
        del view["hydra"]
    return view


def check_params(params: DictConfig) -> list[str]:
    """One message per launcher setting out of range, naming the key and the allowed values."""
    problems = []

    def bad(key: str, allowed: str) -> None:
        problems.append(f"hydra.launcher.{key}={params.get(key)!r}: allowed {allowed}")

    if params.on_failure not in ON_FAILURE:
        bad("on_failure", " or ".join(ON_FAILURE))
    num = params.get("num_actors")
    if num is not None and (not isinstance(num, int) or isinstance(num, bool) or num < 1):
        bad("num_actors", "an integer >= 1, or null for one per cluster CPU")
    retries = params.get("max_retries")
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        bad("max_retries", "an integer >= 0")
    for key, allowed in (("job_timeout_s", "a number of seconds > 0, or null for no limit"),
                         ("ready_timeout_s", "a number of seconds > 0"),
                         ("wait_poll_s", "a number of seconds > 0")):
        value = params.get(key)
        if value is None and key == "job_timeout_s":
            continue
        if (not isinstance(value, int | float) or isinstance(value, bool)
                or not math.isfinite(value) or value <= 0):
            bad(key, allowed)
    return problems


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Treat SIGTERM like Ctrl-C while a sweep runs (main thread only), so the recorder
    closes its runs instead of the process vanishing with them ``RUNNING``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
