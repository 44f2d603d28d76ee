"""Running ``python -m sweep ... -m`` from tests: in this process (on the module's Ray) or as
a subprocess with its own loopback Ray, and reading what it left in the store."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from hydra._internal.hydra import Hydra
from hydra.core.global_hydra import GlobalHydra
from mlflow.tracking import MlflowClient

from sweep.recorder import RESULTS_FILE, read_results_table

REPO = Path(__file__).resolve().parents[1]


def run_sweep(sweep_dir: Path, overrides: list[str]):
    """``python -m sweep <overrides> -m`` in this process; the job returns (Hydra's own test
    runners delete the sweep dir on exit; here it is kept for inspection)."""
    from sweep.app import task

    hydra_ = Hydra.create_main_hydra_file_or_module(
        calling_file=None, calling_module="sweep.app", config_path="../conf", job_name="sweep"
    )
    quiet = [] if "hydra/launcher=basic" in overrides else ["hydra.launcher.progress=false"]
    try:
        returns = hydra_.multirun(
            config_name="config", task_function=task,
            overrides=[*quiet, f"hydra.sweep.dir={sweep_dir}", *overrides],
            with_log_configuration=False,
        )
    finally:
        GlobalHydra().clear()
    return returns[0]


def sweep_env() -> dict[str, str]:
    """The environment for a sweep subprocess: no inherited store or cluster address."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    env["PYTHONPATH"] = str(REPO)
    return env


def table(sweep_dir: Path) -> pd.DataFrame:
    return read_results_table(sweep_dir / RESULTS_FILE)[0]


def runs_by_status(store: str, experiment: str) -> dict[str, list]:
    """Every run of the experiment, grouped by MLflow status."""
    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    out: dict[str, list] = {}
    for run in client.search_runs([exp.experiment_id], max_results=1000):
        out.setdefault(run.info.status, []).append(run)
    return out
