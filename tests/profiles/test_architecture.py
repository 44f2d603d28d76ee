"""Architecture files: shipped families, row counts, validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from profiles.architecture import (
    ArchitectureError,
    known_families,
    load_architecture,
    load_architecture_file,
    parse_architecture,
)

GOOD = {
    "family": "toy",
    "iteration": {"prologue": ["embedding"], "block": ["norm", "attention", "mlp"], "head": ["lm_head"]},
    "layers": {"embedding": {"table": "dense"}, "norm": {"table": "dense", "tp_invariant": True},
               "attention": {"table": "attention"}, "mlp": {"table": "dense"},
               "lm_head": {"table": "per_sequence"}},
}


def test_shipped_families() -> None:
    assert set(known_families()) >= {"llama", "qwen3", "qwen3_moe", "mixtral", "phimoe"}
    for fam in known_families():
        arch = load_architecture(fam)
        assert arch.family == fam
        assert arch.head == ("final_layernorm", "lm_head", "sampler")


@pytest.mark.parametrize(
    ("family", "layers", "rows", "moe"),
    [("llama", 32, 292, False), ("qwen3", 64, 644, False), ("qwen3_moe", 48, 1 + 48 * 8 + 3, True),
     ("mixtral", 32, 1 + 32 * 7 + 3, True)],
)
def test_rows_per_step(family: str, layers: int, rows: int, moe: bool) -> None:
    arch = load_architecture(family)
    assert arch.rows_per_step(layers) == rows
    assert arch.is_moe is moe


def test_llama_block_and_rules() -> None:
    arch = load_architecture("llama")
    assert arch.block == ("layernorm", "qkv_proj", "rotary_emb", "attention", "o_proj", "layernorm",
                          "gate_up_proj", "act_fn", "down_proj")
    tp_inv = {n for n, r in arch.layers.items() if r.tp_invariant}
    assert tp_inv == {"layernorm", "final_layernorm", "sampler"}
    assert arch.layers["rotary_emb"].rotary and arch.layers["lm_head"].table == "per_sequence"


def test_qwen3_has_qk_norm_once_per_block() -> None:
    assert load_architecture("qwen3").block.count("qk_norm") == 1


def test_unknown_family() -> None:
    with pytest.raises(ArchitectureError, match=r"no architecture file for model_type 'gpt9'.*known: "):
        load_architecture("gpt9")


def test_parse_good_and_file_roundtrip(tmp_path: Path) -> None:
    arch = parse_architecture(GOOD, "toy.yaml")
    assert arch.rows_per_step(2) == 1 + 2 * 3 + 1
    p = tmp_path / "toy.yaml"
    p.write_text(yaml.safe_dump(GOOD))
    assert load_architecture_file(p) == arch


def _bad(**changes) -> dict:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    for dotted, value in changes.items():
        node = data
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node[k]
        if value is None:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return data


@pytest.mark.parametrize(
    ("data", "pattern"),
    [(["not", "a", "mapping"], "top level must be a mapping"),
     (_bad(family=None), "missing top-level key 'family'"),
     (_bad(iteration__head=None), r"iteration\.head is missing"),
     (_bad(iteration__block="attention"), r"iteration\.block: expected a list"),
     (_bad(iteration__block=["norm", "mlp"]), "exactly one attention row"),
     (_bad(iteration__block=["norm", "attention", "attention"]), "exactly one attention row"),
     (_bad(iteration__head=["lm_head", "ghost"]), "names 'ghost' which has no entry"),
     (_bad(layers__mlp={"table": "conv"}), r"layers\.mlp\.table = 'conv'"),
     (_bad(layers__mlp={"kind": "dense"}), r"layers\.mlp: expected a mapping with 'table'"),
     (_bad(layers__mlp={"table": "dense", "speed": 3}), r"unknown keys \['speed'\]"),
     (_bad(layers__norm={"table": "dense", "tp_invariant": "yes"}), r"tp_invariant must be true or false"),
     (_bad(iteration__prologue=["attention"]), r"prologue may not contain attention/moe")],
)
def test_validation_errors(data: object, pattern: str) -> None:
    with pytest.raises(ArchitectureError, match=pattern) as info:
        parse_architecture(data, "toy.yaml")
    assert "toy.yaml" in str(info.value)


def test_invalid_yaml_file(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("family: [oops\n")
    with pytest.raises(ArchitectureError, match="invalid YAML"):
        load_architecture_file(p)
    with pytest.raises(ArchitectureError, match="cannot read"):
        load_architecture_file(tmp_path / "missing.yaml")
