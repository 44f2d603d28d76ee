"""Error of the aiconfigurator-derived bundles where we have truth (RTX PRO 6000).

Usage::

    python -m benchmarks.aiconfigurator_error [--data DIR] [--doc docs/aiconfigurator.md]
        [--no-e2e] [--no-skew] [--comm] [--per-gpu]

1. Per table: for every measured RTX PRO 6000 bundle (model, TP folder) the bundle derived
   from aiconfigurator-core's ``rtx_pro_6000_server`` tables (``profiles.aiconfigurator``) is
   joined to it on the table keys; median and P90 of ``|derived / measured - 1|`` per dense
   layer, per-sequence layer, attention regime and MoE (``profiles.roofline.check``).
2. Whole steps: the representative batch shapes of ``benchmarks.roofline_error`` priced with
   ``ProfiledLatencyModel`` on both bundles (host I/O dropped).
3. End to end (unless ``--no-e2e``): ``analysis.validate.run_validation`` on the three vLLM
   ground-truth runs with the measured bundles and with ``--profiles aiconfigurator``, plus
   two diagnostics that locate the gap (neither is a profile source): the measured bundles
   with their skew fit switched off, and the derived bundles carrying the measured bundles'
   skew fit.
4. Skew (unless ``--no-skew``): the derived skew model's alpha (``profiles.aiconfigurator.
   skew``) against the measured bundles' skew profiles, per regime and decode count.
5. Per GPU (``--per-gpu``): the roofline bundle against the aiconfigurator bundle on every
   aiconfigurator system, for the catalog models, on the tables aiconfigurator measures
   (GEMM layers, attention, MoE): how far the roofline fallback is from NVIDIA's tables.
6. Communication (``--comm`` or ``--per-gpu``): a TP2 all-reduce priced by our analytical
   model against aiconfigurator's measured vLLM all-reduce and NCCL tables, and what a
   sweep prices now (``profiles.parallel.comm``).

The markdown is printed and, with ``--doc``, written between the
``<!-- aiconfigurator_error:begin -->`` / ``<!-- aiconfigurator_error:end -->`` markers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from benchmarks.roofline_error import GROUNDTRUTH, SHAPES, _pct, render_e2e, write_doc
from profiles.aiconfigurator import PINNED_VERSION, SYSTEMS, ensure_bundle
from profiles.bundle import clear_bundle_cache, load_bundle
from profiles.catalog import list_models, load_hardware, load_model
from profiles.latency import ProfiledLatencyModel
from profiles.roofline import ensure_bundle as roofline_bundle
from profiles.roofline.check import ErrorRow, table_errors
from profiles.roofline.fit import MEASURED, default_data_dir, measured_tps, measured_variant_dir
from profiles.roofline.generate import CACHE_ENV

BEGIN, END = "<!-- aiconfigurator_error:begin -->", "<!-- aiconfigurator_error:end -->"
HARDWARE = "RTXPRO6000"


def _derived(hw_name: str, model_name: str, tp: int, cache: Path) -> Path:
    return ensure_bundle(load_hardware(hw_name), load_model(model_name), tp, cache=cache)


def all_table_errors(data: Path, cache: Path) -> list[ErrorRow]:
    rows: list[ErrorRow] = []
    for hw_name, model_name in MEASURED:
        mdir = measured_variant_dir(data, hw_name, model_name)
        for tp in measured_tps(mdir):
            gdir = _derived(hw_name, model_name, tp, cache)
            rows += table_errors(mdir / f"tp{tp}", gdir / f"tp{tp}", f"{model_name} tp{tp}")
    return rows


def step_errors(data: Path, cache: Path) -> list[tuple[str, str, int, int]]:
    """(bundle, shape label, measured ns, derived ns) for every SHAPES entry."""
    rows = []
    for hw_name, model_name in MEASURED:
        model = load_model(model_name)
        mdir = measured_variant_dir(data, hw_name, model_name)
        for tp in measured_tps(mdir):
            gdir = _derived(hw_name, model_name, tp, cache)
            measured = ProfiledLatencyModel(load_bundle(mdir), model, tp, host_mem_bw_gbs=None)
            derived = ProfiledLatencyModel(load_bundle(gdir), model, tp, host_mem_bw_gbs=None)
            for label, shape in SHAPES:
                rows.append((f"{model_name} tp{tp}", label, measured.iteration_ns(shape),
                             derived.iteration_ns(shape)))
    return rows


def _link_bundle(src: Path, dest: Path, skew_from: Path | None, skew_on: bool) -> None:
    """``dest``: ``src``'s tables (symlinked) with meta.yaml's skew fit off, or taken (with
    its bucket tables) from the bundle ``skew_from``."""
    meta = yaml.safe_load((src / "meta.yaml").read_text())
    for tp_dir in sorted(p for p in src.glob("tp*") if p.is_dir()):
        (dest / tp_dir.name).mkdir(parents=True, exist_ok=True)
        for f in tp_dir.glob("*.csv"):
            if not f.name.startswith("skew"):
                (dest / tp_dir.name / f.name).symlink_to(f.resolve())
    if skew_on and skew_from is not None:
        donor = yaml.safe_load((skew_from / "meta.yaml").read_text())
        meta["skew_fit"] = donor["skew_fit"]
        for f in skew_from.glob("tp*/skew_fit.csv"):
            if (dest / f.parent.name).is_dir():
                shutil.copy(f, dest / f.parent.name / f.name)
    else:
        meta["skew_fit"] = {"enabled": False}
    (dest / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))


def end_to_end(data: Path, cache: Path, work: Path) -> list[tuple[str, str, dict]]:
    """(run, profile kind, validation report) for each ground-truth run and profile kind."""
    from analysis.validate import AICONFIGURATOR, run_validation

    measured_root = data / "llmservingsim" / "profiles"
    noskew, aic_skew = work / "measured-noskew", work / "aic-measured-skew"
    for hw_name, model_name in MEASURED:
        mdir = measured_variant_dir(data, hw_name, model_name)
        rel = Path(hw_name) / model_name / "bf16"
        _link_bundle(mdir, noskew / rel, None, False)
        gdir = None
        for tp in measured_tps(mdir):
            gdir = _derived(hw_name, model_name, tp, cache)
        assert gdir is not None
        _link_bundle(gdir, aic_skew / rel, mdir, True)
    clear_bundle_cache()
    out = []
    kinds = (("measured", measured_root), (f"aiconfigurator {PINNED_VERSION}", AICONFIGURATOR),
             ("diagnostic: measured, skew fit off", noskew),
             ("diagnostic: aiconfigurator + measured skew fit", aic_skew))
    for example, workload in GROUNDTRUTH:
        truth = data / "llmservingsim" / "groundtruth" / HARDWARE / example
        wl = data / "llmservingsim" / "workloads" / f"{workload}.jsonl"
        for kind, root in kinds:
            out.append((example, kind, run_validation(truth, wl, root).report))
            clear_bundle_cache()
    return out


def per_gpu_errors(cache: Path) -> list[ErrorRow]:
    """The roofline bundle against the aiconfigurator bundle, per system and catalog model
    (TP 1), on the layers aiconfigurator measures."""
    rows: list[ErrorRow] = []
    for hw_name, system in SYSTEMS.items():
        hw = load_hardware(hw_name)
        for model_name in list_models():
            model = load_model(model_name)
            gdir = ensure_bundle(hw, model, 1, cache=cache)
            measured_layers = {k for k, v in yaml.safe_load((gdir / "meta.yaml").read_text())
                               ["aiconfigurator"]["layers"].items() if not v.startswith("roofline")}
            rdir = roofline_bundle(hw, model, 1, cache=cache)
            for e in table_errors(gdir / "tp1", rdir / "tp1", f"{system} {model_name}"):
                if e.table == "attention" or e.item in measured_layers:
                    rows.append(e)
    return rows


#: Mixed-regime samples per measured bundle / TP of the skew check (of ~12,700 rows; the
#: ~330 pure-decode rows are all used).
SKEW_SAMPLES = 1500
SKEW_N_GROUPS = ((2, 4), (8, 16, 32), (64, 128, 256))


def skew_rows(data: Path) -> list[tuple[str, str, str, int, float, float, float]]:
    """The derived skew model against the measured bundles' skew profiles (``tp<N>/skew.csv``:
    two-level batches at 4x KV, timed on the RTX PRO 6000): per (bundle, regime, decode-count
    group) the sample count, the medians of the measured and the model's alpha, and the
    median |model - measured|. A check only: nothing of the model is fitted to these."""
    from profiles.aiconfigurator.skew import _spread, batch_alpha_terms, model_for
    from profiles.aiconfigurator.tables import AttentionShape, attention_tables, load_system
    from profiles.roofline.cost import RankShape

    system = load_system(SYSTEMS[HARDWARE])
    out = []
    for hw_name, model_name in MEASURED:
        model = load_model(model_name)
        mdir = measured_variant_dir(data, hw_name, model_name)
        for tp in measured_tps(mdir):
            s = RankShape.of(model, tp)
            tabs = attention_tables(system.name, AttentionShape(s.heads, s.kv_heads, s.head_dim,
                                                                "bfloat16"))
            sm = model_for(system.name, system.effective_bw, tabs, s.heads, s.kv_heads,
                           s.head_dim, 2.0)
            prof = pd.read_csv(mdir / f"tp{tp}" / "skew.csv")
            prof = prof[prof["skew"] == 4.0]
            mixed = prof[prof["regime"] == "mixed"]
            prof = pd.concat([prof[prof["regime"] == "pure"],  # few: all of them
                              mixed.sample(min(SKEW_SAMPLES, len(mixed)), random_state=0)])
            model_alpha = []
            for r in prof.itertuples():
                kvs = [r.kv_big if big else r.kvs for big in _spread(r.n, r.nb)]
                num, den = batch_alpha_terms(sm.grid, sm.cost, kvs, r.pc, r.kp)
                model_alpha.append(num / den if den > 0 else 0.0)
            prof = prof.assign(model=model_alpha)
            for regime in ("pure", "mixed"):
                for group in SKEW_N_GROUPS:
                    g = prof[(prof["regime"] == regime) & prof["n"].isin(group)]
                    if g.empty:
                        continue
                    out.append((f"{model_name} tp{tp}", regime,
                                "n " + "/".join(map(str, group)), len(g),
                                float(g["alpha"].median()), float(g["model"].median()),
                                float((g["model"] - g["alpha"]).abs().median())))
    return out


def render_skew(rows: list[tuple[str, str, str, int, float, float, float]]) -> str:
    lines = [
        "Derived skew alpha against the measured bundles' skew profiles (samples of "
        "`tp<N>/skew.csv`, two-level batches: a share of the decodes at 4x the KV of the "
        "rest; `pure` = decodes only, `mixed` = with a prefill chunk; "
        "alpha = (t_skewed - t_mean) / (t_max - t_mean)):",
        "",
        "| bundle | regime | decodes | samples | measured alpha (median) | derived alpha "
        r"(median) | median \|derived - measured\| |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for bundle, regime, group, n, meas, der, err in rows:
        lines.append(f"| {bundle} | {regime} | {group} | {n} | {meas:.3f} | {der:.3f} | "
                     f"{err:.3f} |")
    return "\n".join(lines) + "\n"


#: Token counts of the TP all-reduce comparison (message = tokens x hidden x 2 bytes).
COMM_TOKENS = (1, 16, 128, 1024, 2048)


def comm_rows(cache: Path) -> list[tuple[str, int, int, float, float, float, float, float]]:
    """TP2 all-reduce of Llama-3.1-8B's hidden state per system: (system, tokens, bytes,
    our analytical model over the catalog link in µs, aiconfigurator's vLLM custom all-reduce
    eager and CUDA-graph µs, NCCL µs, what a sweep now prices: the measured source of
    ``profiles.parallel.comm``)."""
    from astra_bridge import CommBackend
    from profiles.aiconfigurator.tables import custom_allreduce_table, nccl_table
    from profiles.parallel.comm import collective_source
    from profiles.parallel.latency import latency_for_instance

    model = load_model("meta-llama/Llama-3.1-8B")
    out = []
    for hw_name, system in SYSTEMS.items():
        hw = load_hardware(hw_name)
        bundle = load_bundle(roofline_bundle(hw, model, 2, cache=cache))
        kw = dict(tp=2, hardware=hw, link_bw_gbs=hw.interconnect_bw_gbs,
                  link_latency_ns=hw.interconnect_latency_ns)
        lat = latency_for_instance(bundle, model, **kw)
        src = collective_source(hw, False, CommBackend())
        now = latency_for_instance(bundle, model, **kw, collectives=src)
        eager = custom_allreduce_table(system, graph=False, version=src.allreduce_version)
        graph = custom_allreduce_table(system, graph=True, version=src.allreduce_version)
        nccl = nccl_table(system, "all_reduce")
        for tokens in COMM_TOKENS:
            nbytes = tokens * model.hidden_size * 2
            out.append((system, tokens, nbytes, lat.tp_allreduce_ns(tokens) / 1e3,
                        eager(2, nbytes), graph(2, nbytes), nccl(2, nbytes),
                        now.tp_allreduce_ns(tokens) / 1e3))
    return out


def render_comm(rows: list[tuple[str, int, int, float, float, float, float, float]]) -> str:
    lines = [
        "TP2 all-reduce of Llama-3.1-8B's hidden state (tokens x 4096 x 2 bytes): our "
        "analytical model over the catalog link (what a sweep used before), aiconfigurator's "
        "measured vLLM all-reduce (eager / CUDA graph, at the version `profiles.parallel.comm` "
        "reads) and NCCL, and what a sweep prices now (graph up to 512 tokens, eager above):",
        "",
        "| system | tokens | bytes | analytical µs | vLLM AR eager µs | vLLM AR graph µs | "
        "NCCL µs | sweep now µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system, tokens, nbytes, ours, eager, graph, nccl, now in rows:
        lines.append(f"| {system} | {tokens} | {nbytes} | {ours:.1f} | {eager:.1f} | "
                     f"{graph:.1f} | {nccl:.1f} | {now:.1f} |")
    return "\n".join(lines) + "\n"


def render_tables(errors: list[ErrorRow], steps: list[tuple[str, str, int, int]]) -> str:
    lines = [
        "Per table, `|derived/measured - 1|` over the measured grid points (signed = median "
        "of `derived/measured - 1`, + means the derived bundle is slower). Rows marked "
        "(roofline) are the roofline model's, which aiconfigurator has no table for:",
        "",
        "| bundle | table | layer / regime | rows | median % | P90 % | signed median % |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    roofline_layers = {"embedding", "layernorm", "final_layernorm", "qk_norm", "rotary_emb",
                       "act_fn", "sampler"}
    for e in errors:
        item = f"{e.item} (roofline)" if e.item in roofline_layers else e.item
        lines.append(f"| {e.bundle} | {e.table} | {item} | {e.rows} | {_pct(e.median)} | "
                     f"{_pct(e.p90)} | {_pct(e.signed_median)} |")
    pooled = pd.DataFrame([asdict(e) for e in errors])
    lines += ["", "Pooled over bundles (row-weighted mean of the per-bundle statistics):", "",
              "| table | layer / regime | median % | P90 % | signed median % |",
              "|---|---|---:|---:|---:|"]
    for (table, item), g in pooled.groupby(["table", "item"], sort=False):
        w = g["rows"] / g["rows"].sum()
        label = f"{item} (roofline)" if item in roofline_layers else item
        lines.append(f"| {table} | {label} | {_pct(float((g['median'] * w).sum()))} | "
                     f"{_pct(float((g['p90'] * w).sum()))} | "
                     f"{_pct(float((g['signed_median'] * w).sum()))} |")
    lines += ["", "Whole steps (ProfiledLatencyModel on each bundle, host I/O dropped):", "",
              "| bundle | step | measured ms | derived ms | derived/measured - 1 % |",
              "|---|---|---:|---:|---:|"]
    for bundle, label, m_ns, a_ns in steps:
        lines.append(f"| {bundle} | {label} | {m_ns / 1e6:.3f} | {a_ns / 1e6:.3f} | "
                     f"{100 * (a_ns / m_ns - 1):+.1f} |")
    rel = np.array([a / m - 1 for _, _, m, a in steps])
    lines += ["", f"Whole-step |error| over these {rel.size} steps: median "
              f"{100 * np.median(np.abs(rel)):.1f} %, max {100 * np.max(np.abs(rel)):.1f} %."]
    return "\n".join(lines) + "\n"


E2E_INTRO = ("End to end: `analysis.validate.run_validation` on each vLLM ground-truth run (300 "
             "ShareGPT requests at 10 req/s); Diff% = (sim - vLLM)/vLLM over the 15 validation "
             "metrics:")


def render_per_gpu(rows: list[ErrorRow]) -> str:
    lines = [
        "Roofline against aiconfigurator per GPU (`|roofline/aiconfigurator - 1|`, TP 1, "
        "pooled over the catalog models, row-weighted; signed + means the roofline is "
        "slower):",
        "",
        "| system | table | layer / regime | rows | median % | P90 % | signed median % |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    frame = pd.DataFrame([asdict(e) for e in rows])
    frame["system"] = frame["bundle"].str.split(" ").str[0]
    for (system, table, item), g in frame.groupby(["system", "table", "item"], sort=False):
        w = g["rows"] / g["rows"].sum()
        lines.append(f"| {system} | {table} | {item} | {int(g['rows'].sum())} | "
                     f"{_pct(float((g['median'] * w).sum()))} | "
                     f"{_pct(float((g['p90'] * w).sum()))} | "
                     f"{_pct(float((g['signed_median'] * w).sum()))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_data_dir(), help="shared data folder")
    ap.add_argument("--doc", type=Path, default=None, help="markdown file to update in place")
    ap.add_argument("--no-e2e", action="store_true", help="skip the ground-truth replays")
    ap.add_argument("--per-gpu", action="store_true",
                    help="also compare roofline with aiconfigurator on every system")
    ap.add_argument("--no-skew", action="store_true",
                    help="skip the derived skew alpha against the measured skew profiles")
    ap.add_argument("--comm", action="store_true",
                    help="also the TP2 all-reduce per system (implied by --per-gpu)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        os.environ[CACHE_ENV] = str(cache)  # validate's generated bundles go there too
        block = render_tables(all_table_errors(args.data, cache), step_errors(args.data, cache))
        if not args.no_e2e:
            block += "\n" + render_e2e(end_to_end(args.data, cache, Path(tmp) / "e2e"),
                                        E2E_INTRO, "profiles")
        if not args.no_skew:
            block += "\n" + render_skew(skew_rows(args.data))
        if args.per_gpu:
            block += "\n" + render_per_gpu(per_gpu_errors(cache))
        if args.per_gpu or args.comm:
            block += "\n" + render_comm(comm_rows(cache))
    print(block)
    if args.doc is not None:
        write_doc(args.doc, block, BEGIN, END)


if __name__ == "__main__":
    main()
