"""Every answer about one run, computed once: metrics, the SLO verdict, goodput and cost.

``point_answers`` turns a per-request frame into the ``params`` (the SLO bounds, named
``slo.<key>.bound``) and ``metrics`` (``analysis.metrics.METRIC_KEYS``, the SLO verdict and
observed statistics of ``analysis.slo.SloReport.metrics``, and with a price the cost figures
of ``analysis.cost.cost_metrics``) that sweeps, the capacity search and the vLLM ground-truth
run all log and tabulate. One ``per_request`` pass on the client's clock feeds all of them
(``view="client"``: what ``vllm bench serve`` measures); the engine-side latencies are logged
beside them as ``engine_<metric>`` (``ENGINE_METRIC_KEYS``) where the table records both.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis.cost import cost_metrics
from analysis.metrics import LATENCY_METRICS, STATISTICS, VIEWS, per_request, run_metrics
from analysis.slo import SloReport, SloSpec, evaluate

# The engine's own latencies (from its receipt of a request), logged beside the client's.
ENGINE_METRIC_KEYS = tuple(f"engine_{m}_ms_{s}" for m in LATENCY_METRICS for s in STATISTICS)


@dataclass(frozen=True)
class PointAnswers:
    """The params and metrics to record for one run, and its SLO report."""

    params: dict[str, float]
    metrics: dict[str, float]
    slo: SloReport


def point_answers(requests: pd.DataFrame, spec: SloSpec, usd_per_hour: float | None = None,
                  num_gpus: int | None = None, view: str = "client") -> PointAnswers:
    """The answers of one run on ``view``'s clock (``analysis.metrics.VIEWS``: a ground truth
    timed at the engine is read with ``view="engine"``); cost figures only when
    ``usd_per_hour`` and ``num_gpus`` are given. Metrics are plain floats (NaN where undefined,
    never inf)."""
    pm = per_request(requests, view)
    report = evaluate(pm, spec)
    metrics = {k: float(v) for k, v in run_metrics(pm).items()}
    if view == "client" and all(c in requests.columns for c in VIEWS["engine"][:3]):
        engine = run_metrics(per_request(requests, "engine"))
        metrics.update({k: float(engine[k.removeprefix("engine_")]) for k in ENGINE_METRIC_KEYS})
    metrics.update(report.metrics())
    if usd_per_hour is not None and num_gpus is not None:
        metrics.update(cost_metrics(pm, report.good, usd_per_hour, num_gpus))
    return PointAnswers(spec.params(), metrics, report)
