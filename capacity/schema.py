"""The ``capacity`` config node of ``python -m sweep.capacity``, added to the sweep schema.

``register()`` stores ``CapacitySweepConfig`` (the sweep's ``SweepConfig`` plus ``capacity``)
as ``base_config``, so ``conf/config.yaml`` composes it unchanged and a misspelt
``capacity.*`` key fails at composition time like any other key.
"""

# No `from __future__ import annotations`: OmegaConf reads these annotations at runtime.

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from capacity.search import SearchSettings
from sweep.schema import SweepConfig


@dataclass
class PoolConf:
    """Where probes run: ``num_actors`` Ray actors (``null``: one per CPU, never more than
    configurations; ``0``: in this process, no Ray), on ``address`` (``local`` starts a
    private Ray); a probe running longer than ``probe_timeout_s`` fails its configuration."""

    num_actors: int | None = None
    probe_timeout_s: float = 600.0
    address: str | None = "${oc.env:RAY_ADDRESS,local}"


@dataclass
class CapacityConf:
    """Search and fleet-sizing settings (see ``capacity.search``, ``capacity.fleet``). The SLO is the study's
    ``slo:`` node (``analysis.slo``), the one sweeps use.

    Search: relative ``tolerance``; start at ``initial_rate`` or, when null, at
    ``start_fraction`` x the throughput of a saturation probe at ``saturation_rate``
    (``.inf``: all requests at t = 0); bracket by ``growth`` within ``min_rate`` ..
    ``max_rate`` and at most ``1 + throughput_headroom`` x the saturation throughput
    (null: no such ceiling); at most ``max_probes``. Probe results are cached in ``cache_dir``
    (``auto``: ``$SERVESWEEP_CACHE/capacity_probes``, else
    ``~/.cache/servesweep/capacity_probes``; null: no cache). ``target_rate`` (req/s): size the cheapest fleet, up to
    ``max_replicas`` replicas per option, listing ``fleet_top`` options; the cheapest
    ``verify_top`` are re-simulated as one cluster behind ``router`` (null: the
    configuration's ``cluster.router``; ``capacity.verify``).
    """

    # The search knobs default to capacity.search.SearchSettings' own values (one source).
    tolerance: float = SearchSettings.tolerance
    initial_rate: float | None = SearchSettings.initial_rate
    saturation_rate: float = SearchSettings.saturation_rate
    start_fraction: float = SearchSettings.start_fraction
    growth: float = SearchSettings.growth
    min_rate: float = SearchSettings.min_rate
    max_rate: float = SearchSettings.max_rate
    max_probes: int = SearchSettings.max_probes
    throughput_headroom: float | None = SearchSettings.throughput_headroom
    cache_dir: str | None = "auto"
    target_rate: float | None = None
    max_replicas: int = 64
    fleet_top: int = 5
    verify_top: int = 3
    router: str | None = None
    pool: PoolConf = field(default_factory=PoolConf)


@dataclass
class CapacitySweepConfig(SweepConfig):
    """The sweep config with a ``capacity`` node."""

    capacity: CapacityConf = field(default_factory=CapacityConf)


def register() -> None:
    """Store ``CapacitySweepConfig`` as ``base_config`` (idempotent)."""
    ConfigStore.instance().store(name="base_config", node=CapacitySweepConfig)

