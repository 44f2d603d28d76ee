"""Shared test fixtures: where the read-only reference data lives; Hydra on ``conf/``; a fresh
MLflow sqlite store per test."""

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
    Tracker(f"sqlite:///{path}", "template")
    return path


@pytest.fixture
def store(tmp_path, mlflow_template, monkeypatch) -> str:
    """A fresh copy of the template store in the test's own folder (the working directory,
    since MLflow puts artifacts under ./mlruns); its tracking URI."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(mlflow_template, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
