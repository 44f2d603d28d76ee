"""Error of the generated (roofline) bundles: against the measured RTX PRO 6000 bundles, and
per GPU against the aiconfigurator bundles (NVIDIA's measured vLLM operator tables).

Usage::

    python -m benchmarks.roofline_error [--data DIR] [--doc docs/roofline.md]
        [--no-e2e] [--no-per-gpu]

For every measured bundle (hardware, model, TP folder) it generates the roofline bundle
with the committed factors, joins both on the table keys and reports the median and P90 of
``|generated / measured - 1|`` per table: each dense layer, each per-sequence layer,
attention (all rows and per regime: pure decode, pure prefill, mixed) and MoE. It then prices
a handful of representative batch shapes with ``profiles.latency.ProfiledLatencyModel`` on
both bundles (whole-step latency, host I/O dropped) and reports the ratio.

Unless ``--no-e2e``, it also replays the three vLLM ground-truth runs through
``analysis.validate.run_validation`` with the measured and with the roofline bundles.

Unless ``--no-per-gpu`` (or without aiconfigurator-core installed), for every
aiconfigurator system and catalog model it compares the roofline bundle with the
aiconfigurator bundle on the tables aiconfigurator measures (GEMM layers, lm_head,
attention, MoE), at TP 1 (where the per-system factors were fitted) and TP 2 (shapes the
fit did not see), twice: with the fallback (RTX PRO 6000) factors every GPU used before it
had its own, and with the hardware's own factors.

The markdown is printed and, with ``--doc``, each block computed is written between its
markers in that file (``<!-- roofline_error:begin/end -->``, ``roofline_e2e``,
``roofline_per_gpu``); blocks not computed are left as they are.
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
from profiles.catalog import list_models, load_hardware, load_model
from profiles.latency import ProfiledLatencyModel
from profiles.roofline import ensure_bundle, generate_bundle
from profiles.roofline.check import ErrorRow, attention_split_errors, table_errors
from profiles.roofline.factors import load_factors, load_factors_file
from profiles.roofline.fit import (
    FALLBACK,
    MEASURED,
    default_data_dir,
    measured_tps,
    measured_variant_dir,
)

BEGIN, END = "<!-- roofline_error:begin -->", "<!-- roofline_error:end -->"
E2E_BEGIN, E2E_END = "<!-- roofline_e2e:begin -->", "<!-- roofline_e2e:end -->"
GPU_BEGIN, GPU_END = "<!-- roofline_per_gpu:begin -->", "<!-- roofline_per_gpu:end -->"
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


# ----------------------------------------------------------------------------- per GPU

#: TP degrees of the per-GPU comparison: 1 is where the per-system factors were fitted,
#: 2 gives every GEMM and attention call shapes (n, k, heads per rank) the fit did not see.
PER_GPU_TPS = (1, 2)
#: The rows aiconfigurator measures (the other dense / per-sequence rows of its bundles are
#: the roofline model's own and agree by construction).
_TABLE_ITEMS = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "moe"}


def per_gpu_errors(cache: Path) -> list[tuple[str, int, str, ErrorRow]]:
    """(hardware, tp, factors kind, error row) of the roofline bundle against the
    aiconfigurator bundle, for every aiconfigurator system, catalog model and PER_GPU_TPS,
    priced with the fallback factors and with the hardware's own."""
    from profiles.aiconfigurator import SYSTEMS
    from profiles.aiconfigurator import ensure_bundle as aic_bundle

    fallback = load_factors_file().systems[FALLBACK]
    out = []
    for hw_name in SYSTEMS:
        hw = load_hardware(hw_name)
        own = load_factors(hardware=hw_name)
        for model_name in list_models():
            model = load_model(model_name)
            for tp in PER_GPU_TPS:
                adir = aic_bundle(hw, model, tp, cache=cache)
                for kind, factors in (("fallback", fallback), ("own", own)):
                    rdir = ensure_bundle(hw, model, tp, factors=factors, cache=cache)
                    a, r = adir / f"tp{tp}", rdir / f"tp{tp}"
                    for e in table_errors(a, r, model_name):
                        if e.item in _TABLE_ITEMS:
                            out.append((hw_name, tp, kind, e))
                    for e in attention_split_errors(a, r, model_name):
                        out.append((hw_name, tp, kind, e))
    return out


