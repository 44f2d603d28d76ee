"""What the sweep platform costs on top of the simulator, measured on fresh stores.

Every measured run is the real command line in a subprocess, run in a new temporary directory
with a new MLflow sqlite store and a new sweep directory there (and MLflow's default artifact
root, ``./mlruns``, so no run writes into the checkout), so nothing is resumed: after each
sweep the benchmark checks that ``results.parquet`` holds one finished row per point, none
``resumed_from`` another run, and that the launcher logged ``N jobs done`` (a benchmark that
ran 0 jobs once reported a 3.83x speed-up). Per implementation (this tree, and with
``--compare REV`` the git revision REV extracted into a temporary directory with its
compiled core built (``revision_tree.checkout``), run side by side
in the same invocation, alternating, ``--repeat`` times):

``--compare-dir DIR`` measures another source tree the same way (e.g. a copy of this one with
the platform files of an older revision, to compare the platform on one engine).

* ``single``: ``python -m sweep +experiment=mem_util_grid`` (one point, MLflow on): wall
  time to the first result (its metric summary in the log, or its ``metrics.json`` on disk,
  whichever comes first) and to exit;
* ``sweep``: ``python -m sweep +experiment=mem_util_grid -m`` (the 20-point grid), and a
  ``--small`` grid of 4 points: wall time, CPU seconds of every process of the run (the
  driver, Ray's processes, the actors; sampled with psutil every 0.1 s), the per-point CPU as
  the slope between the two grid sizes and its ratio to a bare ``sweep.job.run_point`` (warm
  caches, in one process, the same points), the fixed part, the grid's CPU split into the
  driver, the actors and Ray's other processes, and the actors' peak RSS;
* ``--probes``: a capacity search (``python -m sweep.capacity +experiment=capacity_search``)
  for the probe workers' peak RSS.

A fresh store is made the way a user's new directory gets one: copied from the MLflow store
template in the user's cache (``sweep.store_template``; made once per MLflow version, which
the first run after an upgrade pays, 2.8 CPU-s), so these figures leave that one-time cost out.

CPU seconds do not depend on what else the machine runs, wall seconds do: on a shared
machine compare the CPU figures, and the wall figures only side by side within one run.

    python benchmarks/sweep_overhead.py [--compare REV] [--repeat 2] [--probes] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SMALL = ["cluster.gpu_memory_utilization=0.5,0.9", "workload.rate=1,4"]  # 4 of the 20 points
GRID = "+experiment=mem_util_grid"
FIRST_LINE = "completed: "  # the first line of a single run's metric summary

BARE = r"""
import json, sys, time
from hydra import compose, initialize_config_dir
from sweep.schema import register
from sweep.job import run_point
register()
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    cfgs = [compose("config", overrides=["+experiment=mem_util_grid",
                                         f"cluster.gpu_memory_utilization={u}",
                                         f"workload.rate={r}"])
            for u in (0.5, 0.6, 0.7, 0.8, 0.9) for r in (1, 2, 3, 4)]
run_point(cfgs[0])  # warm caches, as a long-lived actor is
c0, w0 = time.process_time(), time.perf_counter()
for cfg in cfgs:
    run_point(cfg)
print(json.dumps({"cpu_s": (time.process_time() - c0) / len(cfgs),
                  "wall_s": (time.perf_counter() - w0) / len(cfgs)}))
"""


class TreeMeter:
    """CPU seconds and peak RSS of a process and all its descendants, read from Linux
    ``/proc`` every 0.1 s (a process that exits counts up to its last sample)."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, pid: int, rss_of: tuple[str, ...] = ()) -> None:
        self._root = pid
        self._cpu: dict[int, float] = {}
        self._kind: dict[int, str] = {}  # driver, actors (the job runners), ray (the rest)
        self.peak_rss_mib: dict[str, float] = {name: 0.0 for name in rss_of}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        from hydra_plugins.ray_actor_launcher.ray_cluster import process_tree

        for pid in process_tree(self._root):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                self._cpu[pid] = (int(stat[11]) + int(stat[12])) / self.TICK  # utime + stime
                if self._kind.get(pid, "ray") == "ray":  # a worker is named once it hosts an actor
                    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                    self._kind[pid] = ("driver" if pid == self._root else
                                       "actors" if title.startswith(("ray::JobRunner",
                                                                     "ray::ProbeWorker"))
                                       else "ray")
                if self.peak_rss_mib:
                    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                    for name in self.peak_rss_mib:
                        if title.startswith(f"ray::{name}"):
                            rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
                            rss_mib = rss * os.sysconf("SC_PAGE_SIZE") / 2**20
                            self.peak_rss_mib[name] = max(self.peak_rss_mib[name], rss_mib)
            except (OSError, IndexError, ValueError):  # exited between listing and reading
                continue

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self._cpu.values())

    def cpu_by_kind(self) -> dict[str, float]:
        """CPU seconds of the driver, the actors and Ray's other processes."""
        out = {"driver": 0.0, "actors": 0.0, "ray": 0.0}
        for pid, cpu in self._cpu.items():
            out[self._kind.get(pid, "ray")] += cpu
        return out


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    env["PYTHONPATH"] = str(tree)
    env.setdefault("SERVESWEEP_DATA", str(REPO.parent / "shared" / "data"))
    return env


