"""Roofline bundle generator: layout, loader round trip, monotonicity, TP scaling, cache."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import profiles.roofline.generate as roofline
from engine.batch import BatchShape
from engine.specs import ConfigError
from profiles.bundle import clear_bundle_cache, load_bundle
from profiles.catalog import load_hardware, load_model
from profiles.latency import ProfiledLatencyModel
from profiles.roofline import bundle_key, cache_dir, ensure_bundle, generate_bundle
from profiles.roofline.cost import RankShape, attention_work, dense_work, parse_variant
from profiles.roofline.factors import CATEGORIES, KernelFactors, load_factors
from profiles.roofline.grid import GridSpec, attention_keys, dense_tokens, moe_keys

HW = load_hardware("RTXPRO6000")
LLAMA = load_model("meta-llama/Llama-3.1-8B")
QWEN_MOE = load_model("Qwen/Qwen3-30B-A3B-Instruct-2507")
ATTN_COLS = ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode"]


@pytest.fixture(autouse=True)
def _fresh_loader_cache():
    clear_bundle_cache()
    yield
    clear_bundle_cache()


@pytest.fixture(scope="module")
def moe_bundle(tmp_path_factory) -> Path:
    return generate_bundle(HW, QWEN_MOE, 2, tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def llama_bundle(tmp_path_factory) -> Path:
    return generate_bundle(HW, LLAMA, 2, tmp_path_factory.mktemp("llama"))


def test_layout_and_schema(moe_bundle: Path) -> None:
    assert moe_bundle.parts[-4:] == ("RTXPRO6000", "Qwen", "Qwen3-30B-A3B-Instruct-2507", "bf16")
    meta = yaml.safe_load((moe_bundle / "meta.yaml").read_text())
    assert meta["tp_degrees"] == [1, 2]
    assert meta["engine_effective"]["max_num_batched_tokens"] == 2048
    assert meta["skew_fit"] == {"enabled": False}
    assert sorted(p.name for p in (moe_bundle / "tp1").iterdir()) == [
        "attention.csv", "dense.csv", "moe.csv", "per_sequence.csv"]
    assert not (moe_bundle / "tp2" / "moe.csv").exists()  # MoE is priced from tp1, as measured
    dense = pd.read_csv(moe_bundle / "tp2" / "dense.csv")
    assert list(dense.columns) == ["layer", "tokens", "time_us"]
    assert set(dense["layer"]) == {"embedding", "layernorm", "qkv_proj", "qk_norm", "rotary_emb",
                                   "o_proj", "final_layernorm"}
    per_seq = pd.read_csv(moe_bundle / "tp2" / "per_sequence.csv")
    assert list(per_seq.columns) == ["layer", "sequences", "time_us"]
    attn = pd.read_csv(moe_bundle / "tp2" / "attention.csv")
    assert list(attn.columns) == [*ATTN_COLS, "time_us"]
    assert len(attn) == len(attention_keys(GridSpec())) == 19364
    moe = pd.read_csv(moe_bundle / "tp1" / "moe.csv")
    assert list(moe.columns) == ["tokens", "activated_experts", "time_us"]
    assert len(moe) == 50
    for df in (dense, per_seq, attn, moe):
        assert (df["time_us"] > 0).all() and np.isfinite(df["time_us"]).all()


def test_round_trips_through_loader_and_latency_model(moe_bundle: Path, llama_bundle: Path) -> None:
    b = load_bundle(moe_bundle.parents[3], "RTXPRO6000", QWEN_MOE.name, "bf16")
    assert sorted(b.tps) == [1, 2] and b.tps[1].moe is not None
    assert b.max_num_batched_tokens == 2048 and b.max_num_seqs == 256
    decode = BatchShape(8, 8, 0, 0, 8, 8 * 1000, 1000, 1000)
    prefill = BatchShape(1024, 1, 1024, 0, 0, 0, 0, 0)
    for path, model in ((moe_bundle, QWEN_MOE), (llama_bundle, LLAMA)):
        for tp in (1, 2):
            lm = ProfiledLatencyModel(load_bundle(path), model, tp, host_mem_bw_gbs=None)
            assert 0 < lm.iteration_ns(decode) < lm.iteration_ns(prefill)


def test_tp_stable_layers_equal_tp1(llama_bundle: Path) -> None:
    d1 = pd.read_csv(llama_bundle / "tp1" / "dense.csv").set_index(["layer", "tokens"])
    d2 = pd.read_csv(llama_bundle / "tp2" / "dense.csv").set_index(["layer", "tokens"])
    for layer in ("layernorm", "final_layernorm"):
        assert np.array_equal(d1.loc[layer].to_numpy(), d2.loc[layer].to_numpy())
    s1 = pd.read_csv(llama_bundle / "tp1" / "per_sequence.csv").set_index(["layer", "sequences"])
    s2 = pd.read_csv(llama_bundle / "tp2" / "per_sequence.csv").set_index(["layer", "sequences"])
    assert np.array_equal(s1.loc["sampler"].to_numpy(), s2.loc["sampler"].to_numpy())


def _violations(df: pd.DataFrame, axis: str, others: list[str]) -> int:
    bad = 0
    for _, g in df.groupby(others):
        bad += int((np.diff(g.sort_values(axis)["time_us"].to_numpy()) < 0).sum())
    return bad


@pytest.mark.parametrize("tp", [1, 2])
def test_more_work_is_never_faster(moe_bundle: Path, llama_bundle: Path, tp: int) -> None:
    for path in (moe_bundle, llama_bundle):
        folder = path / f"tp{tp}"
        assert _violations(pd.read_csv(folder / "dense.csv"), "tokens", ["layer"]) == 0
        assert _violations(pd.read_csv(folder / "per_sequence.csv"), "sequences", ["layer"]) == 0
        attn = pd.read_csv(folder / "attention.csv")
        for axis in ATTN_COLS:
            assert _violations(attn, axis, [c for c in ATTN_COLS if c != axis]) == 0, axis
    moe = pd.read_csv(moe_bundle / "tp1" / "moe.csv")
    assert _violations(moe, "tokens", ["activated_experts"]) == 0
    assert _violations(moe, "activated_experts", ["tokens"]) == 0


def test_tp_halves_per_rank_work() -> None:
    p = parse_variant("bf16")
    s1, s2 = RankShape.of(LLAMA, 1), RankShape.of(LLAMA, 2)
    assert (s2.heads, s2.kv_heads, s2.inter, s2.vocab) == (16, 4, 7168, 64128)
    t = dense_tokens(GridSpec())
    for layer in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "act_fn"):
        w1, w2 = dense_work(layer, s1, p, t), dense_work(layer, s2, p, t)
        np.testing.assert_allclose(w2.flops, w1.flops / 2)
    w1 = dense_work("gate_up_proj", s1, p, np.array([1]))
    w2 = dense_work("gate_up_proj", s2, p, np.array([1]))
    assert w2.bytes[0] == pytest.approx(w1.bytes[0] / 2, rel=1e-3)  # weights dominate at 1 token
    keys = attention_keys(GridSpec())
    a1, a2 = attention_work(s1, p, *keys.T), attention_work(s2, p, *keys.T)
    np.testing.assert_allclose(a2.flops, a1.flops / 2)
    np.testing.assert_allclose(a2.bytes, a1.bytes / 2)


def test_tp2_tables_are_cheaper(llama_bundle: Path) -> None:
    d1 = pd.read_csv(llama_bundle / "tp1" / "dense.csv").set_index(["layer", "tokens"])["time_us"]
    d2 = pd.read_csv(llama_bundle / "tp2" / "dense.csv").set_index(["layer", "tokens"])["time_us"]
    for layer in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        ratio = d2.loc[layer, 2048] / d1.loc[layer, 2048]
        assert 0.45 < ratio < 0.6, (layer, ratio)  # half the work plus a fixed launch cost
    a1 = pd.read_csv(llama_bundle / "tp1" / "attention.csv").set_index(ATTN_COLS)["time_us"]
    a2 = pd.read_csv(llama_bundle / "tp2" / "attention.csv").set_index(ATTN_COLS)["time_us"]
    assert 0.45 < a2.loc[(0, 0, 256, 16384)] / a1.loc[(0, 0, 256, 16384)] < 0.55


def test_fp8_weights_and_kv() -> None:
    assert parse_variant("bf16") == parse_variant("bf16")
    assert (parse_variant("fp8").weight_bytes, parse_variant("fp8").kv_bytes) == (1.0, 2.0)
    assert parse_variant("bf16-kvfp8").kv_bytes == 1.0
    with pytest.raises(ConfigError):
        parse_variant("bf15")
    f = load_factors()
    bf16 = roofline.dense_table(HW, LLAMA, 1, parse_variant("bf16"), f, GridSpec())
    fp8 = roofline.dense_table(HW, LLAMA, 1, parse_variant("fp8"), f, GridSpec())
    g_bf16 = bf16[bf16.layer == "gate_up_proj"]["time_us"].to_numpy()
    g_fp8 = fp8[fp8.layer == "gate_up_proj"]["time_us"].to_numpy()
    assert (g_fp8 < g_bf16).all()
    assert g_fp8[0] / g_bf16[0] < 0.6  # weight-bound at 1 token: half the bytes
    kv16 = roofline.attention_table(HW, LLAMA, 1, parse_variant("bf16"), f, GridSpec())
    kv8 = roofline.attention_table(HW, LLAMA, 1, parse_variant("bf16-kvfp8"), f, GridSpec())
    row = (kv16.n_decode == 256) & (kv16.kv_decode == 16384) & (kv16.prefill_chunk == 0)
    assert kv8[row]["time_us"].iloc[0] / kv16[row]["time_us"].iloc[0] < 0.6


def test_moe_grid_respects_sparsity() -> None:
    keys = moe_keys(8, 2, GridSpec())  # Mixtral: E=8, k=2
    assert set(keys[:, 1]) == {2, 4, 8}
    assert ((keys[:, 1] >= 2) & (keys[:, 1] <= np.minimum(8, keys[:, 0] * 2))).all()


def test_bad_tp_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="heads"):
        generate_bundle(HW, LLAMA, 3, tmp_path)
    assert not any(tmp_path.rglob("*.csv"))


def test_cache_hit_reuses_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = ensure_bundle(HW, LLAMA, 1, cache=tmp_path)
    assert first.parents[3] == tmp_path / bundle_key(HW, LLAMA, load_factors())
    stamps = {p: p.stat().st_mtime_ns for p in first.rglob("*.csv")}

    def boom(*args, **kwargs):
        raise AssertionError("cache hit must not regenerate")

    monkeypatch.setattr(roofline, "_generate_locked", boom)
    again = ensure_bundle(HW, LLAMA, 1, cache=tmp_path)
    assert again == first
    assert {p: p.stat().st_mtime_ns for p in again.rglob("*.csv")} == stamps


def test_cache_key_follows_specs(tmp_path: Path) -> None:
    f = load_factors()
    base = ensure_bundle(HW, LLAMA, 1, cache=tmp_path)
    faster = dataclasses.replace(HW, hbm_bw_gbs=HW.hbm_bw_gbs * 2)
    other = ensure_bundle(faster, LLAMA, 1, cache=tmp_path)
    assert other != base and bundle_key(faster, LLAMA, f) != bundle_key(HW, LLAMA, f)
    tweaked = f.replace("gemm", dataclasses.replace(f.categories["gemm"], launch_us=9.0))
    assert bundle_key(HW, LLAMA, tweaked) != bundle_key(HW, LLAMA, f)
    d_base = pd.read_csv(base / "tp1" / "attention.csv")["time_us"]
    d_fast = pd.read_csv(other / "tp1" / "attention.csv")["time_us"]
    assert (d_fast <= d_base).all() and (d_fast < d_base).any()


def test_cache_env_and_tp_added_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    one = ensure_bundle(HW, LLAMA, 1)
    assert one.is_relative_to(tmp_path / "c")
    two = ensure_bundle(HW, LLAMA, 2)
    assert two == one
    assert yaml.safe_load((one / "meta.yaml").read_text())["tp_degrees"] == [1, 2]


def test_loader_sees_tp_folder_added_later(tmp_path: Path) -> None:
    one = ensure_bundle(HW, LLAMA, 1, cache=tmp_path)
    assert sorted(load_bundle(one).tps) == [1]
    ensure_bundle(HW, LLAMA, 2, cache=tmp_path)
    assert sorted(load_bundle(one).tps) == [1, 2]


def test_bare_model_name_follows_loader_path(tmp_path: Path) -> None:
    bare = dataclasses.replace(LLAMA, name="my-llama")
    vdir = ensure_bundle(HW, bare, 1, cache=tmp_path)
    root = tmp_path / bundle_key(HW, bare, load_factors())
    assert vdir == root / "RTXPRO6000" / "my-llama" / "bf16"
    assert sorted(load_bundle(root, "RTXPRO6000", "my-llama").tps) == [1]
    with pytest.raises(ConfigError):
        generate_bundle(HW, dataclasses.replace(LLAMA, name="../escape"), 1, tmp_path)


def _ensure_in_subprocess(cache: str, tp: int) -> str:
    return str(ensure_bundle(HW, LLAMA, tp, cache=Path(cache)))


def test_concurrent_ensure_is_consistent(tmp_path: Path) -> None:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(3, mp_context=mp.get_context("spawn")) as pool:
        paths = list(pool.map(_ensure_in_subprocess, [str(tmp_path)] * 3, [1, 2, 2]))
    assert len(set(paths)) == 1
    vdir = Path(paths[0])
    assert yaml.safe_load((vdir / "meta.yaml").read_text())["tp_degrees"] == [1, 2]
    assert sorted(load_bundle(vdir).tps) == [1, 2]
    assert not [p for p in vdir.iterdir() if p.name.startswith(".tp")]  # no temp dirs left


def test_factors_validate() -> None:
    f = load_factors()
    assert set(f.categories) == set(CATEGORIES)
    with pytest.raises(ConfigError):
        KernelFactors(eff_memory=0.0)
    with pytest.raises(ConfigError):
        f.for_layer("no_such_layer")
    assert len(f.digest()) == 64


# ----------------------------------------------------------------------------- factor sets


def _write_factors_file(path: Path, systems: dict[str, dict], fallback: str,
                        aliases: dict[str, str] | None = None, version: int = 2) -> Path:
    base = load_factors().to_dict()
    body = {"version": version, "fallback": fallback, "hardware_fallback": aliases or {},
            "systems": {name: {"categories": {**base, **cats}} for name, cats in systems.items()}}
    path.write_text(yaml.safe_dump(body))
    return path


def test_committed_file_has_a_set_per_aiconfigurator_system(tmp_path: Path) -> None:
    from profiles.roofline.factors import load_factors_file
    from profiles.roofline.fit import FALLBACK, HARDWARE_FALLBACK, MEASURED_HARDWARE

    f = load_factors_file()
    assert f.fallback == FALLBACK == MEASURED_HARDWARE
    assert dict(f.hardware_fallback) == HARDWARE_FALLBACK
    for name in ("RTXPRO6000", "H100-SXM", "H200", "B200", "B300", "GB200", "GB300", "L40S",
                 "A100-80G"):
        s = load_factors(hardware=name)
        assert s.system == name and s.version == f.version >= 2
    # Catalog hardware without its own set: the documented fallback for it.
    assert load_factors(hardware="RTX4090").system == "L40S"
    assert load_factors(hardware="no-such-gpu").system == MEASURED_HARDWARE
    assert load_factors(hardware="h100-sxm").system == "H100-SXM"  # case-insensitive
    # A catalog alias (the reference cluster configs say "H100") picks the catalog GPU's set,
    # also for a spec built outside the catalog under that name.
    assert load_factors(hardware="H100").system == "H100-SXM"
    assert load_factors(hardware="A100").system == "A100-80G"
    assert load_factors(hardware="RTX-4090").system == "L40S"
    reference_h100 = dataclasses.replace(load_hardware("H100-SXM"), name="H100", mem_gib=80.0)
    meta = yaml.safe_load((ensure_bundle(reference_h100, LLAMA, 1, cache=tmp_path)
                           / "meta.yaml").read_text())
    assert meta["roofline"]["factors_system"] == "H100-SXM"
    # Categories aiconfigurator has no table for are the measured set's, for every system.
    rtx = load_factors(hardware="RTXPRO6000").categories
    for name in f.systems:
        for cat in ("norm", "head_norm", "rotary", "activation", "embedding", "sampler"):
            assert f.systems[name].categories[cat] == rtx[cat], (name, cat)


def test_roofline_prices_with_its_hardwares_factors(tmp_path: Path) -> None:
    h100 = load_hardware("H100-SXM")
    vdir = ensure_bundle(h100, LLAMA, 1, cache=tmp_path)
    meta = yaml.safe_load((vdir / "meta.yaml").read_text())["roofline"]
    own = load_factors(hardware="H100-SXM")
    assert meta["factors_system"] == "H100-SXM" and meta["factors_version"] == own.version
    assert meta["factors_sha256"] == own.digest()
    assert vdir.parents[3] == tmp_path / bundle_key(h100, LLAMA, own)
    fallback = ensure_bundle(h100, LLAMA, 1, factors=load_factors(), cache=tmp_path)
    assert fallback != vdir
    a = pd.read_csv(vdir / "tp1" / "dense.csv")["time_us"]
    b = pd.read_csv(fallback / "tp1" / "dense.csv")["time_us"]
    assert not np.array_equal(a.to_numpy(), b.to_numpy())


def test_cache_key_covers_factor_set_and_file_version() -> None:
    f = load_factors()
    same_values = [dataclasses.replace(f, system=s, version=v)
                   for s, v in (("A", 2), ("B", 2), ("A", 3))]
    keys = {bundle_key(HW, LLAMA, x) for x in [f, *same_values]}
    assert len(keys) == 4  # equal numbers, different provenance: never the same cache entry


def test_factors_file_selection_and_errors(tmp_path: Path) -> None:
    from profiles.roofline.factors import load_factors_file

    gemm = {"gemm": {**load_factors().to_dict()["gemm"], "launch_us": 7.0}}
    path = _write_factors_file(tmp_path / "f.yaml", {"BASE": {}, "FAST": gemm}, "BASE",
                               {"OTHER": "FAST"})
    assert load_factors(path, "FAST").categories["gemm"].launch_us == 7.0
    assert load_factors(path, "OTHER").system == "FAST"
    assert load_factors(path, "unknown").system == "BASE"
    assert load_factors(path).system == "BASE"
    assert load_factors_file(path).version == 2
    bad = _write_factors_file(tmp_path / "bad.yaml", {"BASE": {}}, "MISSING")
    with pytest.raises(ConfigError, match="fallback"):
        load_factors(bad)
    alias = _write_factors_file(tmp_path / "alias.yaml", {"BASE": {}}, "BASE", {"X": "NOPE"})
    with pytest.raises(ConfigError, match="hardware_fallback.X"):
        load_factors(alias)
    # A version-1 file (one `categories` set) prices every hardware.
    v1 = tmp_path / "v1.yaml"
    v1.write_text(yaml.safe_dump({"version": 1, "categories": load_factors().to_dict()}))
    assert load_factors(v1, "H100-SXM").categories == load_factors().categories
