"""Typed schemas of the sweep config, registered in Hydra's ConfigStore as ``base_config``.

``conf/config.yaml`` lists ``base_config`` first in its defaults, so every group file
(``hardware/``, ``model/``, ``cluster/``, ``workload/``) is merged into these dataclasses
and a misspelt key or a wrongly typed value fails at composition time, naming the key.
The engine settings of ``cluster`` are generated from ``engine.specs.EngineConfig`` (one
default each); their ranges are checked by ``EngineConfig`` itself (``sweep.settings``), the
other values and cross-field rules (catalog names, cluster shape) by ``sweep.validate``.
"""

# No `from __future__ import annotations`: OmegaConf reads these annotations at runtime.

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from engine.specs import SIMULATOR_FIELDS, EngineConfig


@dataclass
class BundleConf:
    """Where the latency profile bundle comes from.

    ``source``: ``roofline`` generates one from the hardware/model specs (cached on disk
    under ``root``, default: the generator's own cache); ``aiconfigurator`` derives one from
    aiconfigurator-core's measured vLLM tables for the GPU (``profiles.aiconfigurator``,
    extra ``[aiconfigurator]``; cached the same way); ``dir`` reads measured bundles
    from ``root`` (layout ``<root>/<hardware>/<org>/<model>/<variant>/tp<N>/``). Each
    point records where its latencies came from as the ``bundle_source`` param.
    """

    source: str = "roofline"
    root: str | None = None
    variant: str = "bf16"


@dataclass
class HardwareConf:
    """One accelerator type, by its name in ``profiles/hardware/`` (the numbers live there)."""

    name: str = MISSING
    bundle: BundleConf = field(default_factory=BundleConf)
    cost_per_hour: float | None = None  # overrides the catalog price (USD per GPU-hour)


@dataclass
class ModelConf:
    """A model by its Hugging Face id or alias in ``profiles/models/``."""

    name: str = MISSING


@dataclass
class DeploymentConf:
    """The deployment part of the ``cluster`` group: replicas, DP, router, P/D, prefix tier
    (see ``sweep.cluster``)."""

    num_instances: int = 1  # replicas behind the router
    data_parallel_size: int = 1  # MoE: one lock-step DP group per replica; dense: replicas
    router: str = "least_loaded"  # round_robin, least_loaded, random, prefix_aware
    pd_disaggregation: bool = False  # prefill/decode roles
    num_prefill_instances: int = 0  # with pd_disaggregation: the first N replicas prefill
    prefix_storage: str = "none"  # prefix-cache tier below the NPU: none, cpu, cxl
    # Collective timing: the embedded analytical model, or a built ASTRA-Sim binary
    # (astra_sim, with astra_sim_binary its path; astra_bridge.backend).
    comm_backend: str = "analytical"
    astra_sim_binary: str | None = None
    # The front end between the clients and each engine (engine.frontend): api_server (vllm
    # serve over HTTP, text prompts; what vllm bench serve measures), in_process (AsyncLLM
    # given token ids) or none (clients see the engine's instants). Its costs are
    # engine.frontend.FrontEndSpec's measured defaults (docs/frontend.md).
    frontend: str = "api_server"


# EngineConfig fields that are not keys of the cluster group: the simulator's own
# (SIMULATOR_FIELDS: host-overhead calibration, extras) and chunked prefill (always on in the
# sweeps so far). A new key changes every point's config hash (sweep.config_hash), so a resumed
# sweep would re-run its finished points: add one together with a HASH_VERSION bump.
NOT_CLUSTER_KEYS = ("enable_chunked_prefill", *SIMULATOR_FIELDS)


def _engine_fields() -> list[tuple[str, Any, Any]]:
    """``(name, type, field)`` of every ``EngineConfig`` setting the cluster group exposes,
    with ``EngineConfig``'s own default (its one definition)."""
    hints = get_type_hints(EngineConfig)
    return [
        (f.name, hints[f.name], field(default=f.default))
        for f in fields(EngineConfig)
        if f.name not in NOT_CLUSTER_KEYS
    ]


# The serving cluster of a point: the deployment fields above plus the engine settings of each
# instance, generated from engine.specs.EngineConfig (vLLM's names and defaults, one each), so
# conf/cluster/*.yaml set only what differs. ``sweep.settings.engine_config`` converts back.
ClusterConf = make_dataclass("ClusterConf", _engine_fields(), bases=(DeploymentConf,))
ClusterConf.__module__ = __name__
ClusterConf.__doc__ = (
    "Serving cluster shape (DeploymentConf) and the vLLM engine settings of each instance "
    "(engine.specs.EngineConfig's fields and defaults)."
)
CLUSTER_ENGINE_KEYS = tuple(name for name, _, _ in _engine_fields())


@dataclass
class StageConf:
    """One load stage: ``rate`` req/s (0: idle) for ``duration_s`` seconds."""

    rate: float = MISSING
    duration_s: float = MISSING


