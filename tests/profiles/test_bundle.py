"""Profile bundle loader: layout, ns conversion, pre-indexing, validation errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import profiles.bundle as bundle_mod
from profiles.bundle import (
    BundleError,
    Curve,
    bundle_dir,
    clear_bundle_cache,
    load_bundle,
    us_to_ns,
    variant_name,
)
from tests.conftest import shared_data_dir

DENSE_LAYERS = ("embedding", "layernorm", "qkv_proj", "rotary_emb", "o_proj", "gate_up_proj",
                "act_fn", "down_proj", "final_layernorm")
TOKENS = (1, 2, 4, 8, 16)
SEQS = (1, 2, 4)
PC_AXIS = (0, 16, 32)
ND_AXIS = (0, 1, 2, 4, 64)


def attn_us(pc: int, kp: int, nd: int, kv: int) -> float:
    """Synthetic attention time, multilinear so the 4-D blend reproduces it inside the grid."""
    return 2.0 + 0.5 * pc + 0.01 * kp + 0.001 * pc * kp / 16 + 0.25 * nd + 0.002 * nd * kv


def dense_us(layer: str, tokens: int) -> float:
    return 1.0 + DENSE_LAYERS.index(layer) + 0.5 * tokens


def write_bundle(root: Path, *, hardware: str = "TESTGPU", model: str = "test/tiny",
                 variant: str = "bf16", tps: tuple[int, ...] = (1,), skew: dict | None = None,
                 moe: bool = False) -> Path:
    """Write a small, fully-known bundle; returns the variant directory.

    Attention grid: pc {0, 16, 32} x nd {0, 1, 2, 4, 64}; slices (16, 64) and (32, 64) are
    absent (as the reference's nd = 256 slices for pc > 0, and likewise their nearest pair by
    raw distance is the pure-decode (0, 64)), and the kp = 96 row of the mixed slices only has
    kv_decode points from 32 upward (ragged, like the reference's 1.5x rows). In tp>1 folders
    the tp-invariant rows (norms, sampler) hold 10x wrong values, so a model that reads them
    from there instead of tp1 is caught.
    """
    vdir = root / hardware / model / variant
    for tp in tps:
        d = vdir / f"tp{tp}"
        d.mkdir(parents=True)
        scale = 1.0 / tp
        lines = ["layer,tokens,time_us"]
        for layer in DENSE_LAYERS:
            s = (10.0 if tp > 1 else 1.0) if layer in ("layernorm", "final_layernorm") else scale
            lines += [f"{layer},{t},{dense_us(layer, t) * s:.6g}" for t in TOKENS]
        (d / "dense.csv").write_text("\n".join(lines) + "\n")
        lines = ["layer,sequences,time_us"]
        lines += [f"lm_head,{n},{(100 + 2 * n) * scale:.6g}" for n in SEQS]
        lines += [f"sampler,{n},{(10 + n) * (10 if tp > 1 else 1):.6g}" for n in SEQS]
        (d / "per_sequence.csv").write_text("\n".join(lines) + "\n")
        lines = ["prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"]
        for pc in PC_AXIS:
            for nd in ND_AXIS:
                if (pc, nd) == (0, 0) or (pc > 0 and nd == 64):
                    continue
                kps = (0,) if pc == 0 else (0, 64, 96)
                for kp in kps:
                    kvs = (0,) if nd == 0 else ((32, 64) if kp == 96 else (16, 32, 64))
                    lines += [f"{pc},{kp},{nd},{kv},{attn_us(pc, kp, nd, kv) * scale:.6g}" for kv in kvs]
        (d / "attention.csv").write_text("\n".join(lines) + "\n")
        if moe and tp == 1:
            lines = ["tokens,activated_experts,time_us"]
            for a in (2, 4):
                lines += [f"{t},{a},{20 + t + 5 * a}" for t in (1, 2, 4, 8, 16) if a <= 2 * t]
            (d / "moe.csv").write_text("\n".join(lines) + "\n")
    meta = {"hardware": hardware, "model": model, "variant": variant, "tp_degrees": list(tps),
            "engine_effective": {"max_num_batched_tokens": 16, "max_num_seqs": 4}}
    if skew is not None:
        meta["skew_fit"] = skew
    (vdir / "meta.yaml").write_text(yaml.safe_dump(meta))
    return vdir


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_bundle_cache()
    yield
    clear_bundle_cache()


# ----------------------------------------------------------------------------- naming, units


@pytest.mark.parametrize(
    ("dtype", "kv", "expected"),
    [("bfloat16", "auto", "bf16"), ("float16", "auto", "fp16"), ("half", "auto", "fp16"),
     ("float32", "auto", "fp32"), ("fp8_e4m3", "auto", "fp8"), ("bfloat16", "fp8", "bf16-kvfp8"),
     ("bfloat16", "fp8_e4m3", "bf16-kvfp8"), ("int4", "auto", "int4"), ("mxfp4", "auto", "mxfp4")],
)
def test_variant_name(dtype: str, kv: str, expected: str) -> None:
    assert variant_name(dtype, kv) == expected


def test_us_to_ns_rounds_half_even_and_floors_at_one() -> None:
    us = np.array([8.35233, 0.0025, 0.0035, 0.0001, 714.006, 1.0005])
    assert us_to_ns(us).tolist() == [max(round(x * 1000), 1) for x in us]
    assert us_to_ns(np.array([0.0025]))[0] == 2  # 2.5 -> 2 (half to even)
    assert us_to_ns(np.array([0.0001]))[0] == 1


def test_curve_sorts_and_keeps_first_duplicate() -> None:
    c = Curve.build([4, 1, 2, 2], [40, 10, 20, 99])
    assert c.xs == (1, 2, 4) and c.ys == (10, 20, 40)
    assert c.keys.dtype == np.int64 and c.values.tolist() == [10, 20, 40]


# --------------------------------------------------------------------------- synthetic bundle


def test_load_synthetic_bundle_layout_and_index(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path, tps=(1, 2))
    b = load_bundle(tmp_path, "TESTGPU", "test/tiny")
    assert b.path == vdir.resolve()
    assert sorted(b.tps) == [1, 2]
    assert b.max_num_batched_tokens == 16 and b.max_num_seqs == 4
    t1 = b.tables(1)
    assert set(t1.dense) == set(DENSE_LAYERS)
    assert t1.dense["qkv_proj"].xs == TOKENS
    assert t1.dense["qkv_proj"].ys[0] == round(dense_us("qkv_proj", 1) * 1000)
    att = t1.attention
    assert att.pc_axis == PC_AXIS and att.nd_axis == ND_AXIS
    assert (16, 64) not in att.slices and (0, 0) not in att.slices
    assert att.nd_by_pc[16] == (0, 1, 2, 4) and att.nd_by_pc[0] == (1, 2, 4, 64)
    sl = att.slices[(16, 2)]
    assert sl.kp == (0, 64, 96)
    assert sl.rows[0].xs == (16, 32, 64) and sl.rows[2].xs == (32, 64)  # ragged rows
    assert t1.moe is None
    assert not b.skew_fit.enabled


def test_direct_path_and_cache(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    a = load_bundle(vdir)
    assert load_bundle(tmp_path, "TESTGPU", "test/tiny", "bf16") is a
    clear_bundle_cache()
    assert load_bundle(vdir) is not a


def test_missing_tp_names_available_degrees(tmp_path: Path) -> None:
    b = load_bundle(write_bundle(tmp_path, tps=(1, 2)))
    with pytest.raises(BundleError, match=r"no tp4/.*\[1, 2\]"):
        b.tables(4)


def test_beyond_profiled_range(tmp_path: Path) -> None:
    b = load_bundle(write_bundle(tmp_path))
    assert b.beyond_profiled_range(16, 4) == []
    msgs = b.beyond_profiled_range(2048, 128)
    assert len(msgs) == 2 and "max_num_batched_tokens 2048" in msgs[0]


def test_skew_fit_hydrated(tmp_path: Path) -> None:
    skew = {"enabled": True, "alpha_default": 0.5,
            "per_tp": {1: {"alpha_default": 0.25, "bucket_table": "tp1/skew_fit.csv"}}}
    vdir = write_bundle(tmp_path, skew=skew)
    (vdir / "tp1" / "skew_fit.csv").write_text(
        "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples\n"
        "0,n<=2,sr<=70%,kvB<=1k,kp=0,0.75,3\n"
    )
    b = load_bundle(vdir)
    assert b.skew_fit.enabled and b.skew_fit.alpha_default == 0.5
    entry = b.skew_fit.per_tp[1]
    assert entry.alpha_default == 0.25
    assert entry.table == {"pc=0|n<=2|sr<=70%|kvB<=1k|kp=0": 0.75}
    assert entry.axes.labels["n"][0] == "n<=2"


def test_skew_fit_raw_key_column(tmp_path: Path) -> None:
    skew = {"enabled": True, "per_tp": {1: {"alpha_default": 0.1, "bucket_table": "tp1/skew_fit.csv"}}}
    vdir = write_bundle(tmp_path, skew=skew)
    (vdir / "tp1" / "skew_fit.csv").write_text(
        "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples,raw_key\n"
        "0,a,b,c,d,0.3,1,custom-key\n"
    )
    assert load_bundle(vdir).skew_fit.per_tp[1].table == {"custom-key": 0.3}


# ------------------------------------------------------------------------------- bad input


def _replace_line(path: Path, lineno: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[lineno - 1] = text
    path.write_text("\n".join(lines) + "\n")


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="bundle directory not found"):
        load_bundle(tmp_path, "TESTGPU", "nobody/none")


def test_bad_model_name(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="org>/<model"):
        bundle_dir(tmp_path, "TESTGPU", "../escape")


def test_only_one_of_hardware_or_model(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="give both"):
        load_bundle(tmp_path, "TESTGPU")


def test_missing_meta(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    (vdir / "meta.yaml").unlink()
    with pytest.raises(BundleError, match=r"meta\.yaml: missing"):
        load_bundle(vdir)


def test_invalid_meta_yaml(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    (vdir / "meta.yaml").write_text("a: [unclosed\n")
    with pytest.raises(BundleError, match="invalid YAML"):
        load_bundle(vdir)


def test_no_tp_folders(tmp_path: Path) -> None:
    vdir = tmp_path / "v"
    vdir.mkdir()
    (vdir / "meta.yaml").write_text("hardware: X\n")
    with pytest.raises(BundleError, match=r"no tp<N>/ folders"):
        load_bundle(vdir)


@pytest.mark.parametrize("name", ["dense.csv", "per_sequence.csv", "attention.csv"])
def test_missing_required_csv(tmp_path: Path, name: str) -> None:
    vdir = write_bundle(tmp_path)
    (vdir / "tp1" / name).unlink()
    with pytest.raises(BundleError, match=rf"tp1/{name}: file missing"):
        load_bundle(vdir)


def test_missing_column(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    _replace_line(vdir / "tp1" / "dense.csv", 1, "layer,tokens,time_ms")
    with pytest.raises(BundleError, match=r"dense\.csv: missing column\(s\) \['time_us'\]"):
        load_bundle(vdir)


@pytest.mark.parametrize(
    ("line", "pattern"),
    [("qkv_proj,4,nan", r"dense\.csv:5: column 'time_us' = 'nan' is not finite"),
     ("qkv_proj,4,abc", r"dense\.csv:5: column 'time_us' = 'abc' is not a number"),
     ("qkv_proj,4,0", r"dense\.csv:5: column 'time_us' = '0' must be a positive time"),
     ("qkv_proj,4,-3.5", r"dense\.csv:5: column 'time_us' = '-3.5' must be a positive"),
     ("qkv_proj,4.5,3", r"dense\.csv:5: column 'tokens' = '4.5' must be a non-negative integer"),
     ("qkv_proj,-4,3", r"dense\.csv:5: column 'tokens' = '-4' must be a non-negative integer"),
     ("qkv_proj,4", r"dense\.csv:5: 2 fields, header has 3"),
     ("qkv_proj,4,1e300", r"dense\.csv:5: column 'time_us' = '1e300' us is above an hour"),
     ("qkv_proj,4,3.7e9", r"dense\.csv:5: column 'time_us' = '3.7e9' us is above an hour"),
     ("qkv_proj,4,-inf", r"dense\.csv:5: column 'time_us' = '-inf' is not finite"),
     ("qkv_proj,1e30,3", r"dense\.csv:5: column 'tokens' = '1e30' is above 100000000"),
     ("qkv_proj,100000001,3", r"dense\.csv:5: column 'tokens' = '100000001' is above"),
     ("qkv_proj,nan,3", r"dense\.csv:5: column 'tokens' = 'nan' is not finite"),
     (",4,3", r"dense\.csv: a row has an empty 'layer' name")],
)
def test_bad_dense_values_name_file_and_line(tmp_path: Path, line: str, pattern: str) -> None:
    vdir = write_bundle(tmp_path)
    _replace_line(vdir / "tp1" / "dense.csv", 5, line)
    with pytest.raises(BundleError, match=pattern) as info:
        load_bundle(vdir)
    assert "Re-export dense.csv" in str(info.value)


def test_bad_attention_value(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    _replace_line(vdir / "tp1" / "attention.csv", 3, "0,0,1,32,inf")
    with pytest.raises(BundleError, match=r"attention\.csv:3: column 'time_us' = 'inf'"):
        load_bundle(vdir)


def test_empty_table(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    (vdir / "tp1" / "per_sequence.csv").write_text("layer,sequences,time_us\n")
    with pytest.raises(BundleError, match=r"per_sequence\.csv: no data rows"):
        load_bundle(vdir)


def test_skew_bucket_table_missing(tmp_path: Path) -> None:
    skew = {"enabled": True, "per_tp": {1: {"alpha_default": 0.1, "bucket_table": "tp1/skew_fit.csv"}}}
    vdir = write_bundle(tmp_path, skew=skew)
    with pytest.raises(BundleError, match=r"bucket_table names .*skew_fit\.csv, which is missing"):
        load_bundle(vdir)


def test_skew_bad_axes(tmp_path: Path) -> None:
    skew = {"enabled": True, "bucket_axes": {"n_bins": [0, 2], "n_labels": ["a", "b"]},
            "per_tp": {1: {"alpha_default": 0.1}}}
    with pytest.raises(BundleError, match=r"n_bins must be a list with one more edge"):
        load_bundle(write_bundle(tmp_path, skew=skew))


def test_skew_bad_alpha_default(tmp_path: Path) -> None:
    skew = {"enabled": True, "per_tp": {1: {"alpha_default": "high"}}}
    with pytest.raises(BundleError, match=r"per_tp\.1\.alpha_default = 'high' is not a number"):
        load_bundle(write_bundle(tmp_path, skew=skew))


@pytest.mark.parametrize(
    ("table", "line", "pattern"),
    [("attention.csv", "0,0,1,1000000000,8.5", r"attention\.csv:3: column 'kv_decode' = '1000000000' is above"),
     ("attention.csv", "0,-16,1,32,8.5", r"attention\.csv:3: column 'kv_prefill' = '-16' must be a non-neg"),
     ("per_sequence.csv", "lm_head,1e12,5", r"per_sequence\.csv:3: column 'sequences' = '1e12' is above"),
     ("per_sequence.csv", "lm_head,2,9e99", r"per_sequence\.csv:3: column 'time_us' = '9e99' us is above")],
)
def test_absurd_sizes_and_latencies_name_file_and_line(tmp_path: Path, table: str, line: str,
                                                      pattern: str) -> None:
    vdir = write_bundle(tmp_path)
    _replace_line(vdir / "tp1" / table, 3, line)
    with pytest.raises(BundleError, match=pattern) as info:
        load_bundle(vdir)
    assert f"Re-export {table}" in str(info.value)


def test_absurd_moe_value(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path, moe=True)
    _replace_line(vdir / "tp1" / "moe.csv", 2, "1,2,inf")
    with pytest.raises(BundleError, match=r"moe\.csv:2: column 'time_us' = 'inf' is not finite"):
        load_bundle(vdir)
    _replace_line(vdir / "tp1" / "moe.csv", 2, "1,200000000,3")
    with pytest.raises(BundleError, match=r"moe\.csv:2: column 'activated_experts' = '200000000'"):
        load_bundle(vdir)


@pytest.mark.parametrize("cell", ["nan", "inf", "1e30", "-2e6", "x"])
def test_bad_skew_table_alpha_names_file_and_line(tmp_path: Path, cell: str) -> None:
    skew = {"enabled": True, "per_tp": {1: {"alpha_default": 0.1, "bucket_table": "tp1/skew_fit.csv"}}}
    vdir = write_bundle(tmp_path, skew=skew)
    (vdir / "tp1" / "skew_fit.csv").write_text(
        "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples\n"
        "0,n<=2,sr<=70%,kvB<=1k,kp=0,0.75,3\n"
        f"0,n<=4,sr<=70%,kvB<=1k,kp=0,{cell},3\n"
    )
    with pytest.raises(BundleError, match=r"skew_fit\.csv:3: column 'alpha'") as info:
        load_bundle(vdir)
    assert "Re-run the alpha fit" in str(info.value)


def _meta_line(vdir: Path, key: str) -> int:
    """1-based line of ``key:`` in meta.yaml (the test's own reading, not the loader's)."""
    lines = (vdir / "meta.yaml").read_text().splitlines()
    return next(i for i, t in enumerate(lines, start=1) if t.strip().startswith(f"{key}:"))


@pytest.mark.parametrize("value", ["abc", -1, 0, 1.5, True, 10**9, float("nan"), [4]])
@pytest.mark.parametrize("key", ["max_num_seqs", "max_num_batched_tokens"])
def test_bad_engine_limits_name_meta_line(tmp_path: Path, key: str, value: object) -> None:
    vdir = write_bundle(tmp_path)
    meta = yaml.safe_load((vdir / "meta.yaml").read_text())
    meta["engine_effective"][key] = value
    (vdir / "meta.yaml").write_text(yaml.safe_dump(meta))
    line = _meta_line(vdir, key)
    with pytest.raises(BundleError, match=rf"meta\.yaml:{line}: engine_effective\.{key} = .* must "
                                          rf"be an int in \[1, 100000000\]"):
        load_bundle(vdir)


def test_engine_effective_must_be_a_mapping(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    meta = yaml.safe_load((vdir / "meta.yaml").read_text())
    meta["engine_effective"] = [1, 2]
    (vdir / "meta.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(BundleError, match=rf"meta\.yaml:{_meta_line(vdir, 'engine_effective')}: "
                                          "engine_effective must be a mapping"):
        load_bundle(vdir)


@pytest.mark.parametrize(("value", "needle"), [(float("nan"), "is not a number"),
                                               (float("inf"), "is not a number"),
                                               (True, "is not a number"),
                                               (1e30, "is beyond +-1e+06")])
def test_bad_alpha_defaults_name_meta_line(tmp_path: Path, value: object, needle: str) -> None:
    skew = {"enabled": True, "alpha_default": value, "per_tp": {1: {"alpha_default": 0.1}}}
    vdir = write_bundle(tmp_path, skew=skew)
    with pytest.raises(BundleError) as info:
        load_bundle(vdir)
    msg = str(info.value)
    assert f"meta.yaml:{_meta_line(vdir, 'alpha_default')}: skew_fit.alpha_default" in msg, msg
    assert needle in msg
    skew = {"enabled": True, "per_tp": {1: {"alpha_default": value}}}
    vdir = write_bundle(tmp_path / "per_tp", skew=skew)
    with pytest.raises(BundleError) as info:
        load_bundle(vdir)
    msg = str(info.value)
    assert f"meta.yaml:{_meta_line(vdir, 'alpha_default')}: skew_fit.per_tp.1.alpha_default" in msg
    assert needle in msg


@pytest.mark.parametrize(("bins", "needle"), [([0, 2, 2], "must increase strictly"),
                                              ([0, 5, 2], "must increase strictly"),
                                              ([0, float("nan"), 9], "has a non-number"),
                                              ([0, "x", 9], "has a non-number"),
                                              ([0, True, 9], "has a non-number")])
def test_bad_bucket_edges_name_meta_line(tmp_path: Path, bins: list, needle: str) -> None:
    skew = {"enabled": True, "bucket_axes": {"n_bins": bins, "n_labels": ["a", "b"]},
            "per_tp": {1: {"alpha_default": 0.1}}}
    vdir = write_bundle(tmp_path, skew=skew)
    with pytest.raises(BundleError, match=rf"meta\.yaml:{_meta_line(vdir, 'n_bins')}: "
                                          rf"bucket_axes\.n_bins {needle}"):
        load_bundle(vdir)


def test_bucket_table_outside_the_bundle_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.csv").write_text("pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha\n")
    skew = {"enabled": True, "per_tp": {1: {"bucket_table": "../../../../../elsewhere.csv"}}}
    vdir = write_bundle(tmp_path, skew=skew)
    with pytest.raises(BundleError, match=r"meta\.yaml:\d+: skew_fit\.per_tp\.1\.bucket_table names "
                                          r".*, outside the bundle"):
        load_bundle(vdir)


def test_meta_not_utf8(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    (vdir / "meta.yaml").write_bytes(b"hardware: \xff\xfe\n")
    with pytest.raises(BundleError, match=r"meta\.yaml: not UTF-8 text"):
        load_bundle(vdir)


# ----------------------------------------------------------------------------- shipped data


@pytest.mark.groundtruth
def test_shipped_llama_bundle(shared_data: Path) -> None:
    b = load_bundle(shared_data / "llmservingsim" / "profiles", "RTXPRO6000", "meta-llama/Llama-3.1-8B")
    assert sorted(b.tps) == [1, 2] and b.hardware == "RTXPRO6000"
    t1 = b.tables(1)
    assert len(t1.dense["qkv_proj"]) == 152 and len(t1.per_sequence["lm_head"]) == 40
    assert t1.per_sequence["lm_head"].ys[0] == 714006  # 714.006 us
    att = t1.attention
    assert len(att.pc_axis) == 20 and att.nd_axis == (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert all((pc, 256) not in att.slices for pc in att.pc_axis if pc > 0)
    sl = att.slices[(16, 1)]
    kp768 = sl.rows[sl.kp.index(768)]
    assert kp768.xs[0] == 512  # 1.5x-grid rows start at kv 512
    assert sl.rows[sl.kp.index(1024)].xs[0] == 16
    # sanity values of the spec (us): attention (0,0,1,1024) and (2048,0,0,0)
    row = att.slices[(0, 1)].rows[0]
    assert row.ys[row.xs.index(1024)] == pytest.approx(14590, abs=10)
    assert att.slices[(2048, 0)].rows[0].ys[0] == pytest.approx(172610, abs=10)
    skew = b.skew_fit.per_tp[1]
    assert skew.alpha_default == 0.0543
    assert skew.table["pc=0|n<=2|sr<=70%|kvB<=4k|kp=0"] == 0.0515


@pytest.mark.groundtruth
def test_shipped_moe_bundle(shared_data: Path) -> None:
    b = load_bundle(shared_data / "llmservingsim" / "profiles", "RTXPRO6000",
                    "Qwen/Qwen3-30B-A3B-Instruct-2507")
    moe = b.tables(1).moe
    assert moe is not None and moe.activated == (8, 16, 32, 64, 128)
    assert sum(len(r) for r in moe.rows) == 50
    assert b.tables(2).moe is None
    assert moe.rows[0].ys[0] == 50230  # 50.2297 us


def test_cached_bundle_is_reloaded_when_a_tp_folder_appears(tmp_path) -> None:
    from engine.specs import HardwareSpec
    from profiles.bundle import load_bundle
    from profiles.catalog import load_model
    from profiles.roofline import generate_bundle

    hw = HardwareSpec("TESTGPU", 80.0, 2000.0, 500.0, 1000.0, 100.0, 1000.0)
    model = load_model("meta-llama/Llama-3.1-8B")
    variant = generate_bundle(hw, model, 1, tmp_path)
    assert set(load_bundle(variant).tps) == {1}
    # Another process adds tp2 to the same root (this process's cache is not told).
    import subprocess
    import sys

    code = (
        "from engine.specs import HardwareSpec; from profiles.catalog import load_model;"
        "from profiles.roofline import generate_bundle;"
        "hw = HardwareSpec('TESTGPU', 80.0, 2000.0, 500.0, 1000.0, 100.0, 1000.0);"
        f"generate_bundle(hw, load_model('meta-llama/Llama-3.1-8B'), 2, {str(tmp_path)!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert set(load_bundle(variant).tps) == {1, 2}


def _reads_alike(path: Path, columns: dict[str, str]) -> None:
    """The one-pass reader takes a well-formed table and gives the row reader's values,
    of the same Python types."""
    fast = bundle_mod._read_numeric_csv_columnar(path, columns)
    rows = bundle_mod._read_numeric_csv_rows(path, columns, "fix")
    assert fast is not None, path
    assert fast == rows
    assert all([type(v) for v in fast[c]] == [type(v) for v in rows[c]] for c in fast)


TABLE_COLUMNS = {
    "dense.csv": {"layer": "str", "tokens": "int", "time_us": "time"},
    "per_sequence.csv": {"layer": "str", "sequences": "int", "time_us": "time"},
    "attention.csv": {"prefill_chunk": "int", "kv_prefill": "int", "n_decode": "int",
                      "kv_decode": "int", "time_us": "time"},
}


def test_one_pass_and_row_readers_agree_on_a_bundle(tmp_path: Path) -> None:
    vdir = write_bundle(tmp_path)
    for name, columns in TABLE_COLUMNS.items():
        _reads_alike(vdir / "tp1" / name, columns)


def test_one_pass_and_row_readers_agree_on_the_measured_bundles(shared_data: Path) -> None:
    checked = 0
    for path in sorted((shared_data / "llmservingsim" / "profiles").rglob("*.csv")):
        if path.name in TABLE_COLUMNS:
            _reads_alike(path, TABLE_COLUMNS[path.name])
            checked += 1
    assert checked >= 9


@pytest.mark.parametrize("body", ["qkv_proj,4,3\n\nqkv_proj,8,5\n",  # a blank line
                                  "qkv_proj, 4 ,3\nqkv_proj,8,5\n",  # spaces round a key
                                  "qkv_proj,4,3\n , , \nqkv_proj,8,5\n",  # a row of blanks
                                  '"qkv_proj",4,3\nqkv_proj,8,5\n',  # a quoted name
                                  'qkv_proj,"4",3\nqkv_proj,8,"5"\n'])  # quoted numbers
def test_what_the_one_pass_reader_does_not_take_the_row_reader_reads(tmp_path: Path,
                                                                      body: str) -> None:
    path = tmp_path / "dense.csv"
    path.write_text("layer,tokens,time_us\n" + body)
    assert bundle_mod._read_numeric_csv(path, TABLE_COLUMNS["dense.csv"], "fix") == {
        "layer": ["qkv_proj", "qkv_proj"], "tokens": [4, 8], "time_us": [3.0, 5.0]}


def test_a_quoted_cell_holding_the_delimiter_is_one_cell_as_the_row_reader_reads_it(
        tmp_path: Path) -> None:
    path = tmp_path / "dense.csv"
    path.write_text('layer,tokens,time_us,note\nqkv_proj,4,3,"a,b"\n')  # four cells
    assert bundle_mod._read_numeric_csv(path, TABLE_COLUMNS["dense.csv"], "fix") == {
        "layer": ["qkv_proj"], "tokens": [4], "time_us": [3.0]}
    path.write_text('layer,tokens,time_us,note\nqkv_proj,4,"a,b"\n')  # three cells for four
    with pytest.raises(BundleError, match=r"dense\.csv:2: 3 fields, header has 4"):
        bundle_mod._read_numeric_csv(path, TABLE_COLUMNS["dense.csv"], "fix")


# ------------------------------------------------- attention.csv indexed in one pass (oracle)


def _attention_by_curve(path: Path) -> bundle_mod.AttentionTable:
    """The attention table as ``Curve.build`` makes it curve by curve: the definition the
    one-pass ``_load_attention`` must equal."""
    cols = {"prefill_chunk": "int", "kv_prefill": "int", "n_decode": "int", "kv_decode": "int",
            "time_us": "time"}
    data = bundle_mod._read_numeric_csv(path, cols, "fix")
    ns = bundle_mod.us_to_ns(np.asarray(data["time_us"])).tolist()
    grouped: dict[tuple[int, int], dict[int, tuple[list[int], list[int]]]] = {}
    for pc, kp, nd, kv, v in zip(data["prefill_chunk"], data["kv_prefill"], data["n_decode"],
                                 data["kv_decode"], ns, strict=True):
        ks, vs = grouped.setdefault((pc, nd), {}).setdefault(kp, ([], []))
        ks.append(kv)
        vs.append(v)
    slices = {pair: bundle_mod.AttentionSlice(
        kp=tuple(sorted(rows)), rows=tuple(Curve.build(*rows[k]) for k in sorted(rows)))
        for pair, rows in grouped.items()}
    pairs = tuple(sorted(slices))
    nd_by_pc: dict[int, list[int]] = {}
    for pc, nd in pairs:
        nd_by_pc.setdefault(pc, []).append(nd)
    return bundle_mod.AttentionTable(
        pc_axis=tuple(sorted({p for p, _ in pairs})), nd_axis=tuple(sorted({n for _, n in pairs})),
        slices=slices, pairs=pairs, nd_by_pc={p: tuple(n) for p, n in nd_by_pc.items()})


def assert_same_attention(fast: bundle_mod.AttentionTable,
                          slow: bundle_mod.AttentionTable) -> None:
    assert (fast.pc_axis, fast.nd_axis, fast.pairs) == (slow.pc_axis, slow.nd_axis, slow.pairs)
    assert fast.nd_by_pc == slow.nd_by_pc and list(fast.nd_by_pc) == list(slow.nd_by_pc)
    assert list(fast.slices) == list(slow.slices)  # the file's order of first appearance
    for pair, want in slow.slices.items():
        got = fast.slices[pair]
        assert got.kp == want.kp and len(got.rows) == len(want.rows)
        for a, b in zip(got.rows, want.rows, strict=True):
            assert (a.xs, a.ys) == (b.xs, b.ys)
            assert a.keys.dtype == b.keys.dtype == np.int64 == a.values.dtype
            assert a.keys.tolist() == b.keys.tolist() and a.values.tolist() == b.values.tolist()
            assert a.keys.flags.c_contiguous and a.values.flags.c_contiguous


rows_strategy = st.lists(
    st.tuples(st.sampled_from([0, 16, 512]), st.sampled_from([0, 1, 2048]),
              st.sampled_from([0, 1, 8]), st.integers(0, 40),
              st.floats(0.001, 1e4, allow_nan=False)),
    min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(rows_strategy)
def test_attention_in_one_pass_equals_curve_by_curve(tmp_path_factory, rows) -> None:
    """Any attention.csv: shuffled rows, duplicated keys (the file's first kept), pairs in
    any order of first appearance."""
    path = tmp_path_factory.mktemp("attn") / "attention.csv"
    path.write_text("prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n" + "".join(
        f"{pc},{kp},{nd},{kv},{t!r}\n" for pc, kp, nd, kv, t in rows))
    assert_same_attention(bundle_mod._load_attention(path), _attention_by_curve(path))


def test_attention_of_real_bundles_in_one_pass(tmp_path: Path) -> None:
    """Every attention.csv of the measured bundles (``$SERVESWEEP_DATA``, when present) and
    of a generated roofline bundle, as curve by curve."""
    from profiles.catalog import load_hardware, load_model
    from profiles.roofline.generate import ensure_bundle

    vdir = ensure_bundle(load_hardware("L40S"), load_model("meta-llama/Llama-3.1-8B"), 1,
                         cache=tmp_path)
    paths = sorted(vdir.glob("tp*/attention.csv"))
    paths += sorted((shared_data_dir() / "llmservingsim" / "profiles").glob("**/attention.csv"))
    assert paths
    for path in paths:
        assert_same_attention(bundle_mod._load_attention(path), _attention_by_curve(path))
