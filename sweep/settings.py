"""The one conversion from a sweep config's ``cluster`` group to ``engine.EngineConfig``.

The cluster schema (``sweep.schema.ClusterConf``) carries ``EngineConfig``'s settings under
their own names, so the conversion copies them by name; ``EngineConfig`` checks the values
and ``check_model`` the ones that depend on the model. Errors name the Hydra key
(``cluster.block_size=7 is not allowed; allowed: ...``). Used by the validator
(``sweep.validate``, so the driver refuses a bad point before anything runs) and by the job
(``sweep.job``), which the capacity search runs too.
"""

from __future__ import annotations

from typing import Any

from engine.specs import EngineConfig, ModelSpec, SettingError
from sweep.schema import CLUSTER_ENGINE_KEYS

PREFIX = "cluster."


def engine_config(cluster: Any, model: ModelSpec | None = None) -> EngineConfig:
    """The engine settings of one instance of ``cluster`` (a composed ``cfg.cluster`` or a
    plain mapping of it), checked against ``model`` when given."""
    try:
        config = EngineConfig(**{key: cluster[key] for key in CLUSTER_ENGINE_KEYS})
        if model is not None:
            config.check_model(model)
    except SettingError as err:
        raise err.named(PREFIX) from None
    return config
