"""Read NVIDIA aiconfigurator-core's shipped vLLM operator tables (one pinned version).

aiconfigurator-core (PyPI, Apache-2.0) ships, as package data under
``aiconfigurator_core/systems/``, one ``<system>.yaml`` per GPU system (memory size and
bandwidth, tensor peaks, interconnect) and Parquet tables of measured vLLM operators under
``data/<system>/<op>/vllm/<version>/``. Its Python query API is in flux (0.12.0 routes every
query through a compiled engine and the ``PerfDatabase.query_*`` methods its docstrings list
are gone), so we read the files it ships, as data, through this one module; the version is
pinned (:data:`PINNED_VERSION`) and a different installed version is refused.

Tables read (latencies in the files are milliseconds; everything here returns microseconds):

- ``gemm/vllm/<v>/gemm_perf.parquet``: GEMM latency by (m, n, k) and dtype;
- ``attention/vllm/<v>/{context,generation}_attention_perf.parquet``: prefill attention by
  (batch, input length) and decode attention by (batch, KV length ``step``) per (heads,
  KV heads, head dim, KV-cache dtype, kernel lane);
- ``moe/vllm/<v>/moe_perf.parquet``: fused MoE by tokens per (hidden, expert width, top-k,
  experts, MoE TP/EP, routing distribution);
- ``comm/vllm/<v>/custom_allreduce_perf.parquet`` and ``comm/nccl/<v>/nccl_perf.parquet``:
  vLLM's custom all-reduce and NCCL collectives by (GPUs, message bytes).

The vLLM version read is the system's ``current`` slot in the package's
``query_versions.yaml`` (0.24.0 for most systems, 0.14.0 for A100 in 0.12.0).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml

from engine.specs import ConfigError

PINNED_VERSION = "0.12.0"
DISTRIBUTION = "aiconfigurator-core"
INSTALL_HINT = "pip install -e '.[aiconfigurator]' (pins aiconfigurator-core==0.12.0)"
MS_TO_US = 1000.0

# Our hardware catalog names -> aiconfigurator system names (the systems it ships vLLM
# tables for). The catalog entries cite the system YAML their figures come from.
SYSTEMS: dict[str, str] = {
    "RTXPRO6000": "rtx_pro_6000_server",
    "H100-SXM": "h100_sxm",
    "H200": "h200_sxm",
    "B200": "b200_sxm",
    "B300": "b300_sxm",
    "GB200": "gb200",
    "GB300": "gb300",
    "L40S": "l40s",
    "A100-80G": "a100_sxm",
}


class AiconfiguratorError(ConfigError):
    """aiconfigurator-core is missing, the wrong version, or lacks a table we need."""


# --------------------------------------------------------------------------- the package


def installed_version() -> str | None:
    """The installed aiconfigurator-core version, or None when it is not installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


@cache
def systems_dir() -> Path:
    """``aiconfigurator_core/systems`` of the installed, pinned package (not imported: only
    its data files are read)."""
    version = installed_version()
    if version is None:
        raise AiconfiguratorError(
            "bundle source 'aiconfigurator' needs the optional extra: " + INSTALL_HINT
        )
    if version != PINNED_VERSION:
        raise AiconfiguratorError(
            f"aiconfigurator-core {version} is installed but servesweep reads the tables of "
            f"{PINNED_VERSION} (file layout and units are version-specific): " + INSTALL_HINT
        )
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise AiconfiguratorError("aiconfigurator_core is not importable: " + INSTALL_HINT)
    path = Path(next(iter(spec.submodule_search_locations))) / "systems"
    if not path.is_dir():
        raise AiconfiguratorError(f"{path}: missing from the installed package; reinstall: "
                                  + INSTALL_HINT)
    return path


def system_for(hardware: str) -> str:
    """The aiconfigurator system of one of our hardware names (case-insensitive)."""
    for name, system in SYSTEMS.items():
        if name.lower() == hardware.lower() or system == hardware.lower():
            return system
    raise AiconfiguratorError(
        f"hardware {hardware!r} has no aiconfigurator system; covered: "
        f"{', '.join(f'{k} ({v})' for k, v in SYSTEMS.items())}. Use bundle source "
        "'roofline' (or measured bundles) for it"
    )


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise AiconfiguratorError(f"{path}: cannot read ({exc}); reinstall: {INSTALL_HINT}") from exc
    if not isinstance(data, dict):
        raise AiconfiguratorError(f"{path}: expected a mapping; reinstall: {INSTALL_HINT}")
    return data


