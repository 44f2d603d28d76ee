"""Build our bundle layout for one (system, model, TP, dtype) from aiconfigurator's tables.

The bundle is the LLMServingSim layout ``profiles.bundle`` reads (``meta.yaml``, ``tp<N>/``
with ``dense.csv``, ``per_sequence.csv``, ``attention.csv`` and, in ``tp1/`` of MoE models,
``moe.csv``), on the profiler's own key grids (``profiles.roofline.grid``), so the engine and
the latency model use it unchanged. Per table (docs/aiconfigurator.md gives the evidence):

- **GEMM rows** (``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``, ``lm_head``): the
  system's vLLM GEMM table at the rank's (m = tokens or sequences, n, k), floored by the
  DRAM time of the layer's bytes (``profiles.roofline.cost`` counts them; the floor is
  aiconfigurator's own memory-op model: its constant latency plus bytes at
  ``mem_bw * mem_bw_empirical_scaling_factor``).
- **Attention** (the 4-D table): a prefill chunk is aiconfigurator's batch-1 prefill of the
  chunk plus what its KV history (which the tables do not sweep) adds in the roofline model,
  t(chunk, history) - t(chunk, 0). A set of decodes is aiconfigurator's decode table at
  (decodes, KV length), never below the table's own time at its shortest KV length plus the
  DRAM time of the additional KV (the tables run below DRAM speed for KV sets that stay in
  the collector's L2 cache; a serving step's KV does not). A call holding both is the sum of
  its parts plus the roofline's interaction t(mixed) - t(prefill) - t(decodes): the vLLM
  FlashAttention varlen call that runs them together re-reads each decode's K/V per query
  head and launches empty query tiles, which aiconfigurator's separate prefill and decode
  tables cannot show; never below either part alone. Both roofline terms are differences,
  added in µs, so the roofline's error on the parts (which aiconfigurator measures) cancels
  and a per-call fixed cost is not scaled by the history or the decodes.
- **MoE** (``tp1/moe.csv``): aiconfigurator's fused-MoE table (MoE TP = EP = 1, balanced
  routing) at the token count; a row with fewer activated experts than balanced routing
  hits streams only their weights: the DRAM time of its bytes plus what the measured row
  spent beyond streaming its own (compute, routing, activations).
- **Everything aiconfigurator has no vLLM table for** (embedding, norms, rotary, activation,
  sampler): the roofline model's rows, exactly as a roofline bundle has them.
- **Skew** (``tp<N>/skew_fit.csv``): every aiconfigurator decode row has one KV length for
  the whole batch, so the alpha of a batch whose decodes differ is derived from how the
  FlashAttention kernel spreads (request, head, split) CTAs over the GPU's SMs, with tile
  costs solved on the system's own uniform decode table (:mod:`profiles.aiconfigurator.skew`).

``meta.yaml`` records the source of every layer (table file, kernel lane, vLLM version) and
``source: aiconfigurator <version> <system>``, the label sweeps and validation report.
:func:`ensure_bundle` caches bundles under ``<cache_dir()>/aiconfigurator-<key>/`` (the
roofline cache root), keyed by everything that determines the numbers.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from engine.specs import ConfigError, HardwareSpec, ModelSpec
from profiles.aiconfigurator.skew import (
    KERNEL_LIMITS,
    SKEW_FACTOR,
    derive_skew_table,
    model_for,
)
from profiles.aiconfigurator.tables import (
    PINNED_VERSION,
    AiconfiguratorError,
    AttentionShape,
    AttentionTables,
    SystemSpec,
    attention_tables,
    gemm_table,
    load_system,
    moe_table,
    system_for,
    systems_dir,
)
from profiles.architecture import load_architecture
from profiles.bundle import DEFAULT_BUCKET_AXES, clear_bundle_cache
from profiles.roofline.cost import (
    Precision,
    RankShape,
    attention_call_work,
    attention_work,
    dense_work,
    moe_work,
    parse_variant,
    per_sequence_work,
)
from profiles.roofline.factors import RooflineFactors, load_factors
from profiles.roofline.generate import cache_dir, dense_table, kernel_time_us, per_sequence_table
from profiles.roofline.grid import (
    GridSpec,
    attention_keys,
    dense_tokens,
    moe_keys,
    per_sequence_counts,
)

GENERATOR_VERSION = 9
GENERATOR = "servesweep.profiles.aiconfigurator"

# GEMM layers of the dense / per-sequence tables: (n, k) of the rank's weight.
_GEMM_LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def source_label(system: str) -> str:
    """``aiconfigurator <version> <system>``: where a bundle's latencies come from."""
    return f"aiconfigurator {PINNED_VERSION} {system}"


