"""Error of the generated (roofline) bundles against the measured RTX PRO 6000 bundles.

Usage::

    python -m benchmarks.roofline_error [--data DIR] [--doc docs/roofline.md]

For every measured bundle (hardware, model, TP folder) it generates the roofline bundle
with the committed factors, joins both on the table keys and reports the median and P90 of
``|generated / measured - 1|`` per table: each dense layer, each per-sequence layer,
attention (all rows and per regime: pure decode, pure prefill, mixed) and MoE. It then prices
a handful of representative batch shapes with ``profiles.latency.ProfiledLatencyModel`` on
both bundles (whole-step latency, host I/O dropped) and reports the ratio.

The markdown is printed and, with ``--doc``, written between the
``<!-- roofline_error:begin -->`` / ``<!-- roofline_error:end -->`` markers of that file.
Unless ``--no-e2e``, it also replays the three vLLM ground-truth runs through
``analysis.validate.run_validation`` with the measured and with the roofline bundles.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from engine.batch import BatchShape
from profiles.bundle import clear_bundle_cache, load_bundle
from profiles.catalog import load_hardware, load_model
from profiles.latency import ProfiledLatencyModel
from profiles.roofline import generate_bundle
from profiles.roofline.check import ErrorRow, table_errors
from profiles.roofline.fit import MEASURED, default_data_dir, measured_tps, measured_variant_dir

BEGIN, END = "<!-- roofline_error:begin -->", "<!-- roofline_error:end -->"
#: Representative steps: (label, BatchShape).
SHAPES: tuple[tuple[str, BatchShape], ...] = (
    ("prefill 2048, no history", BatchShape(2048, 1, 2048, 0, 0, 0, 0, 0)),
    ("prefill chunk 512 after 1536", BatchShape(512, 1, 512, 1536, 0, 0, 0, 0)),
    ("1 decode, kv 2048", BatchShape(1, 1, 0, 0, 1, 2048, 2048, 2048)),
    ("32 decodes, kv 1000", BatchShape(32, 32, 0, 0, 32, 32_000, 1000, 1000)),
    ("128 decodes, kv 800-2200", BatchShape(128, 128, 0, 0, 128, 192_000, 800, 2200)),
    ("prefill 1320 + 2 decodes", BatchShape(1322, 3, 1320, 0, 2, 3425, 1041, 2384)),
    ("prefill 1920 + 128 decodes kv 1000", BatchShape(2048, 129, 1920, 0, 128, 128_000, 1000, 1000)),
)


def step_errors(data: Path, workdir: Path) -> list[tuple[str, str, int, int]]:
    """(bundle, shape label, measured ns, roofline ns) for every SHAPES entry."""
    rows = []
    for hw_name, model_name in MEASURED:
        hw, model = load_hardware(hw_name), load_model(model_name)
        mdir = measured_variant_dir(data, hw_name, model_name)
        for tp in measured_tps(mdir):
            gdir = generate_bundle(hw, model, tp, workdir)
            clear_bundle_cache()  # the loader caches per directory; tp folders were added
            measured = ProfiledLatencyModel(load_bundle(mdir), model, tp, host_mem_bw_gbs=None)
            roofline = ProfiledLatencyModel(load_bundle(gdir), model, tp, host_mem_bw_gbs=None)
            for label, shape in SHAPES:
                rows.append((f"{model_name} tp{tp}", label, measured.iteration_ns(shape),
                             roofline.iteration_ns(shape)))
    return rows


#: Ground-truth vLLM runs: (folder under groundtruth/RTXPRO6000, workload file stem).
GROUNDTRUTH: tuple[tuple[str, str], ...] = (
    ("Llama-3.1-8B", "sharegpt-llama-3.1-8b-300-sps10"),
    ("Qwen3-32B", "sharegpt-qwen3-32b-300-sps10"),
    ("Qwen3-30B-A3B-Instruct-2507", "sharegpt-qwen3-30b-a3b-300-sps10"),
)
E2E_METRICS = {"ttft_ms_mean": "TTFT mean", "ttft_ms_p90": "TTFT P90", "tpot_ms_mean": "TPOT mean",
               "tpot_ms_p90": "TPOT P90", "e2el_ms_mean": "latency mean"}


def end_to_end(data: Path, workdir: Path) -> list[tuple[str, str, dict]]:
    """(example, profile kind, validation report) replaying each ground-truth run twice:
    with the measured bundles and with roofline bundles generated for the same TP folders."""
    from analysis.validate import run_validation  # the replay harness (analysis package)

    for hw_name, model_name in MEASURED:
        mdir = measured_variant_dir(data, hw_name, model_name)
        for tp in measured_tps(mdir):
            generate_bundle(load_hardware(hw_name), load_model(model_name), tp, workdir)
    clear_bundle_cache()
    measured_root = data / "llmservingsim" / "profiles"
    out = []
    for example, workload in GROUNDTRUTH:
        truth = data / "llmservingsim" / "groundtruth" / "RTXPRO6000" / example
        wl = data / "llmservingsim" / "workloads" / f"{workload}.jsonl"
        for kind, root in (("measured", measured_root), ("roofline", workdir)):
            out.append((example, kind, run_validation(truth, wl, root).report))
            clear_bundle_cache()
    return out


E2E_INTRO = ("End to end: `analysis.validate.run_validation` replays each vLLM ground-truth run "
             "(300 ShareGPT requests at 10 req/s) with the measured bundles and with roofline "
             "bundles; Diff% = (sim - vLLM)/vLLM over the 15 validation metrics:")


def render_e2e(rows: list[tuple[str, str, dict]], intro: str = E2E_INTRO,
               column: str = "profile") -> str:
    """The end-to-end table: one row per (run, profile kind) validation report."""
    head = " | ".join(f"{label} Diff%" for label in E2E_METRICS.values())
    lines = [
        intro,
        "",
        f"| run | {column} | mean \\|Diff%\\| | max \\|Diff%\\| | {head} |",
        "|---|---|---:|---:|" + "---:|" * len(E2E_METRICS),
    ]
    for example, kind, rep in rows:
        cells = " | ".join(f"{rep['metrics'][m]['diff_pct']:+.1f}" for m in E2E_METRICS)
        lines.append(f"| {example} | {kind} | {rep['mean_abs_diff_pct']:.2f} | "
                     f"{rep['max_abs_diff_pct']:.2f} | {cells} |")
    return "\n".join(lines) + "\n"


def all_table_errors(data: Path, workdir: Path) -> list[ErrorRow]:
    rows: list[ErrorRow] = []
    for hw_name, model_name in MEASURED:
        hw, model = load_hardware(hw_name), load_model(model_name)
        mdir = measured_variant_dir(data, hw_name, model_name)
        for tp in measured_tps(mdir):
            gdir = generate_bundle(hw, model, tp, workdir)
            rows += table_errors(mdir / f"tp{tp}", gdir / f"tp{tp}", f"{model_name} tp{tp}")
    return rows


def _pct(v: float) -> str:
    return f"{100 * v:.1f}"


def render(errors: list[ErrorRow], steps: list[tuple[str, str, int, int]]) -> str:
    lines = [
        "Per-table error, `|roofline/measured - 1|` over the measured grid points "
        "(signed = median of `roofline/measured - 1`, + means the roofline is slower):",
        "",
        "| bundle | table | layer / regime | rows | median % | P90 % | signed median % |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for e in errors:
        lines.append(f"| {e.bundle} | {e.table} | {e.item} | {e.rows} | {_pct(e.median)} | "
                     f"{_pct(e.p90)} | {_pct(e.signed_median)} |")
    pooled = pd.DataFrame([asdict(e) for e in errors])
    lines += ["", "Pooled over bundles (row-weighted mean of the per-bundle statistics):", "",
              "| table | layer / regime | median % | P90 % |", "|---|---|---:|---:|"]
    for (table, item), g in pooled.groupby(["table", "item"], sort=False):
        w = g["rows"] / g["rows"].sum()
        lines.append(f"| {table} | {item} | {_pct(float((g['median'] * w).sum()))} | "
                     f"{_pct(float((g['p90'] * w).sum()))} |")
    lines += ["", "Whole-step latency (ProfiledLatencyModel on each bundle, host I/O dropped):", "",
              "| bundle | step | measured ms | roofline ms | roofline/measured - 1 % |",
              "|---|---|---:|---:|---:|"]
    for bundle, label, m_ns, r_ns in steps:
        lines.append(f"| {bundle} | {label} | {m_ns / 1e6:.3f} | {r_ns / 1e6:.3f} | "
                     f"{100 * (r_ns / m_ns - 1):+.1f} |")
    rel = np.array([r / m - 1 for _, _, m, r in steps])
    lines += ["", f"Whole-step |error| over these {rel.size} steps: median "
              f"{100 * np.median(np.abs(rel)):.1f} %, max {100 * np.max(np.abs(rel)):.1f} %."]
    return "\n".join(lines) + "\n"


def write_doc(doc: Path, block: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace what stands between the ``begin`` and ``end`` markers of ``doc`` by ``block``."""
    text = doc.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{doc}: markers {begin} / {end} not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{begin}\n{block}{end}{tail}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_data_dir(), help="shared data folder")
    ap.add_argument("--doc", type=Path, default=None, help="markdown file to update in place")
    ap.add_argument("--no-e2e", action="store_true", help="skip the ground-truth replays")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        errors = all_table_errors(args.data, Path(tmp))
        clear_bundle_cache()
        steps = step_errors(args.data, Path(tmp) / "steps")
        clear_bundle_cache()
        e2e = [] if args.no_e2e else end_to_end(args.data, Path(tmp) / "e2e")
    block = render(errors, steps)
    if e2e:
        block += "\n" + render_e2e(e2e)
    print(block)
    if args.doc is not None:
        write_doc(args.doc, block)


if __name__ == "__main__":
    main()
