"""Shared test fixtures: where the read-only reference data lives; Hydra on ``conf/``; a fresh
MLflow sqlite store per test; a small loopback-only Ray per test module."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """``$SERVESWEEP_DATA`` or ``../shared/data`` beside the repository."""
    return Path(os.environ.get("SERVESWEEP_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = shared_data_dir()
    if not (root / "llmservingsim").is_dir():
        pytest.skip(
            f"reference data not found at {root} (set SERVESWEEP_DATA to the shared/data folder)"
        )
    return root


@pytest.fixture(scope="module")
def hydra_conf():
    """Hydra initialised on ``conf/`` for a whole test module (``compose`` is then cheap).
    Use with ``pytestmark = pytest.mark.usefixtures("hydra_conf")``."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


@pytest.fixture(scope="module")
def mlflow_template(tmp_path_factory) -> Path:
    """A migrated MLflow sqlite store, created once per module (migrations take seconds)."""
    from sweep.tracking import Tracker

    path = tmp_path_factory.mktemp("mlflow") / "template.db"
    Tracker(f"sqlite:///{path}", "template").close()  # the file alone holds the store
    return path


@pytest.fixture
def store(tmp_path, mlflow_template, monkeypatch) -> str:
    """A fresh copy of the template store in the test's own folder (the working directory,
    since MLflow puts artifacts under ./mlruns); its tracking URI."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(mlflow_template, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="module")
def ray_session(request):
    """A small private Ray for one test module, started the way sweeps start it (loopback
    only). The module's own functions are shipped by value: Ray workers cannot import test
    modules. The launcher attaches to it and never shuts it down."""
    ray = pytest.importorskip("ray")
    from hydra_plugins.ray_actor_launcher.ray_cluster import start_ray, stop_ray

    start_ray(ray, "local", {"num_cpus": 2, "object_store_memory": 100 * 2**20,
                             "include_dashboard": False, "log_to_driver": False})
    ray.cloudpickle.register_pickle_by_value(request.module)
    yield ray
    stop_ray(ray)
