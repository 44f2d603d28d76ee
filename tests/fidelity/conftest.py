"""Fidelity tests: the ``slow`` full set runs only when asked for with ``-m``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("-m"):
        return  # an explicit marker expression decides
    skip = pytest.mark.skip(reason="full differential set: run with -m slow")
    for item in items:
        if "fidelity" in item.path.parts and item.get_closest_marker("slow"):
            item.add_marker(skip)
