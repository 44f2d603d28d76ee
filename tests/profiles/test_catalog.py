"""Model / hardware catalogs, HF config reading, parameter counts and per-rank weight bytes."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from engine.memory import weight_bytes_per_rank
from engine.specs import ConfigError, HardwareSpec, ModelSpec
from profiles import catalog
from profiles.catalog import (
    count_params,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
    model_from_hf_config,
)

# Published total parameter counts (model cards) and the tolerance we hold them to.
PUBLISHED = {
    "meta-llama/Llama-3.1-8B": 8.03e9,
    "meta-llama/Llama-3.1-70B": 70.6e9,
    "Qwen/Qwen3-32B": 32.8e9,
    "Qwen/Qwen3-30B-A3B-Instruct-2507": 30.5e9,
    "mistralai/Mixtral-8x7B-v0.1": 46.7e9,
}


def test_list_models_and_hardware():
    assert list_models() == sorted(PUBLISHED)
    assert list_hardware() == sorted(
        ["H100-SXM", "H200", "A100-80G", "B200", "B300", "GB200", "GB300", "L40S", "RTXPRO6000",
         "RTX4090"]
    )


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published(name):
    m = load_model(name)
    assert m.num_params == count_params(m)
    assert m.num_params == pytest.approx(PUBLISHED[name], rel=0.003)


def test_exact_llama_8b_count_and_bytes():
    m = load_model("llama-3.1-8b")
    assert m.num_params == 8_030_261_248
    # The reference simulator's memory model prints 16,060,522,496 weight bytes for this
    # model at bf16, tp1 (it ignores nothing Llama has), so both counts must agree.
    assert weight_bytes_per_rank(m) == 2 * m.num_params == 16_060_522_496


def test_aliases_and_case_insensitive_lookup():
    assert load_model("LLAMA-3.1-8B") is load_model("meta-llama/Llama-3.1-8B")
    assert load_model("qwen3-30b-a3b").name == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert load_model("mixtral-8x7b").is_moe
    assert load_hardware("h100").name == "H100-SXM"
    assert load_hardware("rtxpro6000").hbm_bw_gbs == 1597


def test_unknown_names_list_allowed():
    with pytest.raises(ConfigError, match="llama-3.1-8b"):
        load_model("gpt-5")
    with pytest.raises(ConfigError, match="H100-SXM"):
        load_hardware("TPUv9")


def test_hardware_fields_sane():
    for name in list_hardware():
        hw = load_hardware(name)
        assert isinstance(hw, HardwareSpec)
        assert 20 < hw.mem_gib < 300  # B300 / GB300: 288 GB of HBM3e
        assert hw.hbm_bw_gbs > 500
        assert hw.peak_bf16_tflops > 100
        assert hw.peak_fp8_tflops in (0, pytest.approx(2 * hw.peak_bf16_tflops, rel=0.02))
        assert hw.cost_per_hour > 0
    # CUDA-visible totals sit a little below nvidia-smi's MiB figures
    smi_mib = {"H100-SXM": 81559, "H200": 143771, "A100-80G": 81920, "B200": 183359,
               "L40S": 46068, "RTXPRO6000": 97887, "RTX4090": 24564}  # fmt: skip
    for name, mib in smi_mib.items():
        assert mib / 1024 * 0.97 < load_hardware(name).mem_gib < mib / 1024, name
    assert load_hardware("H100-SXM").mem_gib == pytest.approx(79.15)
    assert load_hardware("A100-80G").peak_fp8_tflops == 0  # no FP8 tensor cores


def test_every_model_file_matches_hf_config(shared_data):
    cfg_dir = shared_data / "llmservingsim" / "configs" / "model"
    for name in list_models():
        path = cfg_dir / f"{name}.json"
        from_hf = model_from_hf_config(path)
        assert from_hf == load_model(name), name


def test_hf_config_moe_fields(shared_data):
    cfg_dir = shared_data / "llmservingsim" / "configs" / "model"
    mix = model_from_hf_config(cfg_dir / "mistralai" / "Mixtral-8x7B-v0.1.json")
    assert (mix.num_experts, mix.num_experts_per_tok, mix.moe_intermediate_size) == (8, 2, 14336)
    qwen = model_from_hf_config(cfg_dir / "Qwen" / "Qwen3-30B-A3B-Instruct-2507.json")
    assert (qwen.num_experts, qwen.num_experts_per_tok, qwen.moe_intermediate_size) == (
        128,
        8,
        768,
    )
    phi = model_from_hf_config(cfg_dir / "microsoft" / "Phi-mini-MoE-instruct.json")
    assert phi.name == "microsoft/Phi-mini-MoE-instruct"  # _name_or_path has no org
    assert phi.num_experts == 16


def _write_cfg(tmp_path: Path, cfg: dict) -> Path:
    d = tmp_path / "my-model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


BASE_CFG = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def test_hf_config_defaults_and_tied(tmp_path):
    m = model_from_hf_config(_write_cfg(tmp_path, BASE_CFG))
    assert m.name == "my-model"
    assert m.num_kv_heads == 4 and m.head_dim == 64
    assert m.dtype == "bfloat16"
    # tied: embedding counted once
    per_layer = 4 * 256 * 256 + 3 * 256 * 512 + 2 * 256
    assert m.num_params == 1000 * 256 + 256 + 2 * per_layer
    # tied lm_head stored once; vLLM pads the 1000-row vocabulary to 1024 (a multiple of 64)
    assert weight_bytes_per_rank(m) == 2 * (m.num_params + (1024 - 1000) * 256)


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"vocab_size": "big"}, "vocab_size"),
        ({"max_position_embeddings": None}, "max_position_embeddings"),
        ({"model_type": None}, "model_type"),
        ({"num_key_value_heads": 3}, "num_kv_heads"),
    ],
)
def test_hf_config_bad_fields(tmp_path, change, needle):
    cfg = {k: v for k, v in {**BASE_CFG, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=needle):
        model_from_hf_config(_write_cfg(tmp_path, cfg))


def test_hf_config_missing_and_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        model_from_hf_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 4')
    with pytest.raises(ConfigError, match="bad.json"):
        model_from_hf_config(bad)


def test_catalog_file_validation(tmp_path, monkeypatch):
    good = (catalog.MODELS_DIR / "llama-3.1-8b.yaml").read_text()
    (tmp_path / "a.yaml").write_text(good.replace("num_params: 8030261248", "num_params: 8"))
    monkeypatch.setattr(catalog, "MODELS_DIR", tmp_path)
    catalog._model_files.cache_clear()
    try:
        with pytest.raises(ConfigError, match="num_params"):
            load_model("llama-3.1-8b")
        (tmp_path / "a.yaml").write_text(good + "num_layerz: 3\n")
        catalog._model_files.cache_clear()
        with pytest.raises(ConfigError, match="num_layerz"):
            load_model("llama-3.1-8b")
        (tmp_path / "a.yaml").write_text(good.replace("num_layers: 32", "num_layers: '32'"))
        catalog._model_files.cache_clear()
        with pytest.raises(ConfigError, match="num_layers"):
            load_model("llama-3.1-8b")
    finally:
        monkeypatch.undo()
        catalog._model_files.cache_clear()


def test_hardware_file_validation(tmp_path, monkeypatch):
    good = (catalog.HARDWARE_DIR / "h100-sxm.yaml").read_text()
    (tmp_path / "x.yaml").write_text(good.replace("hbm_bw_gbs: 3350", "hbm_bw_gbs: -1"))
    monkeypatch.setattr(catalog, "HARDWARE_DIR", tmp_path)
    catalog._hardware_files.cache_clear()
    try:
        with pytest.raises(ConfigError, match="hbm_bw_gbs"):
            load_hardware("H100-SXM")
    finally:
        monkeypatch.undo()
        catalog._hardware_files.cache_clear()


def test_spec_types_complete():
    # Every ModelSpec field is set explicitly in each catalog file (no silent defaults).
    for path in catalog.MODELS_DIR.glob("*.yaml"):
        text = path.read_text()
        for f in fields(ModelSpec):
            assert f"\n{f.name}:" in text, (path.name, f.name)


def test_weight_bytes_per_rank_sharding_and_reference_figures():
    m70 = load_model("llama-3.1-70b")
    full = weight_bytes_per_rank(m70)
    assert full == 2 * m70.num_params  # 128256 divides by tp: no vocab remainder
    # only the norms are replicated, so 4 shards exceed the whole by 3 copies of them
    norms = (2 * m70.num_layers + 1) * m70.hidden_size * 2
    assert 4 * weight_bytes_per_rank(m70, tp=4) == full + 3 * norms
    moe = load_model("qwen3-30b-a3b")
    ep2 = weight_bytes_per_rank(moe, ep=2)
    experts = moe.num_layers * moe.num_experts * 3 * moe.hidden_size * moe.moe_intermediate_size * 2
    # the reference simulator's figure for tp1 / ep2, bf16 (32,073,191,424) leaves out the
    # per-head q/k norms vLLM holds: 48 layers x 2 x 128 weights x 2 bytes
    assert ep2 == 32_073_191_424 + 48 * 2 * 128 * 2
    assert weight_bytes_per_rank(moe) - ep2 == experts // 2
    assert weight_bytes_per_rank(moe, tp=2, ep=2) < ep2  # attention TP-sharded, experts not
