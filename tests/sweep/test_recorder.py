"""``sweep.recorder.task_config`` and ``config_yaml`` against OmegaConf's own conversion of
the whole job config: a masked copy without ``hydra``, converted and dumped by OmegaConf."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import pytest
from hydra import compose
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf

from sweep.recorder import config_yaml, task_config
from sweep.schema import register

CONF = Path(__file__).resolve().parents[2] / "conf"
# the sweep app's experiments (the capacity search's compose with its own schema)
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")
                     if "\ncapacity:" not in p.read_text())
register()


def without_hydra(cfg: DictConfig) -> DictConfig:
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])


def oracle(cfg: DictConfig) -> Any:
    """The job config without ``hydra`` as OmegaConf converts a copy of it."""
    return OmegaConf.to_container(without_hydra(cfg), resolve=True, enum_to_str=True)


def oracle_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(without_hydra(cfg), resolve=True)


@pytest.mark.usefixtures("hydra_conf")
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_converts_as_omegaconf_does(experiment):
    cfg = compose("config", overrides=[f"+experiment={experiment}"], return_hydra_config=True)
    point = task_config(cfg)
    assert "hydra" not in point
    assert point == oracle(cfg)
    assert list(point) == [k for k in cfg if k != "hydra"]  # the config's order, kept
    assert config_yaml(point) == oracle_yaml(cfg)


class Colour(enum.Enum):
    RED = 1


def test_leaves_missing_values_enums_and_interpolations():
    cfg = OmegaConf.create({
        "hydra": {"job": {"name": "j"}},
        "seed": "${model.layers}",
        "unset": "???",
        "colour": Colour.RED,
        "model": {"layers": 32, "name": "m-${seed}", "later": "???", "tint": Colour.RED,
                  "sizes": [1, "${model.layers}", {"x": "${unset_ok}"}]},
        "unset_ok": None,
        "empty": {},
    })
    point = task_config(cfg)
    assert point == oracle(cfg)
    assert point["seed"] == 32 and point["unset"] == "???" and point["colour"] == "RED"
    assert point["model"]["name"] == "m-32" and point["model"]["later"] == "???"
    assert config_yaml(point) == oracle_yaml(cfg)


# printable text of Unicode's basic plane: libyaml, which emits the text, writes the rest
# in other (equally valid) forms than OmegaConf's PyYAML emitter (job_run.yaml_text)
PRINTABLE = st.characters(max_codepoint=0xFFFF, blacklist_categories=("Cc", "Cs"))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
    st.text(PRINTABLE, max_size=12),
    st.sampled_from(["true", "No", "off", "1e3", "1_000", "0x1F", ".5", "-.inf", "~", "null",
                     "2026-12-06", "a: b", "- x", "#c", "'q'", "\"d\"", "ünï", "  pad ",
                     "multi\nline", "${not_an_interpolation}"]),
)
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(PRINTABLE, min_size=1, max_size=6).filter(
                                lambda k: "$" not in k), inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c", "model", "x y"]), trees, max_size=4))
def test_yaml_is_omegaconfs_for_any_plain_point(point):
    """Strings that read as numbers, booleans, dates or nulls are quoted, unicode kept, key
    order kept: the representer is OmegaConf's, so the text is ``OmegaConf.to_yaml``'s."""
    try:
        expected = OmegaConf.to_yaml(OmegaConf.create(point))
    except Exception:  # a value OmegaConf does not take (e.g. "${...}" it would resolve)
        return
    assert config_yaml(point) == expected
