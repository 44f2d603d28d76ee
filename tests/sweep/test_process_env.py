"""The environment ``import sweep`` sets for its process and the processes it starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = ("import sweep, numpy, os; "
          "print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['ARROW_DEFAULT_MEMORY_POOL'])")


def _run(env_extra: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "ARROW_DEFAULT_MEMORY_POOL")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def test_import_sweep_sets_one_blas_thread_and_the_system_arrow_pool() -> None:
    assert _run({}) == ["1", "system"]


@pytest.mark.parametrize("threads, pool", [("4", "jemalloc"), ("2", "mimalloc")])
def test_the_environments_own_choice_is_kept(threads: str, pool: str) -> None:
    assert _run({"OPENBLAS_NUM_THREADS": threads, "ARROW_DEFAULT_MEMORY_POOL": pool}) == [
        threads, pool]
