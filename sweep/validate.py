"""Checks on a composed sweep config that the typed schema cannot express.

``check_config`` runs in the driver on every job config before Ray or MLflow start (the
launcher's ``validator`` hook) and again at the start of each job. The first problem
raises one ``ConfigError`` naming the key, the bad value and what is allowed. The engine
settings' ranges are ``engine.specs.EngineConfig``'s own (``sweep.settings`` converts).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from analysis.slo import SloSpec
from engine.cluster import ROUTER_POLICIES
from engine.frontend import FRONTEND_MODES
from engine.specs import ConfigError
from profiles.aiconfigurator import system_for, systems_dir
from profiles.catalog import list_hardware, list_models, load_hardware, load_model, model_aliases
from sweep.cluster import check_shape
from sweep.settings import engine_config
from sweep.store_check import TrackingError, check_store
from workloads import ARRIVALS, LengthDist, WorkloadError
from workloads.config import FORMAT_KEYS, FORMATS, KIND_KEYS, KINDS

BUNDLE_SOURCES = ("roofline", "aiconfigurator", "dir")
WORKLOAD_KINDS = KINDS
SEED_LIMIT = 2**32  # numpy's legacy RandomState (Poisson arrivals) takes 32-bit seeds


def resolve_path(path: str) -> Path:
    """An absolute path; relative ones are taken from the directory the sweep started in."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import to_absolute_path

    if HydraConfig.initialized():
        return Path(to_absolute_path(path))
    return Path(path).absolute()


