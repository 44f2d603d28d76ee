"""Profile data, latency models and the assembly of deployments.

* Measured profiles: ``profiles.bundle`` reads an LLMServingSim-layout bundle,
  ``profiles.architecture`` the layer rows of a model family, ``profiles.latency``'s
  ``ProfiledLatencyModel`` prices one engine step on one rank exactly as the reference does.
* ``profiles.roofline``: generated bundles where no measured one exists.
* ``profiles.parallel``: an instance's layout, its collectives, DP padding and P/D hand-off.
* ``profiles.placement``: weights streamed from host DRAM / CXL every step.
* ``profiles.catalog``: the model and hardware catalogs.
* ``profiles.deployment``: the typed deployment description and its one assembly into the
  engine's ``engine.deployment.Deployment``.
"""

import engine  # noqa: F401  (first: under SERVESWEEP_PURE_PYTHON it makes profiles.latency load from source)
from profiles.architecture import Architecture, ArchitectureError, load_architecture
from profiles.bundle import (
    BundleError,
    ProfileBundle,
    clear_bundle_cache,
    load_bundle,
    variant_name,
)
from profiles.latency import ProfiledLatencyModel

__all__ = [
    "Architecture",
    "ArchitectureError",
    "BundleError",
    "ProfileBundle",
    "ProfiledLatencyModel",
    "clear_bundle_cache",
    "load_architecture",
    "load_bundle",
    "variant_name",
]
