"""Engine cost at scale: one synthetic run, wall and CPU time, peak memory, requests per CPU-s.

The load (issue 15): the RTX PRO 6000 / Llama-3.1-8B profile bundle, vLLM's default engine
settings (``EngineConfig()``), ShareGPT-like lengths (``workloads.synthetic``'s ``sharegpt``
fits) arriving as a Poisson process at ``--load`` (default 0.8) of one instance's saturation
throughput, times the number of instances (``--instances K`` replicas behind the
``least_loaded`` router; the replicas share one latency model, as identical instances of a
deployment do: ``profiles.deployment`` assembles them with one model and one memo of its step
prices). The saturation throughput is measured first, in this process, as the
request throughput (``analysis.metrics``) of a burst of ``--saturation-requests`` requests on
one instance; ``--rate`` skips that probe.

Prompt ids are unique lazy ``range`` placeholders (as ``workloads.read_jsonl`` gives a trace
without ids; ``--ids random`` uses the generator's random ids instead). Neither shares a prefix
between requests, so the engine does the same work either way, hashing every full block; the
placeholders keep a million-request workload small (random ids are 8 bytes each, 5.8 GB for 1M
ShareGPT prompts). The workload is generated in chunks of 20,000 requests with seeds
``seed, seed + 1, ...``, each chunk's arrivals continuing after the previous chunk's last one
(still one Poisson process). It is fed to the engine lazily (``--workload lazy``, the default
where the engine takes an iterable): a generator yields the requests chunk by chunk as the
simulation reaches them, so they never all exist at once; ``--workload list`` builds the whole
list first, before the timer (what trees before the lazy engine need; ``--compare`` uses it for
them, and warns that the trees timed different work unless ``--workload list`` is given: a lazy
run generates its requests inside the timed run).

``--stream`` writes the per-request table to a temporary Parquet file in row groups while the
run goes on (``simulate_cluster(..., stream_to=...)``) instead of keeping it, then computes the
metrics from the file (``analysis.metrics.metrics_from_parquet``; ``metrics_s``, not in
``wall_s``); ``finished`` is its ``completed``.

Each measurement runs in a fresh subprocess: it builds the workload, then times
``engine.simulate.simulate_cluster`` (loaded workload to finished per-request results) with
``time.perf_counter`` (``wall_s``) and ``time.process_time`` (``cpu_s``), and reports the
process's peak RSS (``peak_rss_mib``, ``ru_maxrss``: interpreter, imports and workload
included; ``workload_rss_mib`` is the RSS before the simulation starts: with a lazy workload,
before any request exists).

    python benchmarks/engine_scale.py --requests 10000 [--instances K] [--json OUT]
        [--repeat R] [--compare REV] [--stream] [--workload lazy|list]

``--compare REV`` runs the same measurement on the engine of git revision ``REV`` (extracted
with ``git archive`` into a temporary directory, its compiled core built there if it has one
(``setup.py build_ext --inplace``), imported through ``PYTHONPATH``; the repository is not
touched), alternating with the current tree, and prints both side by side
with their ratio. Figures are medians over ``--repeat`` runs; the machine's load average is
printed with them (the machine is shared).

Needs the shared reference data (``$SERVESWEEP_DATA`` or ``../shared/data``).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HARDWARE = "RTXPRO6000"
MODEL = "meta-llama/Llama-3.1-8B"
CHUNK = 20_000
PLACEHOLDER_BASE = 1 << 40  # above any vocabulary id (workloads.limits.PLACEHOLDER_ID_BASE)
FIELDS = ("requests", "instances", "wall_s", "cpu_s", "peak_rss_mib", "req_per_cpu_s")


def _data_dir() -> Path:
    return Path(os.environ.get("SERVESWEEP_DATA", REPO.parent / "shared" / "data"))


def _setup(instances: int):  # type: ignore[no-untyped-def]
    """Model, hardware, config and ``instances`` instance specs sharing one latency model (works
    on older trees too: ``InstanceSpec`` moved to ``engine.deployment`` and gained
    ``capacity``)."""
    from engine import EngineConfig
    from engine.memory import kv_capacity
    from profiles.bundle import load_bundle
    from profiles.catalog import load_hardware, load_model
    from profiles.latency import ProfiledLatencyModel

    try:
        from engine.deployment import InstanceSpec
    except ImportError:  # before the deployment module
        from engine.simulate import InstanceSpec  # type: ignore[attr-defined,no-redef]
    model = load_model(MODEL)
    hw = load_hardware(HARDWARE)
    bundle = load_bundle(_data_dir() / "llmservingsim" / "profiles", HARDWARE, model.name)
    config = EngineConfig()
    extra = {}
    if "capacity" in {f.name for f in dataclasses.fields(InstanceSpec)}:
        extra["capacity"] = kv_capacity(model, hw, config)
    latency = ProfiledLatencyModel(bundle, model, 1)
    specs = [InstanceSpec(f"i{k}", model, hw, config, latency, **extra) for k in range(instances)]
    return specs


def iter_workload(n: int, rate: float, seed: int, ids: str) -> Iterator[Any]:
    """``n`` ShareGPT-like requests at ``rate`` req/s (``inf``: all at t = 0), generated one
    chunk at a time as they are read (see the module docstring)."""
    from engine.workload import RequestSpec
    from workloads import synthetic

    offset = 0
    next_id = PLACEHOLDER_BASE
    # Placeholders: the chunks' arrivals and lengths without drawing random ids (where the
    # tree's generator can; the ids are replaced either way).
    lean = ids == "placeholder" and "placeholder_ids" in inspect.signature(synthetic).parameters
    for c, start in enumerate(range(0, n, CHUNK)):
        part = synthetic(rate, num_requests=min(CHUNK, n - start), seed=seed + c,
                         **({"placeholder_ids": True} if lean else {}))
        for i, spec in enumerate(part):
            if ids == "random":
                prompt = spec.prompt_ids
            else:
                prompt = range(next_id, next_id + spec.prompt_len)
                next_id += spec.prompt_len
            yield RequestSpec(str(start + i), spec.arrival_ns + offset, prompt, spec.output_len)
        offset += part[-1].arrival_ns
        del part


def build_workload(n: int, rate: float, seed: int, ids: str) -> list[Any]:
    """:func:`iter_workload` as one list."""
    return list(iter_workload(n, rate, seed, ids))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(
    n: int, instances: int, rate: float, seed: int, ids: str, workload_mode: str, stream: bool
) -> dict[str, Any]:
    """One timed run in this process (see the module docstring)."""
    import gc

    import engine
    from engine.simulate import simulate_cluster

    specs = _setup(instances)
    lazy_engine = "stream_to" in inspect.signature(simulate_cluster).parameters
    if not lazy_engine and (workload_mode == "lazy" or stream):
        workload_mode, stream = "list", False  # an older tree: what it can do
    workload = (iter_workload if workload_mode == "lazy" else build_workload)(n, rate, seed, ids)
    gc.collect()
    workload_rss = _rss_mib()
    tmp = tempfile.TemporaryDirectory(prefix="engine_scale_") if stream else None
    kwargs = {"stream_to": Path(tmp.name) / "requests.parquet"} if tmp is not None else {}
    w0, c0 = time.perf_counter(), time.process_time()
    result = simulate_cluster(specs, workload, **kwargs)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    metrics_s = None
    if tmp is not None:
        from analysis.metrics import metrics_from_parquet

        m0 = time.perf_counter()
        finished = int(metrics_from_parquet(result.requests_path)["completed"])
        metrics_s = time.perf_counter() - m0
        peak = max(peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        tmp.cleanup()
    else:
        finished = int((result.requests["finish_ns"] >= 0).sum())
    return {
        "requests": n,
        "instances": instances,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mib": peak,
        "req_per_cpu_s": n / cpu,
        "workload_rss_mib": workload_rss,
        "finished": finished,
        "num_steps": result.num_steps,
        "us_per_step": cpu / result.num_steps * 1e6,
        "makespan_s": result.makespan_ns / 1e9,
        "num_preemptions": result.num_preemptions,
        "workload": workload_mode,
        "stream": stream,
        "metrics_s": metrics_s,
        "tree": str(Path(engine.__file__).resolve().parents[1]),
    }


def saturation_rate(requests: int, seed: int) -> float:
    """Request throughput of one instance on a burst of ``requests`` (vLLM bench's figure)."""
    from analysis.metrics import compute_metrics
    from engine.simulate import simulate_cluster

    result = simulate_cluster(_setup(1), build_workload(requests, math.inf, seed, "placeholder"))
    return float(compute_metrics(result.requests)["request_throughput"])


def _child(args: argparse.Namespace, tree: Path | None) -> dict[str, float]:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--child",
        "--requests", str(args.requests), "--instances", str(args.instances),
        "--rate", repr(args.rate), "--seed", str(args.seed), "--ids", args.ids,
        "--workload", args.workload, *(["--stream"] if args.stream else []),
    ]
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        cmd, env=env, cwd=tree or REPO, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    med: dict[str, float] = {}
    for k, v in runs[0].items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            med[k] = statistics.median(r[k] for r in runs)
        else:
            med[k] = v
    return med


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--json", dest="json_out", help="write the figures here")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tree (median reported)")
    ap.add_argument("--compare", metavar="REV", help="also run git revision REV's engine")
    ap.add_argument("--load", type=float, default=0.8, help="fraction of saturation per instance")
    ap.add_argument("--rate", type=float, help="total arrival rate (req/s); skips the probe")
    ap.add_argument("--saturation-requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ids", choices=("placeholder", "random"), default="placeholder")
    ap.add_argument("--workload", choices=("lazy", "list"), default="lazy",
                    help="feed the requests lazily (default) or as one list built first")
    ap.add_argument("--stream", action="store_true",
                    help="stream the per-request table to Parquet; metrics from the file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.requests < 1 or args.instances < 1 or args.repeat < 1:
        ap.error("--requests, --instances and --repeat must be >= 1")
    if not (_data_dir() / "llmservingsim" / "profiles").is_dir():
        print(f"reference data not found at {_data_dir()}; set SERVESWEEP_DATA", file=sys.stderr)
        return 2
    if args.child:
        print(json.dumps(measure(args.requests, args.instances, args.rate, args.seed, args.ids,
                                 args.workload, args.stream)))
        return 0
    sat = None
    if args.rate is None:
        sat = saturation_rate(args.saturation_requests, args.seed)
        args.rate = args.load * sat * args.instances
    trees: dict[str, Path | None] = {"current": None}
    tmp = None
    if args.compare:
        from revision_tree import checkout

        tmp = tempfile.TemporaryDirectory(prefix="engine_scale_")
        trees[f"previous ({args.compare})"] = checkout(args.compare, Path(tmp.name))
    load_before = _loadavg()
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for _ in range(args.repeat):
        for label, tree in trees.items():
            runs[label].append(_child(args, tree))
    load_after = _loadavg()
    med = {label: _median(r) for label, r in runs.items()}
    print(f"load: {args.requests} requests, {args.instances} instance(s), rate {args.rate:.3f} "
          f"req/s" + (f" ({args.load:g} x saturation {sat:.3f} req/s per instance)" if sat else ""))
    print(f"machine: {os.cpu_count()} cores, load average {load_before} before, {load_after} "
          f"after; median of {args.repeat} run(s) per tree")
    cols = (*FIELDS, "us_per_step", "workload_rss_mib")
    widths = [max(16, len(c) + 2) for c in cols]  # a name longer than a column stays apart
    print(f"{'tree':<28}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)))
    for label, m in med.items():
        print(f"{label:<28}" + "".join(f"{m[c]:>{w}.4g}" for c, w in zip(cols, widths, strict=True)))
    ratio = None
    if len(med) == 2:
        cur, prev = med["current"], next(v for k, v in med.items() if k != "current")
        ratio = {c: prev[c] / cur[c] for c in ("wall_s", "cpu_s", "peak_rss_mib")}
        ratio["req_per_cpu_s"] = cur["req_per_cpu_s"] / prev["req_per_cpu_s"]
        print("previous / current: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
        for c in ("finished", "num_steps", "makespan_s", "num_preemptions"):
            if cur[c] != prev[c]:
                print(f"warning: {c} differs: current {cur[c]} vs previous {prev[c]}")
        # A tree without the lazy engine builds its workload as a list before its timer and
        # keeps its per-request table in memory, while a lazy run generates its requests
        # inside the timer (about a tenth of a 10k run) and a streamed one writes Parquet there.
        for key, same in (("workload", "--workload list"), ("stream", "no --stream")):
            if cur[key] != prev[key]:
                print(f"warning: the trees timed different work: {key} {cur[key]} (current) "
                      f"vs {prev[key]} (previous; a tree without the lazy engine can only build "
                      f"a list and keep its table); rerun with {same} for the same timed work")
    if args.json_out:
        report = {
            **{c: med["current"][c] for c in FIELDS},
            "rate_req_s": args.rate,
            "saturation_req_s": sat,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "repeat": args.repeat,
            "median": med,
            "runs": runs,
            "ratio_previous_over_current": ratio,
        }
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