def _fail(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is not allowed; allowed: {allowed}")


def _positive(key: str, value: Any, *, allow_none: bool = False, integer: bool = False,
              allow_inf: bool = False) -> None:
    """``value`` > 0 (NaN never passes; infinity only with ``allow_inf``)."""
    if value is None and allow_none:
        return
    kind = "an integer" if integer else ("a number" if allow_inf else "a finite number")
    if value is None or not value > 0 or (math.isinf(value) and not allow_inf):
        raise _fail(key, value, f"{kind} > 0" + (" or null" if allow_none else ""))


def check_hardware(cfg: DictConfig) -> None:
    hw = cfg.hardware
    try:
        load_hardware(hw.name)
    except ConfigError:
        raise _fail("hardware.name", hw.name, f"one of {list_hardware()}") from None
    if hw.bundle.source not in BUNDLE_SOURCES:
        raise _fail("hardware.bundle.source", hw.bundle.source, f"one of {list(BUNDLE_SOURCES)}")
    if hw.bundle.source == "aiconfigurator":
        try:  # the package (optional extra, pinned version) and a system for this GPU
            systems_dir()
            system_for(hw.name)
        except ConfigError as err:
            raise ConfigError(f"hardware.bundle.source=aiconfigurator: {err}") from None
    if hw.bundle.source == "dir" and (
        not hw.bundle.root or not resolve_path(hw.bundle.root).is_dir()
    ):
        raise _fail(
            "hardware.bundle.root",
            hw.bundle.root,
            "an existing bundle directory (for the reference data set SERVESWEEP_DATA "
            "to the folder holding llmservingsim/), or hardware.bundle.source=roofline",
        )
    price = hw.cost_per_hour
    if price is not None and not (0 <= price < math.inf):
        raise _fail("hardware.cost_per_hour", price, "a finite number >= 0 or null")


def check_cluster(cfg: DictConfig) -> None:
    """The deployment (router, shape vs the model), then the engine settings: converted once
    to ``EngineConfig``, which checks every value (``sweep.settings``)."""
    cl = cfg.cluster
    if cl.router not in ROUTER_POLICIES:
        raise _fail("cluster.router", cl.router, f"one of {list(ROUTER_POLICIES)}")
    if cl.frontend not in FRONTEND_MODES:
        raise _fail("cluster.frontend", cl.frontend, f"one of {list(FRONTEND_MODES)}")
    model = load_model(cfg.model.name)
    check_shape(cl, model)
    engine_config(cl, model)


def check_workload(cfg: DictConfig) -> None:
    """The workload's kind, the keys it reads (a key set for a kind that ignores it is
    refused), its load or trace file and scaling, and its kind's own values."""
    wl = cfg.workload
    if wl.kind not in WORKLOAD_KINDS:
        raise _fail("workload.kind", wl.kind, f"one of {list(WORKLOAD_KINDS)}")
    if not 0 <= wl.seed < SEED_LIMIT:
        raise _fail("workload.seed", wl.seed, f"an integer in 0..{SEED_LIMIT - 1}")
    if wl.kind == "trace" and wl.format not in FORMATS:
        raise _fail("workload.format", wl.format, f"one of {list(FORMATS)}")
    _check_keys_apply(wl)
    if wl.kind == "trace":
        _check_trace(wl)
        return
    _check_load(wl)
    if wl.kind == "synthetic":
        if wl.shared_prefix_len < 0:
            raise _fail("workload.shared_prefix_len", wl.shared_prefix_len, "an integer >= 0")
        _positive("workload.num_prefix_groups", wl.num_prefix_groups, integer=True)
        for key in ("input_len", "output_len"):
            length_dist(wl, key)
        return
    counts = {
        "shared_prefix": {"num_groups": 1, "num_prompts_per_group": 1, "system_prompt_len": 0,
                          "question_len": 0, "output_len": 1},
        "vllm_random": {"input_len": 0, "output_len": 1, "prefix_len": 0,
                        "num_special_tokens": 0},
        "prefix_repetition": {"prefix_len": 0, "suffix_len": 0, "num_prefixes": 1,
                              "output_len": 1},
    }[wl.kind]
    for key, low in counts.items():
        value = wl[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise _fail(f"workload.{key}", value,
                        f"an integer >= {low} (workload.kind={wl.kind} takes a fixed length)")
    if wl.kind == "vllm_random":
        if not 0 <= wl.range_ratio < 1:
            raise _fail("workload.range_ratio", wl.range_ratio, "a number in [0, 1) (vLLM's)")
        if wl.num_special_tokens > 16:
            raise _fail("workload.num_special_tokens", wl.num_special_tokens,
                        "0..16 (what the tokenizer adds: 1 for Llama 3's BOS, 0 for Qwen3)")


def _check_keys_apply(wl: DictConfig) -> None:
    """A key the kind (or trace format) does not read must keep its schema default; trace
    configs may carry the synthetic defaults' load keys (composed on top of them)."""
    from sweep.schema import WorkloadConf

    reads = {"kind", "seed", *KIND_KEYS[wl.kind]}
    tolerated: set[str] = set()
    if wl.kind == "trace":
        reads -= set().union(*FORMAT_KEYS.values()) - set(FORMAT_KEYS[wl.format])
        tolerated = {"rate", "arrival", "cv", "num_requests"}
    defaults = WorkloadConf()
    for key in wl:
        if key in reads or key in tolerated or not hasattr(defaults, key):
            continue
        value = wl[key]
        plain = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) \
            else value
        default = getattr(defaults, key)
        if plain == default:
            continue
        if wl.kind == "trace" and key in KIND_KEYS["trace"]:
            where = f"workload.format={wl.format}"
            readers = "format " + ", ".join(f for f, keys in FORMAT_KEYS.items() if key in keys)
        else:
            where = f"workload.kind={wl.kind}"
            readers = "kind " + ", ".join(k for k, keys in KIND_KEYS.items() if key in keys)
        raise _fail(f"workload.{key}", plain,
                    f"its default {default!r} with {where}, which does not read it (read by "
                    f"{readers}); remove it or change the {where.split('.')[1].split('=')[0]}")


def _check_load(wl: DictConfig) -> None:
    """When a generator's requests arrive: ``rate`` with one of ``num_requests`` /
    ``duration_s``, or ``stages``."""
    if wl.arrival not in ARRIVALS:
        raise _fail("workload.arrival", wl.arrival, f"one of {list(ARRIVALS)}")
    _positive("workload.cv", wl.cv)
    if wl.stages:
        for key in ("num_requests", "duration_s"):
            if wl[key] is not None:
                raise _fail(f"workload.{key}", wl[key],
                            "null with workload.stages (the stages set the request count)")
        for i, stage in enumerate(wl.stages):
            if not (math.isfinite(stage.rate) and stage.rate >= 0):
                raise _fail(f"workload.stages[{i}].rate", stage.rate, "a finite number >= 0")
            if not (math.isfinite(stage.duration_s) and stage.duration_s > 0):
                raise _fail(f"workload.stages[{i}].duration_s", stage.duration_s,
                            "a finite number of seconds > 0")
        if not any(stage.rate > 0 for stage in wl.stages):
            raise _fail("workload.stages", OmegaConf.to_container(wl.stages),
                        "at least one stage with rate > 0")
        return
    # rate = inf: every request arrives at t = 0 (a burst), which needs a request count
    _positive("workload.rate", wl.rate, allow_inf=True)
    if math.isinf(wl.rate) and wl.duration_s is not None:
        raise _fail("workload.rate", wl.rate,
                    "a finite number > 0 with workload.duration_s (inf needs num_requests)")
    if wl.num_requests is None and wl.duration_s is None:
        raise _fail("workload.num_requests", None,
                    "an integer > 0 (or set workload.duration_s or workload.stages)")
    _positive("workload.num_requests", wl.num_requests, allow_none=True, integer=True)
    _positive("workload.duration_s", wl.duration_s, allow_none=True)
    if wl.num_requests is not None and wl.duration_s is not None:
        raise _fail("workload.duration_s", wl.duration_s,
                    "null when workload.num_requests is set (give exactly one of the two)")


def _check_trace(wl: DictConfig) -> None:
    if not wl.path or not resolve_path(wl.path).is_file():
        raise _fail("workload.path", wl.path, f"an existing {wl.format} trace file")
    _positive("workload.limit", wl.limit, allow_none=True, integer=True)
    if not (math.isfinite(wl.start_s) and wl.start_s >= 0):
        raise _fail("workload.start_s", wl.start_s, "a finite number of trace seconds >= 0")
    _positive("workload.duration_s", wl.duration_s, allow_none=True)
    for key in ("time_scale", "rate_scale"):
        _positive(f"workload.{key}", wl[key])
    if wl.format == "mooncake":
        _positive("workload.hash_block_size", wl.hash_block_size, integer=True)


def length_dist(wl: DictConfig, key: str) -> LengthDist:
    """``workload.<key>`` parsed into a ``LengthDist``; errors name the key."""
    value = wl[key]
    plain = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    try:
        return LengthDist.parse(plain, key)
    except WorkloadError as err:
        raise _fail(
            f"workload.{key}", plain,
            f"a length distribution: a kind name, an int, or a mapping with 'kind' ({err})",
        ) from None


STUDY_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


@functools.lru_cache(maxsize=8)
def _store_problem(uri: str) -> str | None:
    """``sweep.store_check.check_store``'s message, once per URI and process (every grid
    point asks)."""
    try:
        check_store(uri)
    except TrackingError as err:
        return str(err)
    return None


def check_rest(cfg: DictConfig) -> None:
    SloSpec.from_config(cfg.slo)  # raises ConfigError naming the slo.* key
    if not STUDY_NAME.fullmatch(str(cfg.study.name)):
        raise _fail("study.name", cfg.study.name,
                    "a file name of letters, digits, '.', '_' and '-' (at most 100, not "
                    "starting with '.'): it names the MLflow experiment and the folder "
                    "multirun/<study.name>")
    budget = cfg.tracking.retry_budget_s
    if not (isinstance(budget, int | float) and math.isfinite(budget) and budget >= 0):
        raise _fail("tracking.retry_budget_s", budget, "a number of seconds >= 0")
    steps = cfg.tracking.get("timeseries_steps")
    if steps is not None and not (isinstance(steps, int) and not isinstance(steps, bool)
                                  and steps >= 1):
        raise _fail("tracking.timeseries_steps", steps,
                    "null (every second) or a whole number of steps >= 1")
    uri = cfg.tracking.uri  # read once: each read parses its ${oc.env:...} again
    problem = _store_problem(str(uri)) if uri else None
    if problem:
        raise ConfigError(problem)
    gt = cfg.groundtruth.dir
    if gt is not None and not resolve_path(gt).is_dir():
        raise _fail("groundtruth.dir", gt, "null or an existing vLLM ground-truth run directory")


# vLLM's short command-line flags (``-tp``, ``-pp``, ``-dp``) and our old names, to suggest.
ALIASES = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size",
           "dp": "data_parallel_size", "ep": "expert_parallel_size",
           "mem_util": "gpu_memory_utilization"}


