"""The sweep's Ray listens on loopback only: socket discovery from /proc, ``start_ray``'s
refusals, and a real ``python -m sweep ... -m`` watched from outside while it runs."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hydra_plugins.ray_actor_launcher import ray_cluster
from hydra_plugins.ray_actor_launcher.ray_cluster import (
    listening_sockets,
    non_loopback_listeners,
    process_tree,
)

# Hydra's plugin scan re-executes plugin modules in place: take the error class and the
# function from the module at call time, not from an import made before the scan.


def start_ray(*args, **kwargs):
    return ray_cluster.start_ray(*args, **kwargs)

REPO = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


def test_decode_proc_addresses():
    assert ray_cluster._decode_address("0100007F") == "127.0.0.1"
    assert ray_cluster._decode_address("00000000") == "0.0.0.0"
    mapped = ray_cluster._decode_address("0000000000000000FFFF00000100007F")
    assert ipaddress.ip_address(mapped) == ipaddress.ip_address("::ffff:127.0.0.1")
    assert ray_cluster._decode_address("00000000000000000000000001000000") == "::1"


@linux_only
def test_listeners_of_this_process_by_address():
    with socket.socket() as lo, socket.socket() as wide:
        lo.bind(("127.0.0.1", 0))
        lo.listen()
        wide.bind(("0.0.0.0", 0))
        wide.listen()
        mine = listening_sockets([os.getpid()])
        assert (os.getpid(), "127.0.0.1", lo.getsockname()[1]) in mine
        assert (os.getpid(), "0.0.0.0", wide.getsockname()[1]) in mine
        exposed = non_loopback_listeners()
        assert [(h, p) for _, h, p in exposed] == [("0.0.0.0", wide.getsockname()[1])]


@linux_only
def test_process_tree_holds_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert {os.getpid(), child.pid} <= process_tree(os.getpid())
    finally:
        child.kill()
        child.wait()


def _stand_in(script: str) -> subprocess.Popen:
    """A sleeping process named as Ray names its Python processes: the script's path under
    the installed ray package is in its command line."""
    path = os.fsdecode(ray_cluster.ray_package_dir()) + "/" + script
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", path])


def _wait_listed(*procs: subprocess.Popen) -> None:
    deadline = time.monotonic() + 10
    while not ({p.pid for p in procs} <= set(ray_cluster.ray_processes())):
        assert time.monotonic() < deadline, "the stand-ins never showed up in /proc"
        time.sleep(0.01)


@linux_only
def test_a_reused_pid_is_not_killed():
    """The leftovers' sweep kills a recorded pid only while it is the process recorded: the
    same start time (a pid may be reused by another process during a sweep)."""
    worker = _stand_in("_private/workers/default_worker.py")
    try:
        _wait_listed(worker)
        ident = ray_cluster.process_identity(worker.pid)
        assert ident is not None
        later = ray_cluster.RayProcess(ident.name, ident.started + 1)  # same pid, another start
        assert ray_cluster._sigkill({worker.pid: later}) == 0
        assert ray_cluster.alive({worker.pid: later}) == {}
        assert worker.poll() is None
        assert ray_cluster.kill_ray_processes({worker.pid: ident}) == 1
        assert worker.wait(timeout=10) == -9
        assert ray_cluster.alive({worker.pid: ident}) == {}
    finally:
        worker.kill()
        worker.wait()


@linux_only
def test_a_renamed_worker_is_still_killed():
    """Ray's workers rename themselves while they run a task (``ray::JobRunner`` and
    ``ray::JobRunner.``): a worker recorded under one name and found under the other is the
    same process, still alive and still killed."""
    worker = _stand_in("_private/workers/default_worker.py")
    try:
        _wait_listed(worker)
        ident = ray_cluster.process_identity(worker.pid)
        assert ident is not None
        renamed = ray_cluster.RayProcess(ident.name + ".", ident.started)
        assert ray_cluster.alive({worker.pid: renamed}) == {worker.pid: renamed}
        assert ray_cluster._sigkill({worker.pid: renamed}) == 1
        assert worker.wait(timeout=10) == -9
    finally:
        worker.kill()
        worker.wait()


class _Actors:
    """``ray`` for ``release_ray``: records kills (which may fail) and shutdowns."""

    def __init__(self, kill_fails: bool = False) -> None:
        self.calls: list[str] = []
        self.kill_fails = kill_fails

    def kill(self, actor):
        self.calls.append(f"kill {actor}")
        if self.kill_fails:
            raise RuntimeError("the cluster is gone")

    def shutdown(self):
        self.calls.append("shutdown")


def test_release_ray_stops_a_local_ray_with_its_leftovers(monkeypatch, caplog):
    stopped = []
    monkeypatch.setattr(ray_cluster, "stop_ray", lambda ray, known: stopped.append(known) or 2)
    fake = _Actors(kill_fails=True)  # a dead cluster: the kills fail, the stop still runs
    known = {7: ray_cluster.RayProcess("raylet", 1)}
    ray_cluster.release_ray(fake, ["a", "b"], stop=True, address="local", known=known)
    assert fake.calls == ["kill a", "kill b"] and stopped == [known]
    assert "killed 2 Ray process(es) left after shutdown" in caplog.text


def test_release_ray_only_disconnects_from_a_cluster(monkeypatch):
    monkeypatch.setattr(ray_cluster, "stop_ray", lambda *a: pytest.fail("a cluster's Ray"))
    fake = _Actors()
    ray_cluster.release_ray(fake, ["a"], stop=True, address="auto", known={})
    assert fake.calls == ["kill a", "shutdown"]
    fake = _Actors()
    ray_cluster.release_ray(fake, ["a"], stop=False, address="local")
    assert fake.calls == ["kill a"]


class FakeRay:
    """Records ``init``/``shutdown``; reports ``node_ip`` as the node address."""

    def __init__(self, node_ip: str, init_fails: bool = False) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.util = SimpleNamespace(get_node_ip_address=lambda: node_ip)
        self.init_fails = init_fails

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        if self.init_fails:
            raise ValueError("bad argument")

    def shutdown(self):
        self.calls.append(("shutdown", {}))


class FakeNode:
    """Ray's head node as ``start_ray`` drives it: its parameters (which must be
    ``RayParams``'s) and how it was stopped."""

    def __init__(self, isolation, **params) -> None:
        from ray._private.parameter import RayParams

        RayParams(**params)  # a misspelt field raises here
        self.isolation = dict(isolation)
        self.params = params
        self.address = "127.0.0.1:6379"
        self.stops: list[str] = []

    def destroy_external_storage(self) -> None:
        self.stops.append("storage")

    def kill_all_processes(self, check_alive: bool, allow_graceful: bool) -> None:
        assert check_alive is False
        self.stops.append("graceful" if allow_graceful else "kill")


