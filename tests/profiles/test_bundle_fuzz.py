"""Damaged profile bundles: a ``BundleError`` naming the file (and line), or a latency model
that prices every step with a positive integer.

A roofline bundle is generated once (``profiles.roofline.generate_bundle``); each example
copies it, damages it (a missing table or meta.yaml, a NaN / infinite / negative / non-numeric
/ absurdly large cell, a bad engine limit in meta.yaml, a dropped column, a short row, all data
rows gone, rows removed, rows shuffled, time values that fall as the key grows, duplicated keys) and loads it with
``profiles.bundle.load_bundle`` and ``ProfiledLatencyModel``. Documented handling: rows are
sorted by key and the first of duplicated keys is kept; lookups between and beyond grid
points interpolate and extrapolate linearly and are floored at 1 ns; a layer missing from a
table is skipped with a warning.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.batch import BatchShape
from profiles.bundle import BundleError, clear_bundle_cache, load_bundle
from profiles.catalog import load_hardware, load_model
from profiles.latency import ProfiledLatencyModel
from profiles.roofline import generate_bundle

MODEL = load_model("meta-llama/Llama-3.1-8B")
TABLES = ("dense.csv", "per_sequence.csv", "attention.csv")
BAD_CELLS = ["nan", "NaN", "inf", "-inf", "-1", "0", "abc", "", "1e400", "1,5", "1e300", "1e30",
             "-1e30", "4e9"]
BAD_LIMITS = ["abc", -1, 0, 2.5, True, 10**12, [1], None]
COUNTS = {"fuzzed": 0, "refused": 0, "loaded": 0}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bundle")
    return generate_bundle(load_hardware("H100-SXM"), MODEL, 1, root)


def _shapes(rng: random.Random, n: int) -> list[BatchShape]:
    out = []
    for _ in range(n):
        nd = rng.randint(0, 300)
        pc = rng.choice([0, 1, 7, 512, 3000, 9000]) if nd else rng.choice([1, 64, 2048, 9000])
        kp = rng.randint(0, 20_000) if pc else 0
        kvs = [rng.randint(1, 40_000) for _ in range(nd)]
        shape = BatchShape(pc + nd, nd + (1 if pc else 0), pc, kp, nd, sum(kvs),
                           min(kvs, default=0), max(kvs, default=0))
        out.append(shape)
    return out


@st.composite
def damages(draw):
    table = draw(st.sampled_from(TABLES))
    kind = draw(st.sampled_from(
        ["missing_file", "missing_meta", "bad_meta", "bad_cell", "drop_column", "short_row",
         "no_rows", "drop_rows", "shuffle", "non_monotone", "duplicate_keys", "empty_file",
         "meta_value"]))
    bad = draw(st.sampled_from(BAD_LIMITS if kind == "meta_value" else BAD_CELLS))
    return table, kind, random.Random(draw(st.integers(0, 2**32))), bad


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(damages())
def test_damaged_bundle_is_refused_by_file_and_line_or_prices_positive(tmp_path, pristine, case):
    table, kind, rng, bad = case
    work = tmp_path / "case"
    shutil.rmtree(work, ignore_errors=True)
    vdir = work / "bf16"
    shutil.copytree(pristine, vdir)
    path = vdir / "tp1" / table
    lines = path.read_text().splitlines()
    header, rows = lines[0], lines[1:]
    expect_line: int | None = None
    expect_file = path
    if kind == "missing_file":
        path.unlink()
    elif kind == "missing_meta":
        (vdir / "meta.yaml").unlink()
        expect_file = vdir / "meta.yaml"
    elif kind == "bad_meta":
        (vdir / "meta.yaml").write_text(rng.choice(["a: [1, 2", "- just\n- a list\n", "{: :}"]))
        expect_file = vdir / "meta.yaml"
    elif kind == "meta_value":  # a profiled engine limit of the wrong type or range
        key = rng.choice(["max_num_seqs", "max_num_batched_tokens"])
        meta = yaml.safe_load((vdir / "meta.yaml").read_text())
        meta["engine_effective"][key] = bad
        text = yaml.safe_dump(meta)
        (vdir / "meta.yaml").write_text(text)
        expect_file = vdir / "meta.yaml"
        expect_line = next(i for i, t in enumerate(text.splitlines(), start=1)
                           if t.strip().startswith(f"{key}:"))
        if bad is None:  # documented: an absent (null) limit means "not recorded"
            kind = "null_limit"
    elif kind == "bad_cell":
        i = rng.randrange(len(rows))
        cells = rows[i].split(",")
        col = rng.randrange(1 if table != "attention.csv" else 0, len(cells))
        cells[col] = bad
        rows[i] = ",".join(cells)
        expect_line = i + 2
        if bad == "0" and col < len(cells) - 1:  # 0 is a valid key (only times must be > 0)
            kind = "zero_key"
    elif kind == "drop_column":
        cols = header.split(",")
        drop = rng.randrange(len(cols))
        header = ",".join(c for j, c in enumerate(cols) if j != drop)
        rows = [",".join(c for j, c in enumerate(r.split(",")) if j != drop) for r in rows]
    elif kind == "short_row":
        i = rng.randrange(len(rows))
        rows[i] = ",".join(rows[i].split(",")[:-1])
        expect_line = i + 2
    elif kind == "no_rows":
        rows = []
    elif kind == "drop_rows":
        keep = max(1, int(len(rows) * rng.uniform(0.05, 0.9)))
        rows = sorted(rng.sample(rows, keep), key=rows.index)
    elif kind == "shuffle":
        rng.shuffle(rows)
    elif kind == "non_monotone":  # times no longer grow with the key
        times = [r.rsplit(",", 1)[1] for r in rows]
        rng.shuffle(times)
        rows = [f"{r.rsplit(',', 1)[0]},{t}" for r, t in zip(rows, times, strict=True)]
    elif kind == "duplicate_keys":
        extra = [f"{r.rsplit(',', 1)[0]},{rng.uniform(0.5, 5000):.3f}" for r in rng.sample(rows, 20)]
        rows = rows + extra
    else:  # empty_file
        header, rows = "", []
    if kind not in ("missing_file", "missing_meta", "bad_meta", "meta_value", "null_limit"):
        path.write_text("\n".join([header, *rows]) + "\n" if header or rows else "")
    clear_bundle_cache()
    COUNTS["fuzzed"] += 1
    try:
        model = ProfiledLatencyModel(load_bundle(vdir), MODEL, 1)
    except BundleError as err:
        COUNTS["refused"] += 1
        msg = str(err)
        where = f"{expect_file}:{expect_line}:" if expect_line else str(expect_file)
        assert where in msg, (kind, table, msg)
        return
    assert kind in ("drop_rows", "shuffle", "non_monotone", "duplicate_keys", "zero_key",
                    "null_limit"), (kind, table)
    COUNTS["loaded"] += 1
    for shape in _shapes(rng, 40):
        ns = model.iteration_ns(shape)
        assert type(ns) is int and ns >= 1, (kind, table, shape, ns)


def test_fuzz_counts_cover_both_outcomes():
    if not COUNTS["fuzzed"]:
        pytest.skip("runs only after the fuzz test in the same session")
    assert COUNTS["refused"] and COUNTS["loaded"], COUNTS


def test_row_with_an_extra_field_is_refused_not_shifted(tmp_path, pristine):
    """Found by the fuzzer: a cell such as ``1,5`` split a row into one field too many and
    the loader read the shifted columns silently (the time of the row became ``5``)."""
    vdir = tmp_path / "bf16"
    shutil.copytree(pristine, vdir)
    path = vdir / "tp1" / "dense.csv"
    lines = path.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",1,5"
    path.write_text("\n".join(lines) + "\n")
    clear_bundle_cache()
    with pytest.raises(BundleError, match=rf"{path}:4: 4 fields, header has 3"):
        load_bundle(vdir)
