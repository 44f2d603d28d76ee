"""The two extension points of the launcher: a config validator and a result recorder.

Both are named in the launcher config as ``"package.module:attribute"`` strings, so the
plugin stays generic and the application decides what to check and where results go.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hydra.core.utils import JobReturn
from omegaconf import DictConfig


class Recorder(Protocol):
    """Receives results in the driver process, one call per finished job.

    ``start`` runs once before the first job is dispatched, ``job_done`` once per job in
    completion order with the job's composed config (``hydra`` node included) and its
    ``JobReturn`` (status ``FAILED`` with the error for a failed job), ``close`` once at the
    end with ``status`` one of ``FINISHED``, ``FAILED`` (some job failed) or ``KILLED``
    (interrupted). ``close`` returns None when everything was recorded, else a message
    saying what is missing; the launcher then exits non-zero with it.
    """

    def __init__(self, config: DictConfig, sweep_dir: Path, num_jobs: int) -> None: ...

    def start(self) -> None: ...

    def job_done(self, idx: int, cfg: DictConfig, ret: JobReturn) -> None: ...

    def close(self, status: str) -> str | None: ...

    # Optional: ``acquire(jobs, reuse_finished)`` with ``jobs`` a list of ``(idx, cfg)``
    # returns ``{idx: (decision, value)}``: ``("run", None)`` to run the job (the recorder
    # has claimed it), ``("done", result)`` to take a stored result instead of running it
    # (only when ``reuse_finished``, i.e. ``hydra.launcher.resume``; ``job_done`` then
    # receives that result), ``("wait", None)`` when another sweep runs the job right now;
    # the launcher asks again about waiting jobs every ``wait_poll_s``.
    # def acquire(self, jobs: list[tuple[int, DictConfig]], reuse_finished: bool
    #             ) -> dict[int, tuple[str, Any]]: ...


# A validator raises for an invalid job config (every job is checked and all problems are
# reported together, before anything starts), and may return a text for a valid job that
# cannot run (infeasible): that job is not run; ``job_done`` receives
# ``{"status": "infeasible", "reason": text}`` as its result.
Validator = Callable[[DictConfig], str | None]


def load_attr(spec: str, key: str) -> Any:
    """Import ``"module:attribute"``; errors name the launcher config ``key``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"hydra.launcher.{key}={spec!r}: expected 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"hydra.launcher.{key}={spec!r}: cannot import {module_name}: {err}") from err
    try:
        return getattr(module, attr)
    except AttributeError as err:
        raise ValueError(f"hydra.launcher.{key}={spec!r}: {module_name} has no {attr!r}") from err