def _gemm_nk(layer: str, s: RankShape) -> tuple[int, int]:
    """(n, k) of a GEMM layer on one rank (the shapes ``profiles.roofline.cost`` prices)."""
    d = s.head_dim
    return {
        "qkv_proj": ((s.heads + 2 * s.kv_heads) * d, s.hidden),
        "o_proj": (s.hidden, s.heads * d),
        "gate_up_proj": (2 * s.inter, s.hidden),
        "down_proj": (s.hidden, s.inter),
        "lm_head": (s.vocab, s.hidden),
    }[layer]


def _weights(variant: str) -> str:
    return variant.partition("-kv")[0]


def _kv_dtype(precision: Precision) -> str:
    return "fp8" if precision.kv_bytes == 1.0 else "bfloat16"


class _Builder:
    """Tables of one (hardware, model, variant) on one aiconfigurator system."""

    def __init__(self, hardware: HardwareSpec, model: ModelSpec, variant: str, system: str,
                 factors: RooflineFactors, grid: GridSpec) -> None:
        self.hw, self.model, self.variant = hardware, model, variant
        self.system: SystemSpec = load_system(system)
        self.precision = parse_variant(variant)
        self.factors, self.grid = factors, grid
        self.arch = load_architecture(model.model_type)
        self.gemm = gemm_table(system, _weights(variant))
        self.sources: dict[str, str] = {}
        self.skew_entries: dict[int, dict[str, object]] = {}

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.system.data_dir.parent.parent))

    # ---------------------------------------------------------------- dense / per-sequence

    def _gemm_us(self, layer: str, shape: RankShape, m: np.ndarray, per_sequence: bool) -> np.ndarray:
        n, k = _gemm_nk(layer, shape)
        t = self.gemm(m, n, k)
        work = (per_sequence_work(layer, shape, m) if per_sequence
                else dense_work(layer, shape, self.precision, m))
        self.sources[layer] = f"{self._rel(self.gemm.path)} [{self.gemm.kernel}]"
        return np.maximum(t, self.system.dram_floor_us(work.bytes))

    def dense(self, tp: int) -> pd.DataFrame:
        tokens = dense_tokens(self.grid)
        frame = dense_table(self.hw, self.model, tp, self.precision, self.factors, self.grid)
        for layer in _GEMM_LAYERS:
            rows = frame["layer"] == layer
            if rows.any():
                shape = RankShape.of(self.model, tp)
                frame.loc[rows, "time_us"] = self._gemm_us(layer, shape, tokens, False)
        for layer in sorted(set(frame["layer"]) - set(_GEMM_LAYERS)):
            self.sources[layer] = "roofline (aiconfigurator has no vLLM table for it)"
        return frame

    def per_sequence(self, tp: int) -> pd.DataFrame:
        seqs = per_sequence_counts(self.grid)
        frame = per_sequence_table(self.hw, self.model, tp, self.factors, self.grid)
        rows = frame["layer"] == "lm_head"
        frame.loc[rows, "time_us"] = self._gemm_us("lm_head", RankShape.of(self.model, tp),
                                                   seqs, True)
        self.sources["sampler"] = "roofline (aiconfigurator has no vLLM table for it)"
        return frame

    # ---------------------------------------------------------------- attention

    def _attention(self, tp: int) -> AttentionTables:
        s = RankShape.of(self.model, tp)
        want = AttentionShape(s.heads, s.kv_heads, s.head_dim, _kv_dtype(self.precision))
        tabs = attention_tables(self.system.name, want)
        note = "" if tabs.head_scale == 1 else (
            f", read at heads={tabs.shape_used.heads} kv_heads={tabs.shape_used.kv_heads} "
            f"x {tabs.head_scale:g}")
        self.sources["attention"] = (
            f"{self._rel(tabs.context_path)} [{tabs.context_lane}] + "
            f"{self._rel(tabs.generation_path)} [{tabs.generation_lane}]{note}; history and "
            "mixed-call costs added from the roofline model")
        return tabs

    def _roofline_attention(self, s: RankShape, pc, kp, nd, kv) -> np.ndarray:
        work = attention_work(s, self.precision, pc, kp, nd, kv)
        return kernel_time_us(work, self.factors.for_layer("attention"), self.hw)

    def attention(self, tp: int) -> pd.DataFrame:
        tabs = self._attention(tp)
        s = RankShape.of(self.model, tp)
        keys = attention_keys(self.grid)
        pc, kp, nd, kv = (keys[:, i] for i in range(4))
        zero = np.zeros_like(pc)
        has_p, has_d = pc > 0, nd > 0
        # Prefill part: aiconfigurator at the chunk plus the roofline's cost of its history
        # (r(chunk, history) - r(chunk, 0): the extra KV tiles walked; the call's fixed cost
        # is aiconfigurator's and does not grow with the history).
        r_p = self._roofline_attention(s, pc, kp, zero, zero)
        r_p0 = self._roofline_attention(s, pc, zero, zero, zero)
        prefill = np.where(has_p, tabs.prefill_us(np.maximum(pc, 1)) + (r_p - r_p0), 0.0)
        # Decode part: aiconfigurator, never faster than its own fixed cost at this batch
        # (its shortest measured KV length) plus streaming the extra KV from DRAM.
        nd1 = np.maximum(nd, 1)
        kv0 = np.full_like(kv, int(tabs.decode_steps[0]))
        extra = (attention_call_work(s, self.precision, zero, zero, nd, kv).bytes
                 - attention_call_work(s, self.precision, zero, zero, nd, kv0).bytes)
        stream = np.maximum(extra, 0.0) / self.system.effective_bw * 1e6
        decode = np.where(has_d, np.maximum(tabs.decode_us(nd1, kv),
                                            tabs.decode_us(nd1, kv0) + stream), 0.0)
        # One varlen call holding both: its parts plus the roofline's interaction, the time
        # the one call spends beyond its two parts run alone (r_full - r_p - r_d).
        r_d = self._roofline_attention(s, zero, zero, nd, kv)
        r_full = self._roofline_attention(s, pc, kp, nd, kv)
        mixed = has_p & has_d
        interaction = np.where(mixed, r_full - r_p - r_d, 0.0)
        # A call is never faster than its prefill or its decodes alone.
        time_us = np.maximum(prefill + decode + interaction, np.maximum(prefill, decode))
        df = pd.DataFrame(keys, columns=["prefill_chunk", "kv_prefill", "n_decode", "kv_decode"])
        df["time_us"] = time_us
        return df

    def skew(self, tp: int) -> tuple[pd.DataFrame, dict[str, object]]:
        """The derived alpha bucket table of ``tp`` and its ``skew_fit.per_tp`` entry."""
        s = RankShape.of(self.model, tp)
        tabs = self._attention(tp)
        sm = model_for(self.system.name, self.system.effective_bw, tabs, s.heads, s.kv_heads,
                       s.head_dim, self.precision.kv_bytes)
        grid, cost = sm.grid, sm.cost
        table, default, samples = derive_skew_table(grid, cost)
        entry: dict[str, object] = {
            "method": "derived: FlashAttention CTA list scheduling (profiles.aiconfigurator.skew)",
            "n_samples": len(samples),
            "alpha_default": round(default, 4),
            "bucket_table": f"tp{tp}/skew_fit.csv",
            "kernel": {"sms": grid.sms, "slots": grid.slots, "block_n": grid.block_n,
                       "heads": grid.heads, "kv_heads": grid.kv_heads},
            "tile_cost": {"decode_c_us": round(cost.c, 4),
                          "dram_tile_us": round(sm.dram_tile_us, 4),
                          "compute_c_us": round(cost.c_compute, 4), "rho": round(cost.rho, 4),
                          "decode_rows": cost.rows, "prefill_lengths": list(sm.prefill_lengths),
                          "from": self.sources.get("attention", "").split("; ")[0]},
            "design_skew_factor": SKEW_FACTOR,
        }
        return table, entry

    # ---------------------------------------------------------------- MoE

    def moe(self) -> pd.DataFrame:
        m = self.model
        table = moe_table(self.system.name, _weights(self.variant), m.hidden_size,
                          m.moe_intermediate_size or m.intermediate_size,
                          m.num_experts_per_tok, m.num_experts)
        keys = moe_keys(m.num_experts, m.num_experts_per_tok, self.grid)
        tokens, activated = keys[:, 0], keys[:, 1]
        shape = RankShape.of(m, 1)
        # aiconfigurator measures balanced routing: tokens * top_k rows over
        # min(E, tokens * top_k) experts. A row with fewer activated experts streams fewer
        # weights: the DRAM time of its own bytes plus what the measurement spent beyond
        # streaming the balanced row's bytes (compute, routing, activations).
        balanced = np.minimum(m.num_experts, tokens * m.num_experts_per_tok)
        stream = self.system.dram_floor_us(moe_work(shape, self.precision, tokens, activated).bytes)
        stream_bal = self.system.dram_floor_us(moe_work(shape, self.precision, tokens, balanced).bytes)
        experts = stream + np.maximum(table(tokens) - stream_bal, 0.0)
        # The block is more than aiconfigurator's fused_experts call (its collector passes
        # precomputed top-k ids): vLLM's Qwen3MoeSparseMoeBlock / MixtralMoE run the router
        # (a replicated unquantised linear, hidden -> experts: the GEMM table, as
        # aiconfigurator's own MoE block emits its router GEMM) and FusedMoE's select_experts
        # runs the topk_softmax kernel (vllm/model_executor/layers/fused_moe/fused_moe.py
        # fused_topk): a memory-bound launch reading the bf16 logits and writing top-k
        # weights, ids and token indices (4 bytes each), priced by aiconfigurator's memory-op
        # model (its constant latency plus the bytes at its bandwidth).
        router = self.gemm(tokens, m.num_experts, m.hidden_size)
        topk_bytes = tokens * (m.num_experts * 2.0 + m.num_experts_per_tok * 12.0)
        t = experts + router + self.system.dram_floor_us(topk_bytes)
        envelope = f", {table.lowered} token counts on the lower envelope" if table.lowered else ""
        self.sources["moe"] = (f"{self._rel(table.path)} [{table.kernel}], MoE TP=EP=1, "
                               f"{table.distribution} routing{envelope}; router GEMM "
                               f"{self._rel(self.gemm.path)} [{self.gemm.kernel}]; top-k "
                               "softmax as a memory op")
        return pd.DataFrame({"tokens": tokens, "activated_experts": activated, "time_us": t})


