"""``profiles.yaml_load.safe_load``: libyaml's parser gives PyYAML's own values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from profiles.yaml_load import LOADER, safe_load

REPO = Path(__file__).resolve().parents[2]


def _yaml_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.yaml") if ".git" not in p.parts)


def test_the_repositorys_yaml_reads_as_pyyamls_safe_load() -> None:
    files = _yaml_files(REPO / "profiles") + _yaml_files(REPO / "conf")
    assert len(files) > 20
    for path in files:
        text = path.read_text()
        assert safe_load(text) == yaml.safe_load(text), path


def test_the_measured_bundles_meta_reads_as_pyyamls_safe_load(shared_data: Path) -> None:
    files = _yaml_files(shared_data / "llmservingsim" / "profiles")
    assert files
    for path in files:
        text = path.read_text()
        assert safe_load(text) == yaml.safe_load(text), path


def test_bad_yaml_is_a_yaml_error_with_its_line() -> None:
    with pytest.raises(yaml.YAMLError, match="line 2"):
        safe_load("a: 1\n b: [2\n")
    assert LOADER in (getattr(yaml, "CSafeLoader", None), yaml.SafeLoader)
