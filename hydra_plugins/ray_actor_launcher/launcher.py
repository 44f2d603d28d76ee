"""``RayActorLauncher``: Hydra jobs on a pool of long-lived Ray actors.

The driver (this process) composes and validates every job config, then starts or
attaches Ray, creates the actors, sends each job to the next idle actor and hands each
result to the recorder as it arrives. Results go back to the sweeper in job order. With
``resume`` (the default) a recorder that offers ``previous_result(cfg)`` is asked first for
each job: a job it already holds a finished result for is not run again, its stored result
is handed to the recorder and returned like a fresh one.
"""

from __future__ import annotations

import logging
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
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.ray_actor_launcher.hooks import Recorder, load_attr

log = logging.getLogger(__name__)

ON_FAILURE = ("continue", "raise")


class RayActorLauncher(Launcher):
    """See ``config.RayActorLauncherConf`` for the options."""

    def __init__(self, **params: Any) -> None:
        self.params = OmegaConf.create(params)
        if self.params.on_failure not in ON_FAILURE:
            raise ValueError(
                f"hydra.launcher.on_failure={self.params.on_failure!r}: allowed values {ON_FAILURE}"
            )
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self._started_ray = False

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
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        jobs = self._compose(job_overrides, initial_job_idx, sweep_dir)
        if self.params.validator:
            self._validate(jobs)
        log.info(f"Launching {len(jobs)} jobs on Ray actors, sweep dir {sweep_dir}")
        recorder = self._make_recorder(sweep_dir, len(jobs))
        # The recorder opens its store (e.g. migrates an MLflow DB) while Ray starts.
        starting = InBackground(recorder.start) if recorder is not None else None
        status = "KILLED"
        try:
            results = self._run(jobs, job_overrides, initial_job_idx, recorder, starting)
            failed = sum(r.status == JobStatus.FAILED for r in results.values())
            status = "FAILED" if failed else "FINISHED"
        finally:
            if recorder is not None and starting is not None and starting.succeeded():
                recorder.close(status)
        ordered = [results[initial_job_idx + i] for i in range(len(jobs))]
        if failed:
            log.warning(f"{failed} of {len(ordered)} jobs failed")
        if self.params.on_failure == "continue":
            for ret in ordered:
                if ret.status == JobStatus.FAILED:
                    error = str(ret._return_value)
                    ret.status = JobStatus.COMPLETED
                    ret.return_value = {"status": "failed", "error": error}
        return ordered

    def _compose(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path
    ) -> list[tuple[int, DictConfig]]:
        assert self.config is not None and self.hydra_context is not None
        jobs = []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.sweep.dir = str(sweep_dir)
                cfg.hydra.job.id = str(idx)
                cfg.hydra.job.num = idx
            jobs.append((idx, cfg))
        return jobs

    def _validate(self, jobs: list[tuple[int, DictConfig]]) -> None:
        """Run the validator on every job config; the first error ends the process."""
        validate = load_attr(self.params.validator, "validator")
        for idx, cfg in jobs:
            try:
                validate(_task_view(cfg))
            except Exception as err:
                overrides = " ".join(filter_overrides(list(cfg.hydra.overrides.task)))
                raise SystemExit(
                    f"Invalid config in job #{idx} ({overrides}); no job was started.\n{err}"
                ) from None

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
        recorder: Recorder | None,
        starting: InBackground | None,
    ) -> dict[int, JobReturn]:
        import ray

        from hydra_plugins.ray_actor_launcher._actor import JobFailure, JobRunner
        from hydra_plugins.ray_actor_launcher._pool import ActorSet
        from hydra_plugins.ray_actor_launcher._progress import Progress

        t_start = time.monotonic()
        self._ensure_ray(ray)
        actor_options = dict(OmegaConf.to_container(self.params.actor_options, resolve=True))
        actor_options.setdefault("max_concurrency", 1)
        remote_cls = ray.remote(JobRunner).options(**actor_options)
        actors: list[Any] = []
        progress = None
        try:
            size = self._pool_size(ray, actor_options, len(jobs))
            preload = tuple(self.params.preload or ())
            actors = [remote_cls.remote(preload) for _ in range(size)]
            ray.get([a.pid.remote() for a in actors], timeout=self.params.ready_timeout_s)
            self._check_exposure()
            if starting is not None:
                starting.wait()
            log.info(f"{size} actors ready {time.monotonic() - t_start:.1f} s after launch")
            t_jobs = time.monotonic()
            pool = ActorSet(
                actors, lambda: remote_cls.remote(preload), self.params.job_timeout_s,
                max_retries=int(self.params.max_retries),
                ready_timeout_s=float(self.params.ready_timeout_s),
            )
            ctx_ref = ray.put(self.hydra_context)
            fn_ref = ray.put(self.task_function)
            state_ref = ray.put(Singleton.get_state())
            state_key = uuid.uuid4().hex

            def submit(actor: Any, item: tuple[int, DictConfig]) -> Any:
                return actor.run.remote(item[0], ctx_ref, item[1], fn_ref, state_ref, state_key)

            progress = Progress(len(jobs), bool(self.params.progress))
            results: dict[int, JobReturn] = {}
            configs = dict(jobs)
            previous = self._previous_results(jobs, recorder)
            for idx, value in previous.items():
                ret = JobReturn(status=JobStatus.COMPLETED, _return_value=value)
                ret.overrides = list(job_overrides[idx - initial_job_idx])
                results[idx] = ret
                assert recorder is not None
                recorder.job_done(idx, configs[idx], ret)
                progress.update(False)
            if previous:
                log.info(f"resume: {len(previous)} of {len(jobs)} jobs already have a finished "
                         f"result; running the other {len(jobs) - len(previous)}")
            todo = [(idx, (idx, cfg)) for idx, cfg in jobs if idx not in previous]
            for out in pool.run(todo, submit):
                if out.error is None:
                    _, ret = out.value
                else:
                    ret = JobReturn(status=JobStatus.FAILED, _return_value=JobFailure(out.error))
                    ret.overrides = list(job_overrides[out.key - initial_job_idx])
                results[out.key] = ret
                if recorder is not None:
                    recorder.job_done(out.key, configs[out.key], ret)
                progress.update(ret.status == JobStatus.FAILED)
            actors = pool.actors
            log.info(f"{len(todo)} jobs ran in {time.monotonic() - t_jobs:.1f} s on {size} actors"
                     + (f" ({pool.replaced} replaced, {pool.retried} jobs retried)"
                        if pool.replaced else ""))
            return results
        finally:
            if progress is not None:
                progress.close()
            for actor in actors:
                ray.kill(actor)
            if self._started_ray and self.params.shutdown_ray:
                ray.shutdown()
                self._started_ray = False

    def _previous_results(
        self, jobs: list[tuple[int, DictConfig]], recorder: Recorder | None
    ) -> dict[int, Any]:
        """Stored results of jobs that already finished (``resume`` and a recorder that
        implements ``previous_result``), by job index."""
        lookup = getattr(recorder, "previous_result", None)
        if not self.params.resume or lookup is None:
            return {}
        found = {}
        for idx, cfg in jobs:
            value = lookup(cfg)
            if value is not None:
                found[idx] = value
        return found

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


def _task_view(cfg: DictConfig) -> DictConfig:
    """The job config without its ``hydra`` node, as the task function will see it."""
    view = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    return view
