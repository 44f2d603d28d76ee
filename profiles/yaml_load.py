"""YAML text to Python values through libyaml's parser where PyYAML was built with it.

``yaml.safe_load`` parses in Python: the hardware and model catalogs, a bundle's meta and the
roofline factors took ~0.1 CPU-s of a cold sweep point's set-up. ``CSafeLoader`` parses in C
and builds the values with the same safe constructor and resolver, so a file both parse gives
the same values (checked over every YAML file of the repository and of the measured bundles,
tests/profiles/test_yaml_load.py). libyaml's scanner takes a few inputs PyYAML's refuses, with
the values they plainly mean (a tab after a mapping's colon: ``a:<tab>b`` is ``{"a": "b"}``),
and words its syntax errors differently (each still names the line). Without libyaml PyYAML's
own ``SafeLoader`` is used.
"""

from __future__ import annotations

from typing import Any

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, parsed by libyaml where available."""
    return yaml.load(text, Loader=LOADER)
