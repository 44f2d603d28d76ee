"""Every reference cluster config on ``workloads/example_trace.jsonl`` (10 requests).

    python benchmarks/reference_scenarios.py [--markdown]

For each config in ``llmservingsim/configs/cluster/`` it runs our engine twice — with the
reference simulator's clock semantics (synchronous steps, no host overhead, streamed P/D KV)
and with our defaults (vLLM's async scheduling, exposed host overhead, whole-KV P/D hand-off) —
and, where the reference's own output exists (``reference_outputs/example_*.csv``), compares
the last request's completion time (the reference's "Total clocks" up to its 1 ms idle tick).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd

from analysis.run_scenario import run_scenario

REPO = Path(__file__).resolve().parents[1]

# config -> (reference output, extra options), as the reference's run.sh pairs them.
SCENARIOS: dict[str, tuple[str | None, dict]] = {
    "single_node_single_instance": ("example_single_run", {}),
    "single_node_power_instance": ("example_power_run", {}),
    "single_node_multi_instance": ("example_multi_run", {}),
    "single_node_multi_instance+cpu_pool": (
        "example_prefix_cpu_mem_pool_run",
        {"prefix_storage": "CPU", "prefix_sharing": True},
    ),
    "dual_node_multi_instance": (None, {}),
    "dual_node_multi_instance+cpu_pool": (
        "example_dual_prefix_cpu_mem_pool_run",
        {"prefix_storage": "CPU", "prefix_sharing": True},
    ),
    "single_node_pd_instance": ("example_pd_run", {}),
    "single_node_pd_per_instance_config": (None, {}),
    "single_node_heterogeneous": (None, {}),
    "single_node_cxl_instance": ("example_cxl_run", {"prefix_storage": "CXL"}),
    "single_node_memory_instance": (None, {}),
    "single_node_pim_instance": ("example_pim_run", {}),
    "single_node_moe_single_instance": ("example_moe_run", {}),
    "single_node_moe_multi_instance": (None, {}),
    "single_node_moe_pd_instance": (None, {}),
    "single_node_moe_dp_ep_instance": (None, {}),
    "single_node_moe_dp_tp_instance": ("example_moe_dp_tp_run", {}),
    "single_node_moe_dp_pp_instance": ("example_moe_dp_pp_run", {}),
    "single_node_moe_dp_tp_pp_instance": ("example_moe_dp_tp_pp_run", {}),
    "dual_node_moe_dp_ep_intra_inter_instance": ("example_dual_moe_dp_ep_run", {}),
    "single_node_dp_instance": ("example_dp_run", {}),
    "single_node_pp_instance": ("example_pp_run", {}),
    "single_node_tp_pp_instance": ("example_tp_pp_run", {}),
    "single_node_moe_pp_instance": ("example_moe_pp_run", {}),
    "single_node_4_instance_2TP": (None, {}),
    "single_node_single_instance_H100": (None, {}),
}


def run_all(data: Path) -> pd.DataFrame:
    d = data / "llmservingsim"
    workload = d / "workloads" / "example_trace.jsonl"
    rows = []
    for key, (ref_name, opts) in SCENARIOS.items():
        cfg = d / "configs" / "cluster" / f"{key.split('+')[0]}.json"
        ref_end = None
        if ref_name:
            ref_end = int(pd.read_csv(d / "reference_outputs" / f"{ref_name}.csv").end_time.max())
        row: dict = {"scenario": key, "reference_end_ns": ref_end}
        for label, refclock in (("refclock", True), ("default", False)):
            t0 = time.perf_counter()
            try:
                res, _ = run_scenario(cfg, workload, d / "profiles", num_reqs=10,
                                      reference_clock=refclock, **opts)
                row[f"{label}_end_ns"] = int(res.requests.finish_ns.max())
                row[f"{label}_wall_s"] = time.perf_counter() - t0
                row[f"{label}_error"] = ""
            except Exception as exc:  # report and go on: one scenario must not hide the rest
                row[f"{label}_end_ns"] = None
                row[f"{label}_error"] = f"{type(exc).__name__}: {exc}"
        if ref_end and row.get("refclock_end_ns"):
            row["refclock_diff_pct"] = (row["refclock_end_ns"] - ref_end) / ref_end * 100
        if ref_end and row.get("default_end_ns"):
            row["default_diff_pct"] = (row["default_end_ns"] - ref_end) / ref_end * 100
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    data = Path(os.environ.get("SERVESWEEP_DATA", REPO.parent / "shared" / "data"))
    if not (data / "llmservingsim").is_dir():
        print(f"reference data not found at {data}; set SERVESWEEP_DATA", file=sys.stderr)
        return 2
    df = run_all(data)
    if args.markdown:
        print("| scenario | reference end (ns) | ours, reference clock | Δ% | ours, default engine | Δ% |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in df.itertuples(index=False):
            def cell(v):
                return "—" if v is None or v != v else f"{int(v):,}"

            def pct(v):
                return "—" if v is None or v != v else f"{v:+.3f}"

            err = r.refclock_error or r.default_error
            print(f"| {r.scenario} | {cell(r.reference_end_ns)} | {cell(r.refclock_end_ns)} | "
                  f"{pct(getattr(r, 'refclock_diff_pct', None))} | {cell(r.default_end_ns)} | "
                  f"{pct(getattr(r, 'default_diff_pct', None))} |" + (f" {err}" if err else ""))
    else:
        with pd.option_context("display.width", 250, "display.max_columns", 20):
            print(df.drop(columns=[c for c in df.columns if c.endswith("_error")]).to_string())
        errs = df[(df.refclock_error != "") | (df.default_error != "")]
        for r in errs.itertuples(index=False):
            print(f"{r.scenario}: {r.refclock_error or r.default_error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
