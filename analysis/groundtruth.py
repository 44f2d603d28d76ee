"""Reader for a reference ground-truth example: a real vLLM run plus its cluster config.

Layout of ``<truth>`` (e.g. ``llmservingsim/groundtruth/RTXPRO6000/Llama-3.1-8B``)::

    config.json            LLMServingSim cluster config (parsed by ``parse_cluster_config``)
    vllm/meta.json         engine kwargs, dataset, timing of the vLLM bench run
    vllm/requests.jsonl    per request: input/output tokens, arrival_time (client wall clock,
                           epoch s), queued_ts / scheduled_ts / first_token_ts / last_token_ts
                           (engine monotonic clock, s)
    vllm/timeseries.csv    optional; per tick: t, prompt/gen throughput, running, waiting,
                           kv_cache_pct (an empty frame when the folder has none)

The per-request DataFrame uses the layout ``analysis.metrics.compute_metrics`` takes. Times
are integer ns on the engine's monotonic clock, measured from the earliest ``queued_ts``;
``arrival_ns`` is the engine receive time (``queued_ts``), the anchor the reference bench
falls back to because ``arrival_time`` is on another clock (wall clock) -- see
``docs/reference-semantics.md`` §14. ``scheduled_ns`` and the raw ``arrival_time`` (epoch s)
are kept.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics import compute_metrics
from engine.specs import SIMULATOR_FIELDS, ConfigError, EngineConfig, SettingError

NS_PER_S = 1_000_000_000
REQUEST_FIELDS = (
    "request_id",
    "input_toks",
    "output_toks",
    "arrival_time",
    "queued_ts",
    "scheduled_ts",
    "first_token_ts",
    "last_token_ts",
)
TIMESERIES_COLUMNS = ("t", "prompt_throughput", "gen_throughput", "running", "waiting")
PD_TYPES = (None, "prefill", "decode")
_INSTANCE_BASE_KEYS = (
    "model_name",
    "hardware",
    "npu_mem",
    "pd_type",
    "num_npus",
    "tp_size",
    "pp_size",
    "ep_size",
    "dp_group",
    "placement",
)
# Per-instance runtime overrides the reference simulator accepts (its CLI flags).
INSTANCE_OVERRIDES = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "long_prefill_token_threshold",
    "dtype",
    "enable_block_copy",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "enable_local_offloading",
    "enable_attn_offloading",
    "enable_sub_batch_interleaving",
    "reserve_full_isl",
    "block_size",
    "kv_cache_dtype",
)
_INSTANCE_KEYS = frozenset(_INSTANCE_BASE_KEYS + INSTANCE_OVERRIDES)


# ---------------------------------------------------------------------------------------
# Cluster config (LLMServingSim schema)


@dataclass(frozen=True, slots=True)
class MemSpec:
    """A memory device: size in GB (the reference reads it as GiB), bw GB/s, latency ns."""

    mem_size: float
    mem_bw: float
    mem_latency: float
    mem_util: float | None = None  # only on npu_mem
    num_devices: int = 1  # only on cxl_mem
    pim_config: str | None = None  # only on cpu_mem (attention offloading)


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One serving instance. Parallelism fields are as written (None when absent); the
    reference infers the missing ones (``docs/reference-semantics.md`` §3)."""

    model_name: str
    hardware: str
    npu_mem: MemSpec
    pd_type: str | None
    num_npus: int | None = None
    tp_size: int | None = None
    pp_size: int | None = None
    ep_size: int | None = None
    dp_group: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    placement: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this schema does not know


