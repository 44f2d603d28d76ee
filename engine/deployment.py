"""What the engine runs: a deployment of serving instances, and the interfaces that price it.

A :class:`Deployment` is the engine's whole input besides the workload: its instances
(:class:`InstanceSpec`), the router policy, the P/D hand-off price and the DP padding rule.
Front ends do not build it by hand: they describe the deployment
(``profiles.deployment.DeploymentPlan``: from a sweep point's ``cluster`` group in
``sweep.cluster``, from a reference cluster JSON in ``analysis.scenario``) and
``profiles.deployment.assemble`` builds it, computing each instance's KV capacity once
(:func:`engine.memory.kv_capacity`).

The interfaces the engine calls, implemented elsewhere:

* :class:`engine.batch.LatencyModel` (``iteration_ns``, ``stage_ns``): the step price of one
  instance (``profiles``);
* :data:`KvTransfer`: the P/D hand-off, ``(prefill instance, decode instance, tokens) -> ns``
  (``profiles.parallel.pd_transfer``);
* :data:`DpPad`: how a lock-step DP group's batches are lined up before pricing
  (``profiles.parallel.dp_pad``);
* :class:`engine.kv_tiers.TierTiming`: one access to a prefix-cache tier below the NPU
  (``astra_bridge.memory.MemoryTier``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.batch import BatchShape, LatencyModel
from engine.frontend import FrontEndSpec
from engine.kv_tiers import KVTierPool
from engine.memory import KVCapacity
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec

ROLES = ("colocated", "prefill", "decode")

# (prefill instance name, decode instance name, tokens whose KV moves) -> ns after the
# prefill step ends until the decode instance holds the KV.
KvTransfer = Callable[[str, str, int], int]
# The batches of a DP group's members (None: idle) -> the shapes they run in one round. A rule
# reads the batches' token and sequence counts only and leaves a batch's decode fields
# (num_decode, decode_kv_sum/min/max) as they are: padding the batches of a decode span's step
# i is padding its step 0 and advancing each busy member's batch i tokens
# (engine.batch.decode_advanced), which the engine's DP spans rely on to price rounds in bulk
# (engine.instance.EngineUnit._plan_span; tests/profiles/test_parallel_latency.py checks it).
DpPad = Callable[[list[BatchShape | None]], list[BatchShape]]


@dataclass(slots=True)
class InstanceSpec:
    """One serving instance of a cluster (one vLLM engine, or one rank of a DP group).

    ``capacity`` is the instance's KV cache (:func:`engine.memory.kv_capacity` of ``model``,
    ``hardware`` and ``config``), computed once by whoever assembles the deployment.
    ``tiers`` are the prefix-cache tiers below the NPU in lookup order (pools may be shared by
    instances); ``recall_requesters`` the NPUs that each load a lower-tier recall (the
    reference bills every NPU: tp x pp).
    """

    name: str
    model: ModelSpec
    hardware: HardwareSpec
    config: EngineConfig
    latency: LatencyModel
    capacity: KVCapacity
    role: str = "colocated"
    dp_group: str | None = None  # members of one group step in lock-step
    tiers: Sequence[KVTierPool] = ()
    recall_requesters: int = 1

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"instance {self.name!r}: role={self.role!r}; use one of {ROLES}")
        if self.capacity.block_size != self.config.block_size:
            raise ConfigError(
                f"instance {self.name!r}: its KV capacity is in blocks of "
                f"{self.capacity.block_size} tokens but block_size={self.config.block_size}; "
                "compute it with engine.memory.kv_capacity of this config"
            )


@dataclass(slots=True)
class Deployment:
    """Everything :func:`engine.simulate.simulate_deployment` needs besides the workload.

    ``kv_transfer_ns`` prices the P/D hand-off (required when an instance is a prefill
    instance), ``dp_pad`` lines up lock-step DP groups (None: each member runs its own batch),
    ``frontend`` is the API server in front of every engine (``engine.frontend``; None: the
    client sees the engine's own instants).
    ``num_gpus`` counts the deployment's GPUs; ``notes`` say what the assembly chose or ignored
    (e.g. a generated roofline bundle); ``range_warnings`` name engine limits beyond the
    profiled range of an instance's bundle (its step prices extrapolate there).
    """

    instances: list[InstanceSpec]
    router: str = "least_loaded"
    kv_transfer_ns: KvTransfer | None = None
    dp_pad: DpPad | None = None
    frontend: FrontEndSpec | None = None
    num_gpus: int = 0
    notes: list[str] = field(default_factory=list)
    range_warnings: list[str] = field(default_factory=list)