@dataclass(frozen=True, slots=True)
class SystemSpec:
    """The figures of one ``systems/<system>.yaml`` we use (SI units as in the file)."""

    name: str
    path: Path
    data_dir: Path
    vllm_version: str
    mem_bw: float  # B/s
    mem_bw_scaling: float  # the file's mem_bw_empirical_scaling_factor
    mem_latency_s: float  # the file's mem_empirical_constant_latency
    mem_capacity: float  # bytes
    bf16_flops: float
    fp8_flops: float
    intra_node_bw: float  # B/s per GPU, one direction
    p2p_latency_s: float
    gpus_per_node: int
    nccl_version: str

    @property
    def effective_bw(self) -> float:
        """The DRAM bandwidth aiconfigurator prices memory-bound work at (B/s)."""
        return self.mem_bw * self.mem_bw_scaling

    def dram_floor_us(self, nbytes: np.ndarray) -> np.ndarray:
        """aiconfigurator's memory-op time for ``nbytes`` distinct bytes (µs): its constant
        latency plus the bytes at its effective bandwidth. No kernel reading that many
        distinct bytes from DRAM can be faster."""
        return (self.mem_latency_s + np.asarray(nbytes, dtype=np.float64) / self.effective_bw) * 1e6


def _vllm_version(root: Path, system: str) -> str:
    doc = _read_yaml(root / "query_versions.yaml")
    slot = (doc.get("overrides") or {}).get(system, {}).get("vllm") or doc["defaults"]["vllm"]
    return str(slot["current"])


