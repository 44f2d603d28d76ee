"""Per-family description of the timed rows of one forward step.

An architecture file (``profiles/architectures/<model_type>.yaml``) says, for one HF
``model_type``, which rows a step emits (prologue, the per-block rows repeated
``num_layers`` times, head) and which profile table prices each row:

- ``dense``: keyed on the step's total scheduled tokens,
- ``per_sequence``: keyed on the number of sequences (lm_head, sampler),
- ``attention``: the 4-D attention lookup,
- ``moe``: the sparse MoE block, keyed on (tokens per EP rank, activated experts).

``tp_invariant: true`` marks rows whose per-rank work does not shrink with tensor
parallelism (norms, sampler); they are priced from the ``tp1`` table at every TP.
``rotary: true`` marks the rotary-embedding row (skipped on TPU-labelled hardware, as in the
reference simulator).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from engine.specs import ConfigError
from profiles.yaml_load import safe_load

ARCHITECTURE_DIR = Path(__file__).with_name("architectures")
TABLE_KINDS = ("dense", "per_sequence", "attention", "moe")


class ArchitectureError(ConfigError):
    """An architecture description file is missing or malformed."""


@dataclass(frozen=True, slots=True)
class LayerRule:
    """How one canonical row is priced."""

    name: str
    table: str  # one of TABLE_KINDS
    tp_invariant: bool = False
    rotary: bool = False


@dataclass(frozen=True, slots=True)
class Architecture:
    """Ordered rows of one step for a model family, with each row's pricing rule."""

    family: str
    prologue: tuple[str, ...]
    block: tuple[str, ...]
    head: tuple[str, ...]
    layers: dict[str, LayerRule]

    @property
    def is_moe(self) -> bool:
        return any(self.layers[n].table == "moe" for n in self.block)

    def rows_per_step(self, num_layers: int) -> int:
        """Number of timed rows one step emits (e.g. 1 + 32*9 + 3 = 292 for Llama-3.1-8B)."""
        return len(self.prologue) + num_layers * len(self.block) + len(self.head)


def _str_list(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ArchitectureError(f"{where}: expected a list of layer names, got {value!r}")
    return tuple(value)


def parse_architecture(data: object, source: str) -> Architecture:
    """Validate a parsed architecture mapping; ``source`` names the file in errors."""
    if not isinstance(data, dict):
        raise ArchitectureError(f"{source}: top level must be a mapping with family/iteration/layers")
    for key in ("family", "iteration", "layers"):
        if key not in data:
            raise ArchitectureError(f"{source}: missing top-level key '{key}'")
    family = data["family"]
    if not isinstance(family, str) or not family:
        raise ArchitectureError(f"{source}: 'family' must be a non-empty string")
    it = data["iteration"]
    if not isinstance(it, dict):
        raise ArchitectureError(f"{source}: 'iteration' must map prologue/block/head to lists")
    sections = {}
    for sec in ("prologue", "block", "head"):
        if sec not in it:
            raise ArchitectureError(f"{source}: iteration.{sec} is missing (use [] if empty)")
        sections[sec] = _str_list(it[sec], f"{source}: iteration.{sec}")
    raw_layers = data["layers"]
    if not isinstance(raw_layers, dict) or not raw_layers:
        raise ArchitectureError(f"{source}: 'layers' must map each row name to its pricing rule")
    layers: dict[str, LayerRule] = {}
    for name, rule in raw_layers.items():
        where = f"{source}: layers.{name}"
        if not isinstance(rule, dict) or "table" not in rule:
            raise ArchitectureError(f"{where}: expected a mapping with 'table' ({', '.join(TABLE_KINDS)})")
        unknown = set(rule) - {"table", "tp_invariant", "rotary"}
        if unknown:
            raise ArchitectureError(f"{where}: unknown keys {sorted(unknown)}; allowed: table, tp_invariant, rotary")
        if rule["table"] not in TABLE_KINDS:
            raise ArchitectureError(f"{where}.table = {rule['table']!r}; use one of {', '.join(TABLE_KINDS)}")
        for flag in ("tp_invariant", "rotary"):
            if not isinstance(rule.get(flag, False), bool):
                raise ArchitectureError(f"{where}.{flag} must be true or false")
        layers[str(name)] = LayerRule(
            name=str(name),
            table=rule["table"],
            tp_invariant=rule.get("tp_invariant", False),
            rotary=rule.get("rotary", False),
        )
    for sec, names in sections.items():
        for n in names:
            if n not in layers:
                raise ArchitectureError(f"{source}: iteration.{sec} names '{n}' which has no entry under 'layers'")
    attn = [n for n in sections["block"] if layers[n].table == "attention"]
    if len(attn) != 1:
        raise ArchitectureError(f"{source}: iteration.block must contain exactly one attention row, found {attn}")
    for sec in ("prologue", "head"):
        bad = [n for n in sections[sec] if layers[n].table in ("attention", "moe")]
        if bad:
            raise ArchitectureError(f"{source}: iteration.{sec} may not contain attention/moe rows {bad}")
    return Architecture(family=family, prologue=sections["prologue"], block=sections["block"],
                        head=sections["head"], layers=layers)


def load_architecture_file(path: str | Path) -> Architecture:
    """Read and validate one architecture YAML file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ArchitectureError(f"{p}: cannot read architecture file ({exc})") from exc
    try:
        data = safe_load(text)
    except yaml.YAMLError as exc:
        raise ArchitectureError(f"{p}: invalid YAML ({exc}); fix the syntax") from exc
    return parse_architecture(data, str(p))


def known_families() -> list[str]:
    """Model types with a shipped architecture file."""
    return sorted(p.stem for p in ARCHITECTURE_DIR.glob("*.yaml"))


@cache
def load_architecture(model_type: str) -> Architecture:
    """The shipped architecture for an HF ``model_type`` (cached)."""
    path = ARCHITECTURE_DIR / f"{model_type}.yaml"
    if not path.is_file():
        raise ArchitectureError(
            f"no architecture file for model_type '{model_type}' (looked for {path}); "
            f"known: {', '.join(known_families())}. Add profiles/architectures/{model_type}.yaml"
        )
    arch = load_architecture_file(path)
    if arch.family != model_type:
        raise ArchitectureError(f"{path}: family '{arch.family}' does not match file name '{model_type}'")
    return arch
