"""``ProfiledLatencyModel.decode_steps_ns`` returns exactly the integers of one
``iteration_ns`` call per step of a pure-decode run (the engine's decode spans rely on it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.batch import BatchShape, decode_advanced
from profiles.latency import _RUN_SCRATCH, ProfiledLatencyModel
from tests.profiles.test_latency import SKEW, TINY, TINY_MOE, make_model


@st.composite
def decode_runs(draw, max_kv: int = 20_000):
    nd = draw(st.integers(0, 300))
    lo = draw(st.integers(0, max_kv))
    hi = lo + draw(st.sampled_from([0, 1, 7, draw(st.integers(0, max_kv))])) if nd > 1 else lo
    mid = draw(st.integers(lo, hi))
    total = lo + hi + mid * (nd - 2) if nd >= 2 else lo * nd
    shape = BatchShape(nd, nd, 0, 0, nd, total, lo if nd else 0, hi if nd else 0)
    # runs longer than the model's buffers too: priced in pieces of _RUN_SCRATCH steps
    return shape, draw(st.one_of(st.integers(1, 120), st.integers(250, 600)))


def _scalar(model: ProfiledLatencyModel, shape: BatchShape, k: int) -> list[int]:
    return [model.iteration_ns(decode_advanced(shape, i)) for i in range(k)]


def _check(model: ProfiledLatencyModel, shape: BatchShape, k: int) -> None:
    bulk = model.decode_steps_ns(shape, k)
    assert bulk == _scalar(model, shape, k)
    assert all(type(v) is int for v in bulk)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[ProfiledLatencyModel]:
    root: Path = tmp_path_factory.mktemp("bundles")
    return [
        make_model(root / "plain"),
        make_model(root / "skew", skew=SKEW),
        make_model(root / "fixed", skew=SKEW, reference_quirks=False),
        make_model(root / "moe", TINY_MOE, skew=SKEW),
        make_model(root / "nohost", TINY, host_mem_bw_gbs=None),
    ]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=decode_runs(max_kv=400), which=st.integers(0, 4))
def test_synthetic_bundles(models, run, which):
    _check(models[which], *run)


@pytest.fixture(scope="module")
def measured(shared_data) -> ProfiledLatencyModel:
    from profiles.bundle import load_bundle
    from profiles.catalog import load_model

    model = load_model("meta-llama/Llama-3.1-8B")
    bundle = load_bundle(shared_data / "llmservingsim" / "profiles", "RTXPRO6000", model.name)
    return ProfiledLatencyModel(bundle, model, 1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=decode_runs())
def test_measured_bundle(measured, run):
    _check(measured, *run)


@st.composite
def kv_terms(draw):
    """A profiled row (strictly increasing integer keys, as ``Curve`` keeps them; zero, one or
    several) or a blend of two, and a run over it: from below the first key to past the last."""
    from profiles.bundle import Curve
    from profiles.latency import _Lerp, _rows_of

    def row():
        keys = draw(st.lists(st.integers(0, 500), unique=True, max_size=8))
        values = draw(st.lists(st.integers(0, 10**7), min_size=len(keys), max_size=len(keys)))
        return _rows_of([Curve.build(keys, values)])[0]

    fn = row()
    if draw(st.booleans()):
        fn = _Lerp(fn, row(), draw(st.floats(0.0, 1.0)))
    # runs short and up to the buffer a blend keeps (profiles.latency._RUN_SCRATCH)
    return fn, draw(st.integers(0, 600)), draw(st.one_of(st.integers(1, 80),
                                                         st.integers(200, _RUN_SCRATCH)))


@settings(max_examples=400, deadline=None)
@given(term=kv_terms())
def test_kv_term_run_is_its_values_at_each_step(term):
    """``_KvFn.run`` (a decode span's attention values in one pass) gives exactly the floats of
    one ``at`` call per step, across the first key, on keys, between them and past the last."""
    from array import array

    fn, kv0, k = term
    out = array("d", bytes(8 * k))
    fn.run(kv0, k, out)
    assert list(out) == [fn.at(kv0 + i) for i in range(k)]


def test_prefill_shapes_are_refused(models):
    with pytest.raises(ValueError, match="prefill"):
        models[0].decode_steps_ns(BatchShape(20, 2, 16, 0, 1, 5, 5, 5), 3)


@pytest.fixture(scope="module")
def parallel_models(tmp_path_factory):
    """Instances over a synthetic rank model: TP 2 (all-reduces), TP 2 x EP 2 on an MoE model
    (all-reduce and EP collectives), and a two-stage pipeline (the per-step fallback)."""
    from profiles.parallel.latency import ParallelLatencyModel
    from profiles.parallel.layout import ParallelLayout, build_network

    root: Path = tmp_path_factory.mktemp("parallel")
    out = []
    for name, spec, layout in (
        ("tp2", TINY, ParallelLayout(tp=2)),
        ("moe", TINY_MOE, ParallelLayout(tp=2, ep=2)),
        ("pp2", TINY, ParallelLayout(pp=2)),
    ):
        compute = make_model(root / name, spec, skew=SKEW, host_mem_bw_gbs=None)
        network = build_network(layout, 100.0, 500.0, 1000.0)  # GB/s, ns, GB/s
        out.append(ParallelLatencyModel(compute, spec, layout, network))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=decode_runs(max_kv=400), which=st.integers(0, 2))
def test_parallel_instances(parallel_models, run, which):
    """``ParallelLatencyModel.decode_steps_ns`` is its per-step ``iteration_ns`` too."""
    model = parallel_models[which]
    shape, k = run
    bulk = model.decode_steps_ns(shape, k)
    assert bulk == [model.iteration_ns(decode_advanced(shape, i)) for i in range(k)]
    assert all(type(v) is int for v in bulk)
