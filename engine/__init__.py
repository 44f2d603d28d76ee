"""servesweep's serving-engine simulator: a plain library (no Ray, Hydra or MLflow).

Entry point: :func:`engine.simulate`.
"""

from engine.batch import BatchShape, LatencyModel
from engine.memory import KVCapacity, kv_capacity
from engine.results import SimulationResult
from engine.simulate import simulate
from engine.specs import ConfigError, EngineConfig, HardwareSpec, ModelSpec
from engine.workload import RequestSpec

__all__ = [
    "BatchShape",
    "ConfigError",
    "EngineConfig",
    "HardwareSpec",
    "KVCapacity",
    "LatencyModel",
    "ModelSpec",
    "RequestSpec",
    "SimulationResult",
    "kv_capacity",
    "simulate",
]
