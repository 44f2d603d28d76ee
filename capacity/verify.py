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
from capacity.pool import run_probe


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


def verify_fleet(point: dict[str, Any], replicas: int, target_rate: float,
                 router: str | None = None) -> dict[str, Any]:
    """Simulate ``replicas`` copies of ``point``'s cluster at ``target_rate`` req/s, checked
    against the point's ``slo`` (the study's).

    Returns ``verified`` (the fleet meets the SLO), the router, the observed SLO statistics,
    the share of good requests, goodput and the fleet's measured cost per 1M output tokens
    (``analysis.cost``, over the cluster run's own steady-state window), each prefixed
    ``verify_``, and the probe's wall time.
    """
    fleet = fleet_point(point, replicas, target_rate, router)
    out = run_probe(fleet)
    m = out["metrics"]
    spec = SloSpec.from_config(point["slo"])
    return {
        "verified": bool(out["passed"]),
        "verify_router": fleet["cluster"].get("router", "least_loaded"),
        "verify_good_pct": m["slo_attainment_pct"],
        "verify_goodput_rps": m["goodput_rps"],
        "verify_usd_per_m_output_tokens": m["usd_per_m_output_tokens"],
        **{f"verify_{b.key}": m[b.key] for b in spec.bounds},
        "verify_wall_s": out["probe_wall_s"],
    }
