"""A Hydra launcher that runs sweep jobs on a pool of long-lived Ray actors.

Selected with ``hydra/launcher=ray_actor``. Importing this package must stay cheap: Hydra
imports every module under the ``hydra_plugins`` namespace on every start-up, so ``ray``
is imported lazily inside the launcher.
"""
