"""Typed schemas of the sweep config, registered in Hydra's ConfigStore as ``base_config``.

``conf/config.yaml`` lists ``base_config`` first in its defaults, so every group file
(``hardware/``, ``model/``, ``cluster/``, ``workload/``) is merged into these dataclasses
and a misspelt key or a wrongly typed value fails at composition time, naming the key.
Value ranges and cross-field rules (catalog names, TP vs heads) are checked by
``sweep.validate``.
"""

# No `from __future__ import annotations`: OmegaConf reads these annotations at runtime.

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


@dataclass
class BundleConf:
    """Where the latency profile bundle comes from.

    ``source``: ``roofline`` generates one from the hardware/model specs (cached on disk
    under ``root``, default: the generator's own cache); ``dir`` reads measured bundles
    from ``root`` (layout ``<root>/<hardware>/<org>/<model>/<variant>/tp<N>/``).
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
class ClusterConf:
    """Serving cluster shape and vLLM engine knobs (per instance); see ``sweep.cluster``."""

    num_instances: int = 1  # replicas behind the router
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1  # MoE: one lock-step DP group per replica; dense: replicas
    expert_parallel_size: int = 1  # 1 or tensor_parallel_size x data_parallel_size (MoE)
    router: str = "least_loaded"  # round_robin, least_loaded, random, prefix_aware
    pd_disaggregation: bool = False  # prefill/decode roles
    num_prefill_instances: int = 0  # with pd_disaggregation: the first N replicas prefill
    prefix_storage: str = "none"  # prefix-cache tier below the NPU: none, cpu, cxl
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    reserve_full_isl: bool = True
    long_prefill_token_threshold: int = 0
    max_model_len: int | None = None
    num_gpu_blocks_override: int | None = None
    async_scheduling: bool = True


@dataclass
class WorkloadConf:
    """Requests to replay: a synthetic generator or a trace file (reference JSONL).

    Synthetic: ``rate`` req/s with ``arrival`` ``poisson`` or ``gamma`` (``cv`` = coefficient
    of variation of the gaps), exactly one of ``num_requests`` / ``duration_s``, prompt and
    output lengths (a distribution name such as ``sharegpt``, an int, or a mapping, see
    ``workloads.LengthDist``), prompts sharing one of ``num_prefix_groups`` prefixes of
    ``shared_prefix_len`` tokens, ``seed``. Trace: ``path`` to a JSONL file, optionally the
    first ``limit`` requests.
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


@dataclass
class SloConf:
    """Service-level objectives for goodput; ``null`` disables a bound."""

    ttft_ms: float | None = 2000.0
    tpot_ms: float | None = 100.0
    e2el_ms: float | None = None


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


@dataclass
class TrackingConf:
    """MLflow logging. ``uri`` defaults to ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``;
    ``null`` turns MLflow off (the Parquet results table is still written)."""

    uri: str | None = "${oc.env:MLFLOW_TRACKING_URI,sqlite:///mlflow.db}"
    experiment: str = "${study.name}"
    timeseries: bool = True
    requests: bool = True
    plots: bool = True


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
