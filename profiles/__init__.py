"""Profile data: measured bundles, architectures, catalogs and latency models.

Measured-profile side (``profiles.bundle``, ``profiles.architecture``, ``profiles.latency``):
``load_bundle`` reads an LLMServingSim-layout bundle, ``ProfiledLatencyModel`` prices one
engine step from it exactly as the reference simulator does.
"""

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
