"""``sweep.tracking._context_tags``: MLflow's own run-context tags, without importing IPython
in a process that runs no IPython shell."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from sweep.tracking import _context_tags
ours = _context_tags()
ipython_loaded = "IPython" in sys.modules
from mlflow.tracking.context.registry import resolve_tags
theirs = {k: str(v) for k, v in resolve_tags().items()}  # imports IPython where installed
print(json.dumps({"same": ours == theirs, "ipython": ipython_loaded, "keys": sorted(ours),
                  "blocked_left": sys.modules.get("IPython", 0) is None}))
"""


def test_same_tags_as_mlflow_without_importing_ipython():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["same"], res
    assert not res["ipython"]
    assert not res["blocked_left"]
    assert {"mlflow.user", "mlflow.source.name", "mlflow.source.type"} <= set(res["keys"])


def test_a_loaded_ipython_is_left_to_the_probes(monkeypatch):
    from mlflow.tracking.context.jupyter_notebook_context import JupyterNotebookRunContext

    from sweep import tracking

    seen = []
    monkeypatch.setattr(JupyterNotebookRunContext, "in_context",
                        lambda self: seen.append(sys.modules.get("IPython", 0)) or False)
    marker = object()
    monkeypatch.setitem(sys.modules, "IPython", marker)
    tracking._context_tags()
    assert seen == [marker]
    assert sys.modules["IPython"] is marker
