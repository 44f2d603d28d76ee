"""``SERVESWEEP_PURE_PYTHON=1``: import the engine from its Python sources, not the compiled core.

``setup.py`` compiles some engine modules with Cython from their own ``.py`` files; the built
extension modules sit beside the sources, and Python's import system prefers them. With this
variable set, a finder installed by ``engine/__init__.py`` (before any engine submodule is
imported) loads every ``engine.*`` module from its ``.py`` file instead: the same logic,
interpreted. That is the oracle ``tests/engine/test_compiled_core.py`` checks the compiled
modules against step for step, and the way to debug the engine with a Python debugger.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

ENV = "SERVESWEEP_PURE_PYTHON"
_HERE = Path(__file__).resolve().parent


def requested() -> bool:
    """Whether the environment asks for the interpreted engine."""
    return os.environ.get(ENV, "") not in ("", "0")


class _SourceFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if not name.startswith("engine.") or name.count(".") != 1:
            return None
        src = _HERE / (name.split(".", 1)[1] + ".py")
        if not src.is_file():
            return None
        return importlib.util.spec_from_file_location(
            name, src, loader=importlib.machinery.SourceFileLoader(name, str(src))
        )


def install() -> None:
    """Put the source finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())


def compiled_modules() -> list[str]:
    """The engine modules this process runs compiled (empty under ``SERVESWEEP_PURE_PYTHON``)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(
        name
        for name, mod in sys.modules.items()
        if name.startswith("engine.") and str(getattr(mod, "__file__", "")).endswith(suffixes)
    )
