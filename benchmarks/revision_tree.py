"""A git revision's source tree for a side-by-side benchmark (``--compare REV``).

``checkout(rev, dest)`` extracts revision ``rev`` of this repository with ``git archive`` into
``dest`` (the repository and its work tree are not touched) and, when the revision has a
compiled core (a ``setup.py``), builds it there in place: without that build an older
revision's engine runs interpreted (it refuses nothing without a stamp) and the comparison
would measure the interpreter, not the revision. Used by ``engine_scale.py`` and
``sweep_overhead.py``; the caller imports the tree through ``PYTHONPATH`` or its cwd.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def checkout(rev: str, dest: Path) -> Path:
    """Revision ``rev`` extracted into ``dest`` (created) with its compiled core built."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    if (dest / "setup.py").is_file():
        if importlib.util.find_spec("Cython") is None:  # pip's isolated build had it, not us
            raise SystemExit(f"--compare {rev}: building its compiled core needs Cython in "
                             f"this environment ({sys.executable}); install the version its "
                             "pyproject.toml's build-system asks for (pip install cython) "
                             "and rerun")
        print(f"building {rev}'s compiled core ...", file=sys.stderr, flush=True)
        built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                               cwd=dest, capture_output=True, text=True, errors="replace")
        if built.returncode != 0:
            output = (built.stdout + built.stderr)[-3000:]
            raise SystemExit(f"--compare {rev}: building its compiled core in {dest} failed "
                             f"(exit {built.returncode}):\n{output}")
    return dest
