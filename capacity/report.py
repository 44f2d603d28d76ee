"""``python -m capacity.report <study dir>``: a self-contained HTML report of a capacity study.

Reads what ``python -m sweep.capacity`` wrote (``capacity.parquet``, ``probes.parquet``,
``study.json`` and, after fleet sizing, ``fleet.parquet``), draws the plots into
``<dir>/plots/`` (cost Pareto front, throughput vs interactivity, latency vs load per
configuration) and writes ``<dir>/report.html`` with the tables and the plots embedded as
base64 PNGs, so the one file can be mailed or committed. Everything on the page, the header
included, is generated from what the run wrote (its resolved configurations, SLO, workload,
search settings and results), never from fixed text.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.cost import WARMUP_FRACTION
from capacity.plots import interactivity_png, latency_file, latency_vs_load_png, pareto_png
from engine.specs import ConfigError

ANSWER_COLUMNS = {
    "config": "configuration",
    "status": "status",
    "max_rate": "max rate (req/s)",
    "rel_gap": "bracket gap",
    "probes": "probes",
    "cached_probes": "from cache",
    "num_gpus": "GPUs",
    "usd_per_hour": "USD/hour",
    "goodput_rps": "goodput (req/s)",
    "slo_attainment_pct": "% requests good",
    "good_output_tok_s": "good out tok/s",
    "tok_s_per_gpu": "good out tok/s/GPU",
    "tok_s_per_user": "out tok/s/user",
    "usd_per_m_output_tokens": "USD / 1M out tokens",
    "bundle_source": "latencies from",
    "comm_source": "collectives from",
}
FLEET_COLUMNS = {
    "rank": "rank", "config": "configuration", "replicas": "replicas", "num_gpus": "GPUs",
    "usd_per_hour": "USD/hour", "usd_per_m_output_tokens": "USD / 1M out tokens",
    "capacity_rps": "capacity (req/s)", "utilization": "utilisation",
    "verified": "meets SLO as one cluster",
}
VERIFY_LABELS = {
    "verify_good_pct": "% requests meeting SLO (cluster)",
    "verify_goodput_rps": "goodput req/s (cluster)",
    "verify_usd_per_m_output_tokens": "USD / 1M out tokens (cluster)",
    "verify_error": "check failed",
}
WINDOW_TEXT = (f"requests arriving after the first {100 * WARMUP_FRACTION:g} % of the arrival "
               "span and before the last arrival, so warm-up and drain are left out; "
               "analysis/cost.py")
CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;
padding:4px 8px;text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
tr.best td{background:#eef7ee}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
code{background:#f5f5f5;padding:1px 4px}dl{display:grid;grid-template-columns:max-content auto;
gap:2px 12px}dt{font-weight:600}"""


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "∞"
        return f"{value:.4g}"
    return html.escape(str(value))


def _table(frame: pd.DataFrame, columns: dict[str, str], best_first: bool = False) -> str:
    cols = [c for c in columns if c in frame.columns]
    head = "".join(f"<th>{html.escape(columns[c])}</th>" for c in cols)
    rows = []
    for i, row in enumerate(frame[cols].itertuples(index=False)):
        cls = ' class="best"' if best_first and i == 0 else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{_fmt(v)}</td>" for v in row) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _img(data: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def load_study(study_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None, dict[str, Any]]:
    """The study's answers, probes, fleet (or ``None``) and metadata."""
    needed = [study_dir / "capacity.parquet", study_dir / "probes.parquet", study_dir / "study.json"]
    missing = [p.name for p in needed if not p.is_file()]
    if missing:
        raise ConfigError(
            f"{study_dir} is not a capacity study directory (missing {missing}); give the "
            "output directory of `python -m sweep.capacity`, e.g. outputs/capacity_search/<timestamp>"
        )
    fleet_path = study_dir / "fleet.parquet"
    fleet = pd.read_parquet(fleet_path) if fleet_path.is_file() else None
    meta = json.loads((study_dir / "study.json").read_text())
    return pd.read_parquet(needed[0]), pd.read_parquet(needed[1]), fleet, meta


