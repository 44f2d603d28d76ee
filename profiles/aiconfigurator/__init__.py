"""aiconfigurator-core as a profile source: bundles for GPUs we have no measurements of.

NVIDIA's ``aiconfigurator-core`` (optional extra ``servesweep[aiconfigurator]``, pinned
0.12.0) ships measured vLLM operator tables for h100_sxm, h200_sxm, b200_sxm, b300_sxm,
gb200, gb300, l40s, a100_sxm and rtx_pro_6000_server. Three modules:

* :mod:`profiles.aiconfigurator.tables`: reads the shipped tables (GEMM, prefill / decode
  attention, MoE, custom all-reduce, NCCL) and system YAMLs, with interpolation;
* :mod:`profiles.aiconfigurator.skew`: the skew correction of batches with mixed KV lengths,
  derived from the attention kernel's CTA layout over the GPU's SMs;
* :mod:`profiles.aiconfigurator.build`: turns them into our bundle layout for one
  (system, model, TP, dtype), cached on disk (``ensure_bundle``).

Its collective tables price TP / EP collectives through :mod:`profiles.parallel.comm`.

Use: ``hardware.bundle.source: aiconfigurator`` in a sweep, ``python -m analysis validate
--profiles aiconfigurator``, or ``load_bundle(ensure_bundle(hw, model, tp))``.
docs/aiconfigurator.md gives the model per table and its error against measured bundles.
"""

from profiles.aiconfigurator.build import ensure_bundle, source_label
from profiles.aiconfigurator.tables import (
    INSTALL_HINT,
    PINNED_VERSION,
    SYSTEMS,
    AiconfiguratorError,
    installed_version,
    system_for,
    systems_dir,
)

__all__ = [
    "INSTALL_HINT",
    "PINNED_VERSION",
    "SYSTEMS",
    "AiconfiguratorError",
    "ensure_bundle",
    "installed_version",
    "source_label",
    "system_for",
    "systems_dir",
]
