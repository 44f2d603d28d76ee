"""``python -m analysis summarize <sweep dir>``: print a sweep's results table, draw its plot.

Reads ``results.parquet`` written by the sweep (``sweep.recorder``), prints one line per grid
point (the config keys that vary across the sweep, then the key metrics) and draws the
study's key plot (``study.plot`` of the sweep's config: ``y`` against ``x``, one line per
``line``; ``sweep.svg_study``) to ``<sweep dir>/study.svg`` unless told otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from sweep.recorder import RESULTS_FILE, STUDY_PLOT, read_results_table

CONFIG_GROUPS = ("hardware.", "model.", "cluster.", "workload.", "slo.", "study.", "groundtruth.")
KEY_METRICS = (
    "request_throughput",
    "output_throughput",
    "slo_met",
    "goodput_rps",
    "slo_attainment_pct",
    "ttft_ms_median",
    "ttft_ms_p99",
    "tpot_ms_p99",
    "e2el_ms_p99",
    "num_preemptions",
    "kv_usage_pct_max",
    "makespan_s",
    "usd_per_m_output_tokens",
)


def varying_config_columns(table: pd.DataFrame) -> list[str]:
    """Config columns whose value differs between grid points, in table order."""
    cols = [c for c in table.columns if c.startswith(CONFIG_GROUPS)]
    return [c for c in cols if table[c].astype(str).nunique(dropna=False) > 1]


def summary_frame(table: pd.DataFrame, metrics: list[str] | None = None) -> pd.DataFrame:
    """Job, status, varying config columns and the chosen (default: key) metrics."""
    wanted = list(metrics) if metrics else [m for m in KEY_METRICS if m in table.columns]
    missing = [m for m in wanted if m not in table.columns]
    if missing:
        raise SystemExit(f"--metrics: unknown column(s) {missing}; available: {sorted(table.columns)}")
    cols = ["job", "status", *varying_config_columns(table), *wanted]
    return table[[c for c in dict.fromkeys(cols) if c in table.columns]]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m analysis summarize",
        description="Print a sweep's results table and draw the study's key plot.",
    )
    p.add_argument("sweep_dir", type=Path, help="the sweep's output dir (holds results.parquet)")
    p.add_argument("--metrics", nargs="+", help="metric columns to print (default: key metrics)")
    p.add_argument("--x", help="plot x column (default: study.plot.x)")
    p.add_argument("--y", help="plot y column (default: study.plot.y)")
    p.add_argument("--line", help="one plot line per value of this column (default: study.plot.line)")
    p.add_argument("--out", type=Path,
                   help=f"plot file, SVG (default: <sweep dir>/{STUDY_PLOT})")
    p.add_argument("--no-plot", action="store_true", help="print only")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``argv`` are the arguments after ``summarize``. Returns the exit code."""
    args = _parser().parse_args(argv)
    if args.out is not None and args.out.suffix.lower() != ".svg":
        raise SystemExit(f"--out {args.out}: the plot is written as SVG; give a file name "
                         "ending in .svg")
    path = args.sweep_dir / RESULTS_FILE if args.sweep_dir.is_dir() else args.sweep_dir
    if not path.is_file():
        raise SystemExit(
            f"{path}: no results table; give the directory of a finished `python -m sweep` "
            "run (it holds results.parquet)"
        )
    table, meta = read_results_table(path)
    study = meta.get("study") or {}
    failed = int((table["status"] != "finished").sum())
    print(f"study {study.get('name', '?')}: {len(table)} points, {failed} failed  ({path})")
    if study.get("description"):
        print(study["description"])
    with pd.option_context("display.width", 200, "display.max_columns", 50,
                           "display.float_format", "{:.4g}".format):
        print(summary_frame(table, args.metrics).to_string(index=False))
    truth = meta.get("groundtruth_metrics")
    if truth:
        shown = args.metrics or [m for m in KEY_METRICS if m in truth]
        print(f"vLLM ground truth ({meta.get('groundtruth_dir')}):")
        print("  " + "  ".join(f"{m}={truth[m]:.4g}" for m in shown if m in truth))
    for _, row in table[table["status"] != "finished"].iterrows():
        first = str(row.get("error") or "").strip().splitlines()[-1:] or ["?"]
        print(f"job {row['job']} failed: {first[0]}")
    if args.no_plot:
        return 0
    plot = study.get("plot") or {}
    x, y = args.x or plot.get("x"), args.y or plot.get("y")
    line = args.line if args.line is not None else plot.get("line")
    if not x or not y:
        raise SystemExit("no plot axes: pass --x and --y (the study config sets none)")
    finished = table[table["status"] == "finished"]
    if finished.empty:
        print("no finished points: nothing to plot")
        return 1
    from sweep.svg_study import study_plot

    out = args.out or path.parent / STUDY_PLOT
    try:
        study_plot(finished, x, y, line or None, out, str(study.get("name", "")),
                   bool(plot.get("logy")))
    except KeyError as err:
        raise SystemExit(str(err.args[0])) from None
    except (TypeError, ValueError, OSError) as err:
        raise SystemExit(f"plot not written to {out}: {err}") from None
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
