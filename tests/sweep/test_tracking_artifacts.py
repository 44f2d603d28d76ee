"""``Tracker.log_artifact``: a run created by the tracker logs its files through the artifact
repository of the URI ``create_run`` answered, without reading the run back; any other run
through MLflow's client; a failed write is retried like every other store write."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
from mlflow.tracking import MlflowClient

from sweep.tracking import RetryPolicy, Tracker, TrackingWriteError

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


@pytest.fixture
def tracker(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # artifacts under ./mlruns
    return Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "artifacts",
                   retry=RetryPolicy(first_s=0.01, budget_s=0.2))


def names(client: MlflowClient, run_id: str) -> list[str]:
    return sorted(f.path for f in client.list_artifacts(run_id))


def test_a_run_made_here_logs_without_reading_the_run_back(tracker, tmp_path, monkeypatch):
    run = tracker.create_run("point", {"kind": "point"})
    tracker.log_params(run, {f"p{i}": i for i in range(80)})
    files = [tmp_path / "metrics.json", tmp_path / "config_resolved.yaml"]
    for f in files:
        f.write_text(f.name)

    def no_read(*args, **kwargs):
        raise AssertionError("the run was read back for its artifact URI")

    with monkeypatch.context() as m:
        m.setattr(tracker.client, "get_run", no_read)
        m.setattr(tracker.client._tracking_client, "get_run", no_read)
        for f in files:
            tracker.log_artifact(run, f)
    tracker.finish(run, "FINISHED")
    reader = MlflowClient(tracker.uri)
    assert names(reader, run) == ["config_resolved.yaml", "metrics.json"]
    local = reader.download_artifacts(run, "metrics.json", str(tmp_path / "back"))
    assert Path(local).read_text() == "metrics.json"


def test_a_run_made_elsewhere_goes_through_the_client(tracker, tmp_path):
    other = MlflowClient(tracker.uri)
    run = other.create_run(tracker.experiment_id).info.run_id
    f = tmp_path / "meta.json"
    f.write_text("{}")
    tracker.log_artifact(run, f)
    assert names(other, run) == ["meta.json"]


def test_a_failed_write_is_retried_then_reported(tracker, tmp_path, monkeypatch):
    run = tracker.create_run("point", {})
    f = tmp_path / "requests.parquet"
    f.write_bytes(b"x")
    real = LocalArtifactRepository.log_artifact
    calls = []

    def flaky(self, local_file, artifact_path=None):
        calls.append(local_file)
        if len(calls) == 1:
            raise OSError("disk busy")
        return real(self, local_file, artifact_path)

    monkeypatch.setattr(LocalArtifactRepository, "log_artifact", flaky)
    tracker.log_artifact(run, f)
    assert len(calls) == 2 and names(MlflowClient(tracker.uri), run) == ["requests.parquet"]

    def broken(self, local_file, artifact_path=None):
        raise OSError("disk gone")

    monkeypatch.setattr(LocalArtifactRepository, "log_artifact", broken)
    with pytest.raises(TrackingWriteError, match="log_artifact requests.parquet"):
        tracker.log_artifact(run, f)
