"""Two real Ray nodes on this machine (loopback only, Ray's token authentication on); the
second node's raylet is killed in the middle of a sweep, and every point still finishes
exactly once in the MLflow store. A driver with the wrong token is refused.

The head and the worker node are started with ``ray start --block`` in their own process
groups, bound to 127.0.0.1 with every port chosen free; the sweep attaches with
``RAY_ADDRESS``. Ray rewrites ``127.0.0.1`` in a bootstrap address to the machine's outward
IP, so the driver and head run with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (which keeps the
loopback address), and the worker node is started through a small wrapper that keeps the
address as given (the CLI refuses worker nodes in that mode). Teardown signals exactly the
two process groups this test started, never other Ray instances on the machine.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweep.config_hash import HASH_KEY
from sweep.recorder import RESULTS_FILE, read_results_table
from sweep.resume import finished_counts
from tests.store_helpers import finished_points
from tests.sweep.hold_jobs import held_jobs, hold_overrides

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]
POINTS = 10
# `ray start` with the bootstrap address kept as given (loopback), for the worker node.
RAY_CLI = (
    "import sys, ray._private.services as services\n"
    "services.resolve_ip_for_localhost = lambda host: host\n"
    "from ray.scripts.scripts import main\n"
    "sys.argv = ['ray', *sys.argv[1:]]\n"
    "main()\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TOKEN = secrets.token_hex(24)  # this test's cluster token (docs/sweep.md: token auth on)


def ray_env(token: str | None = TOKEN) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
    env.update({
        "PYTHONPATH": str(REPO),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token or "",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        # notice a dead node within seconds instead of the default half minute
        "RAY_health_check_initial_delay_ms": "1000",
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_timeout_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
    })
    return env


def start_node(log: Path, extra: list[str], worker: bool) -> subprocess.Popen:
    ports = ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
             "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port",
             "--object-manager-port")
    args = ["start", "--block", "--num-cpus", "1", "--node-ip-address", "127.0.0.1",
            "--object-store-memory", str(80 * 2**20), "--disable-usage-stats",
            *[a for p in ports for a in (p, str(free_port()))], *extra]
    env = ray_env()
    if worker:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"  # else the CLI refuses a worker node
    return subprocess.Popen([sys.executable, "-c", RAY_CLI, *args], env=env, cwd=log.parent,
                            start_new_session=True, stdout=log.open("w"), stderr=subprocess.STDOUT)


def group_pids(pgid: int) -> dict[int, str]:
    """Live (non-zombie) processes of a process group, with their command lines."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if os.getpgid(int(d)) == pgid and state != "Z":
                    out[int(d)] = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (ProcessLookupError, FileNotFoundError, PermissionError):
                pass
    return out


def alive_nodes(address: str, token: str | None = TOKEN) -> int:
    code = (f"import ray\nray.init(address={address!r}, log_to_driver=False)\n"
            "print(sum(n['Alive'] for n in ray.nodes()))\nray.shutdown()\n")
    out = subprocess.run([sys.executable, "-c", code], env=ray_env(token), capture_output=True,
                         text=True, timeout=90)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else 0


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # gcs_server ignores SIGTERM for a while
        p.wait(timeout=30)


def test_sweep_survives_losing_a_node(tmp_path):
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes: list[subprocess.Popen] = []
    driver = None
    try:
        nodes.append(start_node(tmp_path / "head.log",
                                ["--head", "--port", str(port), "--include-dashboard=false"],
                                worker=False))
        time.sleep(3)
        nodes.append(start_node(tmp_path / "worker.log", ["--address", address], worker=True))
        deadline = time.monotonic() + 90
        while alive_nodes(address) < 2:
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(1)
        worker_raylet = [pid for pid, cmd in group_pids(nodes[1].pid).items()
                         if "raylet/raylet" in cmd]
        assert len(worker_raylet) == 1
        assert alive_nodes(address, token="not-the-token") == 0  # token auth is on

        store = f"sqlite:///{tmp_path / 'mlflow.db'}"
        rates = ",".join(str(r) for r in range(1, POINTS + 1))
        env = {**ray_env(), "RAY_ADDRESS": address}
        log = tmp_path / "driver.log"
        # Jobs 2.. wait for `release`: the raylet dies while both nodes' actors hold a job
        release = tmp_path / "release"
        with log.open("w") as out_file:  # a file, not a pipe nobody reads while polling
            driver = subprocess.Popen(
                [sys.executable, "-m", "sweep", "+experiment=mem_util_grid",
                 "cluster.gpu_memory_utilization=0.9", f"workload.rate={rates}",
                 "workload.num_requests=500", "tracking.plots=false",
                 "hydra.launcher.progress=false", "hydra.launcher.max_retries=2",
                 *hold_overrides(release, 2), "-m"],
                cwd=tmp_path, env=env, stdout=out_file, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # kill the worker node's raylet once the sweep is under way on both nodes
        deadline = time.monotonic() + 180
        done = 0
        while done < 2 or held_jobs(release) != {2, 3}:
            assert driver.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the sweep did not get going"
            time.sleep(0.2)
            done = finished_points(tmp_path / "mlflow.db")
        os.kill(worker_raylet[0], signal.SIGKILL)
        killed_at = done
        time.sleep(2)  # let the launcher see the node go before the held jobs move on
        release.touch()
        driver.wait(timeout=400)
        out = log.read_text()
        assert driver.returncode == 0, out[-4000:]
    finally:
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        stop(nodes)
    # every process of both nodes is gone (one SIGKILLed a moment ago may still be exiting:
    # its cmdline already empty, not yet a zombie)
    deadline = time.monotonic() + 15
    while (group_pids(nodes[0].pid) or group_pids(nodes[1].pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_pids(nodes[0].pid) and not group_pids(nodes[1].pid)

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("mem_util_grid").experiment_id
    counts = finished_counts(client, exp)
    assert len(counts) == POINTS and set(counts.values()) == {1}, counts  # exactly once each
    runs = client.search_runs([exp], max_results=100)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == POINTS and {r.info.status for r in children} == {"FINISHED"}
    sweep_dir = next((tmp_path / "multirun" / "mem_util_grid").iterdir())
    frame, _ = read_results_table(sweep_dir / RESULTS_FILE)
    assert (frame.status == "finished").all() and frame[HASH_KEY].nunique() == POINTS
    assert killed_at < POINTS
    lines = [ln for ln in out.splitlines() if "jobs done in" in ln]
    # the launcher replaced the lost node's actor and ran its job again elsewhere
    assert lines and "replaced" in lines[-1] and "retried" in lines[-1], out[-4000:]
