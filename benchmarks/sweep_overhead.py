"""What the sweep platform costs on top of the simulator, and how it scales with actors.

Runs the same grid (``--points`` points of mem_util_grid-like jobs) four ways and prints
wall times:

1. bare: ``sweep.job.run_point`` (engine + metrics) called in this process, one point
   after another, warm caches;
2. the ray_actor launcher with 1 actor, MLflow and plots off (Hydra composition, Ray
   dispatch, first-job warm-up of the actor, per-job files, results table);
3. the same with MLflow tracking and per-point plots on (a pre-migrated sqlite store);
4. the launcher with N actors (``--actors``, default: all CPUs), MLflow and plots off;
5. the launcher with N actors, MLflow and plots on.

Ray start-up and MLflow store creation are one-time costs, measured and reported apart.
Per-job overhead = (sweep wall - bare wall) / points; the ratio is sweep wall / bare wall.

    python benchmarks/sweep_overhead.py [--points 16] [--requests 300] [--actors 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra._internal.hydra import Hydra  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402

from sweep.app import task  # noqa: E402
from sweep.job import run_point  # noqa: E402
from sweep.schema import register  # noqa: E402

UTILS = (0.5, 0.6, 0.7, 0.8, 0.9)
RATES = (1, 2, 3, 4, 5, 6)


def grid(points: int) -> tuple[list[str], list[dict[str, float]]]:
    shapes = [(nu, points // nu) for nu in range(1, len(UTILS) + 1)
              if points % nu == 0 and points // nu <= len(RATES)]
    if not shapes:
        raise SystemExit(f"--points {points}: use a product of <= 5 utilisations x <= 6 rates")
    nu, nr = min(shapes, key=lambda s: abs(s[0] - s[1]))
    utils, rates = UTILS[-nu:], RATES[:nr]
    overrides = [
        "cluster.gpu_memory_utilization=" + ",".join(map(str, utils)),
        "workload.rate=" + ",".join(map(str, rates)),
    ]
    return overrides, [{"u": u, "r": r} for u in utils for r in rates]


def bare(points: list[dict[str, float]], base: list[str]) -> tuple[float, float]:
    """Wall time of run_point over all points (after one warm-up), and summed sim time."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfgs = [
            compose("config", overrides=[*base, f"cluster.gpu_memory_utilization={p['u']}",
                                         f"workload.rate={p['r']}"])
            for p in points
        ]
    GlobalHydra.instance().clear()
    run_point(cfgs[0])  # warm the caches, as a long-lived actor would be
    t0 = time.perf_counter()
    sim = sum(run_point(c)["metrics"]["sim_wall_s"] for c in cfgs)
    return time.perf_counter() - t0, sim


def sweep(overrides: list[str], out: Path) -> float:
    hydra_ = Hydra.create_main_hydra_file_or_module(
        calling_file=None, calling_module="sweep.app", config_path="../conf", job_name="sweep"
    )
    t0 = time.perf_counter()
    try:
        hydra_.multirun(config_name="config", task_function=task,
                        overrides=[*overrides, f"hydra.sweep.dir={out}",
                                   "hydra.launcher.progress=false"],
                        with_log_configuration=False)
    finally:
        GlobalHydra().clear()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=16)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--actors", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    register()
    import logging

    logging.disable(logging.INFO)
    base = ["hardware=l40s", f"workload.num_requests={args.requests}"]
    sweep_keys, points = grid(args.points)
    work = Path(tempfile.mkdtemp(prefix="sweep_overhead_"))
    os.chdir(work)  # MLflow artifacts (./mlruns) and outputs land here

    t_bare, t_sim = bare(points, base)

    import ray

    from sweep.tracking import Tracker

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=os.cpu_count(), object_store_memory=200 * 2**20,
             include_dashboard=False, log_to_driver=False)
    t_ray = time.perf_counter() - t0
    t0 = time.perf_counter()
    uri = f"sqlite:///{work / 'mlflow.db'}"
    Tracker(uri, "bench")
    t_store = time.perf_counter() - t0

    runs = {}
    common = [*base, "+experiment=mem_util_grid", *sweep_keys]
    runs["ray_1actor_no_mlflow_no_plots"] = sweep(
        [*common, "hydra.launcher.num_actors=1", "tracking.uri=null", "tracking.plots=false"],
        work / "a")
    runs["ray_1actor_mlflow"] = sweep(
        [*common, "hydra.launcher.num_actors=1", f"tracking.uri={uri}"], work / "b")
    runs[f"ray_{args.actors}actors_no_mlflow_no_plots"] = sweep(
        [*common, f"hydra.launcher.num_actors={args.actors}", "tracking.uri=null",
         "tracking.plots=false"], work / "c0")
    runs[f"ray_{args.actors}actors_mlflow"] = sweep(
        [*common, f"hydra.launcher.num_actors={args.actors}", f"tracking.uri={uri}"], work / "c")
    ray.shutdown()

    n = len(points)
    res = {"points": n, "requests_per_point": args.requests, "bare_s": t_bare, "sim_s": t_sim,
           "ray_start_s": t_ray, "mlflow_store_create_s": t_store, **{f"{k}_s": v for k, v in runs.items()}}
    print(f"{n} points x {args.requests} requests, L40S / Llama-3.1-8B, {os.cpu_count()} CPUs")
    print(f"  bare run_point, in process      {t_bare:7.2f} s  ({t_bare / n * 1e3:.0f} ms/point; "
          f"engine.simulate {t_sim:.2f} s)")
    for name, wall in runs.items():
        over = (wall - t_bare) / n
        print(f"  {name:<32}{wall:7.2f} s  ratio {wall / t_bare:4.2f}  "
              f"overhead {over * 1e3:+.0f} ms/point")
        res[f"{name}_ratio"] = wall / t_bare
        res[f"{name}_overhead_ms_per_point"] = over * 1e3
    for kind in ("no_mlflow_no_plots", "mlflow"):
        speedup = runs[f"ray_1actor_{kind}"] / runs[f"ray_{args.actors}actors_{kind}"]
        res[f"speedup_{kind}"] = speedup
        print(f"  speedup {args.actors} actors vs 1 ({kind}): {speedup:.2f}x")
    print(f"  one-time: Ray start {t_ray:.2f} s, MLflow store creation {t_store:.2f} s")
    load = os.getloadavg()
    res["load_avg_1m"] = load[0]
    print(f"  load average during the run: {load[0]:.1f} (1 min) on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
