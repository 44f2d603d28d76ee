"""The aiconfigurator profile source without the package: the one error naming the extra,
the version pin, the system map, and bundle-source labels (runs whether or not
aiconfigurator-core is installed)."""

from __future__ import annotations

import importlib.metadata

import pytest

from engine.specs import ConfigError
from profiles.aiconfigurator import tables
from profiles.aiconfigurator.tables import (
    INSTALL_HINT,
    PINNED_VERSION,
    SYSTEMS,
    AiconfiguratorError,
    system_for,
    systems_dir,
)
from profiles.catalog import list_hardware, load_hardware
from profiles.deployment import BundleSource, resolve_bundle


@pytest.fixture
def fresh_dir_cache():
    systems_dir.cache_clear()
    yield
    systems_dir.cache_clear()


def _missing(name: str) -> str:
    raise importlib.metadata.PackageNotFoundError(name)


def test_missing_package_names_the_extra(monkeypatch, fresh_dir_cache):
    monkeypatch.setattr(tables.importlib.metadata, "version", _missing)
    with pytest.raises(AiconfiguratorError, match=r"\[aiconfigurator\]") as err:
        systems_dir()
    assert INSTALL_HINT in str(err.value) and isinstance(err.value, ConfigError)


def test_other_version_is_refused(monkeypatch, fresh_dir_cache):
    monkeypatch.setattr(tables.importlib.metadata, "version", lambda name: "0.11.0")
    with pytest.raises(AiconfiguratorError, match=f"0.11.0 is installed.*{PINNED_VERSION}"):
        systems_dir()


def test_generated_bundle_without_the_package_fails_before_any_work(monkeypatch, tmp_path,
                                                                     fresh_dir_cache):
    from profiles.catalog import load_model

    monkeypatch.setattr(tables.importlib.metadata, "version", _missing)
    src = BundleSource(generate="always", generator="aiconfigurator", cache=str(tmp_path))
    with pytest.raises(AiconfiguratorError, match=r"\[aiconfigurator\]"):
        resolve_bundle(src, load_hardware("H100-SXM"), load_model("meta-llama/Llama-3.1-8B"),
                       1, "auto")
    assert not any(tmp_path.rglob("*.csv"))


def test_every_mapped_system_is_in_the_catalog():
    assert set(SYSTEMS) <= set(list_hardware())
    assert len(set(SYSTEMS.values())) == len(SYSTEMS) == 9
    assert system_for("h100-sxm") == "h100_sxm" and system_for("gb200") == "gb200"


def test_unmapped_hardware_is_refused_with_the_covered_list():
    with pytest.raises(AiconfiguratorError, match="RTX4090.*no aiconfigurator system.*H100-SXM"):
        system_for("RTX4090")


def test_bundle_source_generator_is_checked():
    with pytest.raises(ConfigError, match="generator='aiconfig'"):
        BundleSource(generate="always", generator="aiconfig")


def test_bundle_source_labels(tmp_path, shared_data):
    from profiles.bundle import load_bundle
    from profiles.catalog import load_model
    from profiles.roofline import ensure_bundle

    model = load_model("meta-llama/Llama-3.1-8B")
    roof = load_bundle(ensure_bundle(load_hardware("RTXPRO6000"), model, 1, cache=tmp_path))
    assert roof.source == "roofline"
    measured = load_bundle(shared_data / "llmservingsim" / "profiles", "RTXPRO6000", model.name)
    assert measured.source == f"measured bundle {measured.path}"
