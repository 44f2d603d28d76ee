"""The ray_actor launcher with trivial task functions: Hydra's conformance suites, result
order, a crashing actor, a job timeout, and a recorder receiving every result."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from omegaconf import DictConfig

from hydra_plugins.ray_actor_launcher._actor import JobFailure

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


@pytest.fixture(autouse=True)
def hydra_default_version_base():
    """Hydra's suites assume the default version base; importing the sweep app (another
    test module) sets 1.3 process-wide. Restore the default around each test."""
    from hydra import version

    saved = version.VersionBase.instance().version_base
    version.VersionBase.instance().version_base = version._UNSPECIFIED_
    yield
    version.VersionBase.instance().version_base = saved


def test_plugin_is_discovered():
    names = [p.__name__ for p in Plugins.instance().discover(Launcher)]
    assert "RayActorLauncher" in names


@pytest.mark.parametrize("launcher_name, overrides", [("ray_actor", ["hydra.launcher.num_actors=2"])])
class TestRayActorLauncher(LauncherTestSuite):
    """Hydra's own launcher conformance tests, in process on the module's Ray."""


@pytest.mark.slow
@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [(
        {"defaults": [{"override hydra/launcher": "ray_actor"},
                      {"override hydra/hydra_logging": "hydra_debug"},
                      {"override hydra/job_logging": "disabled"}]},
        ["-m"],
    )],
)
class TestRayActorLauncherIntegration(IntegrationTestSuite):
    """Hydra's integration suite: each test runs an app that starts its own Ray."""


# ---------------------------------------------------------------- project-specific behaviour
RECORDED: list[tuple[int, str]] = []


class ListRecorder:
    """Keeps (job, status) in the driver, like the MLflow recorder would."""

    def __init__(self, config: DictConfig, sweep_dir: Path, num_jobs: int) -> None:
        self.num_jobs = num_jobs

    def start(self) -> None:
        RECORDED.clear()
        RECORDED.append((-1, "start"))

    def job_done(self, idx: int, cfg: DictConfig, ret) -> None:
        assert cfg.x is not None
        RECORDED.append((idx, ret.status.name))

    def close(self, status: str) -> None:
        RECORDED.append((-2, status))


def sleepy_task(cfg: DictConfig):
    """Job x == 0 is slow, so others finish before it; x == 3 raises, x == 4 kills its actor."""
    time.sleep(3.0 if cfg.x == 0 else 0.05)
    if cfg.x == 3:
        raise ValueError("x=3 is cursed")
    if cfg.x == 4 and cfg.get("crash", False):
        os._exit(7)
    if cfg.x == 5 and cfg.get("hang", False):
        time.sleep(60)
    return {"x": cfg.x, "pid": os.getpid()}


def _sweep(hydra_sweep_runner, tmp_path, *extra):
    return hydra_sweep_runner(
        calling_file=__file__,
        calling_module=None,
        task_function=sleepy_task,
        config_path=None,
        config_name=None,
        overrides=["hydra/launcher=ray_actor", "hydra.launcher.progress=false",
                   f"hydra.launcher.recorder={__name__}:ListRecorder", *extra],
        temp_dir=tmp_path,
    )


def test_results_in_job_order_and_failures_recorded(hydra_sweep_runner, tmp_path):
    # retries off: the crashing job fails on its first death (retries: test_reliability_faults)
    with _sweep(hydra_sweep_runner, tmp_path, "+x=0,1,2,3,4,5", "+crash=true",
                "hydra.launcher.max_retries=0", "hydra.launcher.on_failure=return") as sweep:
        returns = sweep.returns[0]
    assert [r.overrides[0] for r in returns] == [f"+x={i}" for i in range(6)]
    values = [r.return_value for r in returns]
    for i in (0, 1, 2, 5):
        assert values[i]["x"] == i
    assert values[3]["status"] == "failed" and "x=3 is cursed" in values[3]["error"]
    assert values[4]["status"] == "failed" and "actor died" in values[4]["error"]
    assert RECORDED[0] == (-1, "start") and RECORDED[-1] == (-2, "FAILED")
    done = dict(RECORDED[1:-1])
    assert sorted(done) == list(range(6))
    assert done[3] == done[4] == "FAILED" and done[0] == "COMPLETED"
    # the slow first job finished after others: results arrived out of order (not "last":
    # under load, the crashed actor's replacement can start after job 0 is done)
    assert RECORDED[1][0] != 0


