"""What the sweep platform costs on top of the simulator, and how it scales with actors.

Grid points are mem_util_grid-like jobs (Llama-3.1-8B on an L40S, ``--requests`` requests
each). Measured, all on one machine:

* bare: ``sweep.job.run_point`` (engine + metrics) in this process, warm caches, per point;
* the ray_actor launcher with 1 actor on grids of ``--small`` and ``--points`` points,
  with MLflow tracking + plots on (the full platform) and off. A straight line through the
  two sizes splits the wall time into a fixed part per sweep (Hydra composition, actor
  start and warm-up, results table) and a part per point; per-job overhead = per-point
  slope - bare time per point, ratio = slope / bare;
* scaling: the ``--points`` grid on ``--actors`` actors, against a control that runs the
  same bare points in ``--actors`` plain worker processes (what the machine allows).

Every figure comes as wall time and as CPU time. CPU time (this process plus every process
Ray starts for it, sampled with psutil) does not depend on what else the machine runs, so
on a shared machine the CPU ratios are the trustworthy ones.

Ray start-up and MLflow store creation are one-time costs, reported apart. Ray runs its
workers at nice 15 by default; on a machine shared with other work that alone slows the
actors against a nice-0 baseline, so this benchmark starts Ray with worker niceness 0
(``RAY_worker_niceness``) to measure the platform, not the scheduling priority.

    python benchmarks/sweep_overhead.py [--points 16] [--small 4] [--requests 300] [--actors 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_worker_niceness", "0")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra._internal.hydra import Hydra  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402

from sweep.app import task  # noqa: E402
from sweep.job import run_point  # noqa: E402
from sweep.schema import register  # noqa: E402

UTILS = (0.5, 0.6, 0.7, 0.8, 0.9)
RATES = (1, 2, 3, 4, 5, 6)


def grid(points: int) -> list[tuple[float, int]]:
    """``points`` (utilisation, rate) pairs on a near-square sub-grid."""
    shapes = [(nu, points // nu) for nu in range(1, len(UTILS) + 1)
              if points % nu == 0 and points // nu <= len(RATES)]
    if not shapes:
        raise SystemExit(f"{points} points: use a product of <= 5 utilisations x <= 6 rates")
    nu, nr = min(shapes, key=lambda s: abs(s[0] - s[1]))
    return [(u, r) for u in UTILS[-nu:] for r in RATES[:nr]]


def sweep_overrides(points: list[tuple[float, int]]) -> list[str]:
    utils = sorted({u for u, _ in points})
    rates = sorted({r for _, r in points})
    return ["cluster.gpu_memory_utilization=" + ",".join(map(str, utils)),
            "workload.rate=" + ",".join(map(str, rates))]


def configs(points: list[tuple[float, int]], base: list[str]) -> list:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        out = [compose("config", overrides=[*base, f"cluster.gpu_memory_utilization={u}",
                                             f"workload.rate={r}"]) for u, r in points]
    GlobalHydra.instance().clear()
    return out


class CpuMeter:
    """CPU seconds used by this process and all its descendants while active.

    Descendants are sampled every 0.2 s and their last sample kept, so processes that
    exit (killed actors) still count, up to the last 0.2 s of their life.
    """

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self._seen: dict[int, float] = {}
        self._base: dict[int, float] = {}
        self._stop = threading.Event()

    def _sample(self) -> dict[int, float]:
        out = {}
        for proc in self._me.children(recursive=True):
            try:
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
            except Exception:  # exited between listing and reading
                continue
        return out

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._seen.update(self._sample())

    def __enter__(self) -> CpuMeter:
        self._base = self._sample()
        self._seen = dict(self._base)
        t = self._me.cpu_times()
        self._self0 = t.user + t.system
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._seen.update(self._sample())
        self._stop.set()
        self._thread.join()
        t = self._me.cpu_times()
        self.self_s = t.user + t.system - self._self0
        self.children_s = sum(v - self._base.get(pid, 0.0) for pid, v in self._seen.items())
        self.total_s = self.self_s + self.children_s


def _warm(cfg) -> int:
    run_point(cfg)
    return os.getpid()


def _time_points(cfgs: list) -> float:
    t0 = time.perf_counter()
    for cfg in cfgs:
        run_point(cfg)
    return time.perf_counter() - t0


def parallel_control(cfgs: list, workers: int) -> float:
    """Wall time of the bare points spread over ``workers`` warm processes."""
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_warm, [cfgs[0]] * workers))
        chunks = [cfgs[i::workers] for i in range(workers)]
        t0 = time.perf_counter()
        list(pool.map(_time_points, chunks))
        return time.perf_counter() - t0


class LoopTime(logging.Handler):
    """Keeps the launcher's "N jobs ran in X s on K actors" (the job loop alone)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds = float("nan")

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"jobs ran in ([0-9.]+) s", record.getMessage())
        if found:
            self.seconds = float(found.group(1))


LOOP = LoopTime()


