"""The thread that owns the sweep's Ray: a launch that fails before Ray is asked for starts
none (a mistyped override ends at once, not after a Ray start and stop)."""

from __future__ import annotations

import threading

import pytest

from hydra_plugins.ray_actor_launcher import launcher as launcher_mod

pytest.importorskip("ray")


def test_the_owner_hands_its_stop_event_to_start_and_stops_after_start_returned():
    seen: list[str] = []
    begun = threading.Event()

    def start(stopping: threading.Event) -> None:
        begun.set()
        assert stopping.wait(10), "stop() never reached the start function"
        seen.append("start saw stop")

    owner = launcher_mod.RayOwner(start, lambda: seen.append("stopped"))
    assert begun.wait(10)
    owner.stop()
    owner.join()
    assert seen == ["start saw stop", "stopped"]
    owner.wait_started()  # no error to re-raise


def _launcher(calls: list[str]) -> launcher_mod.RayActorLauncher:
    from omegaconf import OmegaConf

    launcher = launcher_mod.RayActorLauncher.__new__(launcher_mod.RayActorLauncher)
    launcher.params = OmegaConf.create({"actor_options": {}, "preload": [],
                                        "ready_timeout_s": 5})
    launcher._actors = []

    def ensure_ray(ray: object) -> None:
        calls.append("ray")

    launcher._ensure_ray = ensure_ray  # type: ignore[method-assign]
    return launcher


def test_no_ray_is_started_once_the_launch_is_stopping():
    calls: list[str] = []
    stopping = threading.Event()
    stopping.set()
    _launcher(calls)._start_pool(4, stopping)
    assert calls == []


def test_no_actor_is_created_when_the_launch_stops_during_ray_start():
    calls: list[str] = []
    stopping = threading.Event()
    launcher = _launcher(calls)

    def ensure_ray(ray: object) -> None:
        calls.append("ray")
        stopping.set()  # the composition failed while ray.init ran

    launcher._ensure_ray = ensure_ray  # type: ignore[method-assign]
    launcher._start_pool(4, stopping)
    assert calls == ["ray"] and launcher._actors == []