@cache
def load_system(system: str) -> SystemSpec:
    """The system YAML of ``system`` (e.g. ``h100_sxm``) and its current vLLM version."""
    root = systems_dir()
    path = root / f"{system}.yaml"
    if not path.is_file():
        raise AiconfiguratorError(f"{path}: no such system in aiconfigurator-core {PINNED_VERSION}")
    doc = _read_yaml(path)
    gpu, node, misc = doc.get("gpu") or {}, doc.get("node") or {}, doc.get("misc") or {}
    try:
        return SystemSpec(
            name=system,
            path=path,
            data_dir=root / str(doc["data_dir"]),
            vllm_version=_vllm_version(root, system),
            mem_bw=float(gpu["mem_bw"]),
            mem_bw_scaling=float(gpu.get("mem_bw_empirical_scaling_factor", 1.0)),
            mem_latency_s=float(gpu.get("mem_empirical_constant_latency", 0.0)),
            mem_capacity=float(gpu["mem_capacity"]),
            bf16_flops=float(gpu["bfloat16_tc_flops"]),
            fp8_flops=float(gpu.get("fp8_tc_flops", 0.0)),
            intra_node_bw=float(node["intra_node_bw"]),
            p2p_latency_s=float(node.get("p2p_latency", 0.0)),
            gpus_per_node=int(node["num_gpus_per_node"]),
            nccl_version=str(misc.get("nccl_version", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise AiconfiguratorError(f"{path}: missing or bad key {exc}; reinstall: {INSTALL_HINT}") from exc


def table_path(system: SystemSpec, op: str, filename: str, framework: str = "vllm",
               version: str | None = None) -> Path:
    """``<data_dir>/<op>/<framework>/<version>/<filename>`` (the system's vLLM version)."""
    path = system.data_dir / op / framework / (version or system.vllm_version) / filename
    if not path.is_file():
        raise AiconfiguratorError(
            f"{path}: aiconfigurator-core {PINNED_VERSION} ships no {op} table for "
            f"{system.name} ({framework} {version or system.vllm_version})"
        )
    return path


def _read_table(path: Path, columns: list[str],
                optional: dict[str, object] | None = None) -> pd.DataFrame:
    """``columns`` of the Parquet table at ``path``; ``optional`` columns missing from the
    file take their default (A100's 0.14 attention tables have no ``window_size``)."""
    optional = optional or {}
    try:
        present = set(pq.read_schema(path).names)
        frame = pd.read_parquet(path, columns=[c for c in columns
                                               if c in present or c not in optional])
        for col, default in optional.items():
            if col not in frame:
                frame[col] = default
    except (OSError, ValueError, KeyError) as exc:  # pyarrow raises ArrowInvalid (a ValueError)
        raise AiconfiguratorError(
            f"{path}: cannot read columns {columns} ({exc}); the table layout of "
            f"aiconfigurator-core {PINNED_VERSION} is expected"
        ) from exc
    lat = frame["latency"].to_numpy(dtype=np.float64)
    if len(frame) == 0 or not np.all(np.isfinite(lat)) or np.any(lat <= 0):
        raise AiconfiguratorError(f"{path}: empty or non-positive latencies")
    return frame


# --------------------------------------------------------------------------- interpolation


def _bracket(xs: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices (lo, hi) and weight of ``q`` on sorted ``xs``: clamped below, linear inside,
    and the top two points above (the caller scales beyond the top)."""
    n = len(xs)
    if n == 1:
        z = np.zeros(q.shape, dtype=np.int64)
        return z, z, np.zeros(q.shape)
    qc = np.clip(q, xs[0], xs[-1])
    hi = np.clip(np.searchsorted(xs, qc, side="left"), 1, n - 1)
    lo = hi - 1
    w = (qc - xs[lo]) / (xs[hi] - xs[lo])
    return lo, hi, w


@dataclass(frozen=True, slots=True)
class Curve1D:
    """Latency (µs) against one sorted key, linear inside; ``power`` sets the scaling beyond
    the top sample (``t(top) * (q/top)**power``: 1 where work grows linearly, 2 for causal
    attention over the sequence length); clamped below the first sample."""

    keys: np.ndarray
    values: np.ndarray
    power: float = 1.0

    def __call__(self, q: np.ndarray | float) -> np.ndarray:
        qa = np.asarray(q, dtype=np.float64)
        lo, hi, w = _bracket(self.keys, qa)
        v = self.values[lo] + w * (self.values[hi] - self.values[lo])
        top = self.keys[-1]
        return np.where(qa > top, self.values[-1] * (qa / top) ** self.power, v)


@dataclass(frozen=True, slots=True)
class GemmTable:
    """GEMM latency on a (m, n, k) grid; trilinear inside, proportional in m, n and k beyond
    the largest sample (the work of a GEMM grows linearly in each)."""

    path: Path
    kernel: str
    ms: np.ndarray
    ns: np.ndarray
    ks: np.ndarray
    grid: np.ndarray  # [m, n, k] µs, holes filled

    def __call__(self, m: np.ndarray, n: int, k: int) -> np.ndarray:
        ma = np.asarray(m, dtype=np.float64)
        out = np.zeros(ma.shape)
        nl, nh, nw = (a[()] for a in _bracket(self.ns, np.asarray(float(n))))
        kl, kh, kw = (a[()] for a in _bracket(self.ks, np.asarray(float(k))))
        ml, mh, mw = _bracket(self.ms, ma)
        for ni, nwt in ((nl, 1 - nw), (nh, nw)):
            for ki, kwt in ((kl, 1 - kw), (kh, kw)):
                if nwt == 0 or kwt == 0:
                    continue
                col = self.grid[:, ni, ki]
                out += nwt * kwt * (col[ml] + mw * (col[mh] - col[ml]))
        scale = max(n / self.ns[-1], 1.0) * max(k / self.ks[-1], 1.0)
        return out * scale * np.maximum(ma / self.ms[-1], 1.0)


def _fill_holes(grid: np.ndarray, ms: np.ndarray) -> np.ndarray:
    """Fill missing (m, n, k) cells: along m by interpolation (proportional beyond the
    largest measured m), then columns with no sample at all from the next smaller n at the
    same k, scaled by n (both are linear in n)."""
    out = grid.copy()
    for j in range(out.shape[1]):
        for k in range(out.shape[2]):
            col = out[:, j, k]
            ok = np.isfinite(col)
            if ok.all() or not ok.any():
                continue
            curve = Curve1D(ms[ok].astype(np.float64), col[ok])
            col[~ok] = curve(ms[~ok].astype(np.float64))
    return out


def _fill_columns(grid: np.ndarray, ns: np.ndarray, path: Path) -> np.ndarray:
    for j in range(grid.shape[1]):
        for k in range(grid.shape[2]):
            if np.isfinite(grid[:, j, k]).all():
                continue
            donors = [i for i in range(j - 1, -1, -1) if np.isfinite(grid[:, i, k]).all()]
            donors += [i for i in range(j + 1, grid.shape[1]) if np.isfinite(grid[:, i, k]).all()]
            if not donors:
                raise AiconfiguratorError(f"{path}: no GEMM sample at k={k} for any n")
            grid[:, j, k] = grid[:, donors[0], k] * ns[j] / ns[donors[0]]
    return grid


# GEMM kernel (vLLM's linear method) per weight dtype: unquantised layers run
# torch.nn.functional.linear (vllm/model_executor/layers/linear.py UnquantizedLinearMethod);
# fp8 W8A8 the per-tensor CUTLASS scaled-mm kernel. A100's 0.14 table names its one kernel
# vllm_default.
_GEMM_KERNELS = {"bf16": ("torch.nn.functional.linear", "vllm_default"),
                 "fp16": ("torch.nn.functional.linear", "vllm_default"),
                 "fp8": ("CutlassFP8ScaledMMLinearKernel",)}
_GEMM_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}


@cache
def gemm_table(system: str, weights: str) -> GemmTable:
    """The GEMM table of ``system`` for weight dtype ``weights`` (``bf16``, ``fp16``, ``fp8``;
    fp16 reads the bf16 rows: same tensor-core rate and bytes)."""
    spec = load_system(system)
    if weights not in _GEMM_DTYPES:
        raise AiconfiguratorError(
            f"weight dtype {weights!r}: aiconfigurator GEMM tables are read for "
            f"{sorted(_GEMM_DTYPES)}; use bundle source 'roofline' for it"
        )
    path = table_path(spec, "gemm", "gemm_perf.parquet")
    frame = _read_table(path, ["kernel_source", "gemm_dtype", "m", "n", "k", "latency"])
    rows = frame[frame["gemm_dtype"] == _GEMM_DTYPES[weights]]
    kernels = [k for k in _GEMM_KERNELS[weights] if (rows["kernel_source"] == k).any()]
    if not kernels:
        raise AiconfiguratorError(
            f"{path}: no {_GEMM_DTYPES[weights]} rows of kernel {_GEMM_KERNELS[weights]}; "
            f"present: {sorted(set(zip(frame['kernel_source'], frame['gemm_dtype'], strict=True)))}"
        )
    rows = rows[rows["kernel_source"] == kernels[0]]
    rows = rows.groupby(["m", "n", "k"], as_index=False)["latency"].median()
    ms, ns, ks = (np.sort(rows[c].unique()).astype(np.float64) for c in ("m", "n", "k"))
    grid = np.full((len(ms), len(ns), len(ks)), np.nan)
    grid[np.searchsorted(ms, rows["m"]), np.searchsorted(ns, rows["n"]),
         np.searchsorted(ks, rows["k"])] = rows["latency"].to_numpy() * MS_TO_US
    grid = _fill_columns(_fill_holes(grid, ms), ns, path)
    return GemmTable(path=path, kernel=kernels[0], ms=ms, ns=ns, ks=ks, grid=grid)


# --------------------------------------------------------------------------- attention


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """Per-rank attention shape the tables are keyed on."""

    heads: int
    kv_heads: int
    head_dim: int
    kv_dtype: str  # "bfloat16" or "fp8" (the tables' names)


@dataclass(frozen=True, slots=True)
class AttentionTables:
    """Prefill (context) and decode (generation) attention of one shape on one system."""

    context_path: Path
    generation_path: Path
    context_lane: str
    generation_lane: str
    shape_used: AttentionShape  # the table slice read (same group and head dim)
    head_scale: float  # heads asked / heads of the slice read (1 when exact)
    prefill: Curve1D  # one sequence, no history, by input length (µs)
    decode_steps: np.ndarray  # KV lengths of the decode curves
    decode_by_step: tuple[Curve1D, ...] = field(repr=False)  # per KV length: by batch

    def prefill_us(self, tokens: np.ndarray) -> np.ndarray:
        """One causal prefill of ``tokens`` with no history (µs)."""
        return self.prefill(tokens) * self.head_scale

    def decode_us(self, batch: np.ndarray, kv: np.ndarray) -> np.ndarray:
        """``batch`` decodes each with ``kv`` cached tokens (µs): linear in the KV length
        between measured lengths, proportional beyond the longest."""
        b = np.asarray(batch, dtype=np.float64)
        q = np.asarray(kv, dtype=np.float64)
        steps = self.decode_steps
        lo, hi, w = _bracket(steps, q)
        v_lo = np.empty(b.shape)
        v_hi = np.empty(b.shape)
        for i, curve in enumerate(self.decode_by_step):
            sel = lo == i
            if sel.any():
                v_lo[sel] = curve(b[sel])
            sel = hi == i
            if sel.any():
                v_hi[sel] = curve(b[sel])
        v = v_lo + w * (v_hi - v_lo)
        v = np.where(q > steps[-1], v_hi * (q + 1.0) / (steps[-1] + 1.0), v)
        return v * self.head_scale


_SHAPE_COLS = ["kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads",
               "head_dim", "kv_cache_dtype", "window_size", "step", "latency"]


def _densest_lane(frame: pd.DataFrame, path: Path, kv_dtype: str) -> tuple[str, pd.DataFrame]:
    """The kernel lane with the most rows for ``kv_dtype`` (full attention): the one the
    collector swept as the framework's backend for that dtype on this system."""
    rows = frame[(frame["kv_cache_dtype"] == kv_dtype) & (frame["window_size"] == 0)]
    if rows.empty:
        raise AiconfiguratorError(f"{path}: no full-attention rows with KV cache {kv_dtype}")
    lane = str(rows["kernel_source"].value_counts().idxmax())
    return lane, rows[rows["kernel_source"] == lane]


def _pick_shape(rows: pd.DataFrame, want: AttentionShape, path: Path) -> tuple[AttentionShape, float]:
    """The slice to read for ``want``: exact, else the same head dim and GQA group with the
    nearest head count (attention work is linear in heads at a fixed group), scaled."""
    have = rows.groupby(["num_heads", "num_key_value_heads", "head_dim"]).size().index
    if (want.heads, want.kv_heads, want.head_dim) in have:
        return want, 1.0
    group = want.heads / want.kv_heads
    same = [(h, kvh) for h, kvh, d in have if d == want.head_dim and h / kvh == group]
    if not same:
        raise AiconfiguratorError(
            f"{path}: no attention rows for heads={want.heads}, kv_heads={want.kv_heads}, "
            f"head_dim={want.head_dim} nor any slice with that head dim and GQA group; "
            "use bundle source 'roofline' for this model"
        )
    h, kvh = min(same, key=lambda hk: (abs(np.log(hk[0] / want.heads)), -hk[0]))
    return AttentionShape(int(h), int(kvh), want.head_dim, want.kv_dtype), want.heads / h


@cache
def attention_tables(system: str, want: AttentionShape) -> AttentionTables:
    """Prefill and decode attention tables of ``want`` on ``system``."""
    spec = load_system(system)
    cpath = table_path(spec, "attention", "context_attention_perf.parquet")
    gpath = table_path(spec, "attention", "generation_attention_perf.parquet")
    full = {"window_size": 0}  # absent: every row is full attention
    clane, ctx = _densest_lane(_read_table(cpath, _SHAPE_COLS, full), cpath, want.kv_dtype)
    glane, gen = _densest_lane(_read_table(gpath, _SHAPE_COLS, full), gpath, want.kv_dtype)
    shape, scale = _pick_shape(ctx, want, cpath)
    gshape, gscale = _pick_shape(gen, want, gpath)
    if gshape != shape:
        raise AiconfiguratorError(
            f"{cpath} / {gpath}: the prefill and decode tables hold different slices for "
            f"{want}; use bundle source 'roofline' for this model"
        )

    def sel(f: pd.DataFrame) -> pd.DataFrame:
        return f[(f["num_heads"] == shape.heads) & (f["num_key_value_heads"] == shape.kv_heads)
                 & (f["head_dim"] == shape.head_dim)]

    one = sel(ctx)
    one = one[(one["batch_size"] == 1) & (one["step"] == 0)]
    one = one.groupby("isl")["latency"].median()
    if len(one) < 2:
        raise AiconfiguratorError(f"{cpath}: fewer than two batch-1 prefill rows for {shape}")
    prefill = Curve1D(one.index.to_numpy(np.float64), one.to_numpy() * MS_TO_US, power=2.0)
    dec = sel(gen).groupby(["step", "batch_size"])["latency"].median()
    steps, curves = [], []
    for step, part in dec.groupby(level=0):
        batch = part.index.get_level_values(1).to_numpy(np.float64)
        curves.append(Curve1D(batch, part.to_numpy() * MS_TO_US, power=1.0))
        steps.append(float(step))
    if len(steps) < 2:
        raise AiconfiguratorError(f"{gpath}: fewer than two decode KV lengths for {shape}")
    return AttentionTables(
        context_path=cpath, generation_path=gpath, context_lane=clane, generation_lane=glane,
        shape_used=shape, head_scale=scale, prefill=prefill,
        decode_steps=np.asarray(steps), decode_by_step=tuple(curves),
    )


# --------------------------------------------------------------------------- MoE


@dataclass(frozen=True, slots=True)
class MoeTable:
    """Fused-MoE latency of one layer shape, one rank holding every expert (MoE TP = EP = 1),
    by token count (µs), under ``distribution`` routing (balanced where measured);
    non-decreasing in tokens (the lower envelope of the measured rows from above)."""

    path: Path
    kernel: str
    distribution: str
    curve: Curve1D
    lowered: int = 0  # token counts priced at a larger count's (smaller) time

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        return self.curve(tokens)


_MOE_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}
# Routing distributions in order of preference: balanced (every expert equally loaded, what
# the latency model's routing assumes), else the least skewed power law (A100's 0.14 table
# has no balanced rows).
_MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01", "power_law_1.2")


@cache
def moe_table(system: str, weights: str, hidden: int, inter: int, top_k: int,
              experts: int) -> MoeTable:
    """The MoE table of one layer shape (``inter`` = one expert's intermediate size)."""
    spec = load_system(system)
    path = table_path(spec, "moe", "moe_perf.parquet")
    cols = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk",
            "num_experts", "moe_tp_size", "moe_ep_size", "distribution", "latency"]
    frame = _read_table(path, cols)
    dtype = _MOE_DTYPES.get(weights)
    rows = frame[(frame["moe_dtype"] == dtype) & (frame["hidden_size"] == hidden)
                 & (frame["inter_size"] == inter) & (frame["topk"] == top_k)
                 & (frame["num_experts"] == experts) & (frame["moe_tp_size"] == 1)
                 & (frame["moe_ep_size"] == 1)]
    dist = next((d for d in _MOE_DISTRIBUTIONS if (rows["distribution"] == d).any()), None)
    rows = rows[rows["distribution"] == dist]
    if rows.empty:
        shapes = sorted(set(zip(frame["hidden_size"], frame["inter_size"], frame["topk"],
                                frame["num_experts"], strict=True)))
        raise AiconfiguratorError(
            f"{path}: no {dtype} MoE rows for hidden={hidden}, inter={inter}, "
            f"top_k={top_k}, experts={experts} at MoE TP=EP=1; shapes present "
            f"(hidden, inter, top_k, experts): {shapes}. Use bundle source 'roofline'"
        )
    kernel = str(rows["kernel_source"].value_counts().idxmax())
    rows = rows[rows["kernel_source"] == kernel].groupby("num_tokens")["latency"].median()
    raw = rows.to_numpy() * MS_TO_US
    # Fewer tokens on the same experts are a subset of the work (the same weights, fewer
    # routed rows), so no token count is priced above a larger one: the lower envelope
    # from above. vLLM 0.24's FlashInfer CUTLASS rows are not monotone on the RTX PRO 6000
    # (32 / 48 tokens at 1,047 / 981 µs against 835 µs at 64, the kernel's per-size tactic);
    # vLLM 0.19's kernel on the same card is (the measured bundle: 822 / 828 µs).
    envelope = np.minimum.accumulate(raw[::-1])[::-1]
    curve = Curve1D(rows.index.to_numpy(np.float64), envelope)
    return MoeTable(path=path, kernel=kernel, distribution=str(dist), curve=curve,
                    lowered=int(np.sum(envelope < raw)))


# --------------------------------------------------------------------------- collectives


@dataclass(frozen=True, slots=True)
class CollectiveTable:
    """One collective's latency (µs) by message bytes, per GPU count."""

    path: Path
    kernel: str
    by_gpus: dict[int, Curve1D]

    def __call__(self, gpus: int, nbytes: float) -> float:
        curve = self.by_gpus.get(gpus)
        if curve is None:
            raise AiconfiguratorError(
                f"{self.path}: no {self.kernel} rows for {gpus} GPUs; measured: {sorted(self.by_gpus)}"
            )
        return float(curve(np.asarray(float(nbytes))))


def _collective(path: Path, frame: pd.DataFrame, kernel: str) -> CollectiveTable:
    rows = frame[frame["kernel_source"] == kernel]
    if rows.empty:
        raise AiconfiguratorError(f"{path}: no {kernel} rows")
    by_gpus = {}
    for gpus, part in rows.groupby("num_gpus"):
        part = part.groupby("message_size")["latency"].median()
        by_gpus[int(gpus)] = Curve1D(part.index.to_numpy(np.float64), part.to_numpy() * MS_TO_US)
    return CollectiveTable(path=path, kernel=kernel, by_gpus=by_gpus)


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in v.split("."))


def _newest_with(spec: SystemSpec, op: str, filename: str) -> str:
    """The system's vLLM version when it has ``filename`` for ``op``, else the newest
    version at or below it that does (L40S's custom all-reduce: 0.22.0 beside 0.24.0
    tables), else the newest of all."""
    base = spec.data_dir / op / "vllm"
    have = sorted((p.name for p in base.glob("*") if (p / filename).is_file()), key=_version_key)
    if not have:
        return spec.vllm_version  # table_path names the missing file
    older = [v for v in have if _version_key(v) <= _version_key(spec.vllm_version)]
    return (older or have)[-1]


@cache
def custom_allreduce_table(system: str, graph: bool = False, version: str | None = None
                           ) -> CollectiveTable:
    """vLLM's custom all-reduce (bf16) by GPUs and message bytes; ``graph`` the CUDA-graph
    captured timing, else eager; ``version`` defaults to the system's vLLM version (or the
    newest older one with the table)."""
    spec = load_system(system)
    if version is None:
        version = _newest_with(spec, "comm", "custom_allreduce_perf.parquet")
    path = table_path(spec, "comm", "custom_allreduce_perf.parquet", version=version)
    frame = _read_table(path, ["kernel_source", "allreduce_dtype", "num_gpus", "message_size",
                               "latency"])
    return _collective(path, frame, "vLLM_custom_graph" if graph else "vLLM_custom_eager")


@cache
def nccl_table(system: str, op: str) -> CollectiveTable:
    """NCCL ``op`` (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``alltoall``) in half
    precision by GPUs and message bytes, at the system's NCCL version."""
    spec = load_system(system)
    path = table_path(spec, "comm", "nccl_perf.parquet", framework="nccl",
                      version=spec.nccl_version)
    frame = _read_table(path, ["op_name", "kernel_source", "nccl_dtype", "num_gpus",
                               "message_size", "latency"])
    rows = frame[(frame["op_name"] == op) & (frame["nccl_dtype"] == "half")]
    return _collective(path, rows, "NCCL")


def versions_summary(system: str) -> dict[str, str]:
    """vLLM / NCCL versions of the tables read for ``system`` (for meta.yaml and reports)."""
    spec = load_system(system)
    return {"aiconfigurator_core": PINNED_VERSION, "system": system,
            "vllm_tables": spec.vllm_version, "nccl": spec.nccl_version}

