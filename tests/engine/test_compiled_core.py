"""The compiled core (``setup.py``: Cython builds ``engine/{request,block_pool,kv_cache,
scheduler,instance}.py`` with the types in their ``.pxd`` files) against its oracle, the same
sources interpreted (``SERVESWEEP_PURE_PYTHON=1``, ``engine/_pure.py``).

Every scenario runs twice: here (compiled) and in a subprocess that imports the engine from
its ``.py`` files; every per-request column, every step of the time series and the run's
counters must be equal. The scenarios are the stress test's (every topology, sync and async
scheduling, prefix caching with a CPU tier, tight KV caches that preempt, API-server front
ends), drawn deterministically.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import _pure
from engine.frontend import FrontEndSpec
from engine.simulate import simulate_cluster
from tests.engine.test_stress import BS, build, workload

REPO = Path(__file__).resolve().parents[2]
COMPILED = ("block_pool", "instance", "kv_cache", "request", "scheduler")
TOPOLOGIES = ("single", "router", "pd", "dp", "pp")
ROUTERS = ("round_robin", "least_loaded", "random", "prefix_aware")


def scenario(seed: int) -> dict:
    """The stress test's settings, drawn from ``seed`` (topologies in turn)."""
    rng = random.Random(seed)
    chunked = rng.random() < 0.7
    caching = rng.random() < 0.7
    return {
        "seed": seed,
        "topology": TOPOLOGIES[seed % len(TOPOLOGIES)],
        "router": rng.choice(ROUTERS),
        "async_scheduling": rng.random() < 0.6,
        "reserve_full_isl": rng.random() < 0.5,
        "chunked": chunked,
        "threshold": rng.choice([0, 0, 32, 200]) if chunked else 0,
        "caching": caching,
        "cpu_tier": caching and rng.random() < 0.4,
        "max_num_seqs": rng.randint(1, 24),
        "budget": rng.choice([32, 64, 256, 600]),
        "slack_blocks": rng.randint(0, 40),
        "num_requests": rng.randint(120, 240),
        "frontend": seed % 4 == 3,
    }


SEEDS = range(15)


def run(seed: int) -> dict:
    """One scenario's observable results, as plain Python values."""
    sc = scenario(seed)
    rng = random.Random(sc["seed"])
    max_len = rng.choice([512, 1024])
    reqs = workload(rng, sc["num_requests"], max_len)
    need = max(-(-(r.prompt_len + r.output_len) // BS) for r in reqs) + 1
    instances, kwargs, _ = build(sc, max_len, need)
    if sc["frontend"]:
        kwargs["frontend"] = FrontEndSpec(output_token_us=400.0, ipc_us=30.0)
    res = simulate_cluster(instances, reqs, **kwargs)
    frame = {
        c: [list(v) if isinstance(v, np.ndarray | list) else v for v in res.requests[c]]
        for c in res.requests.columns
    }
    return {
        "requests": frame,
        "timeseries": res.timeseries.to_dict("list"),
        "num_steps": res.num_steps,
        "num_preemptions": res.num_preemptions,
        "makespan_ns": res.makespan_ns,
        "prefix": (res.prefix_hit_tokens, res.prefix_cache_queries, res.prefix_cache_hits),
        "tier_stats": res.tier_stats,
    }


def _interpreted() -> list[dict]:
    env = {**os.environ, _pure.ENV: "1"}
    out = subprocess.run(
        [sys.executable, "-m", "tests.engine.test_compiled_core"],
        cwd=REPO, env=env, check=True, capture_output=True,
    ).stdout
    return pickle.loads(out)


def test_the_engine_runs_compiled():
    """``pip install -e .`` built the core; without it the engine runs interpreted, slowly."""
    if _pure.requested():
        pytest.skip(f"{_pure.ENV} is set: the interpreted engine is under test")
    import engine.instance  # noqa: F401  (all five modules, through their imports)

    missing = sorted(set(f"engine.{m}" for m in COMPILED) - set(_pure.compiled_modules()))
    assert not missing, f"not compiled: {missing}; build the core with `pip install -e .`"


def test_compiled_core_equals_the_interpreted_sources():
    if not _pure.compiled_modules():
        pytest.skip("the engine is not compiled here: nothing to compare")
    oracle = _interpreted()
    for seed, expected in zip(SEEDS, oracle, strict=True):
        got = run(seed)
        for key in expected:
            assert got[key] == expected[key], f"scenario {scenario(seed)}: {key} differs"


if __name__ == "__main__":  # the oracle side (run under SERVESWEEP_PURE_PYTHON=1)
    assert not _pure.compiled_modules(), "the oracle must run interpreted"
    sys.stdout.buffer.write(pickle.dumps([run(s) for s in SEEDS]))
