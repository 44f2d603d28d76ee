"""Capacity planning: the max-rate search (known answer, determinism, probe reuse, probe
counts), fleet sizing, the Pareto front and the HTML report (SLO checks: test_slo.py)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from analysis.answers import point_answers
from analysis.cost import usd_per_m_output_tokens
from analysis.slo import SloSpec
from capacity.fleet import pareto_front, size_fleet
from capacity.pool import LocalProbePool
from capacity.report import render
from capacity.run import write_outputs
from capacity.search import RateSearch, SearchSettings
from capacity.study import CapacityStudy, Configuration, ProbeCache, probe_key
from engine import EngineConfig, simulate
from engine.specs import ConfigError
from engine.workload import RequestSpec
from profiles.catalog import load_hardware, load_model

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


def known_answer_probe(point: dict) -> dict:
    """``run_probe``'s contract for the known-answer engine setup (evenly spaced arrivals;
    ``inf``: all at t = 0), the answers computed as ``sweep.job.run_point`` computes them."""
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
    answers = point_answers(result.requests, SloSpec.from_config(point["slo"]), 2.0, 1)
    return {"passed": answers.slo.passed, "margin": answers.slo.margin,
            "margins": answers.slo.margins, "metrics": answers.metrics}


SPEC = SloSpec.parse({"tpot_ms_median": S_MS})


def _config(name: str = "linear") -> Configuration:
    point = {"hardware": {"name": "H100-SXM"}, "model": {"name": "llama-3.1-8b"},
             "cluster": {"tensor_parallel_size": 1, "case": name},
             "workload": {"rate": 1.0, "num_requests": NUM_REQUESTS}, "slo": SPEC.as_dict()}
    return Configuration(name, {"case": name}, point)


def _study(cache: ProbeCache, settings: SearchSettings | None = None) -> CapacityStudy:
    return CapacityStudy([_config()], SPEC, settings or SearchSettings(tolerance=0.02),
                         LocalProbePool(known_answer_probe), cache)


def test_known_answer_by_hand_is_what_the_engine_does() -> None:
    """The hand derivation holds in the simulation: the median TPOT at lam* is S."""
    slo = SPEC.as_dict()
    for factor, tpot in ((0.9, A_NS / 1e6 / (1 - 0.9 * C_NS / 1e9 * LAMBDA_STAR * OUT)),
                         (1.0, S_MS)):
        out = known_answer_probe({"workload": {"rate": factor * LAMBDA_STAR}, "slo": slo})
        assert out["metrics"]["tpot_ms_median"] == pytest.approx(tpot, rel=2e-3)
    above = known_answer_probe({"workload": {"rate": 1.01 * LAMBDA_STAR}, "slo": slo})
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
    # The answer's cost is the answer probe's own number (the one its MLflow run holds):
    # USD/hour over the good output tokens per hour in the steady-state window. Evenly
    # spaced arrivals at the answer rate, every request good: rate x 64 tokens.
    best = probes[probes["passed"]].sort_values("rate").iloc[-1]
    assert row["usd_per_m_output_tokens"] == best["usd_per_m_output_tokens"]
    assert row["usd_per_m_output_tokens"] == pytest.approx(
        2.0 / (row["good_output_tok_s"] * 3600) * 1e6)
    assert row["good_output_tok_s"] == pytest.approx(row["max_rate"] * OUT, rel=2e-3)
    assert row["tpot_ms_median"] <= S_MS  # the bound's observed statistic, by its name


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
    key = probe_key(point)
    assert probe_key({**point, "tracking": {"uri": "x"}}) == key
    moved = {**point, "workload": {**point["workload"], "rate": 2.0}}
    assert probe_key(moved) != key
    assert probe_key({**point, "slo": {**point["slo"], "goodput_fraction": 0.9}}) != key


def test_probe_key_follows_the_simulator_source(monkeypatch) -> None:
    import capacity.study as study

    point = _config().point
    key = probe_key(point)
    assert len(study.code_fingerprint()) == 64
    monkeypatch.setattr(study, "code_fingerprint", lambda: "another simulator")
    assert probe_key(point) != key


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


# ---------------------------------------------------------------- fleet sizing, Pareto
def test_fleet_sizing_picks_the_cheapest() -> None:
    # good_output_tok_s at the answer: 100 good tokens per offered request (95 for "small").
    answers = pd.DataFrame([
        {"config": "big", "hardware": "B", "num_gpus": 2, "max_rate": 10.0,
         "usd_per_hour": 10.0, "good_output_tok_s": 1000.0},
        {"config": "small", "hardware": "S", "num_gpus": 1, "max_rate": 3.0,
         "usd_per_hour": 2.0, "good_output_tok_s": 285.0},
        {"config": "even", "hardware": "E", "num_gpus": 4, "max_rate": 25.0,
         "usd_per_hour": 14.0, "good_output_tok_s": 2500.0},
        {"config": "none", "hardware": "N", "num_gpus": 1, "max_rate": 0.0,
         "usd_per_hour": 1.0, "good_output_tok_s": 0.0},
    ])
    fleet = size_fleet(answers, 20.0)
    # small: 7 x $2 = $14 (7 GPUs); even: 1 x $14 (4 GPUs, wins the tie); big: 2 x $10.
    assert list(fleet["config"]) == ["even", "small", "big"]
    assert list(fleet["replicas"]) == [1, 7, 2] and list(fleet["rank"]) == [1, 2, 3]
    cost = dict(zip(fleet["config"], fleet["usd_per_m_output_tokens"], strict=True))
    assert cost["even"] == pytest.approx(14 / (20 * 100 * 3600) * 1e6)
    assert cost["small"] == pytest.approx(14 / (20 * 95 * 3600) * 1e6)
    # a fleet's cost is its configuration's own divided by the fleet's utilisation
    own = usd_per_m_output_tokens(10.0, 1000.0)
    big = fleet[fleet["config"] == "big"].iloc[0]
    assert big["usd_per_m_output_tokens"] == pytest.approx(own / big["utilization"])
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
    fleet = size_fleet(answers, 100.0)
    meta = {"study": {"name": "known", "description": "linear step"}, "model": "m",
            "slo": study.spec.as_dict(), "slo_text": study.spec.describe(),
            "settings": {"tolerance": 0.02}, "workload": {}, "probes_total": len(probes),
            "probes_simulated": study.simulated, "search_wall_s": 1.0, "pool_size": 1,
            "target_rate": 100.0, "profiles": ["roofline"]}
    write_outputs(tmp_path, answers, probes, fleet, meta)
    page = render(tmp_path).read_text()
    assert page.count("data:image/png;base64,") == 3  # Pareto, interactivity, one latency plot
    assert "Cheapest fleet for 100 req/s" in page and "linear" in page
    # The header says what ran (from the run's outputs), not what an experiment file claims.
    assert ("Max sustained rate of m within TPOT median &lt;= 20 ms for 1 configuration: "
            "1 accelerator type (H100-SXM) at TP 1, on roofline profiles; and the cheapest "
            "fleet serving 100 req/s.") in page
    # The cost in the table is the answer's number, formatted to 4 significant figures.
    assert f"<td>{answers['usd_per_m_output_tokens'].iloc[0]:.4g}</td>" in page
    assert "src=\"http" not in page and (tmp_path / "plots" / "pareto.png").is_file()
    with pytest.raises(ConfigError, match="not a capacity study directory"):
        render(tmp_path / "plots")


def test_verify_fleet_behind_the_router() -> None:
    """The fleet check simulates N replicas as one cluster under the whole stream: enough
    replicas meet the SLO, one replica under a stream beyond its capacity does not."""
    from hydra import compose, initialize_config_dir

    from capacity.schema import register
    from capacity.verify import verify_fleet

    register()
    conf = str(Path(__file__).resolve().parents[2] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose("config", overrides=["hardware=h100_sxm", "workload.num_requests=300"])
    point = OmegaConf.to_container(cfg, resolve=True)
    point["slo"] = SloSpec.parse({"ttft_ms_p99": 1000, "tpot_ms_p99": 50}).as_dict()
    ok = verify_fleet(point, 3, 20.0)
    assert ok["verified"] and ok["verify_router"] == "least_loaded"
    assert ok["verify_ttft_ms_p99"] < 1000 and ok["verify_usd_per_m_output_tokens"] > 0
    assert not verify_fleet(point, 1, 40.0, router="round_robin")["verified"]


def test_grid_from_sweeper_params_and_overrides() -> None:
    from capacity.run import grid, label

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

    study = CapacityStudy([_config("a"), _config("b")], SPEC, SearchSettings(),
                          LocalProbePool(known_answer_probe), ProbeCache(None), Sink())
    answers, probes = study.run()
    assert sorted(e for e in events if e[0] == "probe") == sorted(
        ("probe", r.probe, r.rate) for r in probes.itertuples())
    assert sorted(e[1] for e in events if e[0] == "answer") == sorted(answers["max_rate"])