def run_sweep(tree: Path, work: Path, extra: list[str], multirun: bool,
              rss_of: tuple[str, ...] = ("JobRunner",)) -> dict[str, Any]:
    """One command in ``tree`` on a fresh store in ``work``: wall, CPU, first result, RSS."""
    work.mkdir(parents=True)
    out = work / "out"
    cmd = [sys.executable, "-m", "sweep", GRID, *extra, f"tracking.uri=sqlite:///{work}/mlflow.db"]
    cmd += ([f"hydra.sweep.dir={out}", "hydra.launcher.progress=false", "-m"] if multirun
            else [f"hydra.run.dir={out}"])
    log = (work / "log.txt").open("w")
    t0 = time.perf_counter()
    # run in ``work``: a new experiment's artifacts go to ``./mlruns`` (MLflow's default
    # artifact root), which must not be the checkout (``tree`` is on PYTHONPATH)
    proc = subprocess.Popen(cmd, cwd=work, env=_env(tree), stdout=log, stderr=subprocess.STDOUT)
    meter = TreeMeter(proc.pid, rss_of)
    first = None
    log_path = work / "log.txt"
    while proc.poll() is None:
        if first is None and (next(out.glob("**/metrics.json"), None) is not None
                              or FIRST_LINE in log_path.read_text()):
            first = time.perf_counter() - t0
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    cpu = meter.stop()
    log.close()
    text = (work / "log.txt").read_text()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} (in {tree}) exited {proc.returncode}:\n{text[-3000:]}")
    return {"wall_s": wall, "cpu_s": cpu, "first_result_s": first,
            "cpu_by_kind": meter.cpu_by_kind(),
            "peak_rss_mib": meter.peak_rss_mib, "log": text, "out": out}


def check_ran(res: dict[str, Any], points: int) -> None:
    """Every point of the sweep was run here, on this fresh store: none reused."""
    import pandas as pd

    table = pd.read_parquet(res["out"] / "results.parquet")
    finished = table[table["status"] == "finished"]
    resumed = int(table["resumed_from"].notna().sum())
    done = re.findall(r"(\d+) jobs done in", res["log"])
    if len(finished) != points or resumed or done != [str(points)]:
        raise SystemExit(f"expected {points} jobs run on a fresh store; results.parquet has "
                         f"{len(finished)} finished rows, {resumed} resumed; the launcher "
                         f"logged {done or 'no'} 'jobs done'")


def bare(tree: Path) -> dict[str, float]:
    """Bare ``run_point`` per point (warm caches) with ``tree``'s code, in a subprocess."""
    out = subprocess.run([sys.executable, "-c", BARE, str(tree / "conf")], cwd=tree,
                         env=_env(tree), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_probes(tree: Path, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True)
    cmd = [sys.executable, "-m", "sweep.capacity", "+experiment=capacity_search",
           f"tracking.uri=sqlite:///{work}/mlflow.db", f"hydra.run.dir={work / 'out'}"]
    t0 = time.perf_counter()
    with (work / "log.txt").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=work, env=_env(tree), stdout=log,  # as run_sweep
                                stderr=subprocess.STDOUT)
        meter = TreeMeter(proc.pid, ("ProbeWorker",))
        proc.wait()
    cpu = meter.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: "
                         f"{(work / 'log.txt').read_text()[-3000:]}")
    return {"wall_s": time.perf_counter() - t0, "cpu_s": cpu,
            "probe_rss_mib": meter.peak_rss_mib["ProbeWorker"]}


