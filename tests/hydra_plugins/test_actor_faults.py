"""Fault injection on the ray_actor launcher with trivial jobs: dying actors are replaced and
their jobs retried a bounded number of times; a job that keeps killing its actor, raises, or
overruns its wall-time limit is recorded as failed with the reason; every job is recorded
exactly once."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from omegaconf import DictConfig

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]
RECORDED: list[tuple[int, str]] = []


@pytest.fixture(autouse=True)
def hydra_default_version_base():
    from hydra import version

    saved = version.VersionBase.instance().version_base
    version.VersionBase.instance().version_base = version._UNSPECIFIED_
    yield
    version.VersionBase.instance().version_base = saved


class ListRecorder:
    """Keeps (job, status) in the driver, like the MLflow recorder would."""

    def __init__(self, config: DictConfig, sweep_dir: Path, num_jobs: int) -> None:
        pass

    def start(self) -> None:
        RECORDED.clear()

    def job_done(self, idx: int, cfg: DictConfig, ret) -> None:
        RECORDED.append((idx, ret.status.name))

    def close(self, status: str) -> None:
        RECORDED.append((-1, status))


def faulty_task(cfg: DictConfig):
    """``mode``: ``crash_once`` kills the actor on the first attempt of every job with
    ``x % 3 == 0``; ``crash_always`` does so on every attempt of job x == 1; ``raise`` raises
    in job x == 2. Attempts are counted in files under ``cfg.marks``."""
    marks = Path(cfg.marks)
    mark = marks / f"{cfg.x}.{len(list(marks.glob(f'{cfg.x}.*')))}"
    mark.write_text(str(os.getpid()))
    time.sleep(0.05)
    if cfg.mode == "crash_once" and cfg.x % 3 == 0 and mark.name.endswith(".0"):
        os._exit(9)
    if cfg.mode == "crash_always" and cfg.x == 1:
        os._exit(9)
    if cfg.mode == "raise" and cfg.x == 2:
        raise RuntimeError("job 2 raises every time")
    return {"x": cfg.x, "pid": os.getpid()}


def _sweep(hydra_sweep_runner, tmp_path, marks: Path, *extra):
    marks.mkdir(exist_ok=True)
    return hydra_sweep_runner(
        calling_file=__file__,
        calling_module=None,
        task_function=faulty_task,
        config_path=None,
        config_name=None,
        overrides=["hydra/launcher=ray_actor", "hydra.launcher.progress=false",
                   f"hydra.launcher.recorder={__name__}:ListRecorder", f"+marks={marks}", *extra],
        temp_dir=tmp_path / "sweep",  # the runner deletes it on exit
    )


def attempts(marks: Path) -> dict[int, int]:
    out: dict[int, int] = {}
    for p in marks.iterdir():
        x = int(p.name.split(".")[0])
        out[x] = out.get(x, 0) + 1
    return out


def test_dead_actors_are_replaced_and_their_jobs_retried(hydra_sweep_runner, tmp_path):
    marks = tmp_path / "marks"
    with _sweep(hydra_sweep_runner, tmp_path, marks, "+x=range(0,10)", "+mode=crash_once",
                "hydra.launcher.max_retries=2") as sweep:
        values = [r.return_value for r in sweep.returns[0]]
    assert [v["x"] for v in values] == list(range(10))  # all finished, in job order
    n = attempts(marks)
    assert {x: n[x] for x in (0, 3, 6, 9)} == {0: 2, 3: 2, 6: 2, 9: 2}  # 4 faults, 4 retries
    assert all(n[x] == 1 for x in range(10) if x % 3)
    assert sorted(i for i, _ in RECORDED[:-1]) == list(range(10))  # each recorded once
    assert RECORDED[-1] == (-1, "FINISHED")


def test_a_job_that_keeps_killing_its_actor_fails_after_bounded_retries(
        hydra_sweep_runner, tmp_path):
    marks = tmp_path / "marks"
    with _sweep(hydra_sweep_runner, tmp_path, marks, "+x=0,1,2,3", "+mode=crash_always",
                "hydra.launcher.max_retries=2", "hydra.launcher.on_failure=return") as sweep:
        values = [r.return_value for r in sweep.returns[0]]
    assert values[1]["status"] == "failed"
    assert "actor died" in values[1]["error"] and "3 attempts" in values[1]["error"]
    assert attempts(marks)[1] == 3
    assert [values[i]["x"] for i in (0, 2, 3)] == [0, 2, 3]
    assert dict(RECORDED[:-1]) == {0: "COMPLETED", 1: "FAILED", 2: "COMPLETED", 3: "COMPLETED"}
    assert RECORDED[-1] == (-1, "FAILED")


def test_a_raising_job_is_not_retried(hydra_sweep_runner, tmp_path):
    marks = tmp_path / "marks"
    with _sweep(hydra_sweep_runner, tmp_path, marks, "+x=1,2", "+mode=raise",
                "hydra.launcher.max_retries=3", "hydra.launcher.on_failure=return") as sweep:
        values = [r.return_value for r in sweep.returns[0]]
    assert values[1]["status"] == "failed" and "job 2 raises every time" in values[1]["error"]
    assert attempts(marks)[2] == 1


def test_retries_off_records_the_first_death(hydra_sweep_runner, tmp_path):
    marks = tmp_path / "marks"
    with _sweep(hydra_sweep_runner, tmp_path, marks, "+x=0,1", "+mode=crash_once",
                "hydra.launcher.max_retries=0", "hydra.launcher.on_failure=return") as sweep:
        values = [r.return_value for r in sweep.returns[0]]
    assert values[0]["status"] == "failed" and "actor died" in values[0]["error"]
    assert values[1]["x"] == 1


class Worker:
    """A bare actor for ``ActorSet``: job 0 kills it."""

    def pid(self) -> int:
        return os.getpid()

    def run(self, x: int) -> int:
        if x == 0:
            os._exit(3)
        return x


def test_jobs_fail_with_the_reason_when_no_replacement_can_start():
    """A replacement the cluster cannot place (here: it asks for a resource no node has, as
    after losing the only node that fits) never gets a job; the jobs left fail with the
    reason after ``ready_timeout_s`` instead of hanging."""
    from hydra_plugins.ray_actor_launcher._pool import ActorSet

    remote = ray.remote(Worker)
    first = remote.options(num_cpus=1).remote()
    ray.get(first.pid.remote(), timeout=60)
    pool = ActorSet([first], lambda: remote.options(num_cpus=1, resources={"absent": 1}).remote(),
                    job_timeout_s=None, poll_s=0.2, max_retries=1, ready_timeout_s=2)
    t0 = time.monotonic()
    try:
        outs = {o.key: o for o in pool.run([(k, k) for k in range(3)],
                                          lambda actor, x: actor.run.remote(x))}
    finally:
        for actor in pool.actors:
            ray.kill(actor)
    assert time.monotonic() - t0 < 30
    assert sorted(outs) == [0, 1, 2]
    assert all("no actor available" in (o.error or "") for o in outs.values()), outs
    assert outs[0].attempts == 2 and pool.replaced == 1 and pool.retried == 1