def sweep(overrides: list[str], out: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one in-process multirun on the running Ray."""
    hydra_ = Hydra.create_main_hydra_file_or_module(
        calling_file=None, calling_module="sweep.app", config_path="../conf", job_name="sweep"
    )
    t0 = time.perf_counter()
    try:
        with CpuMeter() as cpu:
            hydra_.multirun(config_name="config", task_function=task,
                            overrides=[*overrides, f"hydra.sweep.dir={out}",
                                       "hydra.launcher.progress=false"],
                            with_log_configuration=False)
    finally:
        GlobalHydra().clear()
    return time.perf_counter() - t0, cpu.total_s


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=16)
    ap.add_argument("--small", type=int, default=4)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--actors", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    register()
    logging.getLogger().setLevel(logging.WARNING)
    launcher_log = logging.getLogger("hydra_plugins.ray_actor_launcher.launcher")
    launcher_log.setLevel(logging.INFO)
    launcher_log.addHandler(LOOP)
    base = ["hardware=l40s", f"workload.num_requests={args.requests}"]
    big, small = grid(args.points), grid(args.small)
    work = Path(tempfile.mkdtemp(prefix="sweep_overhead_"))
    os.chdir(work)  # MLflow artifacts (./mlruns) and outputs land here

    cfgs = configs(big, base)
    run_point(cfgs[0])  # warm caches, as a long-lived actor is
    c0 = time.process_time()
    t_bare = _time_points(cfgs)
    per_bare = t_bare / len(big)
    cpu_bare = (time.process_time() - c0) / len(big)
    t_control = parallel_control(cfgs, args.actors)

    import ray

    from sweep.tracking import Tracker

    t0 = time.perf_counter()
    from hydra_plugins.ray_actor_launcher.ray_cluster import start_ray

    start_ray(ray, "local", {"num_cpus": os.cpu_count(), "object_store_memory": 200 * 2**20,
                             "log_to_driver": False})
    t_ray = time.perf_counter() - t0
    t0 = time.perf_counter()
    uri = f"sqlite:///{work / 'mlflow.db'}"
    Tracker(uri, "bench")
    t_store = time.perf_counter() - t0

    common = [*base, "+experiment=mem_util_grid"]
    modes = {"platform": [f"tracking.uri={uri}"],
             "no_mlflow_no_plots": ["tracking.uri=null", "tracking.plots=false"]}
    walls: dict[str, float] = {}
    cpus: dict[str, float] = {}
    loops: dict[str, float] = {}
    for mode, extra in modes.items():
        for n, pts in ((len(small), small), (len(big), big)):
            key = f"{mode}_1actor_{n}"
            walls[key], cpus[key] = sweep(
                [*common, *sweep_overrides(pts), "hydra.launcher.num_actors=1", *extra],
                work / f"{mode}_{n}")
            loops[key] = LOOP.seconds
    key = f"platform_{args.actors}actors_{len(big)}"
    walls[key], cpus[key] = sweep(
        [*common, *sweep_overrides(big), f"hydra.launcher.num_actors={args.actors}",
         *modes["platform"]], work / "parallel")
    loops[key] = LOOP.seconds
    ray.shutdown()

    nb, ns = len(big), len(small)
    res: dict[str, float] = {"points": nb, "requests_per_point": args.requests,
                             "bare_s_per_point": per_bare, "ray_start_s": t_ray,
                             "mlflow_store_create_s": t_store, "control_parallel_s": t_control,
                             "bare_cpu_s_per_point": cpu_bare,
                             **{f"{k}_s": v for k, v in walls.items()},
                             **{f"{k}_cpu_s": v for k, v in cpus.items()},
                             **{f"{k}_job_loop_s": v for k, v in loops.items()}}
    print(f"L40S / Llama-3.1-8B, {args.requests} requests per point, {os.cpu_count()} CPUs")
    print(f"  bare run_point (engine + metrics): {per_bare * 1e3:.0f} ms/point wall, "
          f"{cpu_bare * 1e3:.0f} ms/point CPU ({nb} points in {t_bare:.2f} s)")
    for mode in modes:
        for label, table, bare in (("wall", walls, per_bare), ("CPU ", cpus, cpu_bare)):
            small_s, big_s = table[f"{mode}_1actor_{ns}"], table[f"{mode}_1actor_{nb}"]
            slope = (big_s - small_s) / (nb - ns)
            fixed = big_s - slope * nb
            tag = f"{mode}_{label.strip().lower()}"
            res[f"{tag}_per_point_s"], res[f"{tag}_fixed_s"] = slope, fixed
            res[f"{tag}_ratio"] = slope / bare
            print(f"  1 actor, {mode:<18} {label}: {ns} pts {small_s:6.2f} s, {nb} pts "
                  f"{big_s:6.2f} s -> fixed {fixed:5.2f} s + {slope * 1e3:4.0f} ms/point "
                  f"(overhead {(slope - bare) * 1e3:+4.0f} ms/point, ratio {slope / bare:.2f})")
    w1 = walls[f"platform_1actor_{nb}"]
    wn = walls[f"platform_{args.actors}actors_{nb}"]
    l1, ln = loops[f"platform_1actor_{nb}"], loops[f"platform_{args.actors}actors_{nb}"]
    res["speedup_sweep"] = w1 / wn
    res["speedup_job_loop"] = l1 / ln
    res["speedup_control"] = t_bare / t_control
    print(f"  {nb} points, {args.actors} actors: {wn:.2f} s vs 1 actor {w1:.2f} s -> "
          f"speedup {w1 / wn:.2f}x; job loop alone {ln:.2f} s vs {l1:.2f} s -> "
          f"{l1 / ln:.2f}x")
    print(f"  control, same bare points in {args.actors} processes: {t_control:.2f} s vs "
          f"{t_bare:.2f} s serial -> speedup {t_bare / t_control:.2f}x (the machine's ceiling)")
    print(f"  one-time: Ray start {t_ray:.2f} s, MLflow store creation {t_store:.2f} s")
    load = os.getloadavg()
    res["load_avg_1m"] = load[0]
    print(f"  load average at the end: {load[0]:.1f} (1 min) on {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
