"""Structured config of the ``ray_actor`` launcher, registered in Hydra's ConfigStore."""

# No `from __future__ import annotations` here: Hydra execs plugin modules before they are
# in sys.modules, and dataclasses then cannot resolve string annotations.

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


def _default_init() -> dict[str, Any]:
    return {
        "num_cpus": None,
        "object_store_memory": 200 * 1024**2,
        "include_dashboard": False,
        "log_to_driver": False,
    }


@dataclass
class RayActorLauncherConf:
    """Where and how sweep jobs run.

    ``address``: ``local`` starts a private Ray that listens on 127.0.0.1 only, sized by
    ``init``, and stops it at the end; ``auto`` or ``host:port`` attaches to an existing
    cluster with Ray's token authentication (``init`` resource keys are then ignored; see
    docs/sweep.md). ``init``: ``ray.init``'s arguments; ``log_to_driver`` is off by default
    (a job's log is its point's ``sweep.log``, an actor's output Ray's session logs), and on
    it forwards the actors' output to the driver's console and so starts Ray's log monitor
    (``ray_cluster``). ``num_actors``: pool size (>= 1), ``null`` = as many as the cluster's
    CPUs allow (always capped to what the cluster can schedule). ``on_failure``:
    ``continue`` records a failed job, runs the rest and then exits non-zero; ``return``
    does the same but hands the failures to the sweeper as results
    ``{"status": "failed", "error": ...}`` and exits 0 (for sweepers that handle failed
    trials, e.g. Optuna's); ``raise`` lets Hydra's sweeper raise the first failure after the
    batch has run. ``job_timeout_s``: a
    job running longer is killed and recorded as failed (> 0, or null). ``max_retries``
    (>= 0): how many more times a job runs when its actor dies under it (crash, OOM kill,
    lost node); a job that raises or times out is not retried. ``resume``: reuse the stored
    result of a job that already finished (see ``hooks.Recorder.acquire``).
    ``wait_poll_s``: how often to ask again about jobs another live sweep is running.
    ``validator``: ``module:function`` called on every composed job config before anything
    starts. ``recorder``: ``module:Class`` that receives each result in the driver as it
    arrives (see ``hooks.Recorder``). ``preload``: modules each actor imports when it
    starts, before its first job.
    """

    _target_: str = "hydra_plugins.ray_actor_launcher.launcher.RayActorLauncher"
    address: str | None = "${oc.env:RAY_ADDRESS,local}"
    num_actors: int | None = None
    init: dict[str, Any] = field(default_factory=_default_init)
    actor_options: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 1})
    runtime_env: dict[str, Any] = field(default_factory=dict)
    on_failure: str = "continue"
    job_timeout_s: float | None = 3600.0
    max_retries: int = 2
    resume: bool = True
    wait_poll_s: float = 2.0
    ready_timeout_s: float = 120.0
    shutdown_ray: bool = True
    progress: bool = True
    validator: str | None = None
    recorder: str | None = None
    preload: list[str] = field(default_factory=list)


ConfigStore.instance().store(
    group="hydra/launcher",
    name="ray_actor",
    node=RayActorLauncherConf,
    provider="ray_actor_launcher",
)