def unknown_keys(node: Any, prefix: str = "") -> list[str]:
    """Messages for keys of ``node`` (and its typed sub-nodes) that its schema does not have:
    Hydra's ``+key=value`` adds them even to a typed node, and nothing would read them."""
    if not isinstance(node, DictConfig):
        return []
    kind = OmegaConf.get_type(node)
    if kind is None or not dataclasses.is_dataclass(kind):
        return []
    known = {f.name for f in dataclasses.fields(kind)}
    out = []
    for key in node:
        name = f"{prefix}{key}"
        if key not in known:
            guess = ALIASES.get(str(key)) or next(iter(
                difflib.get_close_matches(str(key), sorted(known), n=1)), None)
            hint = f"; did you mean {prefix}{guess}?" if guess in known else ""
            out.append(f"{name} is not a setting of {prefix.rstrip('.') or 'the config'}"
                       f"{hint} (known: {', '.join(sorted(known))})")
        elif key != "hydra":
            out += unknown_keys(node._get_node(key), f"{name}.")
    return out


def check_config(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for the first invalid value in a composed sweep config."""
    unknown = unknown_keys(cfg)
    if unknown:
        raise ConfigError("; ".join(unknown))
    try:
        load_model(cfg.model.name)
    except ConfigError:
        allowed = list_models() + sorted(model_aliases())
        raise _fail("model.name", cfg.model.name, f"one of {allowed}") from None
    check_hardware(cfg)
    check_cluster(cfg)
    check_workload(cfg)
    check_rest(cfg)
