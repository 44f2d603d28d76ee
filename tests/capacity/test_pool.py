"""The probe pool keeps its workers bounded: probes go to a worker warm for their
configuration, a worker past its memory budget is replaced, and results carry no bookkeeping."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import pytest

from capacity.pool import _RSS_KEY, RayProbePool, configuration_key, rss_mib

REPO = Path(__file__).resolve().parents[2]


def test_configuration_key_ignores_the_workload_only():
    a = {"hardware": {"name": "h100_sxm"}, "workload": {"rate": 1.0}}
    b = {"hardware": {"name": "h100_sxm"}, "workload": {"rate": 7.5}}
    c = {"hardware": {"name": "l40s"}, "workload": {"rate": 1.0}}
    assert configuration_key("run", (a,)) == configuration_key("run", (b,))
    assert configuration_key("run", (a,)) != configuration_key("run", (c,))


def test_rss_is_read_for_this_process():
    assert rss_mib() > 10


class _Actor:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[Any] = []
        self.run = self

    def remote(self, *args: Any) -> str:
        self.calls.append(args)
        return f"{self.name}:{len(self.calls)}"


class _Ray:
    def __init__(self) -> None:
        self.killed: list[Any] = []

    def kill(self, actor: Any) -> None:
        self.killed.append(actor)


def _pool(actors: list[_Actor], budget: float) -> RayProbePool:
    """A pool over fake actors: the dispatch logic without Ray."""
    pool = RayProbePool.__new__(RayProbePool)
    pool._ray = _Ray()
    pool._actors = list(actors)
    pool._idle = deque(actors)
    pool._queue = deque()
    pool._running = {}
    pool._done = deque()
    pool._warm = {}
    pool.recycled = 0
    pool.max_worker_rss_mib = budget
    fresh = iter(_Actor(f"fresh{i}") for i in range(10))
    pool._remote = type("R", (), {"remote": staticmethod(lambda: next(fresh))})()
    return pool


def test_a_probe_goes_to_the_worker_warm_for_its_configuration():
    a, b = _Actor("a"), _Actor("b")
    pool = _pool([a, b], budget=1e9)
    h100 = {"hardware": {"name": "h100_sxm"}, "workload": {"rate": 1.0}}
    l40s = {"hardware": {"name": "l40s"}, "workload": {"rate": 1.0}}
    pool.submit("p1", h100)
    pool.submit("p2", l40s)
    assert (len(a.calls), len(b.calls)) == (1, 1)
    # both finish; b (l40s) comes back first, then a: an l40s probe still goes to b
    pool._running.clear()
    pool._idle.extend([b, a])
    pool.submit("p3", {**l40s, "workload": {"rate": 3.0}})
    assert len(b.calls) == 2 and len(a.calls) == 1
    pool.submit("p4", {**h100, "workload": {"rate": 2.0}})
    assert len(a.calls) == 2


def test_a_worker_past_its_memory_budget_is_replaced_and_the_result_kept_clean():
    a = _Actor("a")
    pool = _pool([a], budget=400.0)
    pool._idle.clear()  # a runs a probe
    kept = pool._finished(a, {"passed": True, _RSS_KEY: 120.0})
    assert kept == {"passed": True} and list(pool._idle) == [a] and pool.recycled == 0
    pool._idle.clear()
    kept = pool._finished(a, {"passed": False, _RSS_KEY: 401.0})
    assert kept == {"passed": False}
    assert pool._ray.killed == [a] and pool.recycled == 1
    assert a not in pool._actors and [x.name for x in pool._idle] == ["fresh0"]


def test_a_pool_whose_workers_never_start_releases_the_ray_it_started(monkeypatch):
    """Workers that do not become ready in time: the error reaches the caller, and the Ray
    the pool started is stopped with what it started (no pool object is left to close)."""
    import sys
    import types

    from hydra_plugins.ray_actor_launcher import ray_cluster

    calls: list[str] = []

    class _Handle:
        def __init__(self) -> None:
            self.pid = types.SimpleNamespace(remote=lambda: "ref")

    fake = types.SimpleNamespace(
        is_initialized=lambda: False,
        cluster_resources=lambda: {"CPU": 2},
        remote=lambda cls: types.SimpleNamespace(
            options=lambda **kw: types.SimpleNamespace(remote=_Handle)),
    )

    def get(refs, timeout):
        raise TimeoutError("workers not ready")

    fake.get = get
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(ray_cluster, "start_ray", lambda ray, address, kw: calls.append("start"))
    monkeypatch.setattr(ray_cluster, "release_ray",
                        lambda ray, actors, *, stop, address, known:
                        calls.append(f"release {len(actors)} stop={stop}"))
    with pytest.raises(TimeoutError, match="not ready"):
        RayProbePool(2, address="local")
    assert calls == ["start", "release 2 stop=True"]


@pytest.mark.slow
@pytest.mark.ray
def test_ray_workers_are_recycled_past_the_budget_and_probes_go_on(monkeypatch):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from capacity.schema import register

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["workload.num_requests=40", "workload.rate=4"])
    point = OmegaConf.to_container(cfg, resolve=True)
    point.pop("capacity")
    pool = RayProbePool(1, max_worker_rss_mib=1.0)  # every worker is over budget
    try:
        for key in ("first", "second"):
            pool.submit(key, point)
            done = pool.next_done()
            assert done.error is None and done.key == key
            assert _RSS_KEY not in done.value and done.value["metrics"]["completed"] == 40
        assert pool.recycled == 2
    finally:
        pool.close()
