"""Check fleet-sizing answers with the engine's multi-instance router.

Fleet sizing assumes that ``N`` replicas behave like ``N`` independent instances each taking
``target / N`` req/s. ``verify_fleet`` simulates the fleet as one cluster instead: ``N``
identical instances behind ``engine.simulate_cluster``'s router (``least_loaded`` by
default) under the whole target stream, ``N`` times the per-replica request count, and
checks the same SLO, so the table shows whether the chosen fleet really serves the traffic.
"""

from __future__ import annotations

import copy
from typing import Any

from omegaconf import OmegaConf

from analysis.slo import SloSpec, evaluate
from engine.simulate import InstanceSpec, simulate_cluster
from sweep.job import build_workload, engine_config, hardware_spec, latency_model, model_spec


def verify_fleet(point: dict[str, Any], replicas: int, target_rate: float, spec: SloSpec,
                 router: str = "least_loaded") -> dict[str, Any]:
    """Simulate ``replicas`` copies of ``point``'s instance at ``target_rate`` req/s.

    Returns ``verified`` (the fleet meets ``spec``), the observed SLO statistics (prefixed
    ``verify_``), the share of requests meeting every bound, the fleet's goodput (over the
    benchmark duration, drain included) and the simulation's wall time.
    """
    fleet_point = copy.deepcopy(point)
    wl = fleet_point["workload"]
    wl["rate"] = float(target_rate)
    if wl.get("num_requests") is not None:
        wl["num_requests"] = int(wl["num_requests"]) * replicas
    cfg = OmegaConf.create(fleet_point)
    model, hw = model_spec(cfg.model.name), hardware_spec(cfg.hardware.name)
    bundle = cfg.hardware.bundle
    latency = latency_model(bundle.source, bundle.root, bundle.variant, hw.name, model.name,
                            cfg.cluster.tensor_parallel_size)
    engine = engine_config(cfg)
    instances = [InstanceSpec(f"replica{i}", model, hw, engine, latency) for i in range(replicas)]
    result = simulate_cluster(instances, build_workload(cfg, model), router=router,
                              seed=int(cfg.workload.seed))
    report = evaluate(result.requests, spec)
    return {
        "verified": report.passed,
        "verify_router": router,
        "verify_good_pct": 100.0 * report.good_fraction,
        "verify_goodput_rps": report.goodput_rps,
        **{f"verify_{k}": v for k, v in report.observed.items()},
        "verify_wall_s": float(result.wall_s),
    }
