"""Per-system roofline factors fitted to aiconfigurator-core's tables (profiles.roofline.fit).

Skipped without aiconfigurator-core 0.12.0 (the optional extra ``servesweep[aiconfigurator]``):
the committed factors need no package, refitting and checking them against the tables do.
The error ceilings are what ``python -m benchmarks.roofline_error`` measured for the
committed factors (docs/roofline.md, per-GPU block), rounded up to the next whole percent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from profiles.aiconfigurator.tables import PINNED_VERSION, installed_version

if installed_version() != PINNED_VERSION:
    pytest.skip(
        f"aiconfigurator-core {PINNED_VERSION} is not installed (found {installed_version()}); "
        "pip install -e '.[aiconfigurator]' to run these tests",
        allow_module_level=True,
    )

from profiles.aiconfigurator import ensure_bundle as aic_bundle  # noqa: E402
from profiles.bundle import clear_bundle_cache  # noqa: E402
from profiles.catalog import load_hardware, load_model  # noqa: E402
from profiles.roofline import ensure_bundle  # noqa: E402
from profiles.roofline.check import attention_split_errors, table_errors  # noqa: E402
from profiles.roofline.factors import load_factors, load_factors_file  # noqa: E402
from profiles.roofline.fit import (  # noqa: E402
    FALLBACK,
    TABLE_FREE_PARAMS,
    fit_category,
    table_attention_rows,
    table_samples,
    table_systems,
)

LLAMA = load_model("meta-llama/Llama-3.1-8B")


@pytest.fixture(autouse=True)
def _fresh_loader_cache():
    clear_bundle_cache()
    yield
    clear_bundle_cache()


def test_every_table_system_has_its_own_fitted_set() -> None:
    f = load_factors_file()
    assert set(table_systems()) | {FALLBACK} == set(f.systems)
    rtx = f.systems[FALLBACK]
    for hw in table_systems():
        own = f.systems[hw]
        # fitted: the categories aiconfigurator measures differ from the measured card's
        assert any(own.categories[c] != rtx.categories[c] for c in TABLE_FREE_PARAMS), hw
        # inherited: the mixed-call attention parameters the tables cannot determine
        for name in ("per_seq_us", "mixed_gqa_share", "mixed_cache_mb", "empty_block_ns"):
            assert getattr(own.categories["attention"], name) == getattr(
                rtx.categories["attention"], name), (hw, name)


def test_table_rows_are_the_factor_independent_ones() -> None:
    keys = np.array([[16, 0, 0, 0], [16, 512, 0, 0], [0, 0, 8, 1024], [16, 0, 8, 1024]])
    assert table_attention_rows(keys).tolist() == [True, False, True, False]


@pytest.mark.parametrize("hardware,category", [("H100-SXM", "lm_head"), ("A100-80G", "lm_head")])
def test_committed_table_factors_are_the_fit(tmp_path: Path, hardware: str, category: str) -> None:
    hw, samples = table_samples(hardware, tmp_path)
    fitted = fit_category(category, [s for s in samples if s.category == category], hw,
                          TABLE_FREE_PARAMS[category], load_factors().categories[category])
    committed = load_factors(hardware=hardware).categories[category]
    for name in TABLE_FREE_PARAMS[category]:
        assert getattr(fitted, name) == pytest.approx(getattr(committed, name), rel=2e-3), name


# (hardware, table item) -> max median % of |roofline / aiconfigurator - 1|, Llama-3.1-8B TP 1,
# with the hardware's own factors (measured: H100 3.2 / 2.9 / 1.1 / 1.1 / 1.8 %, A100 2.6 /
# 1.7 / 4.3 / 3.7 %); the fallback (RTX PRO 6000) factors must be worse on each (14-36 %).
# A100's o_proj is left out: its own set is 13 % off there for this model (9 % pooled over
# the catalog models, docs/roofline.md), the fallback 7 %.
OWN_CEILING: dict[tuple[str, str], float] = {
    ("H100-SXM", "o_proj"): 4, ("H100-SXM", "qkv_proj"): 4, ("H100-SXM", "lm_head"): 2,
    ("H100-SXM", "decode"): 2, ("H100-SXM", "prefill, no history"): 3,
    ("A100-80G", "qkv_proj"): 4, ("A100-80G", "lm_head"): 3, ("A100-80G", "decode"): 5,
    ("A100-80G", "prefill, no history"): 5,
}


@pytest.mark.slow
@pytest.mark.parametrize("hardware", ["H100-SXM", "A100-80G"])
def test_own_factors_beat_the_fallback_on_the_tables(tmp_path: Path, hardware: str) -> None:
    hw = load_hardware(hardware)
    adir = aic_bundle(hw, LLAMA, 1, cache=tmp_path) / "tp1"
    errs = {}
    for kind, factors in (("own", load_factors(hardware=hardware)),
                          ("fallback", load_factors())):
        rdir = ensure_bundle(hw, LLAMA, 1, factors=factors, cache=tmp_path) / "tp1"
        rows = table_errors(adir, rdir, LLAMA.name) + attention_split_errors(adir, rdir, LLAMA.name)
        errs[kind] = {e.item: e for e in rows}
    checked = [(item, c) for (h, item), c in OWN_CEILING.items() if h == hardware]
    assert checked
    for item, ceiling in checked:
        own, fallback = errs["own"][item], errs["fallback"][item]
        assert 100 * own.median <= ceiling, (item, own.median)
        assert own.median < fallback.median, (item, own.median, fallback.median)