def measure(tree: Path, work: Path, probes: bool) -> dict[str, float]:
    single = run_sweep(tree, work / "single", [], multirun=False)
    small = run_sweep(tree, work / "small", SMALL, multirun=True)
    check_ran(small, 4)
    big = run_sweep(tree, work / "grid", [], multirun=True)
    check_ran(big, 20)
    b = bare(tree)
    slope = (big["cpu_s"] - small["cpu_s"]) / 16
    res = {
        "single_first_result_s": single["first_result_s"], "single_wall_s": single["wall_s"],
        "single_cpu_s": single["cpu_s"],
        "grid_wall_s": big["wall_s"], "grid_cpu_s": big["cpu_s"],
        "grid_first_result_s": big["first_result_s"],
        **{f"grid_cpu_{kind}_s": v for kind, v in big["cpu_by_kind"].items()},
        "small_wall_s": small["wall_s"], "small_cpu_s": small["cpu_s"],
        "cpu_per_point_s": slope, "cpu_fixed_s": big["cpu_s"] - 20 * slope,
        "bare_cpu_per_point_s": b["cpu_s"], "bare_wall_per_point_s": b["wall_s"],
        "ratio": slope / b["cpu_s"],
        "actor_rss_mib": max(big["peak_rss_mib"]["JobRunner"],
                             small["peak_rss_mib"]["JobRunner"]),
    }
    if probes:
        p = run_probes(tree, work / "probes")
        res["probe_rss_mib"] = p["probe_rss_mib"]
        res["probe_wall_s"] = p["wall_s"]
    return res


ROWS = [
    ("grid_wall_s", "20-point grid, wall s", "{:.2f}"),
    ("grid_cpu_s", "20-point grid, CPU s (all processes)", "{:.2f}"),
    ("grid_cpu_driver_s", "  of it the driver", "{:.2f}"),
    ("grid_cpu_actors_s", "  the actors", "{:.2f}"),
    ("grid_cpu_ray_s", "  Ray's other processes", "{:.2f}"),
    ("grid_first_result_s", "20-point grid, first result s", "{:.2f}"),
    ("small_wall_s", "4-point grid, wall s", "{:.2f}"),
    ("cpu_per_point_s", "CPU s per point (slope 4 -> 20)", "{:.3f}"),
    ("cpu_fixed_s", "CPU s fixed per sweep", "{:.2f}"),
    ("bare_cpu_per_point_s", "bare run_point CPU s per point", "{:.3f}"),
    ("ratio", "per-point CPU / bare", "{:.2f}"),
    ("single_first_result_s", "one point: first result s", "{:.2f}"),
    ("single_wall_s", "one point: wall s to exit", "{:.2f}"),
    ("actor_rss_mib", "sweep actor peak RSS MiB", "{:.0f}"),
    ("probe_rss_mib", "probe worker peak RSS MiB", "{:.0f}"),
]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", metavar="REV", help="also measure git revision REV")
    ap.add_argument("--compare-dir", metavar="DIR", type=Path,
                    help="also measure the source tree DIR (e.g. a copy with other changes)")
    ap.add_argument("--repeat", type=int, default=1, help="measurements per implementation")
    ap.add_argument("--probes", action="store_true", help="also run a capacity search")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sweep_overhead_"))
    trees = {"this tree": REPO}
    if args.compare:  # extracted with its compiled core built (revision_tree.checkout)
        from revision_tree import checkout

        trees[args.compare] = checkout(args.compare, work / "revision")
    if args.compare_dir:
        trees[str(args.compare_dir)] = args.compare_dir.resolve()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        for i in range(args.repeat):  # alternate, so both see the same machine load
            for name, tree in trees.items():
                label = re.sub(r"\W", "_", name)
                runs[name].append(measure(tree, work / f"{label}_{i}", args.probes))
                print(f"  {name} #{i + 1} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    finally:  # the extracted revision (with its build) goes, as its worktree did before
        shutil.rmtree(work / "revision", ignore_errors=True)
    print(f"mem_util_grid (20 points, 300 requests each), {os.cpu_count()} CPUs, fresh store "
          f"per run; median of {args.repeat} (min..max)")
    print(f"  {'':40s}" + "".join(f"{name:>24s}" for name in trees))
    for key, label, fmt in ROWS:
        cells = []
        for name in trees:
            vals = [r[key] for r in runs[name] if r.get(key) is not None]
            if not vals:
                cells.append(f"{'-':>24s}")
                continue
            med = fmt.format(statistics.median(vals))
            spread = f" ({fmt.format(min(vals))}..{fmt.format(max(vals))})" if len(vals) > 1 else ""
            cells.append(f"{med + spread:>24s}")
        print(f"  {label:40s}" + "".join(cells))
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} (1 min)")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return runs


if __name__ == "__main__":
    main()
