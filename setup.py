"""Build the engine's compiled core (``pip install -e .`` or ``pip install .``).

The engine's modules and latency models named in ``COMPILED`` below are compiled by Cython
from their own Python sources; for the scheduler, KV cache manager, block pool, request state,
engine loop, API server and bundle latency model the C types of their attributes and hot locals are
declared beside them in the matching ``.pxd`` files
("augmenting" declarations: the ``.py`` stays plain, runnable Python). One implementation of
the logic: the uncompiled sources are the oracle the tests compare the compiled modules
against step for step (``SERVESWEEP_PURE_PYTHON=1``, ``engine/_pure.py``). Everything else
in ``pyproject.toml``.
"""

import importlib.util
import json
import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# What engine/_pure.py checks at import: the sources each compiled module was built from. The
# digest rule is _pure.digest's (that module imports only the standard library, so the build
# loads it by path).
STAMP = "engine/_compiled_sources.json"
_spec = importlib.util.spec_from_file_location("_servesweep_pure", HERE / "engine" / "_pure.py")
assert _spec is not None and _spec.loader is not None
_pure = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_pure)

# Dotted module names; each is built from its own .py (types from the .pxd beside it, if any).
COMPILED = (
    "engine.request",
    "engine.block_pool",
    "engine.kv_cache",
    "engine.scheduler",
    "engine.instance",
    "engine.cluster",  # the event loop (run_cluster), the router
    "engine.frontend",  # the API server queue
    "engine.results",
    "engine.simulate",
    "profiles.parallel.latency",
    "profiles.parallel.dp_pad",
    "profiles.latency",  # the bundle latency model (C types for its interpolation primitives)
)


class StampedBuildExt(build_ext):
    """build_ext that records the source digests of the modules it built (in the source tree
    for an in-place / editable build, in the build tree otherwise) and, for a wheel, drops
    extension modules of earlier builds from the build tree."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1  # compile the modules side by side

    def run(self) -> None:
        super().run()
        if self.inplace:
            root = HERE
        else:  # a wheel takes build_lib whole: no module of an earlier build
            root = Path(self.build_lib)
            built = _pure.extension_modules({m.split(".")[0] for m in COMPILED}, root)
            for name, f in built.items():
                if name not in COMPILED:
                    f.unlink()
        # Beside the modules it describes only (a stamp in the source tree without built
        # modules there would refuse the sources once they change).
        stamp = json.dumps({m: _pure.digest(m) for m in COMPILED}, indent=1, sort_keys=True)
        (root / STAMP).parent.mkdir(parents=True, exist_ok=True)
        (root / STAMP).write_text(stamp + "\n")


setup(
    cmdclass={"build_ext": StampedBuildExt},
    ext_modules=cythonize(
        [Extension(name, [name.replace(".", "/") + ".py"]) for name in COMPILED],
        compiler_directives={
            "language_level": 3,
            # Types come from the .pxd files only; the .py annotations are documentation
            # (``x: int`` must stay a Python int, which may exceed 64 bits).
            "annotation_typing": False,
            # Indices in the compiled core are never negative and always in range (the pure
            # Python oracle, SERVESWEEP_PURE_PYTHON=1, raises on any that is not): no checks.
            "boundscheck": False,
            "wraparound": False,
        },
        quiet=True,
        nthreads=os.cpu_count() or 1,
    ),
)
