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
    ``JobReturn`` (status ``FAILED`` with the error for a failed job), ``close`` once at the end with ``status`` one of ``FINISHED``,
    ``FAILED`` (some job failed) or ``KILLED`` (interrupted).
    """

    def __init__(self, config: DictConfig, sweep_dir: Path, num_jobs: int) -> None: ...

    def start(self) -> None: ...

    def job_done(self, idx: int, cfg: DictConfig, ret: JobReturn) -> None: ...

    def close(self, status: str) -> None: ...

    # Optional: with ``hydra.launcher.resume`` (the default) the launcher calls
    # ``previous_result(cfg)`` for every job once ``start`` has run; a job for which it
    # returns a result is not run, and ``job_done`` receives that result instead.
    # def previous_result(self, cfg: DictConfig) -> Any | None: ...


Validator = Callable[[DictConfig], None]


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
