"""The compiled core (``setup.py``: Cython builds ``engine/{request,block_pool,kv_cache,
scheduler,instance}.py`` with the types in their ``.pxd`` files) against its oracle, the same
sources interpreted (``SERVESWEEP_PURE_PYTHON=1``, ``engine/_pure.py``).

Every scenario runs twice: here (compiled) and in a subprocess that imports the engine from
its ``.py`` files; every per-request column, every step of the time series and the run's
counters must be equal. The scenarios are the stress test's (every topology, sync and async
scheduling, prefix caching with a CPU tier, tight KV caches that preempt, API-server front
ends), drawn deterministically, and, where the shared data is present, two instances priced
by a measured bundle (the compiled ``profiles.latency``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import EngineConfig, _pure
from engine.deployment import InstanceSpec
from engine.frontend import FrontEndSpec
from engine.memory import kv_capacity
from engine.simulate import simulate_cluster
from tests.conftest import shared_data_dir
from tests.engine.test_stress import BS, build, workload

REPO = Path(__file__).resolve().parents[2]
BUNDLE = shared_data_dir() / "llmservingsim" / "profiles"
COMPILED = ("engine.block_pool", "engine.cluster", "engine.frontend", "engine.instance",
            "engine.kv_cache", "engine.request", "engine.results", "engine.scheduler",
            "engine.simulate", "profiles.latency", "profiles.parallel.dp_pad",
            "profiles.parallel.latency")
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


# The stress scenarios, and the measured-bundle run where the shared data is present.
SEEDS: list[int | None] = [*range(15), *([None] if BUNDLE.is_dir() else [])]


def _bundle_run() -> tuple[list, list, dict]:
    """Two instances priced by the measured RTX PRO 6000 / Llama-3.1-8B bundle (the compiled
    ``profiles.latency``, decode spans and all), 400 ShareGPT-like requests behind API servers."""
    from profiles.bundle import load_bundle
    from profiles.catalog import load_hardware, load_model
    from profiles.latency import ProfiledLatencyModel
    from workloads import synthetic

    model = load_model("meta-llama/Llama-3.1-8B")
    hw = load_hardware("RTXPRO6000")
    bundle = load_bundle(BUNDLE, "RTXPRO6000", model.name)
    config = EngineConfig()
    cap = kv_capacity(model, hw, config)
    instances = [InstanceSpec(f"i{k}", model, hw, config,
                              ProfiledLatencyModel(bundle, model, 1), capacity=cap)
                 for k in range(2)]
    return instances, synthetic(9.0, num_requests=400, seed=3), {"frontend": FrontEndSpec()}


def run(seed: int | None) -> dict:
    """One scenario's observable results, as plain Python values (None: the bundle run)."""
    if seed is None:
        instances, reqs, kwargs = _bundle_run()
    else:
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
    for name in COMPILED:
        importlib.import_module(name)
    missing = sorted(set(COMPILED) - set(_pure.compiled_modules()))
    assert not missing, f"not compiled: {missing}; build the core with `pip install -e .`"


def test_compiled_core_equals_the_interpreted_sources():
    if not _pure.compiled_modules():
        pytest.skip("the engine is not compiled here: nothing to compare")
    oracle = _interpreted()
    for seed, expected in zip(SEEDS, oracle, strict=True):
        got = run(seed)
        what = "the bundle run" if seed is None else f"scenario {scenario(seed)}"
        for key in expected:
            assert got[key] == expected[key], f"{what}: {key} differs"


def test_a_core_older_than_its_sources_is_refused(tmp_path, monkeypatch):
    """A compiled module whose .py / .pxd changed after the build would run the old code:
    importing the engine then fails with the modules and the fix."""
    if not _pure.STAMP.is_file():
        pytest.skip("the core is not built here")
    built = json.loads(_pure.STAMP.read_text())
    stamp = tmp_path / "stamp.json"
    stamp.write_text(json.dumps({**built, "engine.kv_cache": "0" * 64}))
    monkeypatch.setattr(_pure, "STAMP", stamp)
    with pytest.raises(ImportError, match=r"engine\.kv_cache changed.*pip install -e \."):
        _pure.check_fresh()
    stamp.write_text(json.dumps(built))
    _pure.check_fresh()  # fresh: nothing raised


def test_an_extension_module_the_build_did_not_make_is_refused(tmp_path, monkeypatch):
    """A .so left from an earlier build (a module since dropped from setup.py's list) would be
    imported instead of its .py: importing the engine then fails, naming it."""
    so = importlib.machinery.EXTENSION_SUFFIXES[0]  # this interpreter's, e.g. .cpython-311-...so
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "kept.py").write_text("x = 1\n")
    (tmp_path / "engine" / f"kept{so}").write_bytes(b"")
    (tmp_path / "engine" / f"dropped{so}").write_bytes(b"")
    monkeypatch.setattr(_pure, "_ROOT", tmp_path)
    stamp = tmp_path / "stamp.json"
    stamp.write_text(json.dumps({"engine.kept": _pure.digest("engine.kept")}))
    monkeypatch.setattr(_pure, "STAMP", stamp)
    with pytest.raises(ImportError, match=r"engine\.dropped \(left over"):
        _pure.check_fresh()
    (tmp_path / "engine" / f"dropped{so}").unlink()
    _pure.check_fresh()  # only what the build made: nothing raised


if __name__ == "__main__":  # the oracle side (run under SERVESWEEP_PURE_PYTHON=1)
    results = [run(s) for s in SEEDS]
    assert not _pure.compiled_modules(), f"the oracle ran compiled: {_pure.compiled_modules()}"
    sys.stdout.buffer.write(pickle.dumps(results))
