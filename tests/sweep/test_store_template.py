"""A new sqlite store copied from the template is the store MLflow would have created."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sweep import store_template
from sweep.store_lock import open_tracker


def _schema(db: Path) -> list[tuple[str, list[str]]]:
    """Every table and index with its definition's lines in sorted order (MLflow's own
    migrations emit a table's constraints in varying order from one store to the next)."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")
        return sorted((name, sorted(line.strip().rstrip(",") for line in sql.splitlines()))
                      for name, sql in rows)


def _rows(db: Path, table: str) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute(f"SELECT * FROM {table}").fetchall()  # noqa: S608


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache" / "mlflow_store"


def test_seeded_store_matches_mlflow(tmp_path: Path, cache: Path) -> None:
    from mlflow.tracking import MlflowClient

    own = tmp_path / "own" / "mlflow.db"
    own.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{own}").create_experiment("study")
    first = open_tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "study")
    second = open_tracker(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", "study")
    assert len(list(cache.glob("mlflow-*.db"))) == 1  # made once, copied twice
    for tracker, name in ((first, "a"), (second, "b")):
        db = tmp_path / name / "mlflow.db"
        assert _schema(db) == _schema(own)
        assert _rows(db, "alembic_version") == _rows(own, "alembic_version")
        default = tracker.client.get_experiment("0")
        assert default.name == "Default"
        assert default.artifact_location == str(tmp_path / "mlruns" / "0")  # resolved here
        exp = tracker.client.get_experiment(tracker.experiment_id)
        assert (exp.experiment_id, exp.name) == ("1", "study")
        run = tracker.create_run("p", {"k": "v"})
        tracker.log_point(run, {"a": 1}, {"m": 2.0}, series={"x": [1.0, 2.0]}, steps=[0, 1])
        tracker.finish(run, "FINISHED")
        got = tracker.client.get_run(run)
        assert got.info.status == "FINISHED" and got.data.metrics["m"] == 2.0
        assert [m.value for m in tracker.client.get_metric_history(run, "ts/x")] == [1.0, 2.0]
    assert _rows(tmp_path / "a" / "mlflow.db", "experiments")[0][2] == str(
        tmp_path / "mlruns" / "0")


def test_existing_store_is_not_touched(tmp_path: Path, cache: Path) -> None:
    db = tmp_path / "mlflow.db"
    open_tracker(f"sqlite:///{db}", "one")
    before = db.stat().st_mtime_ns, _rows(db, "experiments")
    assert store_template.seed_store(db) is False
    assert (db.stat().st_mtime_ns, _rows(db, "experiments")) == before


def test_damaged_template_is_remade(tmp_path: Path, cache: Path) -> None:
    open_tracker(f"sqlite:///{tmp_path / 'a.db'}", "one")
    (template,) = cache.glob("mlflow-*.db")
    template.write_bytes(b"not a database")
    tracker = open_tracker(f"sqlite:///{tmp_path / 'b.db'}", "one")
    assert tracker.client.get_experiment("0").name == "Default"
    assert store_template._is_template(template)


def test_unusable_cache_leaves_it_to_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            ) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SERVESWEEP_CACHE", str(blocker))  # a file: no folder can be made in it
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlflow.db"
    assert store_template.seed_store(db) is False and not db.exists()
    tracker = open_tracker(f"sqlite:///{db}", "one")
    assert tracker.client.get_experiment("0").name == "Default"
