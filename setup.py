"""Build the engine's compiled core (``pip install -e .`` or ``pip install .``).

The scheduler, KV cache manager, block pool, request state and engine loop
(``engine/{request,block_pool,kv_cache,scheduler,instance}.py``) and the bundle latency model
(``profiles/latency.py``) are compiled by Cython from their own Python sources; the C types of
their attributes and hot locals are declared beside them in the matching ``.pxd`` files
("augmenting" declarations: the ``.py`` stays plain, runnable Python). One implementation of the logic: the uncompiled sources are the oracle the
tests compare the compiled modules against step for step (``SERVESWEEP_PURE_PYTHON=1``,
``engine/_pure.py``). Everything else in ``pyproject.toml``.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

# Dotted module names; each is built from its own .py (types from the .pxd beside it, if any).
COMPILED = (
    "engine.request",
    "engine.block_pool",
    "engine.kv_cache",
    "engine.scheduler",
    "engine.instance",
    "profiles.latency",  # the bundle latency model: no .pxd, compiled as it is
)

setup(
    ext_modules=cythonize(
        [Extension(name, [name.replace(".", "/") + ".py"]) for name in COMPILED],
        compiler_directives={
            "language_level": 3,
            # Types come from the .pxd files only; the .py annotations are documentation
            # (``x: int`` must stay a Python int, which may exceed 64 bits).
            "annotation_typing": False,
        },
        quiet=True,
    ),
)
