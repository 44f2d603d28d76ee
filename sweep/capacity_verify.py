"""Check fleet-sizing answers with the engine's multi-instance router.

Fleet sizing assumes that ``N`` replicas behave like ``N`` independent instances each taking
``target / N`` req/s. ``verify_fleet`` simulates the fleet as one cluster instead: the
configuration's cluster repeated ``N`` times behind the router of ``sweep.job.run_point``'s
cluster model (``cluster.router``, or the one given) under the whole target stream, ``N``
times the per-replica request count, and checks the same SLO, so the table shows whether the
chosen fleet really serves the traffic.
"""

from __future__ import annotations

import copy
from typing import Any

from analysis.slo import SloSpec
from sweep.capacity_pool import run_probe


def fleet_point(point: dict[str, Any], replicas: int, target_rate: float,
                router: str | None = None) -> dict[str, Any]:
    """``point`` as a fleet of ``replicas`` copies of its cluster at ``target_rate`` req/s."""
    fleet = copy.deepcopy(point)
    cl, wl = fleet["cluster"], fleet["workload"]
    cl["num_instances"] = int(cl.get("num_instances", 1)) * replicas
    if cl.get("num_prefill_instances"):
        cl["num_prefill_instances"] = int(cl["num_prefill_instances"]) * replicas
    if router is not None:
        cl["router"] = router
    wl["rate"] = float(target_rate)
    if wl.get("num_requests") is not None:
        wl["num_requests"] = int(wl["num_requests"]) * replicas
    return fleet


def verify_fleet(point: dict[str, Any], replicas: int, target_rate: float, spec: SloSpec,
                 router: str | None = None) -> dict[str, Any]:
    """Simulate ``replicas`` copies of ``point``'s cluster at ``target_rate`` req/s.

    Returns ``verified`` (the fleet meets ``spec``), the router, the observed SLO statistics
    (prefixed ``verify_``), the share of requests meeting every bound, the fleet's goodput
    (over the benchmark duration, drain included) and the probe's wall time.
    """
    fleet = fleet_point(point, replicas, target_rate, router)
    out = run_probe(fleet, spec.as_dict())
    return {
        "verified": bool(out["passed"]),
        "verify_router": fleet["cluster"].get("router", "least_loaded"),
        "verify_good_pct": 100.0 * out["good_fraction"],
        "verify_goodput_rps": out["goodput_rps"],
        **{f"verify_{k}": v for k, v in out["observed"].items()},
        "verify_wall_s": out["probe_wall_s"],
    }