def test_job_timeout_kills_the_actor_and_the_sweep_goes_on(hydra_sweep_runner, tmp_path):
    t0 = time.monotonic()
    with _sweep(hydra_sweep_runner, tmp_path, "+x=2,5,6", "+hang=true",
                "hydra.launcher.job_timeout_s=3", "hydra.launcher.on_failure=return") as sweep:
        values = [r.return_value for r in sweep.returns[0]]
    assert time.monotonic() - t0 < 40
    assert values[0]["x"] == 2 and values[2]["x"] == 6
    assert values[1]["status"] == "failed" and "timed out after 3 s" in values[1]["error"]


def test_a_failed_job_makes_the_sweep_exit_non_zero_after_all_jobs_ran(hydra_sweep_runner,
                                                                      tmp_path):
    with pytest.raises(SystemExit, match=r"1 of 3 jobs failed"), \
            _sweep(hydra_sweep_runner, tmp_path, "+x=2,3,6"):
        pass
    assert sorted(i for i, _ in RECORDED[1:-1]) == [0, 1, 2]
    assert RECORDED[-1] == (-2, "FAILED")


@pytest.mark.parametrize("setting, allowed", [
    ("num_actors=0", "an integer >= 1"), ("num_actors=-2", "an integer >= 1"),
    ("max_retries=-1", "an integer >= 0"), ("job_timeout_s=0", "a number of seconds > 0"),
    ("on_failure=ignore", "continue or return or raise"), ("wait_poll_s=-1", "a number of seconds > 0"),
])
def test_launcher_settings_are_checked_before_anything_runs(hydra_sweep_runner, tmp_path,
                                                            setting, allowed):
    RECORDED.clear()
    with pytest.raises(SystemExit, match=rf"hydra\.launcher\.{setting.split('=')[0]}=.*allowed "
                                         rf"{allowed}"), \
            _sweep(hydra_sweep_runner, tmp_path, "+x=2", f"hydra.launcher.{setting}"):
        pass
    assert RECORDED == []


def test_on_failure_raise_fails_the_sweep_after_all_jobs_ran(hydra_sweep_runner, tmp_path):
    with pytest.raises(JobFailure, match="(?s)ValueError: x=3 is cursed"), \
            _sweep(hydra_sweep_runner, tmp_path, "+x=2,3,6", "hydra.launcher.on_failure=raise"):
        pass
    assert sorted(i for i, _ in RECORDED[1:-1]) == [0, 1, 2]


def test_pool_is_capped_to_the_cluster_cpus(hydra_sweep_runner, tmp_path):
    with _sweep(hydra_sweep_runner, tmp_path, "+x=0,1,2,6", "hydra.launcher.num_actors=8") as sweep:
        pids = {r.return_value["pid"] for r in sweep.returns[0]}
    assert 1 <= len(pids) <= 2  # 2 CPUs, 1 CPU per actor: never 8 unschedulable actors


def test_validator_rejects_before_any_job(hydra_sweep_runner, tmp_path):
    RECORDED.clear()
    with pytest.raises(SystemExit, match=r"(?s)Invalid config \(2 problems\); no job was "
                                         r"started.*job #1 \(\+x=3\): x must not be 3.*"
                                         r"job #3 \(\+x=5\): x must not be 5"), _sweep(
        hydra_sweep_runner, tmp_path, "+x=2,3,4,5",
        f"hydra.launcher.validator={__name__}:reject_three",
    ):
        pass
    assert RECORDED == []  # the recorder never started: nothing ran


def test_validator_text_marks_a_job_infeasible_and_it_is_not_run(hydra_sweep_runner, tmp_path):
    with _sweep(hydra_sweep_runner, tmp_path, "+x=2,7",
                f"hydra.launcher.validator={__name__}:seven_cannot_run") as sweep:
        values = [r.return_value for r in sweep.returns[0]]
    assert values[0]["x"] == 2
    assert values[1] == {"status": "infeasible", "reason": "7 does not fit"}
    assert dict(RECORDED[1:-1]) == {0: "COMPLETED", 1: "COMPLETED"}


def reject_three(cfg: DictConfig) -> None:
    if cfg.x in (3, 5):
        raise ValueError(f"x must not be {cfg.x}")


def seven_cannot_run(cfg: DictConfig) -> str | None:
    return "7 does not fit" if cfg.x == 7 else None