@dataclass(frozen=True, slots=True)
class NodeSpec:
    cpu_mem: MemSpec
    instances: tuple[InstanceSpec, ...]
    power: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A whole cluster config. ``link_bw`` (GB/s) / ``link_latency`` (ns) are per topology
    dimension; a scalar in the file becomes a 1-tuple (the reference broadcasts it)."""

    link_bw: tuple[float, ...]
    link_latency: tuple[float, ...]
    nodes: tuple[NodeSpec, ...]
    cxl_mem: MemSpec | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def instances(self) -> tuple[InstanceSpec, ...]:
        """All instances in config order across nodes (the reference's instance ids)."""
        return tuple(inst for node in self.nodes for inst in node.instances)


def _need(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise ConfigError(f"{where}: missing required field '{key}'")
    return obj[key]


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: must be a number, got {value!r}")
    return float(value)


def _opt_int(obj: dict[str, Any], key: str, where: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}.{key}: must be an integer >= 1, got {value!r}")
    return value


def _mem(obj: Any, where: str, kind: str) -> MemSpec:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: must be an object with mem_size, mem_bw, mem_latency")
    values = {
        k: _number(_need(obj, k, where), f"{where}.{k}")
        for k in ("mem_size", "mem_bw", "mem_latency")
    }
    util = obj.get("mem_util")
    if util is not None:
        util = _number(util, f"{where}.mem_util")
        if not 0 < util <= 1:
            raise ConfigError(f"{where}.mem_util: must be in (0, 1], got {util}")
    devices = obj.get("num_devices", 1)
    if kind == "cxl" and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
        raise ConfigError(f"{where}.num_devices: must be an integer >= 1, got {devices!r}")
    pim = obj.get("pim_config")
    return MemSpec(**values, mem_util=util, num_devices=devices, pim_config=pim)


def _link(value: Any, where: str) -> tuple[float, ...]:
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{where}: an empty list; give a number or one per dimension")
        return tuple(_number(v, where) for v in value)
    return (_number(value, where),)


def _instance(obj: Any, where: str) -> InstanceSpec:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: must be an object")
    pd_type = _need(obj, "pd_type", where)
    if pd_type not in PD_TYPES:
        raise ConfigError(f"{where}.pd_type: {pd_type!r}; use 'prefill', 'decode' or null")
    for key in ("model_name", "hardware"):
        if not isinstance(_need(obj, key, where), str):
            raise ConfigError(f"{where}.{key}: must be a string")
    dp_group = obj.get("dp_group")
    if dp_group is not None and not isinstance(dp_group, str):
        raise ConfigError(f"{where}.dp_group: must be a string id, got {dp_group!r}")
    placement = obj.get("placement")
    if placement is not None and not isinstance(placement, dict):
        raise ConfigError(f"{where}.placement: must be an object")
    return InstanceSpec(
        model_name=obj["model_name"],
        hardware=obj["hardware"],
        npu_mem=_mem(_need(obj, "npu_mem", where), f"{where}.npu_mem", "npu"),
        pd_type=pd_type,
        num_npus=_opt_int(obj, "num_npus", where),
        tp_size=_opt_int(obj, "tp_size", where),
        pp_size=_opt_int(obj, "pp_size", where),
        ep_size=_opt_int(obj, "ep_size", where),
        dp_group=dp_group,
        overrides={k: obj[k] for k in INSTANCE_OVERRIDES if k in obj},
        placement=placement,
        extra={k: v for k, v in obj.items() if k not in _INSTANCE_KEYS},
    )


def parse_cluster_config(data: dict[str, Any], where: str = "cluster config") -> ClusterSpec:
    """Validate and type an LLMServingSim cluster config (``docs/reference-semantics.md`` §2).

    Checks required keys, ``num_nodes == len(nodes)``, ``num_instances == len(instances)``,
    ``pd_type`` values, memory fields and ``mem_util`` in (0, 1]. Parallelism inference and
    placement resolution are left to the cluster builder.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object at the top level")
    nodes_raw = _need(data, "nodes", where)
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ConfigError(f"{where}.nodes: must be a non-empty list")
    num_nodes = _need(data, "num_nodes", where)
    if num_nodes != len(nodes_raw):
        raise ConfigError(
            f"{where}.num_nodes: {num_nodes} but {len(nodes_raw)} node(s) listed; make them equal"
        )
    nodes = []
    for i, node in enumerate(nodes_raw):
        nw = f"{where}.nodes[{i}]"
        if not isinstance(node, dict):
            raise ConfigError(f"{nw}: must be an object")
        insts = _need(node, "instances", nw)
        if not isinstance(insts, list) or not insts:
            raise ConfigError(f"{nw}.instances: must be a non-empty list")
        if _need(node, "num_instances", nw) != len(insts):
            raise ConfigError(
                f"{nw}.num_instances: {node['num_instances']} but {len(insts)} instance(s) "
                "listed; make them equal"
            )
        power = node.get("power")
        if power is not None and not isinstance(power, dict):
            raise ConfigError(f"{nw}.power: must be an object")
        nodes.append(
            NodeSpec(
                cpu_mem=_mem(_need(node, "cpu_mem", nw), f"{nw}.cpu_mem", "cpu"),
                instances=tuple(
                    _instance(inst, f"{nw}.instances[{j}]") for j, inst in enumerate(insts)
                ),
                power=power,
            )
        )
    cxl = data.get("cxl_mem")
    return ClusterSpec(
        link_bw=_link(_need(data, "link_bw", where), f"{where}.link_bw"),
        link_latency=_link(_need(data, "link_latency", where), f"{where}.link_latency"),
        nodes=tuple(nodes),
        cxl_mem=None if cxl is None else _mem(cxl, f"{where}.cxl_mem", "cxl"),
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: file not found; the ground-truth folder needs it") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno} ({exc.msg})") from exc


def load_cluster_config(path: str | Path) -> ClusterSpec:
    """Read and parse a cluster config JSON file."""
    p = Path(path)
    return parse_cluster_config(_read_json(p), str(p))


# ---------------------------------------------------------------------------------------
# vLLM run


def read_vllm_requests(path: str | Path) -> pd.DataFrame:
    """``requests.jsonl`` -> the per-request DataFrame (see the module docstring).

    Columns: ``request_id, request_index, arrival_ns, scheduled_ns, first_token_ns,
    finish_ns, prompt_len, output_len, arrival_time``. ``request_index`` is the number in
    ``bench-<i>`` (the workload line), or the file line order when ids have no number.
    """
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except FileNotFoundError as exc:
        raise ConfigError(f"{p}: file not found; the ground-truth folder needs it") from exc
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}:{lineno}: invalid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise ConfigError(f"{p}:{lineno}: expected a JSON object")
        missing = [k for k in REQUEST_FIELDS if k not in obj]
        if missing:
            raise ConfigError(f"{p}:{lineno}: missing field(s) {missing}")
        for key in REQUEST_FIELDS[1:]:
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"{p}:{lineno}: field '{key}' must be a number, got {v!r}")
        rows.append(obj)
    if not rows:
        raise ConfigError(f"{p}: no request records")
    raw = pd.DataFrame(rows, columns=list(REQUEST_FIELDS))
    t0 = raw["queued_ts"].min()

    def rel_ns(col: str) -> np.ndarray:
        return np.rint((raw[col].to_numpy(dtype=np.float64) - t0) * NS_PER_S).astype(np.int64)

    ids = raw["request_id"].astype(str)
    index = pd.to_numeric(ids.str.extract(r"(\d+)$")[0], errors="coerce")
    if index.isna().any() or index.duplicated().any():
        index = pd.Series(np.arange(len(raw)))
    return pd.DataFrame(
        {
            "request_id": ids,
            "request_index": index.to_numpy(dtype=np.int64),
            "arrival_ns": rel_ns("queued_ts"),
            "scheduled_ns": rel_ns("scheduled_ts"),
            "first_token_ns": rel_ns("first_token_ts"),
            "finish_ns": rel_ns("last_token_ts"),
            "prompt_len": raw["input_toks"].to_numpy(dtype=np.int64),
            "output_len": raw["output_toks"].to_numpy(dtype=np.int64),
            "arrival_time": raw["arrival_time"].to_numpy(dtype=np.float64),
        }
    )


def read_timeseries(path: str | Path) -> pd.DataFrame:
    """``timeseries.csv`` as a DataFrame (``kv_cache_pct`` optional)."""
    p = Path(path)
    try:
        df = pd.read_csv(p)
    except FileNotFoundError as exc:
        raise ConfigError(f"{p}: file not found; the ground-truth folder needs it") from exc
    missing = [c for c in TIMESERIES_COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(f"{p}: missing column(s) {missing}")
    return df


@dataclass(frozen=True, slots=True)
class GroundTruth:
    """Everything in one ground-truth folder."""

    path: Path
    meta: dict[str, Any]
    requests: pd.DataFrame
    timeseries: pd.DataFrame
    cluster: ClusterSpec

    def metrics(self) -> dict[str, float]:
        """vLLM's metrics, computed like ``compute_metrics`` computes the simulator's."""
        return compute_metrics(self.requests)


def load_groundtruth(truth: str | Path) -> GroundTruth:
    """Read ``<truth>/config.json`` and ``<truth>/vllm/{meta.json,requests.jsonl}`` and, when
    present, ``<truth>/vllm/timeseries.csv`` (else ``timeseries`` is an empty frame); missing
    files or fields raise ``ConfigError`` naming them."""
    root = Path(truth)
    if not root.is_dir():
        raise ConfigError(f"{root}: ground-truth folder not found; check the path")
    meta = _read_json(root / "vllm" / "meta.json")
    if not isinstance(meta, dict):
        raise ConfigError(f"{root / 'vllm' / 'meta.json'}: expected a JSON object")
    kwargs = _need(meta, "engine_kwargs", str(root / "vllm" / "meta.json"))
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{root / 'vllm' / 'meta.json'}.engine_kwargs: must be an object")
    series = root / "vllm" / "timeseries.csv"
    return GroundTruth(
        path=root,
        meta=meta,
        requests=read_vllm_requests(root / "vllm" / "requests.jsonl"),
        timeseries=read_timeseries(series) if series.is_file() else pd.DataFrame(),
        cluster=load_cluster_config(root / "config.json"),
    )


# vLLM engine kwargs recorded in meta.json under another name than EngineConfig's field.
_KWARG_RENAMES = {"scheduler_reserve_full_isl": "reserve_full_isl"}


@dataclass(frozen=True, slots=True)
class RecordedEngine:
    """What a ground-truth vLLM run ran with, converted once: the engine settings of each
    instance (``config``, vLLM's names) and the run-wide facts that are not per-instance
    settings (``data_parallel_size``, the weight ``dtype``, the ``seed``)."""

    config: EngineConfig
    data_parallel_size: int
    dtype: str
    seed: Any

    def params(self) -> dict[str, Any]:
        """The vLLM settings as flat ``name: value`` pairs (vLLM's names; for logging)."""
        out = {f.name: getattr(self.config, f.name) for f in fields(EngineConfig)
               if f.name not in SIMULATOR_FIELDS}
        out.update(data_parallel_size=self.data_parallel_size, dtype=self.dtype, seed=self.seed)
        return out


def recorded_engine(truth: GroundTruth | str | Path, base: EngineConfig | None = None
                    ) -> RecordedEngine:
    """The engine settings a ground-truth run recorded, on top of ``base`` (default:
    ``EngineConfig()``, vLLM's defaults).

    Every ``engine_kwargs`` entry of ``vllm/meta.json`` that is an ``EngineConfig`` field is
    taken by its name (``scheduler_reserve_full_isl`` sets ``reserve_full_isl``);
    ``max_model_len`` is taken even when null. ``expert_parallel_size`` is tp x dp when
    ``enable_expert_parallel`` was on (vLLM spreads the experts over every TP x DP rank), else 1.
    ``gpu_memory_utilization`` falls back to the cluster config's first ``npu_mem.mem_util``
    (the reference's name for it), then to ``base``'s; a recorded ``kv_cache.num_gpu_blocks``
    is the KV capacity (``num_gpu_blocks_override``). A value ``EngineConfig`` refuses is an
    error naming meta.json and the key.
    """
    gt = truth if isinstance(truth, GroundTruth) else load_groundtruth(truth)
    meta_path = gt.path / "vllm" / "meta.json"
    where = f"{meta_path}.engine_kwargs"
    kw = gt.meta["engine_kwargs"]
    required = (
        "max_num_seqs",
        "max_num_batched_tokens",
        "tensor_parallel_size",
        "dtype",
        "kv_cache_dtype",
        "seed",
    )
    for key in required:
        _need(kw, key, where)
    names = {f.name for f in fields(EngineConfig)} - set(SIMULATOR_FIELDS)
    source: dict[str, str] = {}
    values: dict[str, Any] = {}
    for key, value in kw.items():
        name = _KWARG_RENAMES.get(key, key)
        if name in names and (value is not None or name == "max_model_len"):
            values[name], source[name] = value, f"engine_kwargs.{key}"
    values.setdefault("max_model_len", None)
    tp, dp = kw["tensor_parallel_size"], kw.get("data_parallel_size", 1)
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ConfigError(f"{where}.data_parallel_size: must be an integer >= 1, got {dp!r}")
    if kw.get("enable_expert_parallel") and isinstance(tp, int):
        values["expert_parallel_size"] = tp * dp
        source["expert_parallel_size"] = "engine_kwargs.enable_expert_parallel"
    if "gpu_memory_utilization" not in values:
        utils = [i.npu_mem.mem_util for i in gt.cluster.instances if i.npu_mem.mem_util]
        if utils:
            values["gpu_memory_utilization"] = utils[0]
            source["gpu_memory_utilization"] = "config.json npu_mem.mem_util"
    kv = gt.meta.get("kv_cache")
    if isinstance(kv, dict) and kv.get("num_gpu_blocks") is not None:
        values["num_gpu_blocks_override"] = kv["num_gpu_blocks"]
        source["num_gpu_blocks_override"] = "kv_cache.num_gpu_blocks"
    try:
        config = replace(base or EngineConfig(), **values)
    except SettingError as err:
        raise ConfigError(f"{meta_path}: {source.get(err.field, err.field)}: {err}") from None
    return RecordedEngine(config, dp, str(kw["dtype"]), kw["seed"])


def engine_settings(truth: GroundTruth | str | Path) -> dict[str, Any]:
    """The vLLM settings of a ground-truth run as flat pairs in vLLM's names
    (``recorded_engine(truth).params()``)."""
    return recorded_engine(truth).params()
