"""A new sqlite MLflow store as a copy of one MLflow created and migrated once.

MLflow creates a sqlite store by building its initial tables and then running every alembic
migration since (about 60 for MLflow 3.x): 2.8 CPU-s and 3 to 6 s of wall time on the
2-core development machine, paid by every sweep or single run that starts in a new
directory. ``seed_store`` instead copies a *template*: a store that MLflow itself created
and migrated once per MLflow version, kept under ``$SERVESWEEP_CACHE/mlflow_store`` (default
``~/.cache/servesweep/mlflow_store``), with the one row MLflow writes that depends on where
the store is used removed: the ``Default`` experiment (id 0), whose artifact location is
resolved from the working directory. On first use of the copy MLflow finds its tables at
the head revision and creates that experiment itself
(``SqlAlchemyStore._initialize_store_state``), so the copy ends up as MLflow would have made
it here. Any problem with the template (an unwritable cache, a damaged file) leaves the
store to MLflow, as before.

Only ``sweep.store_lock.open_tracker`` calls it, under the store's lock, and only for a
database file that does not exist yet.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_ENV = "SERVESWEEP_CACHE"
SUBDIR = "mlflow_store"


def template_dir() -> Path:
    """``$SERVESWEEP_CACHE/mlflow_store``, else ``~/.cache/servesweep/mlflow_store``."""
    env = os.environ.get(CACHE_ENV)
    root = Path(env) if env else Path("~/.cache/servesweep")
    return (root / SUBDIR).expanduser()


def _template_path() -> Path:
    from importlib.metadata import version

    return template_dir() / f"mlflow-{version('mlflow')}.db"


def _make_template(path: Path) -> None:
    """Let MLflow create and migrate a store at a temporary name, drop its ``Default``
    experiment and rename it to ``path`` (atomic, so concurrent makers are harmless)."""
    from mlflow.tracking import MlflowClient

    path.parent.mkdir(parents=True, exist_ok=True)
    # A new name each time: MLflow caches the store of a URI for the process's lifetime.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp}")
        client.search_experiments()  # the store is created (tables, migrations) on first use
        dispose_client(client)
        with sqlite3.connect(tmp) as con:
            runs = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            experiments = con.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
            if runs or experiments != 1:
                raise RuntimeError(f"a new store holds {experiments} experiments, {runs} runs")
            con.execute("DELETE FROM experiments WHERE experiment_id = 0")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def dispose_client(client: object) -> None:
    """Close every connection of the SQLAlchemy engine behind the MLflow ``client``'s store
    (here before the template file is renamed; ``Tracker.close`` at the end of a run, where
    closing the last connection checkpoints sqlite's write-ahead log into the file)."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    engine = getattr(store, "engine", None)
    if engine is not None:
        engine.dispose()


def _is_template(path: Path) -> bool:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            ok = con.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            rev = con.execute("SELECT version_num FROM alembic_version").fetchall()
            empty = con.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == 0
        return ok and len(rev) == 1 and empty
    except sqlite3.Error:
        return False


def seed_store(db: Path) -> bool:
    """Create the sqlite store ``db`` (which must not exist) as a copy of the template, made
    first if needed; True when it did, False when MLflow should create it instead."""
    if db.exists():
        return False
    try:
        template = _template_path()
        if not (template.is_file() and _is_template(template)):
            _make_template(template)
        tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
        try:
            shutil.copyfile(template, tmp)
            os.replace(tmp, db)
        finally:
            tmp.unlink(missing_ok=True)
    except Exception as err:  # the template is an optimisation: MLflow creates the store
        log.debug("MLflow store template not used for %s: %s: %s", db, type(err).__name__, err)
        return False
    return True
