"""YAML text to Python values through libyaml's parser where PyYAML was built with it.

``yaml.safe_load`` parses in Python: the hardware and model catalogs, a bundle's meta and the
roofline factors took ~0.1 CPU-s of a cold sweep point's set-up. ``CSafeLoader`` parses in C
and builds the values with the same safe constructor and resolver, so the values are the same
(checked over every YAML file the profiles read, tests/profiles/test_yaml_load.py); without
libyaml PyYAML's own ``SafeLoader`` is used.
"""

from __future__ import annotations

from typing import Any

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, parsed by libyaml where available."""
    return yaml.load(text, Loader=LOADER)