@pytest.fixture
def nodes(monkeypatch):
    """The nodes ``start_ray`` starts (none really started); no private node left after."""
    started: list[FakeNode] = []

    def start_local_node(isolation, **params):
        started.append(FakeNode(isolation, **params))
        return started[-1]

    monkeypatch.setattr(ray_cluster, "start_local_node", start_local_node)
    monkeypatch.setattr(ray_cluster, "kill_ray_processes", lambda known: 0)
    monkeypatch.setattr(ray_cluster, "_local_node", None)  # and back to it after the test
    yield started


def test_local_ray_is_a_node_without_monitors_that_the_driver_joins(nodes):
    fake = FakeRay("127.0.0.1")
    start_ray(fake, "local", {"num_cpus": 2, "object_store_memory": 100, "_temp_dir": "/t",
                              "namespace": "ns", "object_spilling_directory": "/s",
                              "system_reserved_cpu": 0.5}, {"env_vars": {"A": "1"}})
    (node,) = nodes
    assert node.params == {"node_ip_address": "127.0.0.1", "no_monitor": True,
                           "include_log_monitor": False, "num_cpus": 2,
                           "object_store_memory": 100, "temp_dir": "/t",
                           "object_spilling_directory": "/s", "include_dashboard": False,
                           "dashboard_port": None}
    assert node.isolation == {"system_reserved_cpu": 0.5}
    # the node's arguments went to the node; the driver's own (and the temp dir) to ray.init
    assert fake.calls == [("init", {"address": "127.0.0.1:6379", "namespace": "ns",
                                    "_temp_dir": "/t", "log_to_driver": False,
                                    "runtime_env": {"env_vars": {"A": "1"}}})]
    assert ray_cluster._local_node is node
    assert ray_cluster.stop_ray(fake) == 0
    assert fake.calls[-1] == ("shutdown", {}) and node.stops == ["storage", "graceful"]
    assert ray_cluster._local_node is None
    ray_cluster.stop_ray(fake)  # a second stop has no node left to stop
    assert node.stops == ["storage", "graceful"]


def test_node_args_are_ray_inits_and_ray_params():
    """Each argument taken for the node is one ray.init takes (named, or one of its hidden
    ``kwargs.pop``s), and each goes to a ``RayParams`` field of ray.init's local start."""
    import inspect

    import ray
    from ray._private.parameter import RayParams

    named = inspect.signature(ray.init).parameters
    source = inspect.getsource(ray.init)
    fields = inspect.signature(RayParams).parameters
    for arg, field in ray_cluster.NODE_ARGS.items():
        assert arg in named or re.search(rf'kwargs\.pop\(\s*"{arg}"', source), arg
        assert field in fields, field
    for arg in ray_cluster.RESOURCE_ISOLATION_ARGS:
        assert arg in named, arg


