"""Reading an MLflow sqlite store from tests without racing the driver that creates it."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def finished_points(db: Path) -> int:
    """Finished point runs in the store, read with plain read-only sqlite: an MLflow client
    here would race the driver's creation of the schema."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
            return con.execute(
                "SELECT COUNT(*) FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                "WHERE r.status = 'FINISHED' AND t.key = 'config_hash'").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is still being created
        return 0
