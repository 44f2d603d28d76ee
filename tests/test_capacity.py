"""Capacity planning: SLO checks, the max-rate search (known answer, determinism, probe
reuse, probe counts), fleet sizing, the Pareto front and the HTML report."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from analysis.capacity import RateSearch, SearchSettings, pareto_front, size_fleet
from analysis.report import render
from analysis.slo import SloSpec, evaluate
from engine import EngineConfig, simulate
from engine.specs import ConfigError
from engine.workload import RequestSpec
from profiles.catalog import load_hardware, load_model
from sweep.capacity import write_outputs
from sweep.capacity_pool import LocalProbePool
from sweep.capacity_study import CapacityStudy, Configuration, ProbeCache, probe_key

# ---------------------------------------------------------------- the known-answer case
# Every step costs A + C x (sequences in the batch); every request has a P-token prompt
# (one prefill step that emits the first token) and O output tokens, so it stays O steps.
# With arrivals every 1/lam s, Little's law gives b = lam O s running requests and a step
# time s = A + C b, hence s = A / (1 - C lam O): the median TPOT is s, and the largest
# rate with median TPOT <= S is lam* = (1 - A/S) / (C O) = 39.0625 req/s.
A_NS, C_NS, PROMPT, OUT, S_MS = 10_000_000, 200_000, 16, 64, 20.0
LAMBDA_STAR = (1 - A_NS / 1e6 / S_MS) / (C_NS / 1e9 * OUT)
NUM_REQUESTS = 1500


class LinearStep:
    """A latency model with a fixed cost per step plus a fixed cost per sequence."""

    def iteration_ns(self, shape) -> int:
        return A_NS + C_NS * shape.num_seqs


def known_answer_probe(point: dict, slo: dict) -> dict:
    """``run_probe``'s contract for the known-answer engine setup (evenly spaced arrivals;
    ``inf``: all at t = 0)."""
    rate = float(point["workload"]["rate"])
    workload = [
        RequestSpec(f"r{i}", 0 if math.isinf(rate) else int(i * 1e9 / rate),
                    tuple(range(i * PROMPT, (i + 1) * PROMPT)), OUT)
        for i in range(NUM_REQUESTS)
    ]
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192,
                          num_gpu_blocks_override=20_000, async_scheduling=False,
                          step_overhead_us=0.0, enable_prefix_caching=False)
    result = simulate(load_model("llama-3.1-8b"), load_hardware("H100"), config, workload,
                      LinearStep())
    req = result.requests
    report = evaluate(req, SloSpec.parse(slo["bounds"], slo["goodput_fraction"]))
    duration_s = (req["finish_ns"].max() - req["arrival_ns"].min()) / 1e9
    tpot = (req["finish_ns"] - req["first_token_ns"]) / 1e6 / (req["output_len"] - 1)
    return {
        "passed": report.passed, "margin": report.margin, "margins": report.margins,
        "observed": report.observed, "good_fraction": report.good_fraction,
        "goodput_rps": report.goodput_rps, "goodput_tok_s": report.goodput_tok_s,
        "output_tokens_per_request": float(OUT),
        "metrics": {"request_throughput": len(req) / duration_s, "num_gpus": 1.0,
                    "usd_per_hour": 2.0, "tpot_ms_median": float(np.median(tpot)),
                    "output_throughput": len(req) * OUT / duration_s},
    }


def _config(name: str = "linear") -> Configuration:
    point = {"hardware": {"name": "H100-SXM"}, "model": {"name": "llama-3.1-8b"},
             "cluster": {"tensor_parallel_size": 1, "case": name},
             "workload": {"rate": 1.0, "num_requests": NUM_REQUESTS}}
    return Configuration(name, {"case": name}, point)


def _study(cache: ProbeCache, settings: SearchSettings | None = None) -> CapacityStudy:
    spec = SloSpec.parse({"tpot_ms_median": S_MS})
    return CapacityStudy([_config()], spec, settings or SearchSettings(tolerance=0.02),
                         LocalProbePool(known_answer_probe), cache)


def test_known_answer_by_hand_is_what_the_engine_does() -> None:
    """The hand derivation holds in the simulation: the median TPOT at lam* is S."""
    spec = {"bounds": {"tpot_ms_median": S_MS}, "goodput_fraction": None}
    for factor, tpot in ((0.9, A_NS / 1e6 / (1 - 0.9 * C_NS / 1e9 * LAMBDA_STAR * OUT)),
                         (1.0, S_MS)):
        out = known_answer_probe({"workload": {"rate": factor * LAMBDA_STAR}}, spec)
        assert out["observed"]["tpot_ms_median"] == pytest.approx(tpot, rel=2e-3)
    above = known_answer_probe({"workload": {"rate": 1.01 * LAMBDA_STAR}}, spec)
    assert not above["passed"]


def test_search_finds_the_known_answer_within_tolerance() -> None:
    answers, probes = _study(ProbeCache(None)).run()
    row = answers.iloc[0]
    assert row["status"] == "converged"
    # lo passed and hi failed, so the true answer lies in [lo, hi] with hi/lo <= 1.02.
    assert row["bracket_lo"] <= LAMBDA_STAR * (1 + 1e-6) < row["bracket_hi"]
    assert row["bracket_hi"] / row["bracket_lo"] <= 1.02 * (1 + 1e-9)
    assert row["max_rate"] == pytest.approx(LAMBDA_STAR, rel=0.02)
    assert row["probes"] <= 10
    assert probes["kind"].iloc[0] == "saturation"
    assert row["usd_per_m_tokens"] == pytest.approx(
        2.0 / (row["goodput_tok_s"] * 3600) * 1e6)


def test_search_is_deterministic() -> None:
    first = _study(ProbeCache(None)).run()[1]
    second = _study(ProbeCache(None)).run()[1]
    pd.testing.assert_frame_equal(first[["rate", "passed", "margin"]],
                                  second[["rate", "passed", "margin"]])


def test_rerun_reuses_finished_probes(tmp_path) -> None:
    first = _study(ProbeCache(tmp_path))
    answers1, probes1 = first.run()
    assert first.simulated == len(probes1) and len(list(tmp_path.glob("*.json"))) == len(probes1)
    second = _study(ProbeCache(tmp_path))
    answers2, probes2 = second.run()
    assert second.simulated == 0
    assert probes2["cached"].all() and answers2["cached_probes"].iloc[0] == len(probes1)
    assert answers2["max_rate"].iloc[0] == answers1["max_rate"].iloc[0]
    # A tighter tolerance reuses the saturation and bracketing probes (same rates).
    third = _study(ProbeCache(tmp_path), SearchSettings(tolerance=0.005))
    _, probes3 = third.run()
    shared = (probes1["kind"] != "bisect").sum()
    assert probes3["cached"].iloc[:shared].all() and third.simulated == len(probes3) - shared


def test_probe_key_follows_the_point_and_slo() -> None:
    point = _config().point
    slo = {"bounds": {"tpot_ms_median": 20.0}, "goodput_fraction": None}
    key = probe_key(point, slo)
    assert probe_key({**point, "tracking": {"uri": "x"}}, slo) == key
    moved = {**point, "workload": {**point["workload"], "rate": 2.0}}
    assert probe_key(moved, slo) != key
    assert probe_key(point, {**slo, "goodput_fraction": 0.9}) != key


def test_probe_key_follows_the_simulator_source(monkeypatch) -> None:
    import sweep.capacity_study as study

    point, slo = _config().point, {"bounds": {"tpot_ms_median": 20.0}, "goodput_fraction": None}
    key = probe_key(point, slo)
    assert len(study.code_fingerprint()) == 64
    monkeypatch.setattr(study, "code_fingerprint", lambda: "another simulator")
    assert probe_key(point, slo) != key


def _hockey_stick(capacity: float, knee: float):
    """An M/M/1-like latency margin: crosses 0 at ``knee`` x ``capacity``."""
    def margin(rate: float) -> float:
        if rate >= capacity:
            return math.log(1e3)
        return math.log(max((1 - knee) / (1 - rate / capacity), 1e-3))
    return margin


def _drive(search: RateSearch, margin, capacity: float) -> RateSearch:
    while (step := search.next_rate()) is not None:
        rate, kind = step
        m = margin(rate)
        search.record(rate, m <= 0, m, capacity if kind == "saturation" else math.nan)
    return search


def test_probe_count_to_two_percent() -> None:
    """Over 300 random configurations (capacity 0.3-100 req/s, SLO knee at 5-99 % of it)
    the search needs on average under 8 probes (saturation probe included) and at most 11."""
    rng = random.Random(7)
    counts = []
    for _ in range(300):
        capacity, knee = 10 ** rng.uniform(-0.5, 2), rng.uniform(0.05, 0.99)
        res = _drive(RateSearch(SearchSettings(tolerance=0.02)),
                     _hockey_stick(capacity, knee), capacity).result
        assert res is not None and res.status == "converged"
        assert knee * capacity / 1.02 <= res.max_rate <= knee * capacity * (1 + 1e-9)
        counts.append(res.probes)
    assert np.mean(counts) < 8 and max(counts) <= 11


def test_pure_pass_fail_still_converges() -> None:
    """Without a useful margin (a step function) the bisection fallback still converges."""
    res = _drive(RateSearch(SearchSettings(tolerance=0.02)),
                 lambda r: -0.1 if r <= 3.3 else 0.5, 10.0).result
    assert res.status == "converged" and 3.3 / 1.02 <= res.max_rate <= 3.3
    assert res.probes <= 15


@pytest.mark.parametrize(("margin", "status", "answer"), [
    (lambda r: 1.0, "infeasible", 0.0),
    (lambda r: -1.0, "unbounded", 5.0),
])
def test_search_end_states(margin, status, answer) -> None:
    res = _drive(RateSearch(SearchSettings()), margin, 5.0).result
    assert res.status == status and res.max_rate == answer


def test_search_ceiling_follows_the_saturation_throughput() -> None:
    """A run that meets the SLO everywhere but the saturation probe stops at
    (1 + headroom) x the saturation throughput, not at max_rate."""
    margin = lambda r: 1.0 if math.isinf(r) else -1.0  # noqa: E731
    res = _drive(RateSearch(SearchSettings()), margin, 5.0).result
    assert res.status == "capped" and res.max_rate == pytest.approx(5.0 * 1.5)
    free = _drive(RateSearch(SearchSettings(throughput_headroom=None, max_rate=100.0)),
                  margin, 5.0).result
    assert free.status == "capped" and free.max_rate == 100.0


def test_search_capped_and_initial_rate() -> None:
    s = SearchSettings(initial_rate=10.0, max_rate=50.0)
    res = _drive(RateSearch(s), lambda r: -1.0, 5.0).result
    assert res.status == "capped" and res.max_rate == 50.0
    assert [p.rate for p in RateSearch(s).probes] == []
    with pytest.raises(ValueError, match="capacity.tolerance"):
        SearchSettings(tolerance=0).check()


# ---------------------------------------------------------------- SLO specs
def _frame() -> pd.DataFrame:
    ms = 1_000_000
    return pd.DataFrame({
        "request_id": ["a", "b", "c", "d"],
        "arrival_ns": [0, 0, 0, 0],
        "first_token_ns": [100 * ms, 200 * ms, 300 * ms, 400 * ms],
        "finish_ns": [1100 * ms, 1200 * ms, 2300 * ms, 400 * ms],
        "prompt_len": [10, 10, 10, 10],
        "output_len": [11, 11, 11, 1],
        "token_times_ns": [[100 * ms + i * 100 * ms for i in range(11)],
                           [200 * ms + i * 100 * ms for i in range(11)],
                           [300 * ms + i * 200 * ms for i in range(11)],
                           [400 * ms]],
    })


def test_slo_evaluate_by_hand() -> None:
    spec = SloSpec.parse({"ttft_ms_p50": 260, "tpot_ms_mean": 150, "itl_ms_p99_9": 250,
                          "e2el_ms_median": 1200})
    rep = evaluate(_frame(), spec)
    assert rep.observed["ttft_ms_p50"] == pytest.approx(250.0)
    assert rep.observed["tpot_ms_mean"] == pytest.approx((100 + 100 + 200) / 3)
    assert rep.observed["itl_ms_p99_9"] == pytest.approx(200.0)
    assert rep.observed["e2el_ms_median"] == pytest.approx(1150.0)
    assert rep.passed and rep.margin <= 0
    # Good requests: a and b (c: TPOT 200 > 150 and E2E 2300 > 1200; d: TTFT 400 > 260).
    assert rep.good_fraction == 0.5
    assert rep.goodput_rps == pytest.approx(2 / 2.3)
    assert rep.goodput_tok_s == pytest.approx(22 / 2.3)
    strict = evaluate(_frame(), SloSpec.parse({"ttft_ms_p50": 260}, goodput_fraction=0.75))
    assert not strict.passed and strict.margins["goodput_fraction"] > 0
    assert not evaluate(_frame(), SloSpec.parse({"ttft_ms_p99": 300})).passed


def test_slo_unfinished_request_fails() -> None:
    frame = _frame()
    frame.loc[3, ["first_token_ns", "finish_ns"]] = -1
    rep = evaluate(frame, SloSpec.parse({"ttft_ms_p50": 1000}))
    assert not rep.passed and rep.margin > 0 and rep.good_fraction == 0.75


@pytest.mark.parametrize(("bounds", "fraction", "needle"), [
    ({"ttft_p99": 1}, None, "capacity.slo.ttft_p99 is not an SLO bound"),
    ({"ttft_ms_p0": 1}, None, "percentile 0 is not in"),
    ({"tpot_ms_p99": -5}, None, "capacity.slo.tpot_ms_p99=-5"),
    ({}, None, "capacity.slo has no bound"),
    ({"ttft_ms_p99": 1}, 1.5, "capacity.goodput_fraction=1.5"),
])
def test_slo_bad_config_names_the_key(bounds, fraction, needle) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        SloSpec.parse(bounds, fraction)


# ---------------------------------------------------------------- fleet sizing, Pareto
def test_fleet_sizing_picks_the_cheapest() -> None:
    answers = pd.DataFrame([
        {"config": "big", "hardware": "B", "num_gpus": 2, "max_rate": 10.0,
         "usd_per_hour": 10.0, "output_tokens_per_request": 100.0},
        {"config": "small", "hardware": "S", "num_gpus": 1, "max_rate": 3.0,
         "usd_per_hour": 2.0, "output_tokens_per_request": 100.0},
        {"config": "even", "hardware": "E", "num_gpus": 4, "max_rate": 25.0,
         "usd_per_hour": 14.0, "output_tokens_per_request": 100.0},
        {"config": "none", "hardware": "N", "num_gpus": 1, "max_rate": 0.0,
         "usd_per_hour": 1.0, "output_tokens_per_request": 100.0},
    ])
    fleet = size_fleet(answers, 20.0)
    # small: 7 x $2 = $14 (7 GPUs); even: 1 x $14 (4 GPUs, wins the tie); big: 2 x $10.
    assert list(fleet["config"]) == ["even", "small", "big"]
    assert list(fleet["replicas"]) == [1, 7, 2] and list(fleet["rank"]) == [1, 2, 3]
    assert fleet["usd_per_m_tokens"].iloc[0] == pytest.approx(14 / (20 * 100 * 3600) * 1e6)
    assert list(size_fleet(answers, 20.0, max_replicas=3)["config"]) == ["even", "big"]
    with pytest.raises(ValueError, match="capacity.target_rate"):
        size_fleet(answers, 0)


def test_pareto_front() -> None:
    x, cost = [1, 2, 3, 2, 4], [1.0, 0.5, 0.8, 0.6, 2.0]
    assert pareto_front(x, cost) == [1, 2, 4]


# ---------------------------------------------------------------- report
def test_report_is_self_contained(tmp_path) -> None:
    study = _study(ProbeCache(None))
    answers, probes = study.run()
    fleet = size_fleet(answers.assign(output_tokens_per_request=float(OUT)), 100.0)
    meta = {"study": {"name": "known", "description": "linear step"}, "model": "m",
            "slo": study.spec.as_dict(), "slo_text": study.spec.describe(),
            "settings": {"tolerance": 0.02}, "workload": {}, "probes_total": len(probes),
            "probes_simulated": study.simulated, "search_wall_s": 1.0, "pool_size": 1,
            "target_rate": 100.0}
    write_outputs(tmp_path, answers, probes, fleet, meta)
    page = render(tmp_path).read_text()
    assert page.count("data:image/png;base64,") == 3  # Pareto, interactivity, one latency plot
    assert "Cheapest fleet for 100 req/s" in page and "linear" in page
    assert "src=\"http" not in page and (tmp_path / "plots" / "pareto.png").is_file()
    with pytest.raises(ConfigError, match="not a capacity study directory"):
        render(tmp_path / "plots")


def test_verify_fleet_behind_the_router() -> None:
    """The fleet check simulates N replicas as one cluster under the whole stream: enough
    replicas meet the SLO, one replica under a stream beyond its capacity does not."""
    from hydra import compose, initialize_config_dir

    from sweep.capacity_schema import register
    from sweep.capacity_verify import verify_fleet

    register()
    conf = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose("config", overrides=["hardware=h100_sxm", "workload.num_requests=300"])
    point = OmegaConf.to_container(cfg, resolve=True)
    spec = SloSpec.parse({"ttft_ms_p99": 1000, "tpot_ms_p99": 50})
    ok = verify_fleet(point, 3, 20.0, spec)
    assert ok["verified"] and ok["verify_router"] == "least_loaded"
    assert ok["verify_ttft_ms_p99"] < 1000
    assert not verify_fleet(point, 1, 40.0, spec, router="round_robin")["verified"]


def test_grid_from_sweeper_params_and_overrides() -> None:
    from sweep.capacity import grid, label

    hc = OmegaConf.create({
        "sweeper": {"params": {"hardware": "h100_sxm,l40s", "cluster.tensor_parallel_size": "1,2",
                               "cluster.max_num_seqs": "range(64,257,192)",
                               "cluster.gpu_memory_utilization": "0.8"}},
        "overrides": {"task": ["+experiment=capacity_search", "cluster.tensor_parallel_size=4"]},
    })
    common, combos = grid(hc)
    assert common == ["+experiment=capacity_search", "cluster.tensor_parallel_size=4"]
    assert combos == [{"hardware": h, "cluster.max_num_seqs": n,
                       "cluster.gpu_memory_utilization": "0.8"}
                      for h in ("h100_sxm", "l40s") for n in ("64", "256")]
    assert label(combos[1]) == "h100_sxm seqs=256 mem=0.8"


def test_sink_sees_every_probe_then_the_answer() -> None:
    events = []

    class Sink:
        def probe_done(self, cfg, row):
            events.append(("probe", row["probe"], row["rate"]))

        def config_done(self, cfg, answer):
            events.append(("answer", answer["max_rate"]))

    spec = SloSpec.parse({"tpot_ms_median": S_MS})
    study = CapacityStudy([_config("a"), _config("b")], spec, SearchSettings(),
                          LocalProbePool(known_answer_probe), ProbeCache(None), Sink())
    answers, probes = study.run()
    assert sorted(e for e in events if e[0] == "probe") == sorted(
        ("probe", r.probe, r.rate) for r in probes.itertuples())
    assert sorted(e[1] for e in events if e[0] == "answer") == sorted(answers["max_rate"])
