"""``SERVESWEEP_PURE_PYTHON=1``: import the engine from its Python sources, not the compiled core.

``setup.py`` compiles some modules (the engine's core, the bundle latency model) with Cython
from their own ``.py`` files; the built extension modules sit beside the sources, and Python's
import system prefers them. With this variable set, a finder installed by
``engine/__init__.py`` (before any engine submodule is imported) loads each of them from its
``.py`` file instead: the same logic, interpreted. That is the oracle ``tests/engine/test_compiled_core.py`` checks the compiled
modules against step for step, and the way to debug the engine with a Python debugger.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

ENV = "SERVESWEEP_PURE_PYTHON"
_ROOT = Path(__file__).resolve().parent.parent  # the directory that holds engine/, profiles/


def requested() -> bool:
    """Whether the environment asks for the interpreted engine."""
    return os.environ.get(ENV, "") not in ("", "0")


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds a module as usual; when that is one of our compiled modules (an extension module
    under this project's directory with its ``.py`` beside it), loads the ``.py`` instead."""

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.origin or spec.loader is None:
            return None
        origin = Path(spec.origin)
        if not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return None
        if _ROOT not in origin.resolve().parents:
            return None
        src = origin.with_name(origin.name.split(".", 1)[0] + ".py")
        if not src.is_file():
            return None
        return importlib.util.spec_from_file_location(
            name, src, loader=importlib.machinery.SourceFileLoader(name, str(src))
        )


STAMP = Path(__file__).resolve().parent / "_compiled_sources.json"


def digest(module: str) -> str:
    """sha256 of a module's .py and .pxd: what setup.py stamps for each module it compiles."""
    h = hashlib.sha256()
    base = _ROOT / module.replace(".", "/")
    for suffix in (".py", ".pxd"):
        f = base.with_suffix(suffix)
        if f.is_file():
            h.update(suffix.encode() + f.read_bytes())
    return h.hexdigest()


def check_fresh() -> None:
    """Refuse to run a compiled module whose source changed after it was built, or an
    extension module the build did not make (either would run old code): the error names the
    modules and the fix."""
    if not STAMP.is_file():
        return  # never built here: every module runs from source
    built = json.loads(STAMP.read_text())
    strays = sorted(set(extension_modules({m.split(".")[0] for m in built})) - set(built))
    if strays:
        raise ImportError(
            f"extension modules not part of the compiled core's build: {', '.join(strays)} "
            "(left over from an earlier build, they would run old code): delete their .so "
            "files and rebuild with `pip install -e .`"
        )
    stale = sorted(m for m, d in built.items() if digest(m) != d)
    if stale:
        raise ImportError(
            f"the compiled engine core is older than its sources ({', '.join(stale)} changed "
            "since the build): rebuild it with `pip install -e .` (or `python setup.py "
            f"build_ext --inplace`), or run the sources as they are with {ENV}=1"
        )


def extension_modules(packages: set[str], root: Path | None = None) -> dict[str, Path]:
    """The extension modules under these top-level packages of ``root`` (None: this
    project's directory): dotted name -> file."""
    root = _ROOT if root is None else root
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = {}
    for top in packages:
        for f in (root / top).rglob("*.so"):
            if f.name.endswith(suffixes):
                rel = f.relative_to(root).with_name(f.name.split(".", 1)[0])
                out[".".join(rel.parts)] = f
    return out


def install() -> None:
    """Put the source finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())


def compiled_modules() -> list[str]:
    """Our modules this process runs compiled (empty under ``SERVESWEEP_PURE_PYTHON``)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = []
    for name, mod in list(sys.modules.items()):
        f = str(getattr(mod, "__file__", "") or "")
        if f.endswith(suffixes) and _ROOT in Path(f).resolve().parents:
            out.append(name)
    return sorted(out)
