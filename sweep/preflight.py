"""Everything a grid point needs, checked in the driver before any job runs.

``preflight(cfg)`` is the sweep's validator (``hydra.launcher.validator``): the launcher calls
it on every composed point before Ray starts, and a single ``python -m sweep`` calls it
before it simulates. It

* checks the config values (``sweep.validate.check_config``: engine settings, shape, SLO,
  workload, tracking), raising ``ConfigError`` naming the key;
* parses the point's profile bundle and its workload once (both are cached, so a grid that
  shares them pays once, and the actors then load the generated bundle from its cache): a
  damaged file raises ``ConfigError`` with ``file:line``;
* decides whether the valid point can run on its hardware at all: the model must fit each
  instance's memory (the deployment's assembly computes each instance's KV capacity and
  raises ``InfeasibleError``) and every request must fit
  ``max_model_len``. A point that cannot is *infeasible*, a capacity answer: ``preflight``
  returns the reason instead of raising, and the point is recorded as infeasible, never run.
"""

from __future__ import annotations

from omegaconf import DictConfig

from engine.specs import ConfigError, InfeasibleError
from profiles.bundle import BundleError
from workloads import WorkloadError


def preflight(cfg: DictConfig) -> str | None:
    """Raise ``ConfigError`` for an invalid point; return why a valid point cannot run on its
    hardware, or None when it can."""
    from sweep import job
    from sweep.validate import check_config

    check_config(cfg)
    model = job.model_spec(cfg.model.name)
    try:  # the one assembly: KV capacity of every instance computed once, here
        pc = job.point_cluster_of(cfg)
    except BundleError as err:
        raise ConfigError(f"hardware.bundle: {err}") from None
    except InfeasibleError as err:
        return str(err)
    try:
        workload = job.build_workload(cfg, model)
    except WorkloadError as err:
        raise ConfigError(f"workload: {err}") from None
    limit = min(inst.config.model_len(inst.model) for inst in pc.instances)
    longest = max(workload, key=lambda s: s.prompt_len + s.output_len, default=None)
    if longest is not None and longest.prompt_len + longest.output_len > limit:
        n_long = sum(s.prompt_len + s.output_len > limit for s in workload)
        return (f"{n_long} of {len(workload)} requests are longer than max_model_len={limit} "
                f"(the longest, {longest.request_id!r}, needs {longest.prompt_len} prompt + "
                f"{longest.output_len} output tokens; vLLM rejects them); raise "
                "cluster.max_model_len or shorten the workload")
    return None
