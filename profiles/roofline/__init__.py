"""Roofline profile bundles: generated where no measured bundle exists (docs/roofline.md).

* :mod:`profiles.roofline.generate`: writes and caches a bundle for one (hardware, model, TP)
  (``ensure_bundle``, ``generate_bundle``, ``bundle_key``, ``cache_dir``, re-exported here);
* :mod:`profiles.roofline.cost`: per-rank FLOPs and HBM bytes of each layer;
* :mod:`profiles.roofline.factors` (+ ``factors.yaml``): the fitted efficiency factors, one
  set per hardware type, and the fallback for hardware without its own;
* :mod:`profiles.roofline.grid`: the profiler's grids the rows sit on;
* :mod:`profiles.roofline.fit`: fits every set, the RTX PRO 6000's to its measured bundles and
  the other aiconfigurator systems' to NVIDIA's tables (``python -m profiles.roofline.fit``);
* :mod:`profiles.roofline.check`: error of a generated table against a measured one.
"""

from profiles.roofline.generate import bundle_key, cache_dir, ensure_bundle, generate_bundle

__all__ = ["bundle_key", "cache_dir", "ensure_bundle", "generate_bundle"]
