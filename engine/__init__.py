"""servesweep's serving-engine simulator: a plain library (no Ray, Hydra or MLflow).

Entry points: :func:`engine.simulate` (one instance), :func:`engine.simulate_deployment` (a
:class:`engine.Deployment` of instances; ``engine.deployment`` says what it holds).
"""

from engine import _pure

if _pure.requested():  # the interpreted engine (the compiled core's oracle), see engine/_pure.py
    _pure.install()
else:
    _pure.check_fresh()  # never the compiled modules of older sources

from engine.batch import BatchShape, LatencyModel
from engine.deployment import Deployment, InstanceSpec
from engine.memory import KVCapacity, kv_capacity
from engine.results import SimulationResult
from engine.simulate import simulate, simulate_deployment
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec
from engine.workload import RequestSpec

__all__ = [
    "BatchShape",
    "ConfigError",
    "Deployment",
    "EngineConfig",
    "HardwareSpec",
    "InstanceSpec",
    "KVCapacity",
    "LatencyModel",
    "ModelSpec",
    "RequestSpec",
    "SimulationResult",
    "kv_capacity",
    "simulate",
    "simulate_deployment",
]