@dataclass
class WorkloadConf:
    """Requests to replay: a generator or a trace (docs/sweep.md, "Workloads").

    ``kind``: ``synthetic``, ``shared_prefix`` (inference-perf), ``vllm_random`` and
    ``prefix_repetition`` (``vllm bench serve``'s datasets) or ``trace``. Every generator
    takes a load: ``rate`` req/s with ``arrival`` ``poisson``, ``gamma`` (``cv`` = coefficient
    of variation of the gaps) or ``constant``, and exactly one of ``num_requests``,
    ``duration_s`` or ``stages`` (``[{rate, duration_s}, ...]``, ``workloads.Load``).
    Synthetic: prompt and output lengths (a distribution name such as ``sharegpt``, an int, or
    a mapping, see ``workloads.LengthDist``), prompts sharing one of ``num_prefix_groups``
    prefixes of ``shared_prefix_len`` tokens. shared_prefix: ``num_groups``,
    ``num_prompts_per_group``, ``system_prompt_len``, ``question_len``, ``output_len``,
    ``shuffle``. vllm_random: ``input_len``, ``output_len``, ``range_ratio``, ``prefix_len``,
    ``num_special_tokens``. prefix_repetition: ``prefix_len``, ``suffix_len``,
    ``num_prefixes``, ``output_len``, ``shuffle``. Trace: ``path`` in ``format`` ``jsonl``
    (the reference replay format), ``azure``, ``burstgpt`` (with ``models``) or ``mooncake``
    (with ``hash_block_size``); the first ``limit`` requests, the window ``start_s`` /
    ``duration_s`` of the trace's clock, replayed at ``time_scale`` / ``rate_scale``.
    ``seed`` seeds the generators and the router.
    """

    kind: str = "synthetic"
    rate: float = 4.0
    arrival: str = "poisson"
    cv: float = 1.0
    num_requests: int | None = 200
    duration_s: float | None = None
    input_len: Any = "sharegpt"
    output_len: Any = "sharegpt"
    shared_prefix_len: int = 0
    num_prefix_groups: int = 1
    seed: int = 0
    path: str | None = None
    limit: int | None = None
    stages: list[StageConf] = field(default_factory=list)
    num_groups: int = 10
    num_prompts_per_group: int = 10
    system_prompt_len: int = 100
    question_len: int = 50
    shuffle: bool = True
    range_ratio: float = 0.0
    prefix_len: int = 0
    num_special_tokens: int = 0
    suffix_len: int = 256
    num_prefixes: int = 10
    format: str = "jsonl"
    start_s: float = 0.0
    time_scale: float = 1.0
    rate_scale: float = 1.0
    models: list[str] = field(default_factory=list)
    hash_block_size: int = 512


@dataclass
class GoodputConf:
    """Per-request SLO bounds (ms), as ``vllm bench serve --goodput``; ``null``: no bound."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None


@dataclass
class SloConf:
    """The study's SLO (``analysis.slo.SloSpec``; values in ``conf/config.yaml``): run-level
    ``bounds`` (``<metric>_ms_<stat>: ms``), per-request ``goodput`` bounds and the optional
    ``goodput_fraction``."""

    bounds: dict[str, float | None] = field(default_factory=dict)
    goodput: GoodputConf = field(default_factory=GoodputConf)
    goodput_fraction: float | None = None


@dataclass
class PlotConf:
    """The study's key plot: ``y`` metric against config column ``x``, one line per ``line``."""

    x: str = "workload.rate"
    y: str = "ttft_ms_p99"
    line: str | None = None
    logy: bool = False


@dataclass
class StudyConf:
    """A study = one MLflow experiment; ``plot`` is what ``analysis summarize`` draws."""

    name: str = "default"
    description: str = ""
    plot: PlotConf = field(default_factory=PlotConf)
    # A metric name: each multirun job then hands the sweeper that one number (NaN for a
    # failed or infeasible point), so Hydra's search sweepers (e.g. Optuna's) can drive it.
    objective: str | None = None


@dataclass
class TrackingConf:
    """MLflow logging. ``uri`` defaults to ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``;
    ``null`` turns MLflow off (the Parquet results table is still written).
    ``retry_budget_s``: how long one store write is retried (with backoff) before the point
    is counted as missing from MLflow (``sweep.tracking.RetryPolicy``).
    ``timeseries_steps``: at most this many steps of each ``ts/`` metric (means over runs of
    consecutive seconds beyond it, ``sweep.tracking.chart_series``; ``null``: every second);
    the default is what one MLflow run chart fetches. ``timeseries.parquet`` keeps every
    second."""

    uri: str | None = "${oc.env:MLFLOW_TRACKING_URI,sqlite:///mlflow.db}"
    experiment: str = "${study.name}"
    timeseries: bool = True
    requests: bool = True
    plots: bool = True
    retry_budget_s: float = 20.0
    # An MLflow run chart fetches at most 320 points of a stepped metric (``maxResults: 320``
    # in the UI of mlflow 3.17; a longer history is sampled down to that, a zoomed range
    # re-fetched), while each stored step costs the driver ~55 us per column (one ORM row):
    # 24 s for a day-long point.
    timeseries_steps: int | None = 320


@dataclass
class GroundTruthConf:
    """A vLLM ground-truth run directory to log beside the simulated runs (or ``null``)."""

    dir: str | None = None


@dataclass
class SweepConfig:
    """The whole composed config a job sees (everything but the ``hydra`` node)."""

    hardware: HardwareConf = field(default_factory=HardwareConf)
    model: ModelConf = field(default_factory=ModelConf)
    cluster: ClusterConf = field(default_factory=ClusterConf)
    workload: WorkloadConf = field(default_factory=WorkloadConf)
    slo: SloConf = field(default_factory=SloConf)
    study: StudyConf = field(default_factory=StudyConf)
    tracking: TrackingConf = field(default_factory=TrackingConf)
    groundtruth: GroundTruthConf = field(default_factory=GroundTruthConf)


def register() -> None:
    """Store the schema as ``base_config``, unless an extension of it (a subclass, e.g. the
    capacity search's schema) is stored already: then every key of ours is known anyway."""
    store = ConfigStore.instance()
    try:
        current = OmegaConf.get_type(store.load("base_config.yaml").node)
    except Exception:  # nothing stored yet
        current = None
    if isinstance(current, type) and issubclass(current, SweepConfig):
        return
    store.store(name="base_config", node=SweepConfig)
