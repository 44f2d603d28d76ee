"""Start or attach the Ray cluster a sweep runs on, and check who it listens to.

``address="local"`` starts a private single-machine Ray that listens on loopback only.
Ray on Linux takes the node's external address as its node IP, even when told
``_node_ip_address="127.0.0.1"`` (``ray/_private/services.py``: ``resolve_ip_for_localhost``
replaces a loopback address by ``get_node_ip_address()``), and its GCS, raylet, object
manager, workers and runtime-env agent then listen on every interface. Ray's own
single-machine mode (the one it uses on macOS and Windows, switched by
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read into ``ray._private.ray_constants`` at import)
makes ``get_node_ip_address()`` return the loopback address, and Ray 2.60 binds each of its
servers to the node IP. ``start_ray`` sets that mode, starts Ray, and refuses to go on
(shutting Ray down again) unless the node IP is loopback; ``non_loopback_listeners`` lets
the launcher check the sockets themselves once its actors run.

The private Ray is Ray's own head node (``ray._private.node.Node``, what ``ray.init`` starts
for ``address="local"``) started with the parameters and set-up ``ray.init`` would give it,
except three processes a private single-machine Ray has no use for, which ``ray.init`` has
no argument to leave out: the autoscaler monitor (a fixed local node has nothing to scale);
unless the driver wants its workers' output (``log_to_driver``), the log monitor that
forwards it; and, on a minimal Ray unless the dashboard is asked for (``include_dashboard``),
the API server, which then does nothing the sweep uses and which the node start waits for.
Each is a Python process importing Ray while the node starts; without the monitors the
sweep's actors were ready 3.5–4.5 s after Ray was asked for instead of 4.9–5.4 s, and
without the API server too Ray started and had two actors ready in 2.34–2.72 s instead of
3.66–5.58 s (docs/sweep.md). The
driver then connects to that node with ``ray.init(address=...)``, and ``stop_ray`` stops it
as ``ray.shutdown()`` stops a node ``ray.init`` started.

Any other address attaches to an existing (multi-node) cluster. That cluster is reachable
from other machines by design, so Ray's token authentication must be on
(``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``; docs/sweep.md
says how to set it up); ``start_ray`` sets token mode unless the environment chose a mode,
and warns when it says ``disabled``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import ipaddress
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

LOOPBACK_IP = "127.0.0.1"
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's single-machine mode
LOCAL_ADDRESSES = (None, "", "local")
# The ray.init arguments that describe the node of a new local Ray, each with the RayParams
# field ray.init sets from it (ray/_private/worker.py, ``init``: its hidden ``kwargs.pop``s and
# its "start a new cluster" branch); ray.init refuses or ignores them when it connects to a
# running node. Any other argument is the driver's own (``log_to_driver``, ``namespace``,
# ``logging_level``, ...) and goes to the ``ray.init`` that connects. ``_temp_dir`` and the
# Redis credentials go to both (the connecting driver reads the session through them).
NODE_ARGS = {
    "num_cpus": "num_cpus",
    "num_gpus": "num_gpus",
    "resources": "resources",
    "labels": "labels",
    "object_store_memory": "object_store_memory",
    "include_dashboard": "include_dashboard",
    "dashboard_host": "dashboard_host",
    "dashboard_port": "dashboard_port",
    "proxy_server_url": "proxy_server_url",
    "object_spilling_directory": "object_spilling_directory",
    "_memory": "memory",
    "_temp_dir": "temp_dir",
    "_system_config": "_system_config",
    "_plasma_directory": "plasma_directory",
    "_enable_object_reconstruction": "enable_object_reconstruction",
    "_metrics_export_port": "metrics_export_port",
    "_tracing_startup_hook": "tracing_startup_hook",
    "_node_name": "node_name",
    "_redis_username": "redis_username",
    "_redis_password": "redis_password",
}
NODE_AND_DRIVER_ARGS = ("_temp_dir", "_redis_username", "_redis_password")
# ray.init's arguments that it gathers into the node's ``ResourceIsolationConfig``.
RESOURCE_ISOLATION_ARGS = ("enable_resource_isolation", "cgroup_path", "system_reserved_cpu",
                           "system_reserved_memory")
# The head node of the private Ray this process started (as ray.init keeps its own in
# ``ray._private.worker._global_node``: one Ray per driver process); ``stop_ray`` stops it.
# Kept across Hydra's plugin scan, which executes this module again in place.
_local_node: Any = globals().get("_local_node")


class RayExposedError(RuntimeError):
    """A local Ray would listen (or listens) beyond the loopback interface."""


class ClusterLost(RuntimeError):
    """The local Ray cluster the launcher started is gone (its raylet or GCS exited)."""


def is_local(address: str | None) -> bool:
    """True when ``address`` asks for a private Ray started by this process."""
    return address in LOCAL_ADDRESSES


def start_ray(
    ray: Any,
    address: str | None,
    init_kwargs: Mapping[str, Any] | None = None,
    runtime_env: Mapping[str, Any] | None = None,
) -> None:
    """``ray.init`` for a sweep: a loopback-only private Ray for ``local``, or an attach with
    token authentication for a cluster address (``auto``, ``host:port``, ``ray://...``)."""
    kwargs = {k: v for k, v in (init_kwargs or {}).items() if v is not None}
    if is_local(address):
        _single_machine_mode(ray)
        # Loopback only, so no other machine can reach it: no token needed.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        kwargs.setdefault("include_dashboard", False)
        if kwargs.get("include_dashboard"):
            kwargs.setdefault("dashboard_host", LOOPBACK_IP)
        if kwargs.get("dashboard_host") not in (None, LOOPBACK_IP, "localhost"):
            raise RayExposedError(
                f"hydra.launcher.init.dashboard_host={kwargs['dashboard_host']!r} would expose "
                f"the local Ray dashboard beyond this machine; use {LOOPBACK_IP} (or run a "
                "cluster with token authentication and set RAY_ADDRESS)"
            )
        _start_private_ray(ray, kwargs, runtime_env)
        node_ip = ray.util.get_node_ip_address()
        if not _is_loopback(node_ip):
            stop_ray(ray)
            raise RayExposedError(
                f"the local Ray took node address {node_ip}, not loopback, so it would listen "
                f"beyond this machine; it was shut down. Set {SINGLE_MACHINE_ENV}=0 in the "
                "environment before Python starts, or attach to a cluster with token "
                "authentication through RAY_ADDRESS"
            )
        return
    mode = os.environ.setdefault("RAY_AUTH_MODE", "token")
    if mode == "disabled":
        log.warning(
            "RAY_AUTH_MODE=disabled while attaching to the Ray cluster at %s: anyone who can "
            "reach its ports can run code on it. Use token authentication (docs/sweep.md).",
            address,
        )
    for key in ("num_cpus", "num_gpus", "object_store_memory", "resources", "memory",
                "include_dashboard", "dashboard_host"):
        kwargs.pop(key, None)  # a cluster's resources and dashboard are its own
    ray.init(address=address, runtime_env=dict(runtime_env) if runtime_env else None, **kwargs)


def _start_private_ray(ray: Any, kwargs: dict[str, Any],
                       runtime_env: Mapping[str, Any] | None) -> None:
    """Start the private head node on loopback from ``kwargs`` (ray.init's arguments) and
    connect this driver to it; a failed connect stops the node again."""
    global _local_node
    if _local_node is not None:  # left running by a bare ray.shutdown(): stopped, not leaked
        log.warning("stopping the private Ray left running by an earlier ray.shutdown()")
        stop_ray(ray)
    node_args = {NODE_ARGS[key]: kwargs[key] for key in kwargs if key in NODE_ARGS}
    isolation = {key: kwargs.pop(key) for key in RESOURCE_ISOLATION_ARGS if key in kwargs}
    for key in NODE_ARGS.keys() - set(NODE_AND_DRIVER_ARGS):
        kwargs.pop(key, None)
    node_args.setdefault("dashboard_port", None)  # ray.init's default: 8265, or the next free
    log_to_driver = bool(kwargs.setdefault("log_to_driver", False))
    node = start_local_node(isolation, node_ip_address=LOOPBACK_IP, no_monitor=True,
                            include_log_monitor=log_to_driver, **node_args)
    worker_log = logging.getLogger("ray._private.worker")
    worker_log.addFilter(_not_connecting)  # the node is the one just started, not an "existing" one
    try:
        ray.init(address=node.address, runtime_env=dict(runtime_env) if runtime_env else None,
                 **kwargs)
    except BaseException:
        node.kill_all_processes(check_alive=False, allow_graceful=False)
        raise
    finally:
        worker_log.removeFilter(_not_connecting)
    _local_node = node


def start_local_node(isolation: Mapping[str, Any], **params: Any) -> Any:
    """Ray's head node (``ray._private.node.Node``) with these ``RayParams``, started with
    the set-up ``ray.init`` does before it starts a local one (ray/_private/worker.py,
    ``init``): the open-file limit raised, token set-up (``RAY_AUTH_MODE`` decides), no usage
    report, the node address resolved as ``ray.init`` resolves it, the resource isolation
    from ``isolation`` (ray.init's arguments of that name). Its processes are fate-shared
    with the calling thread (a reaper process stands in where the kernel cannot)."""
    from ray._common.usage import usage_lib
    from ray._private import services
    from ray._private.authentication.authentication_token_setup import (
        enable_token_auth_by_default,
        ensure_token_if_auth_enabled,
    )
    from ray._private.parameter import RayParams
    from ray._private.resource_isolation_config import ResourceIsolationConfig

    _raise_open_file_limit()
    enable_token_auth_by_default()
    ensure_token_if_auth_enabled(params.get("_system_config"), create_token_if_missing=True)
    if not usage_lib.is_nightly_wheel():
        usage_lib.set_usage_stats_enabled_via_env_var(False)
    params["node_ip_address"] = services.resolve_ip_for_localhost(params["node_ip_address"])
    params["resource_isolation_config"] = ResourceIsolationConfig(**isolation)
    node_class = head_node_class(bool(params.get("include_dashboard")))
    return node_class(RayParams(**params), head=True, shutdown_at_exit=False,
                      spawn_reaper=True, ray_init_cluster=True)


def head_node_class(include_dashboard: bool) -> type:
    """The class of the private head node: Ray's ``Node``, or, without the dashboard on a
    minimal Ray (``ray`` without ``ray[default]``'s dashboard packages, as this project
    installs it), that node without its API server (``_node_without_api_server``). With the
    dashboard packages installed the dashboard agent's event module waits for the API
    server's address, so the API server stays."""
    from ray._private.node import Node
    from ray._private.utils import get_dashboard_dependency_error

    if include_dashboard or get_dashboard_dependency_error() is None:
        return Node
    return _node_without_api_server()


@functools.cache
def _node_without_api_server() -> type:
    """Ray's head node without its API server process, for a minimal Ray without the
    dashboard (``head_node_class``).

    ``Node.start_head_processes`` starts the API server (``ray/dashboard/dashboard.py``)
    whatever ``include_dashboard`` says, and then polls until the process has imported Ray
    and published its address (``services.start_api_server``). On a minimal Ray without the
    dashboard it runs ``--minimal`` and loads only its usage-stats module
    (``--modules-to-load=UsageStatsHead``), and usage stats are off here, so it does nothing
    the sweep uses: the node then starts as it does when the API server fails to start
    (``_webui_url`` None, which the raylet and ``ray.init`` accept)."""
    from ray._private.node import Node

    class NodeWithoutApiServer(Node):  # type: ignore[misc]
        def start_api_server(self, *, include_dashboard: bool | None,
                             raise_on_failure: bool) -> None:
            assert not include_dashboard
            self._webui_url = None

    return NodeWithoutApiServer


def _raise_open_file_limit() -> None:
    """Raise this process's soft limit of open files towards the hard limit (at most 65,536)
    before Ray's processes inherit it, as ``ray.init`` does for a local start."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


def _not_connecting(record: logging.LogRecord) -> bool:
    """False for ray.init's "Connecting to existing Ray cluster ..." and "Connected to Ray
    cluster." lines while the driver connects to the node it has just started (the line
    that gives the dashboard's address, when one was asked for, stays)."""
    msg = str(record.msg)
    return not (msg.startswith("Connecting to existing Ray") or msg == "Connected to Ray cluster.")


@atexit.register
def _stop_local_node_at_exit() -> None:
    """Stop a private node still running when the interpreter exits (ray.init's own exit
    handler, ``ray.shutdown``, stops only a node ray.init started)."""
    if _local_node is not None:
        with contextlib.suppress(Exception):
            stop_ray(sys.modules["ray"])


def _single_machine_mode(ray: Any) -> None:
    """Make Ray take loopback as the node IP, also when ``ray`` was imported already."""
    os.environ[SINGLE_MACHINE_ENV] = "0"  # read by Ray processes started from here on
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # read once at import: the driver may have imported Ray early
        constants.ENABLE_RAY_CLUSTER = False


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


# ------------------------------------------------------------------ processes
def _stat(stat: Path) -> tuple[str, list[str]] | None:
    """A ``/proc/<pid>/stat``: ``comm`` and the fields after it (state, ppid, ...), or None
    when the process is gone; comm may hold spaces and parentheses."""
    try:
        head, _, rest = stat.read_text().rpartition(")")
    except OSError:
        return None
    return head.partition("(")[2], rest.split()


def _stat_fields(stat: Path) -> list[str] | None:
    read = _stat(stat)
    return None if read is None else read[1]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        pass
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return fields is None or fields[0] != "Z"  # no /proc (not Linux): os.kill decided


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if fields is None:  # the process ended while we looked
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


# ------------------------------------------------------------------ listening sockets
def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:  # ended, or not ours to read
        pass
    return inodes


def _decode_address(hex_addr: str) -> str:
    """``/proc/net/tcp{,6}`` local address (little-endian words) to text."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_sockets(pids: Iterable[int]) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every listening TCP socket the processes hold."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            pid = owner.get(fields[9])
            if pid is None:
                continue
            host, port = fields[1].split(":")
            found.append((pid, _decode_address(host), int(port, 16)))
    return sorted(found)


def non_loopback_listeners(root: int | None = None) -> list[tuple[int, str, int]]:
    """Listening sockets of ``root``'s process tree (default: this process) bound beyond
    loopback (``0.0.0.0``, ``::`` and external addresses; ``::ffff:127.0.0.1`` is loopback).
    Empty where ``/proc`` is not available."""
    if not Path("/proc/net/tcp").exists():
        return []
    out = []
    for pid, host, port in listening_sockets(process_tree(root or os.getpid())):
        ip = ipaddress.ip_address(host)
        mapped = getattr(ip, "ipv4_mapped", None)
        if not (mapped or ip).is_loopback:
            out.append((pid, host, port))
    return out


def describe(listeners: Iterable[tuple[int, str, int]]) -> str:
    parts = []
    for pid, host, port in listeners:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            name = "?"
        parts.append(f"{name} (pid {pid}) on {host}:{port}")
    return ", ".join(parts)


# ------------------------------------------------------------------ Ray's own processes
RAY_HEADS = ("raylet", "gcs_server")


class RayProcess(NamedTuple):
    """A process as ``/proc`` names it: its ``comm`` and its start time (clock ticks after
    boot, ``/proc/<pid>/stat`` field 22). The start time tells a process from a later one
    that reuses its pid (:func:`same_process`); the name is what it was called when recorded
    (Ray's workers rename themselves as they run tasks: ``ray::JobRunner`` becomes
    ``ray::JobRunner.`` and back)."""

    name: str
    started: int


def same_process(pid: int, recorded: RayProcess) -> bool:
    """Whether ``pid`` still runs the process ``recorded`` (started at the same tick: a pid is
    not reused while its process lives, and never within one tick of its last use)."""
    now = process_identity(pid)
    return now is not None and now.started == recorded.started


def process_identity(pid: int) -> RayProcess | None:
    """``pid``'s name and start time, or None when it is gone (or has exited: a zombie)."""
    read = _stat(Path(f"/proc/{pid}/stat"))
    if read is None or not read[1] or read[1][0] == "Z":
        return None
    return RayProcess(read[0], int(read[1][19]))


@functools.cache
def ray_package_dir() -> bytes:
    """Where the installed ``ray`` package lives (found without importing it), as the bytes
    Ray puts in its Python processes' command lines (``ray._private.services`` builds them
    from ``RAY_PATH``, the package's directory): site-packages, dist-packages or a source
    tree alike."""
    spec = importlib.util.find_spec("ray")
    origin = spec.origin if spec is not None else None
    return os.fsencode(Path(origin).parent) if origin else b"/ray"


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _is_ray_process(name: str, cmdline: bytes | None) -> bool:
    if name in RAY_HEADS or name.startswith("ray::"):
        return True
    return cmdline is not None and ray_package_dir() + b"/" in cmdline


def ray_processes(root: int | None = None) -> dict[int, RayProcess]:
    """The Ray processes below ``root`` (default: this process), by pid: GCS, raylet,
    agents, monitors and workers that a local ``ray.init`` started."""
    root = root or os.getpid()
    if not Path("/proc").is_dir():
        return {}
    out = {}
    for pid in process_tree(root) - {root}:
        ident = process_identity(pid)
        if ident is not None and _is_ray_process(ident.name, _cmdline(pid)):
            out[pid] = ident
    return out


def _sigkill(targets: Mapping[int, RayProcess]) -> int:
    """SIGKILL each process of ``targets`` that is still the one recorded
    (:func:`same_process`: a pid reused since is left alone); how many were killed. The
    signal goes through a pidfd opened before the check, so the process checked is the one
    signalled even if it exits and its pid is reused in between."""
    import signal

    killed = 0
    for pid, ident in targets.items():
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone (or a kernel without pidfds: then check, then kill)
            fd = -1
            if not Path(f"/proc/{pid}").exists():
                continue
        try:
            if not same_process(pid, ident):
                continue
            if fd >= 0:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)
    return killed


