"""Can the tracking store be used at all? Checked before anything runs, without MLflow.

``check_store`` finds a sqlite file that cannot be created or written, and an HTTP server
that does not answer within ``REACH_TIMEOUT_S``: MLflow's own client would retry for
minutes and then raise a chain of tracebacks. Standard library only, so the config
validator can call it without importing MLflow.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

REACH_TIMEOUT_S = 5.0


class TrackingError(RuntimeError):
    """The tracking store cannot be used; the message names ``tracking.uri`` and the fix."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative paths are cwd-relative)."""
    prefix = "sqlite:///"
    return Path(uri[len(prefix) :]) if uri.startswith(prefix) else None


def check_store(uri: str) -> None:
    """Raise ``TrackingError`` when ``uri`` cannot work: a sqlite file that cannot be
    created or written, or an HTTP server that does not answer within a few seconds."""
    db = sqlite_path(uri)
    fix = "set tracking.uri to a reachable store, or tracking.uri=null to run without MLflow"
    if db is not None:
        folder = db.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TrackingError(
                f"tracking.uri={uri}: cannot create folder {folder} ({err.strerror}); {fix}"
            ) from None
        target = db if db.exists() else folder
        if not os.access(target, os.W_OK):
            raise TrackingError(f"tracking.uri={uri}: {target} is not writable; {fix}")
        return
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=REACH_TIMEOUT_S):
                pass
        except urllib.error.HTTPError:
            pass  # something answers (an older server, a proxy): MLflow calls will tell
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise TrackingError(
                f"tracking.uri={uri}: no MLflow server answered within {REACH_TIMEOUT_S:g} s "
                f"({reason}); start one (mlflow server --host 127.0.0.1 --port <port> "
                f"--backend-store-uri sqlite:///mlflow.db) or {fix}"
            ) from None
