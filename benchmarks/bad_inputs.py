"""Census of bad inputs: each one through the real CLI, and how it ended.

Every case runs ``python -m sweep <overrides> -m`` (a one-point sweep) in a fresh temporary
directory with its own MLflow store, and is classified from the exit code and the output:

* ``refused up front``: non-zero exit before Ray started, no traceback, and the output names
  the key or file the case broke (``expect``);
* ``infeasible``: exit 0, the point recorded as infeasible with its reason, not simulated
  (a capacity answer, for a valid point that cannot run on its hardware);
* ``refused at run time``: Ray started and the point failed, exit non-zero;
* ``traceback``: a Python traceback reached the user;
* ``accepted``: exit 0 and the point ran (the input was not refused).

    python benchmarks/bad_inputs.py [--json OUT] [--only SUBSTRING]

docs/reliability.md quotes its table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOOD_LINE = {"input_toks": 12, "output_toks": 5, "arrival_time_ns": 1000}


@dataclass
class Case:
    name: str
    overrides: list[str]
    expect: str  # text the message must contain (the key or file name)
    trace: list[str] | None = None  # lines of a trace file to write as trace.jsonl
    bundle_damage: str | None = None  # "nan" | "negative": a copied bundle with a bad cell
    expected: str = "refused up front"


def _line(**kw: object) -> str:
    return json.dumps({**GOOD_LINE, **kw})


TRACE = ["workload.kind=trace", "workload.path=trace.jsonl"]
CASES = [
    # engine settings
    Case("block_size not in vLLM's set", ["cluster.block_size=7"], "cluster.block_size"),
    Case("gpu_memory_utilization 0", ["cluster.gpu_memory_utilization=0"], "gpu_memory_utilization"),
    Case("gpu_memory_utilization 1.5", ["cluster.gpu_memory_utilization=1.5"], "gpu_memory_utilization"),
    Case("gpu_memory_utilization nan", ["cluster.gpu_memory_utilization=nan"], "gpu_memory_utilization"),
    Case("max_num_seqs 0", ["cluster.max_num_seqs=0"], "cluster.max_num_seqs"),
    Case("max_num_seqs -1", ["cluster.max_num_seqs=-1"], "cluster.max_num_seqs"),
    Case("max_num_batched_tokens 0", ["cluster.max_num_batched_tokens=0"], "max_num_batched_tokens"),
    Case("tensor_parallel_size 3 (32 heads)", ["cluster.tensor_parallel_size=3"], "tensor_parallel_size"),
    Case("unknown key +cluster.tp", ["+cluster.tp=3"], "cluster.tp"),
    Case("unknown key +workload.foo", ["+workload.foo=1"], "workload.foo"),
    Case("kv_cache_dtype int3", ["cluster.kv_cache_dtype=int3"], "kv_cache_dtype"),
    Case("data_parallel_size 0", ["cluster.data_parallel_size=0"], "data_parallel_size"),
    Case("pipeline_parallel_size 1000", ["cluster.pipeline_parallel_size=1000"], "pipeline_parallel_size"),
    Case("expert_parallel_size 2 on a dense model", ["cluster.expert_parallel_size=2"], "expert_parallel_size"),
    Case("router unknown", ["cluster.router=sideways"], "cluster.router"),
    Case("num_instances 0", ["cluster.num_instances=0"], "num_instances"),
    Case("prefix_storage disk", ["cluster.prefix_storage=disk"], "prefix_storage"),
    Case("max_model_len 100 (infeasible)", ["cluster.max_model_len=100"], "max_model_len", expected="infeasible"),
    Case("model does not fit (infeasible)", ["hardware=rtx4090", "model=llama3_70b"], "does not fit", expected="infeasible"),
    # workload settings
    Case("rate 0", ["workload.rate=0"], "workload.rate"),
    Case("rate -1", ["workload.rate=-1"], "workload.rate"),
    Case("rate nan", ["workload.rate=nan"], "workload.rate"),
    # vllm bench serve's --request-rate inf: every request at t = 0 (a valid burst)
    Case("rate inf (all at once)", ["workload.rate=inf"], "", expected="accepted"),
    Case("num_requests 0", ["workload.num_requests=0"], "num_requests"),
    Case("num_requests 10^12", ["workload.num_requests=1000000000000"], "num_requests"),
    Case("seed -1", ["workload.seed=-1"], "workload.seed"),
    Case("seed 2^40", ["workload.seed=1099511627776"], "workload.seed"),
    Case("arrival lognormal", ["workload.arrival=lognormal"], "workload.arrival"),
    Case("cv 0", ["workload.arrival=gamma", "workload.cv=0"], "workload.cv"),
    Case("input_len unknown kind", ["workload.input_len=bogus"], "workload.input_len"),
    Case("workload kind unknown", ["workload.kind=bogus"], "workload.kind"),
    Case("trace file missing", ["workload.kind=trace", "workload.path=missing.jsonl"], "missing.jsonl"),
    # damaged trace lines
    Case("trace: truncated line", TRACE, "trace.jsonl:2", trace=[_line(), '{"input_toks": 3, "outp']),
    Case("trace: arrival 1e30", TRACE, "trace.jsonl:1", trace=['{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 1e30}']),
    Case("trace: negative count", TRACE, "trace.jsonl:1", trace=[_line(input_toks=-4)]),
    Case("trace: count 10^9", TRACE, "trace.jsonl:1", trace=[_line(input_toks=10**9)]),
    Case("trace: not JSON", TRACE, "trace.jsonl:1", trace=["hello world"]),
    Case("trace: string count", TRACE, "trace.jsonl:1", trace=[_line(output_toks="five")]),
    Case("trace: ids length mismatch", TRACE, "trace.jsonl:1", trace=[_line(input_tok_ids=[1, 2])]),
    Case("trace: request longer than max_model_len (infeasible)",
         [*TRACE, "cluster.max_model_len=16"], "max_model_len", trace=[_line(input_toks=40)],
         expected="infeasible"),
    # hardware, model, bundle
    Case("hardware name unknown", ["hardware.name=NOPE9000"], "hardware.name"),
    Case("model name unknown", ["model.name=nobody/none"], "model.name"),
    Case("cost_per_hour -1", ["hardware.cost_per_hour=-1"], "cost_per_hour"),
    Case("bundle source unknown", ["hardware.bundle.source=guess"], "hardware.bundle.source"),
    Case("bundle root missing", ["hardware.bundle.source=dir", "hardware.bundle.root=/nonexistent"],
         "/nonexistent"),
    Case("bundle with a NaN cell", [], ".csv:", bundle_damage="nan"),
    Case("bundle with a negative time", [], ".csv:", bundle_damage="negative"),
    # SLO
    Case("SLO bound -1", ["slo.bounds.ttft_ms_p99=-1"], "slo.bounds.ttft_ms_p99"),
    Case("SLO unknown statistic", ["+slo.bounds.ttft_ms_p42x=1"], "ttft_ms_p42x"),
    # tracking and study
    Case("tracking server unreachable", ["tracking.uri=http://127.0.0.1:9"], "tracking.uri=http://127.0.0.1:9"),
    Case("sqlite under an unwritable path", ["tracking.uri=sqlite:////proc/nope/mlflow.db"], "tracking.uri"),
    Case("study.name escaping multirun/", ["study.name=../../escaped"], "study.name"),
    Case("retry_budget_s -1", ["tracking.retry_budget_s=-1"], "tracking.retry_budget_s"),
    Case("timeseries_steps 0", ["tracking.timeseries_steps=0"], "tracking.timeseries_steps"),
    Case("groundtruth dir missing", ["groundtruth.dir=/nonexistent"], "groundtruth.dir"),
    # launcher
    Case("num_actors 0", ["hydra.launcher.num_actors=0"], "hydra.launcher.num_actors"),
    Case("num_actors -2", ["hydra.launcher.num_actors=-2"], "hydra.launcher.num_actors"),
    Case("max_retries -1", ["hydra.launcher.max_retries=-1"], "hydra.launcher.max_retries"),
    Case("job_timeout_s 0", ["hydra.launcher.job_timeout_s=0"], "hydra.launcher.job_timeout_s"),
    Case("on_failure ignore", ["hydra.launcher.on_failure=ignore"], "hydra.launcher.on_failure"),
]


def _damaged_bundle(work: Path, damage: str) -> list[str]:
    """A copy of the measured RTX PRO 6000 Llama-3.1-8B bundle with one bad cell."""
    data = Path(os.environ.get("SERVESWEEP_DATA", REPO.parent / "shared" / "data"))
    src = data / "llmservingsim" / "profiles"
    dst = work / "profiles"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*Qwen*"))
    table = dst / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16" / "tp1" / "dense.csv"
    lines = table.read_text().splitlines()
    cells = lines[1].split(",")
    cells[-1] = "nan" if damage == "nan" else "-5"
    lines[1] = ",".join(cells)
    table.write_text("\n".join(lines) + "\n")
    return ["hardware=rtxpro6000_measured", f"hardware.bundle.root={dst}"]


def run_case(case: Case, timeout_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="badinput-") as tmp:
        work = Path(tmp)
        extra: list[str] = []
        if case.trace is not None:
            (work / "trace.jsonl").write_text("\n".join(case.trace) + "\n")
        if case.bundle_damage:
            extra = _damaged_bundle(work, case.bundle_damage)
        cmd = [sys.executable, "-m", "sweep", "workload.num_requests=20", "tracking.plots=false",
               "hydra.launcher.progress=false", f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
               *extra, *case.overrides, "-m"]
        if any(o.startswith("workload.num_requests=") for o in case.overrides):
            cmd.remove("workload.num_requests=20")
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
        t0 = time.monotonic()
        try:
            out = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                                 timeout=timeout_s)
            code, text = out.returncode, out.stdout + out.stderr
        except subprocess.TimeoutExpired as err:
            code, text = None, f"timed out after {timeout_s} s: {err}"
        wall = time.monotonic() - t0
        error_files = [p.read_text() for p in work.rglob("error.txt")]
    ray_started = "actors ready" in text or "Starting Ray" in text
    if "Traceback" in text and not error_files:
        outcome = "traceback"
    elif code == 0 and "is infeasible, recorded without running" in text:
        outcome = "infeasible"
    elif code == 0:
        outcome = "accepted"
    elif not ray_started:
        outcome = "refused up front"
    else:
        outcome = "refused at run time"
    named = case.expect in text or any(case.expect in e for e in error_files)
    lines = [ln for ln in text.splitlines() if ln.strip() and "WARNING" not in ln]
    return {"case": case.name, "outcome": outcome, "expected": case.expected,
            "named": named, "exit": code,
            "wall_s": round(wall, 1), "message": (lines[-1] if lines else "")[:300]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args()
    rows = [run_case(c, args.timeout) for c in CASES if args.only in c.name]
    width = max(len(r["case"]) for r in rows)
    for r in rows:
        flag = "" if r["named"] else "  (message does not name it)"
        if r["outcome"] != r["expected"]:
            flag += f"  (expected: {r['expected']})"
        print(f"{r['case']:<{width}}  {r['outcome']:<20} exit={r['exit']!s:<4} {r['wall_s']:>5} s{flag}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(f"\n{len(rows)} inputs: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
          + f"; {sum(not r['named'] for r in rows)} without the key or file in the message"
          + f"; {sum(r['outcome'] != r['expected'] for r in rows)} not as expected")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
