"""What running a sweep job costs the actor around its task: Hydra's ``run_job`` against the
launcher's ``job_run.run_job``, side by side in one process.

Each job is a ``mem_util_grid`` point composed as the launcher composes it (its config
pickled, as it travels to an actor), run with a task that does nothing, so the figures are
the wrapper's own CPU: installing ``HydraConfig``, the copies, the log set-up, the three
config files. The two implementations alternate job by job into the same kind of output
directory; the CPU per job is the median over ``--rounds`` rounds of ``--jobs`` jobs each.

    python benchmarks/job_run.py [--jobs 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import logging
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _configs(sweep_dir: Path, jobs: int) -> list[bytes]:
    """``jobs`` job configs of ``mem_util_grid``, numbered and pickled as the launcher sends them."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from hydra_plugins.ray_actor_launcher._actor import pickle_config
    from hydra_plugins.ray_actor_launcher.compose import JobComposer

    loader = GlobalHydra.instance().config_loader()
    master = loader.load_configuration(
        "config", ["+experiment=mem_util_grid", f"hydra.sweep.dir={sweep_dir}"],
        RunMode.MULTIRUN)
    OmegaConf.select(master, "hydra.run.dir")
    composer = JobComposer(loader, master)
    out = []
    for num in range(jobs):
        cfg = composer.compose([f"workload.rate={1 + num % 4}",
                                f"cluster.gpu_memory_utilization={0.5 + 0.1 * (num % 5):.1f}"])
        with open_dict(cfg):
            cfg.hydra.job.num = num
            cfg.hydra.job.id = f"sweep_{num}"
        out.append(pickle_config(cfg))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from hydra import initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job as hydra_run_job
    from hydra.types import HydraContext

    from hydra_plugins.ray_actor_launcher.job_run import run_job
    from sweep.schema import register

    register()

    def task(cfg: Any) -> dict[str, float]:
        return {"rate": float(cfg.workload.rate)}

    runs = {"Hydra's run_job": hydra_run_job, "job_run.run_job": run_job}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as tmp, initialize_config_dir(
            config_dir=str(REPO / "conf"), version_base="1.3"):
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                               callbacks=Callbacks())
        for rnd in range(args.rounds + 1):  # round 0 warms both up
            for name, fn in runs.items():
                blobs = _configs(Path(tmp) / f"{rnd}_{len(cpu[name])}", args.jobs)
                c0 = time.process_time()
                for blob in blobs:
                    ret = fn(hydra_context=context, task_function=task,
                             config=pickle.loads(blob), job_dir_key="hydra.sweep.dir",
                             job_subdir_key="hydra.sweep.subdir")
                    assert ret.return_value["rate"] > 0
                if rnd:
                    cpu[name].append((time.process_time() - c0) / args.jobs)
        logging.shutdown()
    print(f"{args.jobs} mem_util_grid jobs with a task that does nothing, "
          f"median of {args.rounds} rounds (min..max), CPU ms a job:")
    for name, values in cpu.items():
        print(f"  {name:<18} {1e3 * statistics.median(values):7.2f} "
              f"({1e3 * min(values):.2f}..{1e3 * max(values):.2f})")
    hydra, ours = (statistics.median(v) for v in cpu.values())
    print(f"  ratio Hydra's / ours: {hydra / ours:.2f}x")


if __name__ == "__main__":
    main()