# --------------------------------------------------------------------------- writing


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    out = df.copy()
    t = out["time_us"].to_numpy(dtype=np.float64)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise AiconfiguratorError(f"{path}: derived a non-positive or non-finite time; this is "
                                  "a bug in profiles.aiconfigurator.build")
    out["time_us"] = [float(f"{v:.6g}") for v in np.maximum(t, 1e-3)]
    out.to_csv(path, index=False)


def _write_tp_dir(dest: Path, b: _Builder, tp: int) -> None:
    """Write ``dest`` (a ``tp<N>`` folder) atomically: build in a sibling temp dir, rename."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        _write_csv(b.dense(tp), tmp / "dense.csv")
        _write_csv(b.per_sequence(tp), tmp / "per_sequence.csv")
        _write_csv(b.attention(tp), tmp / "attention.csv")
        if b.model.is_moe and tp == 1:
            _write_csv(b.moe(), tmp / "moe.csv")
        if b.system.name in KERNEL_LIMITS:
            table, entry = b.skew(tp)
            table.to_csv(tmp / "skew_fit.csv", index=False)
            b.skew_entries[tp] = entry
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _present_tps(vdir: Path) -> list[int]:
    return sorted(int(p.name[2:]) for p in vdir.glob("tp*") if p.is_dir() and p.name[2:].isdigit())


def _skew_block(b: _Builder, tps: list[int], previous: dict | None) -> dict[str, object]:
    """``skew_fit`` of meta.yaml: this build's per-TP entries plus those of TPs built before
    (a ``tp<N>/`` added later keeps the others)."""
    old = ((previous or {}).get("skew_fit") or {}).get("per_tp") or {}
    per_tp = {tp: b.skew_entries.get(tp, old.get(tp)) for tp in tps}
    per_tp = {tp: e for tp, e in per_tp.items() if e}
    if not per_tp:
        return {"enabled": False}
    return {"enabled": True, "bucket_axes": DEFAULT_BUCKET_AXES, "per_tp": per_tp}


def _meta(b: _Builder, tps: list[int], key: str,
          previous: dict | None = None) -> dict[str, object]:
    sysspec = b.system
    return {
        "generator": GENERATOR,
        "generator_version": GENERATOR_VERSION,
        "source": source_label(sysspec.name),
        "hardware": b.hw.name,
        "architecture": b.model.model_type,
        "model": b.model.name,
        "variant": b.variant,
        "tp_degrees": tps,
        "engine_effective": {
            "max_num_batched_tokens": b.grid.max_num_batched_tokens,
            "max_num_seqs": b.grid.max_num_seqs,
            "block_size": 16,
        },
        "aiconfigurator": {
            "version": PINNED_VERSION,
            "system": sysspec.name,
            "system_yaml": sysspec.path.name,
            "vllm_tables": sysspec.vllm_version,
            "dram_floor": {
                "mem_bw": sysspec.mem_bw,
                "mem_bw_empirical_scaling_factor": sysspec.mem_bw_scaling,
                "mem_empirical_constant_latency_s": sysspec.mem_latency_s,
            },
            "layers": dict(sorted(b.sources.items())),
            "cache_key": key,
        },
        "roofline": {"factors_sha256": b.factors.digest(), "factors_system": b.factors.system,
                     "hardware_spec": asdict(b.hw)},
        "skew_fit": _skew_block(b, tps, previous),
    }


def _write_meta(vdir: Path, meta: dict[str, object]) -> None:
    tmp = vdir / ".meta.yaml.tmp"
    tmp.write_text(yaml.safe_dump(meta, sort_keys=False))
    os.replace(tmp, vdir / "meta.yaml")


def bundle_key(hardware: HardwareSpec, model: ModelSpec, variant: str, system: str,
               factors: RooflineFactors, grid: GridSpec) -> str:
    """16 hex digits over everything that determines the bundle's numbers."""
    blob = json.dumps(
        {"generator_version": GENERATOR_VERSION, "aiconfigurator": PINNED_VERSION,
         "system": system, "variant": variant, "hardware": asdict(hardware),
         "model": asdict(model), "factors": factors.to_dict(), "grid": asdict(grid)},
        sort_keys=True, default=str,
    ).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def variant_dir(root: Path, hardware: HardwareSpec, model: ModelSpec, variant: str) -> Path:
    """``<root>/<hardware>/<org>/<model>/<variant>`` (the loader's layout)."""
    parts = model.name.split("/")
    if not model.name or model.name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"model name '{model.name}' must look like '<org>/<model>'")
    return Path(root) / hardware.name / model.name / variant


