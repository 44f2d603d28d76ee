"""A capacity study, the whole command: compose the grid, search every configuration's max
rate, size the cheapest fleet, write the tables, plots and report, log to MLflow.

The grid is the experiment's ``hydra.sweeper.params`` (the same syntax as ``python -m sweep``
studies; change a list with ``"hydra.sweeper.params.hardware='h100_sxm,l40s'"``); other
command-line overrides apply to every configuration. Each configuration's max rate is searched
(``capacity.search.RateSearch``), the probes of all configurations running concurrently on a
Ray actor pool (``capacity.pool``). The SLO is the study's ``slo:`` node (``analysis.slo``,
the one sweeps use); search settings live under ``capacity`` (``capacity.schema``). With
``capacity.target_rate`` it also sizes the cheapest fleet (``capacity.fleet``).

Writes into the run directory (``outputs/<study>/<timestamp>/``): ``capacity.parquet`` (one
answer per configuration), ``probes.parquet``, ``fleet.parquet``/``fleet.csv`` (fleet sizing),
``study.json``, ``plots/*.png`` and ``report.html``; and to MLflow a parent run for the
study, one run per configuration (max rate, goodput, GPUs, $/hour, $/1M output tokens) with
each probe as its child run, and a ``fleet-sizing`` run. ``sweep.capacity`` is its Hydra
front (``python -m sweep.capacity``).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from analysis.slo import SloSpec
from capacity.fleet import size_fleet
from capacity.schema import register
from capacity.search import SearchSettings
from capacity.study import CapacityStudy, Configuration, ProbeCache
from engine.cluster import ROUTER_POLICIES
from engine.specs import ConfigError
from sweep.validate import check_config

log = logging.getLogger(__name__)
register()

SHORT_KEYS = {
    "tensor_parallel_size": "tp",
    "gpu_memory_utilization": "mem",
    "max_num_seqs": "seqs",
    "max_num_batched_tokens": "batched",
}


def grid(hc: Any) -> tuple[list[str], list[dict[str, str]]]:
    """``(common overrides, one override dict per configuration)``: the grid is the product
    of the ``hydra.sweeper.params`` lists; a command-line override of a grid key fixes it."""
    parser = OverridesParser.create()
    params = OmegaConf.to_container(hc.sweeper.params, resolve=False) if hc.sweeper.get("params") else {}
    axes: dict[str, list[str]] = {}
    for o in parser.parse_overrides([f"{k}={v}" for k, v in (params or {}).items()]):
        axes[o.get_key_element()] = (list(o.sweep_string_iterator()) if o.is_sweep_override()
                                     else [o.get_value_element_as_str()])
    common = []
    for o in parser.parse_overrides(list(hc.overrides.task)):
        axes.pop(o.get_key_element(), None)
        common.append(o.input_line)
    keys = list(axes)
    combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]
    return common, combos


def label(overrides: dict[str, str]) -> str:
    """A short name: group choices by value, other keys as ``tp=2``."""
    parts = []
    for key, value in overrides.items():
        if "." not in key:
            parts.append(value)
        else:
            leaf = key.rsplit(".", 1)[1]
            parts.append(f"{SHORT_KEYS.get(leaf, leaf)}={value}")
    return " ".join(parts) or "default"


def compose_configs(common: list[str], combos: list[dict[str, str]],
                    spec: SloSpec | None = None) -> list[Configuration]:
    """Compose and validate every configuration; the first invalid one stops the study, and
    so does a configuration whose SLO is not the study's ``spec`` (the SLO is one per study:
    it cannot be a grid axis)."""
    configs = []
    for combo in combos:
        overrides = common + [f"{k}={v}" for k, v in combo.items()]
        cfg = hydra.compose(config_name="config", overrides=overrides)
        try:
            check_config(cfg)
        except ConfigError as err:
            raise SystemExit(
                f"Invalid configuration ({' '.join(f'{k}={v}' for k, v in combo.items())}); "
                f"nothing was run.\n{err}"
            ) from None
        point = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(point, dict)
        point.pop("capacity", None)
        if spec is not None and SloSpec.from_config(point["slo"]) != spec:
            raise SystemExit(
                f"configuration {label(combo)} has its own SLO; the SLO is the study's "
                "(slo.*): set it once, not in hydra.sweeper.params. Nothing was run.")
        configs.append(Configuration(label(combo), combo, point))
    names = [c.label for c in configs]
    if len(set(names)) != len(names):
        raise SystemExit(f"grid gives duplicate configurations: {names}")
    return configs


def check_fleet_settings(cap: DictConfig) -> str | None:
    """The first bad fleet-sizing or pool setting, as a message naming the key."""
    rules = (
        ("target_rate", cap.target_rate is None or cap.target_rate > 0,
         "null (no fleet sizing) or a rate > 0 (req/s)"),
        ("max_replicas", cap.max_replicas >= 1, "an integer >= 1"),
        ("fleet_top", cap.fleet_top >= 1, "an integer >= 1"),
        ("verify_top", cap.verify_top >= 0, "an integer >= 0 (0: no cluster check)"),
        ("router", cap.router is None or cap.router in ROUTER_POLICIES,
         f"null (the configuration's cluster.router) or one of {list(ROUTER_POLICIES)}"),
        ("pool.num_actors", cap.pool.num_actors is None or cap.pool.num_actors >= 0,
         "null (one per CPU), 0 (no Ray) or an integer > 0"),
        ("pool.probe_timeout_s", cap.pool.probe_timeout_s > 0, "seconds > 0"),
    )
    for key, ok, allowed in rules:
        if not ok:
            value = OmegaConf.select(cap, key)
            return f"capacity.{key}={value!r} is not allowed; allowed: {allowed}"
    return None


def settings_of(cap: DictConfig) -> SearchSettings:
    # ``capacity`` holds every SearchSettings knob under the same name (capacity.schema).
    s = SearchSettings(**{f.name: cap[f.name] for f in fields(SearchSettings)})
    s.check()
    return s


def probe_cache_dir(value: str | None) -> Path | None:
    """``capacity.cache_dir`` as a path (``auto``: beside the roofline bundle cache)."""
    if value is None:
        return None
    if value == "auto":
        env = os.environ.get("SERVESWEEP_CACHE")
        root = Path(env) if env else Path("~/.cache/servesweep")
        return (root / "capacity_probes").expanduser()
    from sweep.validate import resolve_path

    return resolve_path(str(Path(value).expanduser()))


def prepare_bundles(configs: list[Configuration]) -> None:
    """Generate every roofline / aiconfigurator bundle the study needs, here, before any
    worker loads one.

    Workers then only read complete bundles: a worker that loaded a bundle's TP1 tables
    keeps them cached in memory and would not see a TP degree another worker adds later.
    """
    from profiles.aiconfigurator import ensure_bundle as aiconfigurator_bundle
    from profiles.catalog import load_hardware, load_model
    from profiles.roofline import ensure_bundle
    from sweep.validate import resolve_path

    seen = set()
    for c in configs:
        hw, bundle = c.point["hardware"], c.point["hardware"]["bundle"]
        key = (hw["name"], c.point["model"]["name"], c.point["cluster"]["tensor_parallel_size"],
               bundle["variant"], bundle["root"])
        if bundle["source"] not in ("roofline", "aiconfigurator") or key in seen:
            continue
        seen.add(key)
        make = ensure_bundle if bundle["source"] == "roofline" else aiconfigurator_bundle
        make(load_hardware(key[0]), load_model(key[1]), key[2], variant=key[3],
             cache=resolve_path(key[4]) if key[4] else None)


def make_pool(cap: DictConfig, num_configs: int) -> Any:
    from capacity.pool import LocalProbePool, RayProbePool

    if cap.pool.num_actors == 0:
        return LocalProbePool()
    # More actors than configurations would idle: each search has one probe in flight.
    wanted = min(cap.pool.num_actors or os.cpu_count() or 1, num_configs)
    return RayProbePool(wanted, cap.pool.probe_timeout_s, cap.pool.address)


def run_study(cfg: DictConfig) -> dict[str, Any]:
    """The whole command: compose, search, size the fleet, write tables/plots/report, log."""
    t0 = time.perf_counter()
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    cap = cfg.capacity
    try:
        spec = SloSpec.from_config(cfg.slo)
        settings = settings_of(cap)
    except (ConfigError, ValueError) as err:
        raise SystemExit(f"Invalid SLO or capacity settings; nothing was run.\n{err}") from None
    problem = check_fleet_settings(cap)
    if problem:
        raise SystemExit(f"Invalid capacity settings; nothing was run.\n{problem}")
    common, combos = grid(hc)
    configs = compose_configs(common, combos, spec)
    log.info(f"{len(configs)} configurations; SLO: {spec.describe()}; "
             f"tolerance {100 * settings.tolerance:g} %")
    cache_dir = probe_cache_dir(cap.cache_dir)
    sink = None
    if cfg.tracking.uri:
        from capacity.tracking import MlflowSink

        sink = MlflowSink.open(cfg, out_dir, spec)
    pool = None
    status = "FAILED"
    try:
        prepare_bundles(configs)
        pool = make_pool(cap, len(configs))
        study = CapacityStudy(configs, spec, settings, pool, ProbeCache(cache_dir), sink)
        answers, probes = study.run()
        fleet = None
        if cap.target_rate is not None:
            fleet = size_fleet(answers, float(cap.target_rate), cap.max_replicas, cap.fleet_top)
            fleet = verify(fleet, configs, float(cap.target_rate), cap.verify_top,
                           cap.router, pool)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise SystemExit("interrupted: the study stopped; finished probes stay in the cache") from None
    finally:
        if pool is not None:
            pool.close()
        if sink is not None and status != "FINISHED":
            sink.close(status, [])
    try:  # the outputs: a failure here still closes the study's runs, as failed
        meta = {
            "study": OmegaConf.to_container(cfg.study, resolve=True),
            "model": ", ".join(sorted({str(c.point["model"]["name"]) for c in configs})),
            "slo": spec.as_dict(),
            "slo_text": spec.describe(),
            "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
            "grid": {k: sorted({c.overrides[k] for c in configs}) for k in combos[0]} if combos else {},
            "common_overrides": common,
            "profiles": sorted({str(c.point["hardware"]["bundle"]["source"]) for c in configs}),
            "workload": OmegaConf.to_container(cfg.workload, resolve=True),
            "target_rate": cap.target_rate,
            "pool_size": pool.size,
            "probes_simulated": study.simulated,
            "probes_total": int(len(probes)),
            "search_wall_s": study.wall_s,
        }
        meta["total_wall_s"] = time.perf_counter() - t0  # everything but writing the report
        files = write_outputs(out_dir, answers, probes, fleet, meta)
        from capacity.report import render

        report = render(out_dir)
        if sink is not None:
            sink.log_fleet(fleet, float(cap.target_rate) if cap.target_rate else None)
    except BaseException:
        if sink is not None:
            sink.close("FAILED", [])
        raise
    if sink is not None:
        sink.close(status, [*files, report, *sorted((out_dir / "plots").glob("*.png"))])
    print_summary(answers, fleet, meta, out_dir)
    return {"answers": answers, "fleet": fleet, "dir": str(out_dir)}


def verify(fleet: pd.DataFrame, configs: list[Configuration], target_rate: float,
           top: int, router: str | None, pool: Any) -> pd.DataFrame:
    """Re-simulate the cheapest ``top`` fleets as clusters behind ``router``, side by side
    on ``pool``; add the ``verified`` column and the cluster's observed SLO statistics."""
    points = {c.label: c.point for c in configs}
    checks = list(fleet.head(top).itertuples(index=False))
    for i, row in enumerate(checks):
        pool.submit(i, points[row.config], int(row.replicas), target_rate, router,
                    method="check")
    extra: list[dict[str, Any]] = [{} for _ in range(len(fleet))]
    for _ in checks:
        done = pool.next_done()
        row = checks[done.key]
        if done.error is not None:  # the sizing stands; say why it was not verified
            log.warning(f"fleet {row.replicas} x {row.config}: verification failed: {done.error}")
            extra[done.key] = {"verify_error": done.error}
            continue
        extra[done.key] = done.value
        log.info(f"fleet {row.replicas} x {row.config} at {target_rate:g} req/s behind a "
                 f"{done.value['verify_router']} router: "
                 f"{'meets' if done.value['verified'] else 'misses'} the SLO")
    return pd.concat([fleet, pd.DataFrame(extra, index=fleet.index)], axis=1)