def render_per_gpu(rows: list[tuple[str, int, str, ErrorRow]]) -> str:
    """Per (hardware, TP, table, item): pooled over the catalog models (row-weighted), the
    error with the fallback factors and with the hardware's own."""
    from profiles.aiconfigurator import PINNED_VERSION, SYSTEMS

    frame = pd.DataFrame([{"hw": hw, "tp": tp, "kind": kind, **asdict(e)}
                          for hw, tp, kind, e in rows])
    frame["table"] = frame["table"].replace({"per_sequence": "dense"})
    pooled = []
    for (hw, tp, table, item, kind), g in frame.groupby(["hw", "tp", "table", "item", "kind"],
                                                        sort=False):
        w = g["rows"] / g["rows"].sum()
        pooled.append({"hw": hw, "tp": tp, "table": table, "item": item, "kind": kind,
                       "rows": int(g["rows"].sum()),
                       **{c: float((g[c] * w).sum()) for c in ("median", "p90", "signed_median")}})
    p = pd.DataFrame(pooled)
    lines = [
        f"Roofline against aiconfigurator-core {PINNED_VERSION} per GPU: "
        "`|roofline/aiconfigurator - 1|` over every row of the aiconfigurator bundle's tables "
        "that aiconfigurator measures (GEMM layers, lm_head, attention, MoE), pooled over the "
        f"catalog models ({', '.join(list_models())}; row-weighted mean of the per-model "
        "statistics); signed = median of `roofline/aiconfigurator - 1`, + means the roofline "
        f"is slower. *fallback*: the {FALLBACK} factors every GPU used before it had its own; "
        "*own*: the hardware's factors (`profiles/roofline/factors.yaml`). TP 1 is where the "
        "own factors were fitted (on the attention rows without KV history or mixing only); "
        "TP 2 has shapes the fit did not see. Attention `decode` and `prefill, no history` are "
        "aiconfigurator's table rows; `prefill, history` and `mixed` are those rows plus "
        "the roofline's history / mixed-call costs with the GPU's own factors (profiles.aiconfigurator.build), so "
        "they are not measurements, and the own column agrees there largely by construction.",
        "",
    ]
    for tp in PER_GPU_TPS:
        lines += [
            f"TP {tp}:",
            "",
            "| GPU (system) | table | layer / regime | rows | fallback median % | fallback P90 % "
            "| fallback signed % | own median % | own P90 % | own signed % |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        sub = p[p["tp"] == tp]
        for (hw, table, item), g in sub.groupby(["hw", "table", "item"], sort=False):
            by = g.set_index("kind")
            cells = " | ".join(f"{_pct(by.loc[k, c])}" for k in ("fallback", "own")
                               for c in ("median", "p90", "signed_median"))
            lines.append(f"| {hw} ({SYSTEMS[hw]}) | {table} | {item} | "
                         f"{int(by.loc['own', 'rows'])} | {cells} |")
        lines.append("")
    summary = p[p["item"].isin(["decode", "prefill, no history"]) | (p["table"] == "dense")]
    worst = (summary[summary["kind"] == "own"].groupby("tp")["median"].max() * 100).round(1)
    before = (summary[summary["kind"] == "fallback"].groupby("tp")["median"].max() * 100).round(1)
    lines.append("Largest pooled median over the GEMM, lm_head, decode and history-free "
                 "prefill attention rows (the table rows): " + "; ".join(
                     f"TP {tp}: {before[tp]} % with the fallback factors, {worst[tp]} % with "
                     "the own" for tp in PER_GPU_TPS) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_data_dir(), help="shared data folder")
    ap.add_argument("--doc", type=Path, default=None, help="markdown file to update in place")
    ap.add_argument("--no-e2e", action="store_true", help="skip the ground-truth replays")
    ap.add_argument("--no-per-gpu", action="store_true",
                    help="skip the per-GPU comparison with aiconfigurator's tables")
    args = ap.parse_args(argv)
    from profiles.aiconfigurator import installed_version

    per_gpu = not args.no_per_gpu and installed_version() is not None
    blocks: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        errors = all_table_errors(args.data, Path(tmp))
        clear_bundle_cache()
        steps = step_errors(args.data, Path(tmp) / "steps")
        clear_bundle_cache()
        blocks.append((BEGIN, END, render(errors, steps)))
        if not args.no_e2e:
            blocks.append((E2E_BEGIN, E2E_END,
                           render_e2e(end_to_end(args.data, Path(tmp) / "e2e"))))
        if per_gpu:
            blocks.append((GPU_BEGIN, GPU_END,
                           render_per_gpu(per_gpu_errors(Path(tmp) / "per-gpu"))))
    print("\n".join(b for _, _, b in blocks))
    if args.doc is not None:
        for begin, end, block in blocks:
            write_doc(args.doc, block, begin, end)


if __name__ == "__main__":
    main()