def _complete(vdir: Path, tp: int, model: ModelSpec) -> bool:
    if not (vdir / "meta.yaml").is_file():
        return False
    for n in sorted({1, tp}):
        names = ["dense.csv", "per_sequence.csv", "attention.csv"]
        if model.is_moe and n == 1:
            names.append("moe.csv")
        if not all((vdir / f"tp{n}" / f).is_file() for f in names):
            return False
    return True


def _generate(vdir: Path, b: _Builder, tp: int, key: str) -> None:
    for n in sorted({1, tp}):
        _write_tp_dir(vdir / f"tp{n}", b, n)
    meta_path = vdir / "meta.yaml"
    previous = yaml.safe_load(meta_path.read_text()) if meta_path.is_file() else None
    _write_meta(vdir, _meta(b, _present_tps(vdir), key, previous))
    clear_bundle_cache()  # the loader memoises per directory; a tp<N>/ may have been added


def ensure_bundle(hardware: HardwareSpec, model: ModelSpec, tp: int, variant: str = "bf16", *,
                  system: str | None = None, factors: RooflineFactors | None = None,
                  grid: GridSpec | None = None, cache: Path | None = None) -> Path:
    """Variant dir of the cached aiconfigurator bundle of (hardware, model, tp), generated
    on a miss (``tp1/`` too when ``tp > 1``: TP-invariant rows and MoE are priced from it).

    ``system`` defaults to the aiconfigurator system of ``hardware.name``. The bundle lives at
    ``<cache>/aiconfigurator-<key>/<hardware>/<org>/<model>/<variant>``.
    """
    systems_dir()  # the package (extra [aiconfigurator], pinned version) before any work
    system = system or system_for(hardware.name)
    # the roofline rows and ratios with this GPU's own factor set (profiles.roofline.factors)
    factors = factors if factors is not None else load_factors(hardware=hardware.name)
    grid = grid if grid is not None else GridSpec()
    RankShape.of(model, tp)  # validate the split before any work
    key = bundle_key(hardware, model, variant, system, factors, grid)
    root = (cache if cache is not None else cache_dir()) / f"aiconfigurator-{key}"
    vdir = variant_dir(root, hardware, model, variant)
    if _complete(vdir, tp, model):
        return vdir
    with _locked(vdir):
        if not _complete(vdir, tp, model):  # another process may have written it meanwhile
            b = _Builder(hardware, model, variant, system, factors, grid)
            _generate(vdir, b, tp, key)
    return vdir