def test_a_left_node_is_stopped_before_the_next(nodes):
    start_ray(FakeRay("127.0.0.1"), "local", {})
    start_ray(FakeRay("127.0.0.1"), "local", {})  # as after a bare ray.shutdown()
    assert nodes[0].stops == ["storage", "graceful"] and nodes[1].stops == []
    assert ray_cluster._local_node is nodes[1]


def test_a_node_left_at_exit_is_stopped(nodes, monkeypatch):
    fake = FakeRay("127.0.0.1")
    start_ray(fake, "local", {})
    monkeypatch.setitem(sys.modules, "ray", fake)
    ray_cluster._stop_local_node_at_exit()
    assert nodes[0].stops == ["storage", "graceful"] and fake.calls[-1][0] == "shutdown"
    ray_cluster._stop_local_node_at_exit()  # nothing left: nothing more done
    assert nodes[0].stops == ["storage", "graceful"] and len(fake.calls) == 2


def test_log_to_driver_starts_the_log_monitor(nodes):
    fake = FakeRay("127.0.0.1")
    start_ray(fake, "local", {"log_to_driver": True})
    assert nodes[0].params["include_log_monitor"] is True
    assert fake.calls[0][1]["log_to_driver"] is True


def test_a_failed_connect_stops_the_node(nodes):
    with pytest.raises(ValueError, match="bad argument"):
        start_ray(FakeRay("127.0.0.1", init_fails=True), "local", {"bogus": 1})
    assert nodes[0].stops == ["kill"] and ray_cluster._local_node is None


def test_local_ray_refused_when_node_address_is_external(monkeypatch, nodes):
    monkeypatch.delenv(ray_cluster.SINGLE_MACHINE_ENV, raising=False)
    fake = FakeRay("192.0.2.7")
    with pytest.raises(ray_cluster.RayExposedError, match="192.0.2.7"):
        start_ray(fake, "local", {"num_cpus": 2})
    assert [c for c, _ in fake.calls] == ["init", "shutdown"]
    assert nodes[0].params["node_ip_address"] == "127.0.0.1"
    assert nodes[0].params["include_dashboard"] is False
    assert nodes[0].stops == ["storage", "graceful"]
    assert os.environ[ray_cluster.SINGLE_MACHINE_ENV] == "0"


def test_local_dashboard_stays_on_loopback(nodes):
    start_ray(FakeRay("127.0.0.1"), "local", {"include_dashboard": True})
    assert nodes[0].params["dashboard_host"] == "127.0.0.1"
    with pytest.raises(ray_cluster.RayExposedError, match="dashboard_host='0.0.0.0'"):
        start_ray(FakeRay("127.0.0.1"), None, {"include_dashboard": True,
                                               "dashboard_host": "0.0.0.0"})
    assert len(nodes) == 1  # refused before any node


