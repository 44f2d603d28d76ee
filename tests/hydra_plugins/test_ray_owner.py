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


TURNS = r"""
import sys, threading, time
from omegaconf import OmegaConf
from hydra_plugins.ray_actor_launcher import launcher as L

assert "ray" not in sys.modules
ray_began = threading.Event()
windows = {}

class Watch:  # notes when the import of ray begins (a meta path finder that finds nothing)
    def find_spec(self, name, path=None, target=None):
        if name == "ray" and not ray_began.is_set():
            windows["ray"] = [time.monotonic(), None]
            ray_began.set()
        return None

sys.meta_path.insert(0, Watch())
launcher = L.RayActorLauncher.__new__(L.RayActorLauncher)
launcher.params = OmegaConf.create({"actor_options": {}, "preload": [], "ready_timeout_s": 5})
launcher._actors = []
stopping = threading.Event()

def ensure_ray(ray):  # Ray is imported by now; start nothing
    windows["ray"][1] = time.monotonic()
    stopping.set()

class Recorder:
    def start(self):
        pass

def make_recorder(sweep_dir, num_jobs):  # the recorder's imports, made slow
    begin = time.monotonic()
    time.sleep(0.3)
    windows["recorder"] = [begin, time.monotonic()]
    return Recorder()

launcher._ensure_ray = ensure_ray
launcher._make_recorder = make_recorder
owner = threading.Thread(target=launcher._start_pool, args=(4, stopping))
owner.start()
assert ray_began.wait(30)
opened = {}
recorder = threading.Thread(target=launcher._open_recorder, args=(None, 4, opened))
recorder.start()
owner.join(); recorder.join()
(r0, r1), (c0, c1) = windows["ray"], windows["recorder"]
assert "recorder" in opened
print("overlap" if c0 < r1 and r0 < c1 else "turns", round(r1 - r0, 3), round(c0 - r1, 3))
"""


def test_ray_and_the_recorder_import_in_turns():
    """The recorder's imports (MLflow's stack) do not run while the ``RayOwner`` imports Ray:
    the two trees share packages with import cycles, and two threads importing such a cycle
    from both ends get a partially initialised module (see ``launcher._IMPORTING``)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", TURNS], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[0] == "turns", out.stdout