def write_outputs(out_dir: Path, answers: pd.DataFrame, probes: pd.DataFrame,
                  fleet: pd.DataFrame | None, meta: dict[str, Any]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "capacity.parquet", out_dir / "probes.parquet"]
    answers.to_parquet(files[0], index=False)
    probes.to_parquet(files[1], index=False)
    if fleet is not None:
        files += [out_dir / "fleet.parquet", out_dir / "fleet.csv"]
        fleet.to_parquet(files[-2], index=False)
        fleet.to_csv(files[-1], index=False)
    files.append(out_dir / "study.json")
    files[-1].write_text(json.dumps(meta, indent=1, default=str))
    return files


def print_summary(answers: pd.DataFrame, fleet: pd.DataFrame | None, meta: dict[str, Any],
                  out_dir: Path) -> None:
    cols = ["config", "status", "max_rate", "probes", "cached_probes", "num_gpus",
            "usd_per_hour", "usd_per_m_output_tokens", "good_output_tok_s"]
    print(f"\nSLO: {meta['slo_text']}")
    print(answers[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if fleet is not None:
        print(f"\nCheapest fleets for {meta['target_rate']:g} req/s:")
        shown = [c for c in ("rank", "config", "replicas", "num_gpus", "usd_per_hour",
                             "usd_per_m_output_tokens", "capacity_rps", "utilization",
                             "verified")
                 if c in fleet.columns]
        print(fleet[shown].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    done = answers[answers["probes"] > 0]["probes"]
    mean = float(done.mean()) if len(done) else math.nan
    print(f"\n{meta['probes_total']} probes ({meta['probes_simulated']} simulated, the rest "
          f"from the cache), {mean:.1f} per configuration (max {done.max() if len(done) else 0}); "
          f"search {meta['search_wall_s']:.1f} s on {meta['pool_size']} workers")
    print(f"report: {out_dir / 'report.html'}")
