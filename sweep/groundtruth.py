"""Log a real vLLM run (a ground-truth directory) as an MLflow run beside the simulated ones.

The run carries the same metric names as a simulated point (``analysis.answers`` on the
vLLM per-request records: the metrics, the verdict and goodput under the study's ``slo``)
and the same ``ts/*`` step metrics, so the MLflow UI can chart simulation and vLLM side by
side. Cost is left out: the ground truth records no price.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from analysis.answers import point_answers
from analysis.groundtruth import engine_settings, load_groundtruth
from analysis.slo import SloSpec
from sweep.tracking import chart_series
from sweep.validate import resolve_path

# vLLM time-series columns -> the simulator's names.
SERIES = {
    "running": "running",
    "waiting": "waiting",
    "kv_cache_pct": "kv_usage_pct",
    "prompt_throughput": "prompt_throughput",
    "gen_throughput": "gen_throughput",
}


def recorded_series(ts: Any) -> tuple[dict[str, list[float]], list[str]]:
    """The vLLM time series under the simulator's names, and the columns left out as not
    recorded: absent, or zero in every row of a run that had requests running (the recorder
    read an attribute that did not exist, as LLMServingSim's did for ``kv_cache_pct``; a
    real KV usage is never 0 % while requests run)."""
    series, missing = {}, []
    busy = "running" in ts and bool((ts["running"] > 0).any())
    for theirs, ours in SERIES.items():
        if theirs not in ts:
            missing.append(ours)
        elif theirs == "kv_cache_pct" and busy and bool((ts[theirs] == 0).all()):
            missing.append(f"{ours} (zero in every row: not recorded)")
        else:
            series[ours] = ts[theirs].tolist()
    return series, missing


def groundtruth_metrics(gt_dir: str, slo: DictConfig) -> tuple[Any, dict[str, float]]:
    """The loaded ground truth and its metrics (analysis metrics, SLO verdict, goodput)
    under ``slo`` (the ``slo:`` config node)."""
    gt, answers = _answers(gt_dir, slo)
    return gt, answers.metrics


def _answers(gt_dir: str, slo: DictConfig) -> tuple[Any, Any]:
    gt = load_groundtruth(resolve_path(gt_dir))
    # The shared runs are timed at the engine core (queued_ts): its clock, not the client's.
    return gt, point_answers(gt.requests, SloSpec.from_config(slo), view="engine")


def log_groundtruth_run(tracker: Any, gt_dir: str, slo: DictConfig, parent_id: str | None, *,
                        max_steps: int | None) -> tuple[str, dict[str, float]]:
    """Create the ``vllm-groundtruth`` run; return its id and metrics. Its ``ts/`` series
    are bounded to ``max_steps`` as the simulated runs' are (``tracking.timeseries_steps``,
    ``sweep.tracking.chart_series``)."""
    gt, answers = _answers(gt_dir, slo)
    metrics = answers.metrics
    run_id = tracker.create_run(
        "vllm-groundtruth",
        tags={"source": "vllm", "groundtruth_dir": str(gt.path)},
        parent_id=parent_id,
    )
    # The simulated runs' param names: cluster.<vLLM setting>, hardware.name, model.name.
    params: dict[str, Any] = {f"cluster.{k}": v for k, v in engine_settings(gt).items()}
    first = gt.cluster.nodes[0].instances[0]
    params["hardware.name"] = first.hardware
    params["model.name"] = str(gt.meta.get("model") or first.model_name)
    params["groundtruth.dir"] = str(gt.path)
    params["vllm_version"] = str(gt.meta.get("vllm_version", "unknown"))
    params.update(answers.params)  # the SLO bounds, named as in the simulated runs
    tracker.log_params(run_id, params)
    tracker.log_metrics(run_id, metrics)
    ts = gt.timeseries
    steps = [int(round(t)) for t in ts["t"]] if "t" in ts else []
    series, missing = recorded_series(ts)
    if missing:
        tracker.set_tags(run_id, {"missing_series": ",".join(missing)})
    if series and len(set(steps)) == len(steps):
        order = sorted(range(len(steps)), key=steps.__getitem__)  # in time order for binning
        series = {k: [col[i] for i in order] for k, col in series.items()}
        tracker.log_series(run_id, *chart_series(series, [steps[i] for i in order], max_steps))
    tracker.log_artifact(run_id, gt.path / "vllm" / "meta.json")
    tracker.finish(run_id, "FINISHED")
    return run_id, metrics
