"""The Ray actor that runs Hydra jobs; one long-lived instance per pool slot.

Module-level caches of the task code (loaded profiles, model specs) survive between the
jobs an actor runs, because the actor process lives for the whole sweep.
"""

from __future__ import annotations

import importlib
import os
import pickle
import traceback
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hydra_plugins.ray_actor_launcher.compose import PROTOCOL
from hydra_plugins.ray_actor_launcher.job_run import run_job


class JobFailure(RuntimeError):
    """A job's exception, carried back to the driver as text (tracebacks do not pickle)."""


def pickle_config(config: DictConfig) -> bytes:
    """A job's config as it travels to an actor: pickled by the driver, unpickled by the
    actor once Hydra's state is installed. Installing it (``Singleton.set_state``) scans
    Hydra's plugins, which executes their modules again and so redefines their classes
    (``Plugins._scan_all_plugins``); a config Ray unpickled with the call's arguments, before
    that, would hold classes its copies by pickling (``job_run.run_job``) no longer find."""
    return pickle.dumps(config, PROTOCOL)


class JobRunner:
    """Runs one Hydra job at a time (the actor is created with ``max_concurrency=1``)."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        # the launch's state key, Hydra context and task function (``run``)
        self._launch: tuple[str, HydraContext, TaskFunction] | None = None
        for module in preload:  # warm up while the driver still prepares the sweep
            importlib.import_module(module)

    def pid(self) -> int:
        return os.getpid()

    def run(
        self,
        idx: int,
        pickled_config: bytes,
        shared: list[Any],
        state_key: str,
    ) -> tuple[int, JobReturn]:
        """Run job ``idx`` on its config (``pickled_config``, see ``pickle_config``).
        ``shared`` holds the object refs of what every job of one launch (``state_key``)
        shares: the Hydra context, the task function and Hydra's global state. Ray resolves
        an object ref only where it is an argument itself, not inside a list, so they are
        fetched and unpickled here once per launch instead of with every call (10-25 ms a
        job: the context and the state hold Hydra's config repository and store); the
        state is installed then. The context and the task function are reused by the
        launch's later jobs on this actor, as Hydra's basic launcher reuses them for all
        its jobs in one process."""
        import ray

        setup_globals()
        if self._launch is None or self._launch[0] != state_key:
            hydra_context, task_function, singleton_state = ray.get(shared)
            Singleton.set_state(singleton_state)
            self._launch = state_key, hydra_context, task_function
        _, hydra_context, task_function = self._launch
        sweep_config = pickle.loads(pickled_config)  # after the state (pickle_config)
        # No HydraConfig.set_config here: run_job installs the job's config itself first
        # (job_run.py, as hydra/core/utils.py), and the config was composed in the driver.
        ret = run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        if ret.status == JobStatus.FAILED:
            err = ret._return_value
            text = "".join(traceback.format_exception(err))
            ret.return_value = JobFailure(f"job #{idx} failed in pid {os.getpid()}:\n{text}")
            ret.status = JobStatus.FAILED
        return idx, ret