def test_cluster_attach_uses_token_auth(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    fake = FakeRay("10.0.0.1")
    start_ray(fake, "auto", {"num_cpus": 4, "log_to_driver": False, "include_dashboard": False})
    assert os.environ["RAY_AUTH_MODE"] == "token"
    # the cluster's resources and dashboard are its own; other init options pass through
    assert fake.calls == [("init", {"address": "auto", "runtime_env": None,
                                    "log_to_driver": False})]


def _monitors() -> list[str]:
    """The optional processes among this process's Ray processes, sorted: the monitors
    ``autoscaler`` (v1 or v2) and ``log``, and the API server ``dashboard``."""
    found = []
    for pid in ray_cluster.ray_processes():
        cmdline = ray_cluster._cmdline(pid) or b""
        if b"/autoscaler/" in cmdline and b"monitor.py" in cmdline:
            found.append("autoscaler")
        elif b"/_private/log_monitor.py" in cmdline:
            found.append("log")
        elif b"/dashboard/dashboard.py" in cmdline:
            found.append("dashboard")
    return sorted(found)


def test_a_node_without_dashboard_starts_no_api_server():
    """The node class of a private Ray without the dashboard is Ray's own head node with the
    API server left out: it starts no process and leaves the node without a web URL."""
    from ray._private.node import Node

    cls = ray_cluster._node_without_api_server()
    assert issubclass(cls, Node) and cls.start_api_server is not Node.start_api_server
    node = object.__new__(cls)  # no node started: only the method is exercised
    node._webui_url = "stale"
    assert node.start_api_server(include_dashboard=False, raise_on_failure=False) is None
    assert node._webui_url is None and not hasattr(node, "all_processes")


def test_the_api_server_stays_with_the_dashboard_or_its_packages(monkeypatch):
    """Ray's own node when the dashboard is asked for, or when ``ray[default]``'s dashboard
    packages are installed (its agent then waits for the API server); the node without the
    API server only on a minimal Ray without the dashboard."""
    import ray._private.utils as ray_utils
    from ray._private.node import Node

    monkeypatch.setattr(ray_utils, "get_dashboard_dependency_error", lambda: "no aiohttp_cors")
    assert ray_cluster.head_node_class(True) is Node
    assert ray_cluster.head_node_class(False) is ray_cluster._node_without_api_server()
    monkeypatch.setattr(ray_utils, "get_dashboard_dependency_error", lambda: None)
    assert ray_cluster.head_node_class(False) is Node


@linux_only
@pytest.mark.ray
def test_private_ray_runs_without_monitors_and_stops_whole():
    """A real private Ray (in a child process, as its own driver): GCS, raylet and agents
    without the autoscaler monitor, the log monitor or the API server; with
    ``log_to_driver`` the log monitor runs and forwards a worker's print; ``stop_ray``
    leaves no Ray process; and nothing of a node still running when the driver exits
    outlives it. (With ``ray[default]`` installed the API server stays.)"""
    # a short session path: Ray's sockets live under it (AF_UNIX paths end at 107 bytes)
    temp_dir = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    try:
        _private_ray_in_a_child(temp_dir)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _private_ray_in_a_child(temp_dir: Path) -> None:
    code = f"""
import io, sys, time
sys.path.insert(0, {str(REPO)!r})
import ray
from hydra_plugins.ray_actor_launcher import ray_cluster
from tests.hydra_plugins.test_ray_cluster import _monitors
from ray._private.utils import get_dashboard_dependency_error

class Tee(io.TextIOBase):  # the driver's console, recorded
    def __init__(self, out): self.out, self.text = out, []
    def write(self, s): self.text.append(s); return self.out.write(s)
    def flush(self): self.out.flush()
sys.stdout, sys.stderr = Tee(sys.stdout), Tee(sys.stderr)
seen = lambda: "from-a-worker" in "".join(sys.stdout.text + sys.stderr.text)
for log in (False, True):
    ray_cluster.start_ray(ray, "local", {{"num_cpus": 1, "object_store_memory": 80 * 2**20,
                                          "log_to_driver": log,
                                          "_temp_dir": {str(temp_dir)!r}}})
    names = {{p.name for p in ray_cluster.ray_processes().values()}}
    assert {{"gcs_server", "raylet"}} <= names, names
    # the API server only where ray[default]'s dashboard packages are installed
    api = [] if get_dashboard_dependency_error() is not None else ["dashboard"]
    assert _monitors() == sorted((["log"] if log else []) + api), _monitors()
    ray.get(ray.remote(lambda: print("from-a-worker")).remote())
    deadline = time.monotonic() + (20 if log else 2)
    while not seen() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen() is log, (log, seen())
    ray_cluster.stop_ray(ray)
    assert ray_cluster.ray_processes() == {{}} and ray_cluster._local_node is None
ray_cluster.start_ray(ray, "local", {{"num_cpus": 1, "object_store_memory": 80 * 2**20,
                                      "_temp_dir": {str(temp_dir)!r}}})
print("ok", flush=True)
"""  # ends with a node still running: nothing of it may outlive the driver
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0 and "ok" in out.stdout.split(), out.stderr[-3000:]
    deadline = time.monotonic() + 20
    while _of_temp_dir(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _of_temp_dir(temp_dir) == []


def _of_temp_dir(temp_dir: Path) -> list[int]:
    """The pids of processes whose command line names ``temp_dir`` (a Ray's session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            cmdline = ray_cluster._cmdline(int(entry.name))
            if cmdline is not None and os.fsencode(temp_dir) in cmdline:
                found.append(int(entry.name))
    return found


@linux_only
@pytest.mark.ray
@pytest.mark.slow
def test_sweep_ray_listens_on_loopback_only(tmp_path):
    """``python -m sweep +experiment=mem_util_grid -m`` (shortened): every listening socket
    of the sweep's process tree (driver, GCS, raylet, agents, actors) is on loopback."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env.pop(ray_cluster.SINGLE_MACHINE_ENV, None)
    cmd = [sys.executable, "-m", "sweep", "+experiment=mem_util_grid",
           "workload.num_requests=150", "tracking.plots=false", "hydra.launcher.progress=false",
           f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", "-m"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    exposed: list[tuple[int, str, int]] = []
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        tree = process_tree(proc.pid)
        for pid, _host, _port in listening_sockets(tree):
            ident = ray_cluster.process_identity(pid)
            seen.add(ident.name if ident is not None else "?")
        exposed += non_loopback_listeners(proc.pid)
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-3000:]
    assert {"gcs_server", "raylet"} <= seen, f"Ray processes not observed: {seen}"
    assert exposed == [], f"listening beyond loopback: {exposed}"
