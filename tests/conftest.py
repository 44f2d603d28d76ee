"""Shared test fixtures: where the read-only reference data lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """``$SERVESWEEP_DATA`` or ``../shared/data`` beside the repository."""
    return Path(os.environ.get("SERVESWEEP_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = shared_data_dir()
    if not (root / "llmservingsim").is_dir():
        pytest.skip(
            f"reference data not found at {root} (set SERVESWEEP_DATA to the shared/data folder)"
        )
    return root
