"""Model and hardware catalogs: our own YAML files -> ``ModelSpec`` / ``HardwareSpec``.

One YAML file per model in ``profiles/models/`` and per accelerator in ``profiles/hardware/``.
Models are found by Hugging Face id (``meta-llama/Llama-3.1-8B``) or short alias
(``llama-3.1-8b``), both case-insensitive; hardware by name or alias, case-insensitive.

Also here: reading a Hugging Face ``config.json`` into a ``ModelSpec`` and the exact parameter
count of a spec (``count_params``). Per-rank weight bytes under TP / EP / PP, for the KV
capacity, are ``engine.memory.weight_bytes_per_rank``.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from engine.memory import QK_NORM_MODEL_TYPES
from engine.specs import ConfigError, HardwareSpec, ModelSpec
from profiles.yaml_load import safe_load

CATALOG_DIR = Path(__file__).resolve().parent
MODELS_DIR = CATALOG_DIR / "models"
HARDWARE_DIR = CATALOG_DIR / "hardware"


_SIMPLE_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}
# Documentation-only keys allowed in catalog files besides the spec's own fields.
_MODEL_META_KEYS = {"alias", "published_params"}
_HARDWARE_META_KEYS = {"aliases"}


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}); fix the file syntax") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields at the top level")
    return data


def _spec_from_mapping(cls: type, data: dict[str, Any], allowed_extra: set[str], where: str):
    """Build a frozen spec dataclass, rejecting unknown keys and checking field types."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names - allowed_extra)
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {unknown}; allowed: {sorted(names | allowed_extra)}"
        )
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        expected = _SIMPLE_TYPES.get(str(f.type))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if expected is not None and (
            not isinstance(value, expected) or (expected is not bool and isinstance(value, bool))
        ):
            raise ConfigError(
                f"{where}: field '{f.name}' must be {expected.__name__}, got {value!r}"
            )
        kwargs[f.name] = value
    missing = [
        f.name
        for f in fields(cls)
        if f.name not in kwargs and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required field(s) {missing}")
    return cls(**kwargs)


# ---------------------------------------------------------------------------------------
# Parameter counting and weight bytes


def _attention_params(m: ModelSpec) -> int:
    """q/k/v/o projection weights of one layer (no biases in these models)."""
    qkv = m.hidden_size * (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim
    o_proj = m.num_attention_heads * m.head_dim * m.hidden_size
    return qkv + o_proj


def _layer_norm_params(m: ModelSpec) -> int:
    """RMSNorm weights of one layer (input + post-attention, plus q/k norms for Qwen3)."""
    n = 2 * m.hidden_size
    if m.model_type in QK_NORM_MODEL_TYPES:
        n += 2 * m.head_dim
    return n


def _mlp_params(m: ModelSpec) -> int:
    """SwiGLU FFN weights (gate, up, down) of one layer; for MoE the router plus every expert."""
    if not m.is_moe:
        return 3 * m.hidden_size * m.intermediate_size
    return m.hidden_size * m.num_experts + m.num_experts * 3 * m.hidden_size * m.moe_intermediate_size


def count_params(m: ModelSpec) -> int:
    """Exact parameter count from the architecture shapes (unpadded vocabulary).

    embedding + lm_head (once if tied) + final norm + per layer (attention projections,
    norms, FFN or router + experts). Biases are not modelled (none of the catalog models
    has any).
    """
    embed = m.vocab_size * m.hidden_size
    lm_head = 0 if m.tie_word_embeddings else embed
    per_layer = _attention_params(m) + _layer_norm_params(m) + _mlp_params(m)
    return embed + lm_head + m.hidden_size + m.num_layers * per_layer


# ---------------------------------------------------------------------------------------
# Model catalog


def _check_model(spec: ModelSpec, where: str) -> ModelSpec:
    positive = (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    )
    for name in positive:
        if getattr(spec, name) < 1:
            raise ConfigError(f"{where}: field '{name}' must be >= 1, got {getattr(spec, name)}")
    if spec.num_attention_heads % spec.num_kv_heads:
        raise ConfigError(
            f"{where}: num_attention_heads ({spec.num_attention_heads}) must be a multiple of "
            f"num_kv_heads ({spec.num_kv_heads})"
        )
    if spec.is_moe and not (
        1 <= spec.num_experts_per_tok <= spec.num_experts and spec.moe_intermediate_size >= 1
    ):
        raise ConfigError(
            f"{where}: a MoE model needs 1 <= num_experts_per_tok <= num_experts and "
            "moe_intermediate_size >= 1"
        )
    return spec


@cache
def _model_files() -> dict[str, tuple[Path, ModelSpec]]:
    """Lookup key (lower-case name and alias) -> (file, spec)."""
    table: dict[str, tuple[Path, ModelSpec]] = {}
    for path in sorted(MODELS_DIR.glob("*.yaml")):
        data = _read_yaml(path)
        alias = data.get("alias")
        spec = _check_model(
            _spec_from_mapping(ModelSpec, data, _MODEL_META_KEYS, str(path)), str(path)
        )
        computed = count_params(spec)
        if spec.num_params != computed:
            raise ConfigError(
                f"{path}: num_params {spec.num_params} != {computed} computed from the shapes; "
                "update num_params"
            )
        for key in (spec.name, alias):
            if not key:
                continue
            if key.lower() in table:
                raise ConfigError(f"{path}: name or alias '{key}' already used by another file")
            table[key.lower()] = (path, spec)
    return table


def list_models() -> list[str]:
    """Hugging Face ids of all catalog models, sorted."""
    return sorted({spec.name for _, spec in _model_files().values()})


def model_aliases() -> dict[str, str]:
    """Short alias -> Hugging Face id."""
    out = {}
    for path, spec in _model_files().values():
        alias = _read_yaml(path).get("alias")
        if alias:
            out[alias] = spec.name
    return out


def load_model(name_or_alias: str) -> ModelSpec:
    """The catalog ``ModelSpec`` for a Hugging Face id or alias (case-insensitive)."""
    hit = _model_files().get(str(name_or_alias).lower())
    if hit is None:
        allowed = list_models() + sorted(model_aliases())
        raise ConfigError(f"unknown model '{name_or_alias}'; use one of {allowed}")
    return hit[1]


# ---------------------------------------------------------------------------------------
# Hardware catalog


@cache
def _hardware_files() -> dict[str, HardwareSpec]:
    table: dict[str, HardwareSpec] = {}
    for path in sorted(HARDWARE_DIR.glob("*.yaml")):
        data = _read_yaml(path)
        aliases = data.get("aliases") or []
        if not isinstance(aliases, list):
            raise ConfigError(f"{path}: 'aliases' must be a list of names")
        spec = _spec_from_mapping(HardwareSpec, data, _HARDWARE_META_KEYS, str(path))
        for name in ("mem_gib", "hbm_bw_gbs", "peak_bf16_tflops"):
            if getattr(spec, name) <= 0:
                raise ConfigError(f"{path}: field '{name}' must be > 0")
        for name in (
            "peak_fp8_tflops",
            "interconnect_bw_gbs",
            "interconnect_latency_ns",
            "cost_per_hour",
        ):
            if getattr(spec, name) < 0:
                raise ConfigError(f"{path}: field '{name}' must be >= 0")
        for key in [spec.name, *map(str, aliases)]:
            if key.lower() in table:
                raise ConfigError(f"{path}: name or alias '{key}' already used by another file")
            table[key.lower()] = spec
    return table


def list_hardware() -> list[str]:
    """Canonical names of all catalog accelerators, sorted."""
    return sorted({spec.name for spec in _hardware_files().values()})


def load_hardware(name: str) -> HardwareSpec:
    """The catalog ``HardwareSpec`` for a name or alias (case-insensitive)."""
    spec = _hardware_files().get(str(name).lower())
    if spec is None:
        raise ConfigError(f"unknown hardware '{name}'; use one of {list_hardware()}")
    return spec


# ---------------------------------------------------------------------------------------
# Hugging Face config.json


def _hf_int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: missing required field '{key}'; add it to the config")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: field '{key}' must be an integer, got {value!r}")
    return value


def _default_hf_name(path: Path) -> str:
    if path.name == "config.json":
        return path.parent.name
    return f"{path.parent.name}/{path.stem}"


def model_from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (or a directory holding one) into a ``ModelSpec``.

    ``name`` defaults to ``_name_or_path`` when it looks like an ``org/model`` id, else to
    ``<parent dir>/<file stem>`` (``configs/model/meta-llama/Llama-3.1-8B.json`` ->
    ``meta-llama/Llama-3.1-8B``) or the directory name for ``.../config.json``.
    Experts come from ``num_local_experts`` (Mixtral, PhiMoE) or ``num_experts`` (Qwen3-MoE);
    ``moe_intermediate_size`` defaults to ``intermediate_size``; ``head_dim`` to
    ``hidden_size // num_attention_heads``. ``num_params`` is computed with ``count_params``
    (biases, e.g. PhiMoE's attention bias, are not counted).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    where = str(p)
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{where}: file not found; pass a Hugging Face config.json") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc}); fix the file") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: expected a JSON object at the top level")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(f"{where}: missing required field 'model_type'")
    hidden = _hf_int(cfg, "hidden_size", where)
    heads = _hf_int(cfg, "num_attention_heads", where)
    if "intermediate_size" not in cfg and "ffn_dim" in cfg:
        intermediate = _hf_int(cfg, "ffn_dim", where)
    else:
        intermediate = _hf_int(cfg, "intermediate_size", where)
    experts_key = "num_local_experts" if "num_local_experts" in cfg else "num_experts"
    experts = _hf_int(cfg, experts_key, where, default=0)
    moe = experts > 0
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ConfigError(f"{where}: field 'tie_word_embeddings' must be true/false")
    if name is None:
        hf_name = cfg.get("_name_or_path")
        name = hf_name if isinstance(hf_name, str) and "/" in hf_name else _default_hf_name(p)
    spec = ModelSpec(
        name=name,
        model_type=model_type,
        num_layers=_hf_int(cfg, "num_hidden_layers", where),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=_hf_int(cfg, "num_key_value_heads", where, default=heads),
        head_dim=_hf_int(cfg, "head_dim", where, default=hidden // heads if heads else 0),
        intermediate_size=intermediate,
        vocab_size=_hf_int(cfg, "vocab_size", where),
        max_position_embeddings=_hf_int(cfg, "max_position_embeddings", where),
        num_experts=experts,
        num_experts_per_tok=_hf_int(cfg, "num_experts_per_tok", where, default=0) if moe else 0,
        moe_intermediate_size=(
            _hf_int(cfg, "moe_intermediate_size", where, default=intermediate) if moe else 0
        ),
        tie_word_embeddings=tied,
        dtype=str(dtype),
    )
    _check_model(spec, where)
    return replace(spec, num_params=count_params(spec))