def render(study_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw the plots into ``<dir>/plots`` and write the HTML report; return its path."""
    study_dir = Path(study_dir)
    answers, probes, fleet, meta = load_study(study_dir)
    plots_dir = study_dir / "plots"
    plots_dir.mkdir(exist_ok=True)
    bounds = dict(meta["slo"]["bounds"])
    study = meta.get("study", {})
    name = str(study.get("name", study_dir.name))
    pngs: dict[str, bytes] = {"pareto.png": pareto_png(answers, f"{name}: {meta['slo_text']}")}
    if "tpot_ms_median" in probes.columns and len(probes):
        pngs["interactivity.png"] = interactivity_png(probes, list(answers["config"]))
    for row in answers.itertuples(index=False):
        part = probes[probes["config"] == row.config] if len(probes) else probes
        pngs[latency_file(row.config)] = latency_vs_load_png(
            part, bounds, float(row.max_rate), f"{row.config}: {meta['slo_text']}")
    for file, data in pngs.items():
        (plots_dir / file).write_bytes(data)
    body = [f"<h1>Capacity study: {html.escape(name)}</h1>",
            f"<p>{html.escape(headline(answers, meta))}</p>"]
    body.append(_summary(answers, meta))
    body.append("<h2>Max sustained rate per configuration</h2>")
    body.append("<p>The largest arrival rate (requests/s, per replica) at which the run met the "
                "SLO, found by bracketing and bisection; the bracket gap is hi/lo − 1 of the "
                "final bracket. Goodput, cost and per-GPU figures are those of the probe at the "
                "answer rate, the same numbers its MLflow run holds. USD per 1M output tokens "
                "is USD/hour over the output tokens per hour of the requests that met the SLO, "
                f"over the steady-state window ({html.escape(WINDOW_TEXT)}).</p>")
    ranked = answers.sort_values("usd_per_m_output_tokens", kind="stable")
    body.append(_table(ranked, ANSWER_COLUMNS))
    slo_cols = {k: f"{k} at max rate (bound {bounds[k]:g})" for k in sorted(bounds)
                if k in answers.columns}
    if slo_cols:
        body.append(_table(ranked, {"config": "configuration", **slo_cols}))
    if fleet is not None:
        body.append(f"<h2>Cheapest fleet for {_fmt(meta.get('target_rate'))} req/s</h2>")
        body.append("<p>Replicas are independent instances each taking an equal share of the "
                    "traffic (a Poisson stream split at random stays Poisson), so a "
                    "configuration sustaining <i>r</i> req/s needs ⌈target / <i>r</i>⌉ replicas. "
                    "Rank 1 is the answer, the rest are the runner-ups. Each replica is taken "
                    "to yield the good output tokens per request measured at its max rate, so "
                    "a fleet's USD per 1M output tokens is its configuration's divided by the "
                    "fleet's utilisation. Where the last columns "
                    "are filled, the fleet was also simulated as one cluster: all replicas "
                    f"behind the engine's {html.escape(str(_router(fleet)))} router under the "
                    "whole target stream, checked against the same SLO.</p>")
        verify_cols = {c: VERIFY_LABELS.get(c, c.removeprefix("verify_") + " (cluster)")
                       for c in fleet.columns
                       if c.startswith("verify_") and c not in ("verify_router", "verify_wall_s")}
        body.append(_table(fleet, {**FLEET_COLUMNS, **verify_cols}, best_first=True) if len(fleet) else
                    "<p><b>No configuration serves the target within the replica limit.</b></p>")
    body.append("<h2>Cost vs sustained rate</h2>" + _img(pngs["pareto.png"], "Pareto plot"))
    if "interactivity.png" in pngs:
        body.append("<h2>Throughput per GPU vs per user</h2>"
                    + _img(pngs["interactivity.png"], "throughput vs interactivity"))
    body.append("<h2>Latency vs load</h2>")
    for row in answers.itertuples(index=False):
        body.append(f"<h3>{html.escape(row.config)}</h3>"
                    + _img(pngs[latency_file(row.config)], f"latency vs load, {row.config}"))
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(name)}"
            f"</title><style>{CSS}</style></head><body>{''.join(body)}</body></html>")
    path = Path(out) if out else study_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def _router(fleet: pd.DataFrame) -> str:
    if "verify_router" not in fleet.columns:
        return "(none)"
    names = fleet["verify_router"].dropna().unique()
    return ", ".join(map(str, names)) or "(none)"


def _values(column: pd.Series) -> str:
    return ", ".join(str(v) for v in dict.fromkeys(column.dropna().tolist()))


def headline(answers: pd.DataFrame, meta: dict[str, Any]) -> str:
    """One sentence saying what the run was, from its own outputs: the model, the accelerator
    types and TP degrees of the configurations actually searched, the SLO, the profiles and
    the fleet target."""
    hardware = answers["hardware"] if "hardware" in answers else pd.Series(dtype=object)
    tps = answers["tensor_parallel_size"] if "tensor_parallel_size" in answers \
        else pd.Series(dtype=object)
    n_hw = hardware.nunique()
    text = (f"Max sustained rate of {meta.get('model', '?')} within {meta['slo_text']} for "
            f"{len(answers)} configuration{'s' if len(answers) != 1 else ''}: "
            f"{n_hw} accelerator type{'s' if n_hw != 1 else ''} ({_values(hardware)}) at TP "
            f"{_values(tps)}")
    if meta.get("profiles"):
        text += f", on {', '.join(meta['profiles'])} profiles"
    if meta.get("target_rate"):
        text += f"; and the cheapest fleet serving {_fmt(float(meta['target_rate']))} req/s"
    return text + "."


def _summary(answers: pd.DataFrame, meta: dict[str, Any]) -> str:
    s = meta.get("settings", {})
    wl = meta.get("workload", {})
    counts = answers.loc[answers["probes"] > 0, "probes"]
    grid = meta.get("grid") or {}
    items = {
        "model": meta.get("model", ""),
        "SLO": meta["slo_text"],
        "grid": "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in grid.items()) or "(none)",
        "workload": f"{wl.get('kind', '')}, {wl.get('num_requests') or wl.get('duration_s')} "
                    f"{'requests' if wl.get('num_requests') else 's'}, {wl.get('arrival', '')} "
                    f"arrivals, input {wl.get('input_len')}, output {wl.get('output_len')}, "
                    f"seed {wl.get('seed')}",
        "cost window": WINDOW_TEXT,
        "search": f"tolerance {100 * float(s.get('tolerance', math.nan)):g} %, growth "
                  f"{s.get('growth')}, start {s.get('initial_rate') or 'saturation probe'}",
        "probes": f"{meta.get('probes_total')} ({meta.get('probes_simulated')} simulated, rest "
                  f"from cache); per configuration mean {counts.mean():.1f}, max "
                  f"{int(counts.max()) if len(counts) else 0}",
        "wall time": f"search {meta.get('search_wall_s', math.nan):.1f} s on "
                     f"{meta.get('pool_size')} workers"
                     + (f"; whole command {meta['total_wall_s']:.1f} s (Ray and profile set-up, "
                        "MLflow, fleet checks)" if "total_wall_s" in meta else ""),
        "common overrides": " ".join(meta.get("common_overrides", [])),
    }
    description = (meta.get("study") or {}).get("description")
    if description:
        items["study description"] = str(description)
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>"
                   for k, v in items.items())
    return f"<dl>{rows}</dl>"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m capacity.report",
                                     description="HTML report of a capacity study")
    parser.add_argument("study_dir", help="output directory of python -m sweep.capacity")
    parser.add_argument("--out", help="HTML file to write (default <study_dir>/report.html)")
    args = parser.parse_args(argv)
    try:
        path = render(args.study_dir, args.out)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