def alive(known: Mapping[int, RayProcess]) -> dict[int, RayProcess]:
    """The processes of ``known`` that still run (the same process, not a reused pid)."""
    return {pid: ident for pid, ident in known.items() if same_process(pid, ident)}


def kill_ray_processes(known: Mapping[int, RayProcess]) -> int:
    """SIGKILL every process of ``known`` (as ``ray_processes`` gave them) and of
    ``ray_processes()`` that still runs; how many were killed. Workers and agents orphaned
    by a dead raylet are no longer below this process, hence ``known``."""
    return _sigkill({**known, **ray_processes()})


def stop_ray(ray: Any, known: Mapping[int, RayProcess] | None = None) -> int:
    """Shut down the local Ray this process started: ``ray.shutdown()`` disconnects the
    driver, the private node's processes are stopped as ``ray.shutdown`` stops a node of
    ``ray.init``'s (its spilled objects removed, then SIGTERM and, after a grace period,
    SIGKILL), then SIGKILL for any Ray process of ours still alive (``kill_ray_processes``
    over ``known`` and this process's children: a dead head leaves orphans that the node no
    longer tracks). Returns how many were left."""
    global _local_node
    node, _local_node = _local_node, None
    try:
        ray.shutdown()
        if node is not None:
            node.destroy_external_storage()
            node.kill_all_processes(check_alive=False, allow_graceful=True)
    finally:
        left = kill_ray_processes(dict(known or {}))
    return left


def release_ray(ray: Any, actors: Iterable[Any], *, stop: bool, address: str | None,
                known: Mapping[int, RayProcess] | None = None) -> None:
    """The end of a launcher's or a probe pool's use of Ray: kill its actors (a dead
    cluster cannot, which is ignored); with ``stop``, a local Ray (``is_local(address)``)
    this process started is stopped with ``stop_ray`` and what was left is logged, while a
    cluster attached to is only disconnected from (``ray.shutdown()``: its processes are
    not ours to kill)."""
    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor)
    if not stop:
        return
    if not is_local(address):
        ray.shutdown()
        return
    left = stop_ray(ray, known)
    if left:
        log.warning(f"killed {left} Ray process(es) left after shutdown")
