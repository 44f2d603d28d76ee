"""Load and pre-index a measured profile bundle (LLMServingSim on-disk layout).

Layout: ``<root>/<hardware>/<org>/<model>/<variant>/meta.yaml`` plus one ``tp<N>/`` folder per
profiled tensor-parallel degree holding ``dense.csv``, ``per_sequence.csv``, ``attention.csv``
and optionally ``moe.csv``, ``skew.csv`` and ``skew_fit.csv``. Times in the CSVs are
microseconds; they are converted once, at load, to integer nanoseconds with
round-half-to-even and a floor of 1 ns.

Every table is pre-indexed for cheap scalar lookups:

- dense / per-sequence: one :class:`Curve` per layer (sorted unique keys, first duplicate kept);
- attention: :class:`AttentionTable` with the global prefill-chunk and decode-count axes, and
  per (prefill_chunk, n_decode) slice a sorted kv_prefill axis whose rows each keep their *own*
  kv_decode key list (the grid is ragged; a rectangular tensor would change results);
- moe: :class:`MoeTable`, one token curve per activated-experts value;
- skew_fit: :class:`SkewFit`, the bucketed alpha table per TP plus the bucket axes.

Each curve stores numpy arrays (the data of record, handy for vectorised use) and tuple
mirrors that the scalar hot path bisects (faster than numpy for one element).

Bad input raises :class:`BundleError` naming the file, the line where it applies, and the fix,
while the bundle loads (before any step is priced): a missing table, column or meta key of the
wrong type; a cell that is not a number, NaN, infinite, negative where it cannot be, or absurd
(a key above ``MAX_KEY``, a time above ``MAX_TIME_US``, an alpha beyond ``MAX_ABS_ALPHA``);
skew-fit bucket edges that are not increasing; a bucket table outside the bundle.
"""

from __future__ import annotations

import csv
import logging
import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from engine.specs import ConfigError
from profiles.yaml_load import safe_load

log = logging.getLogger(__name__)

REQUIRED_TABLES = ("dense.csv", "per_sequence.csv", "attention.csv")

# weight dtype -> short folder name (the reference's naming rule); unknown names pass through
_SHORT_DTYPE = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "int8": "int8",
    "int4": "int4",
}

# Bucket axes used when meta.yaml gives none (those of every shipped RTXPRO6000 bundle).
DEFAULT_BUCKET_AXES: dict[str, list] = {
    "n_bins": [0, 2, 4, 8, 16, 32, 64, 128, 256, 1000000],
    "n_labels": ["n<=2", "n<=4", "n<=8", "n<=16", "n<=32", "n<=64", "n<=128", "n<=256", "n>256"],
    "skew_rate_bins": [-0.01, 0.05, 0.15, 0.4, 0.7, 1.01],
    "skew_rate_labels": ["sr<=5%", "sr<=15%", "sr<=40%", "sr<=70%", "sr>70%"],
    "kv_big_bins": [0, 1024, 4096, 16384, 1000000000],
    "kv_big_labels": ["kvB<=1k", "kvB<=4k", "kvB<=16k", "kvB>16k"],
    "kp_bins": [-1, 0, 512, 1024, 2048, 4096, 8192, 1000000000],
    "kp_labels": ["kp=0", "kp<=512", "kp<=1k", "kp<=2k", "kp<=4k", "kp<=8k", "kp>8k"],
}
_AXES = ("n", "skew_rate", "kv_big", "kp")

# Largest integer key (tokens, sequences, KV length, experts) a table may hold: no batch or
# context comes near it (the longest context in the catalog is 262,144 tokens).
MAX_KEY = 10**8
# Longest time one profiled op may take, an hour (the slowest shipped row is 135 ms): a
# larger value is a unit error or damage, and would overflow int64 ns once priced.
MAX_TIME_US = 3.6e9
# Largest skew-fit alpha magnitude. The shipped fits span -735 .. 27; a step priced with
# 1e6 x the measured skew gap is damage, and larger values could overflow int64 ns.
MAX_ABS_ALPHA = 1e6


class BundleError(ConfigError):
    """A profile bundle is missing, incomplete or contains invalid values."""


def short_dtype(dtype: str) -> str:
    """Folder-style short name of a dtype (``bfloat16`` -> ``bf16``); unknown names pass through."""
    return _SHORT_DTYPE.get(dtype.lower(), dtype.lower())


def variant_name(dtype: str = "bfloat16", kv_cache_dtype: str = "auto") -> str:
    """Bundle variant folder for a weight dtype and KV-cache dtype.

    ``variant_name("bfloat16")`` -> ``"bf16"``; ``variant_name("bfloat16", "fp8")`` ->
    ``"bf16-kvfp8"`` (the suffix is added whenever the KV dtype is not ``auto``).
    """
    name = short_dtype(dtype)
    if kv_cache_dtype and kv_cache_dtype.lower() != "auto":
        name += "-kv" + short_dtype(kv_cache_dtype)
    return name


def us_to_ns(time_us: np.ndarray) -> np.ndarray:
    """Microseconds -> integer ns: round half to even (as Python ``round``), at least 1."""
    return np.maximum(np.rint(np.asarray(time_us, dtype=np.float64) * 1000.0), 1).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Curve:
    """A sorted 1-D table: strictly increasing integer keys -> integer ns."""

    keys: np.ndarray
    values: np.ndarray
    xs: tuple[int, ...] = field(repr=False)
    ys: tuple[int, ...] = field(repr=False)

    @classmethod
    def build(cls, keys: Iterable[int], values_ns: Iterable[int]) -> Curve:
        """Sort by key and keep the first row of duplicated keys."""
        k = np.asarray(list(keys), dtype=np.int64)
        v = np.asarray(list(values_ns), dtype=np.int64)
        order = np.argsort(k, kind="stable")
        k, v = k[order], v[order]
        keep = np.ones(len(k), dtype=bool)
        keep[1:] = k[1:] != k[:-1]
        k, v = k[keep], v[keep]
        return cls(keys=k, values=v, xs=tuple(int(x) for x in k), ys=tuple(int(y) for y in v))

    def __len__(self) -> int:
        return len(self.xs)


@dataclass(frozen=True, slots=True)
class AttentionSlice:
    """All rows of one (prefill_chunk, n_decode) pair: kv_prefill axis, one kv_decode curve per kp."""

    kp: tuple[int, ...]
    rows: tuple[Curve, ...]


@dataclass(frozen=True, slots=True)
class AttentionTable:
    """attention.csv indexed as global pc / nd axes plus ragged per-slice rows."""

    pc_axis: tuple[int, ...]
    nd_axis: tuple[int, ...]
    slices: dict[tuple[int, int], AttentionSlice]
    pairs: tuple[tuple[int, int], ...]  # existing (pc, nd) pairs, sorted
    nd_by_pc: dict[int, tuple[int, ...]]  # sorted nd values present for each pc


@dataclass(frozen=True, slots=True)
class MoeTable:
    """moe.csv: activated-experts axis, one token curve per activated value."""

    activated: tuple[int, ...]
    rows: tuple[Curve, ...]


@dataclass(frozen=True, slots=True)
class BucketAxes:
    """Bin edges and labels for the skew-alpha bucket key (right-inclusive bins)."""

    bins: dict[str, tuple[float, ...]]
    labels: dict[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class SkewTpEntry:
    """Fitted alpha for one TP degree: pooled default and the per-bucket table."""

    alpha_default: float
    axes: BucketAxes
    table: dict[str, float]


@dataclass(frozen=True, slots=True)
class SkewFit:
    """The meta.yaml ``skew_fit`` block, hydrated. ``enabled=False`` means alpha = 0."""

    enabled: bool
    alpha_default: float | None  # block-level default (used when the TP has no entry)
    per_tp: dict[int, SkewTpEntry]


@dataclass(frozen=True, slots=True)
class TpTables:
    """Every table of one ``tp<N>/`` folder."""

    tp: int
    folder: Path
    dense: dict[str, Curve]
    per_sequence: dict[str, Curve]
    attention: AttentionTable
    moe: MoeTable | None


@dataclass(frozen=True, slots=True)
class ProfileBundle:
    """A loaded bundle: meta.yaml, per-TP tables and the skew fit."""

    path: Path
    hardware: str
    model: str
    variant: str
    meta: dict
    tps: dict[int, TpTables]
    skew_fit: SkewFit
    max_num_batched_tokens: int | None  # meta engine_effective (profiled range)
    max_num_seqs: int | None

    @property
    def source(self) -> str:
        """Where this bundle's latencies come from: a generator's ``source`` in meta.yaml
        (``aiconfigurator 0.12.0 h100_sxm``), ``roofline`` for a roofline bundle, else
        ``measured bundle <path>`` (a profiler's measurements)."""
        if self.meta.get("source"):
            return str(self.meta["source"])
        if self.meta.get("generator") == "servesweep.profiles.roofline":
            return "roofline"
        return f"measured bundle {self.path}"

    def tables(self, tp: int) -> TpTables:
        """Tables of one TP degree, or :class:`BundleError` listing the profiled degrees."""
        try:
            return self.tps[tp]
        except KeyError:
            raise BundleError(
                f"{self.path}: no tp{tp}/ folder; profiled TP degrees are {sorted(self.tps)}. "
                "Profile this TP degree or choose one of those."
            ) from None

    def beyond_profiled_range(self, max_num_batched_tokens: int, max_num_seqs: int) -> list[str]:
        """Messages for runtime limits above the profiled ones (lookups then extrapolate)."""
        msgs = []
        if self.max_num_batched_tokens and max_num_batched_tokens > self.max_num_batched_tokens:
            msgs.append(
                f"max_num_batched_tokens {max_num_batched_tokens} > profiled "
                f"{self.max_num_batched_tokens} in {self.path / 'meta.yaml'}: dense lookups extrapolate"
            )
        if self.max_num_seqs and max_num_seqs > self.max_num_seqs:
            msgs.append(
                f"max_num_seqs {max_num_seqs} > profiled {self.max_num_seqs} in "
                f"{self.path / 'meta.yaml'}: per-sequence and attention lookups extrapolate"
            )
        return msgs


# ----------------------------------------------------------------------------------- CSV reading


def _read_numeric_csv(path: Path, columns: dict[str, str], fix: str) -> dict[str, list]:
    """Read ``path`` and return the requested columns.

    ``columns`` maps a column name to its kind: ``"int"`` (integer key in ``[0, MAX_KEY]``),
    ``"time"`` (float in ``(0, MAX_TIME_US]``), ``"alpha"`` (float in
    ``[-MAX_ABS_ALPHA, MAX_ABS_ALPHA]``) or ``"str"``. Errors name the file, the line and
    ``fix``.

    A well-formed file is parsed in one pass by numpy's C reader (``np.loadtxt``) and checked
    column by column (``_columns_in_bounds``); anything that pass does not take as it is (a
    cell that is not a plain number, a quoted cell, a row not as wide as the header, a value out
    of bounds, no rows) is read again row by row (``_read_numeric_csv_rows``), which keeps the
    rows a file may skip and names the first bad cell's line. Both give the same values (numpy parses a float as
    Python's ``float`` does, correctly rounded); the row reader is the definition, the one-pass
    reader only skips its per-cell Python work (19,364 attention rows: 0.089 against 0.020 s).
    """
    if not path.is_file():
        raise BundleError(f"{path}: file missing. {fix}")
    fast = _read_numeric_csv_columnar(path, columns)
    if fast is not None:
        return fast
    return _read_numeric_csv_rows(path, columns, fix)


def _read_numeric_csv_columnar(path: Path, columns: dict[str, str]) -> dict[str, list] | None:
    """The requested columns of a well-formed ``path`` read in one pass, or None when the
    row reader must look (see ``_read_numeric_csv``)."""
    text = path.read_text()
    if '"' in text or "\x00" in text:
        return None  # quoted cells (the csv module's quoting) and NULs: the row reader reads them
    lines = text.splitlines()
    if not lines:
        return None
    header = next(csv.reader(lines[:1]), None)
    if not header:
        return None
    names = [h.strip() for h in header]
    if len(set(names)) != len(names) or any(c not in names for c in columns):
        return None
    commas = len(names) - 1  # every row as wide as the header (a cell "1,5" shifts none)
    body = lines[1:]
    for line in body:
        if line.count(",") != commas and line.strip():
            return None
    numeric = [c for c, kind in columns.items() if kind != "str"]
    out: dict[str, list] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (an empty table warns: the row reader says so)
            # numpy's C reader, without comment lines or quotes
            table = np.loadtxt(body, delimiter=",", comments=None, ndmin=2,
                               usecols=[names.index(c) for c in numeric], dtype=np.float64)
            for c in columns:
                if columns[c] == "str":
                    cells = np.loadtxt(body, delimiter=",", comments=None, ndmin=1,
                                       usecols=[names.index(c)], dtype=str)
                    out[c] = [cell.strip() for cell in cells.tolist()]
    except (ValueError, UserWarning):
        return None  # a cell that is not a plain number, no rows
    if table.shape[0] == 0 or table.shape[1] != len(numeric):
        return None
    for j, c in enumerate(numeric):
        values = table[:, j]
        if not _columns_in_bounds(values, columns[c]):
            return None
        out[c] = values.astype(np.int64).tolist() if columns[c] == "int" else values.tolist()
    return {c: out[c] for c in columns}


def _columns_in_bounds(values: np.ndarray, kind: str) -> bool:
    """Whether every value of a numeric column passes the row reader's checks for ``kind``
    (finite; an integer key in ``[0, MAX_KEY]``, a time in ``(0, MAX_TIME_US]``, an alpha in
    ``[-MAX_ABS_ALPHA, MAX_ABS_ALPHA]``)."""
    if not np.isfinite(values).all():
        return False
    if kind == "int":
        return bool(((values >= 0) & (values == np.floor(values)) & (values <= MAX_KEY)).all())
    if kind == "time":
        return bool(((values > 0) & (values <= MAX_TIME_US)).all())
    return bool((np.abs(values) <= MAX_ABS_ALPHA).all())


def _read_numeric_csv_rows(path: Path, columns: dict[str, str], fix: str) -> dict[str, list]:
    """``_read_numeric_csv`` row by row: the definition of what a table may hold, and the
    reader that names the file, line and column of the first cell that breaks it."""
    out: dict[str, list] = {c: [] for c in columns}
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise BundleError(f"{path}: empty file (no header). {fix}")
        header = [h.strip() for h in header]
        missing = [c for c in columns if c not in header]
        if missing:
            raise BundleError(
                f"{path}: missing column(s) {missing}; header is {header}. "
                f"Expected columns {list(columns)}. {fix}"
            )
        idx = {c: header.index(c) for c in columns}
        for lineno, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):  # extra fields would shift the columns read
                raise BundleError(f"{path}:{lineno}: {len(row)} fields, header has {len(header)}. {fix}")
            for c, kind in columns.items():
                cell = row[idx[c]].strip()
                if kind == "str":
                    out[c].append(cell)
                    continue
                try:
                    val = float(cell)
                except ValueError:
                    raise BundleError(f"{path}:{lineno}: column '{c}' = {cell!r} is not a number. {fix}") from None
                if not math.isfinite(val):
                    raise BundleError(f"{path}:{lineno}: column '{c}' = {cell!r} is not finite. {fix}")
                if kind == "int":
                    if val < 0 or val != int(val):
                        raise BundleError(
                            f"{path}:{lineno}: column '{c}' = {cell!r} must be a non-negative integer. {fix}"
                        )
                    if val > MAX_KEY:
                        raise BundleError(
                            f"{path}:{lineno}: column '{c}' = {cell!r} is above {MAX_KEY}: no "
                            f"batch, sequence count or context comes near it. {fix}"
                        )
                    out[c].append(int(val))
                elif kind == "time":
                    if val <= 0:
                        raise BundleError(
                            f"{path}:{lineno}: column '{c}' = {cell!r} must be a positive time (us). {fix}"
                        )
                    if val > MAX_TIME_US:
                        raise BundleError(
                            f"{path}:{lineno}: column '{c}' = {cell!r} us is above an hour "
                            f"({MAX_TIME_US:g} us): a unit error? {fix}"
                        )
                    out[c].append(val)
                else:  # alpha
                    if abs(val) > MAX_ABS_ALPHA:
                        raise BundleError(
                            f"{path}:{lineno}: column '{c}' = {cell!r} is beyond "
                            f"+-{MAX_ABS_ALPHA:g} (shipped fits span -735 .. 27). {fix}"
                        )
                    out[c].append(val)
    first = next(iter(columns))
    if not out[first]:
        raise BundleError(f"{path}: no data rows. {fix}")
    return out


def _fix_hint(path: Path) -> str:
    return f"Re-export {path.name} from the profiler (time_us in microseconds, integer keys)."


def _load_layer_table(path: Path, key: str) -> dict[str, Curve]:
    data = _read_numeric_csv(path, {"layer": "str", key: "int", "time_us": "time"}, _fix_hint(path))
    ns = us_to_ns(np.asarray(data["time_us"]))
    by_layer: dict[str, tuple[list[int], list[int]]] = {}
    for name, k, v in zip(data["layer"], data[key], ns.tolist(), strict=True):
        if not name:
            raise BundleError(f"{path}: a row has an empty 'layer' name. {_fix_hint(path)}")
        ks, vs = by_layer.setdefault(name, ([], []))
        ks.append(k)
        vs.append(v)
    return {name: Curve.build(ks, vs) for name, (ks, vs) in by_layer.items()}


def _load_attention(path: Path) -> AttentionTable:
    """attention.csv indexed: per (prefill_chunk, n_decode) pair the kv_prefill values, each
    with its kv_decode curve. Each curve is what ``Curve.build`` makes of its rows (sorted by
    kv_decode, the first of a duplicated key kept) and the pairs keep the file's order of
    first appearance; the rows are sorted and split once for the whole table instead of
    ``Curve.build`` per curve (2,042 curves in 180 pairs of a roofline bundle: numpy's
    per-call overhead was most of a bundle's load)."""
    cols = {"prefill_chunk": "int", "kv_prefill": "int", "n_decode": "int", "kv_decode": "int",
            "time_us": "time"}
    data = _read_numeric_csv(path, cols, _fix_hint(path))
    pc, kp, nd, kv = (np.asarray(data[c], dtype=np.int64)
                      for c in ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode"))
    ns = us_to_ns(np.asarray(data["time_us"]))
    order = np.lexsort((kv, kp, nd, pc))  # stable: equal keys keep the file's order
    pc, kp, nd, kv, ns = pc[order], kp[order], nd[order], kv[order], ns[order]
    n = len(order)
    new_pair = np.ones(n, dtype=bool)
    new_pair[1:] = (pc[1:] != pc[:-1]) | (nd[1:] != nd[:-1])
    new_curve = new_pair.copy()
    new_curve[1:] |= kp[1:] != kp[:-1]
    keep = new_curve.copy()
    keep[1:] |= kv[1:] != kv[:-1]  # a duplicated key: its first row (the file's first)
    pair_starts = np.flatnonzero(new_pair)
    first_seen = np.minimum.reduceat(order, pair_starts)  # a pair's first row in the file
    pc, kp, nd, kv, ns = pc[keep], kp[keep], nd[keep], kv[keep], ns[keep]
    new_pair, new_curve = new_pair[keep], new_curve[keep]
    kv_list, ns_list, kp_list = kv.tolist(), ns.tolist(), kp.tolist()
    curve_starts = np.flatnonzero(new_curve).tolist()
    curve_ends = [*curve_starts[1:], len(kv_list)]
    curve_pair = np.cumsum(new_pair)[curve_starts].tolist()  # 1-based pair of each curve
    by_pair: list[tuple[list[int], list[Curve]]] = [([], []) for _ in pair_starts]
    for a, b, j in zip(curve_starts, curve_ends, curve_pair, strict=True):
        kps, rows = by_pair[j - 1]
        kps.append(kp_list[a])
        rows.append(Curve(keys=kv[a:b], values=ns[a:b], xs=tuple(kv_list[a:b]),
                          ys=tuple(ns_list[a:b])))
    heads = np.flatnonzero(new_pair)
    pair_keys = list(zip(pc[heads].tolist(), nd[heads].tolist(), strict=True))
    slices = {pair_keys[j]: AttentionSlice(kp=tuple(by_pair[j][0]), rows=tuple(by_pair[j][1]))
              for j in np.argsort(first_seen, kind="stable").tolist()}
    pairs = tuple(sorted(slices))
    nd_by_pc: dict[int, list[int]] = {}
    for chunk, decodes in pairs:
        nd_by_pc.setdefault(chunk, []).append(decodes)
    return AttentionTable(
        pc_axis=tuple(sorted({p for p, _ in pairs})),
        nd_axis=tuple(sorted({n for _, n in pairs})),
        slices=slices,
        pairs=pairs,
        nd_by_pc={p: tuple(n) for p, n in nd_by_pc.items()},
    )


def _load_moe(path: Path) -> MoeTable:
    data = _read_numeric_csv(path, {"tokens": "int", "activated_experts": "int", "time_us": "time"},
                             _fix_hint(path))
    ns = us_to_ns(np.asarray(data["time_us"])).tolist()
    rows: dict[int, tuple[list[int], list[int]]] = {}
    for t, a, v in zip(data["tokens"], data["activated_experts"], ns, strict=True):
        ks, vs = rows.setdefault(a, ([], []))
        ks.append(t)
        vs.append(v)
    acts = tuple(sorted(rows))
    return MoeTable(activated=acts, rows=tuple(Curve.build(*rows[a]) for a in acts))


# ------------------------------------------------------------------------------------ skew fit


class _MetaLines:
    """``meta.yaml:<line>`` of a key path, for messages (the file alone if it cannot be found)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        try:
            self.root: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            self.root = None

    def __call__(self, *keys: object) -> str:
        node, line = self.root, None
        for key in keys:
            if not isinstance(node, yaml.MappingNode):
                return str(self.path)
            pair = next(((k, v) for k, v in node.value if str(k.value) == str(key)), None)
            if pair is None:
                return str(self.path)
            line, node = pair[0].start_mark.line + 1, pair[1]  # the key's line
        return f"{self.path}:{line}" if line is not None else str(self.path)


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _alpha(value: object, where: str, name: str) -> float:
    if not _real(value) or not math.isfinite(value):  # type: ignore[arg-type]
        raise BundleError(f"{where}: {name} = {value!r} is not a number; write the fitted alpha")
    if abs(value) > MAX_ABS_ALPHA:  # type: ignore[arg-type]
        raise BundleError(
            f"{where}: {name} = {value!r} is beyond +-{MAX_ABS_ALPHA:g} (shipped fits span "
            "-735 .. 27); re-run the alpha fit"
        )
    return float(value)  # type: ignore[arg-type]


def _bucket_axes(block: object, fallback: BucketAxes | None, where: _MetaLines,
                 keys: tuple[object, ...]) -> BucketAxes:
    if not block:
        if fallback is not None:
            return fallback
        block = DEFAULT_BUCKET_AXES
    if not isinstance(block, dict):
        raise BundleError(f"{where(*keys)}: {'.'.join(map(str, keys))} must be a mapping of "
                          "<axis>_bins / <axis>_labels lists")
    bins: dict[str, tuple[float, ...]] = {}
    labels: dict[str, tuple[str, ...]] = {}
    for ax in _AXES:
        b = block.get(f"{ax}_bins", DEFAULT_BUCKET_AXES[f"{ax}_bins"])
        lab = block.get(f"{ax}_labels", DEFAULT_BUCKET_AXES[f"{ax}_labels"])
        at = where(*keys, f"{ax}_bins")
        if not isinstance(b, list) or not isinstance(lab, list) or len(b) != len(lab) + 1:
            raise BundleError(
                f"{at}: bucket_axes.{ax}_bins must be a list with one more edge than "
                f"{ax}_labels (got {b!r} / {lab!r})"
            )
        if not all(_real(x) for x in b) or any(math.isnan(x) for x in b):
            raise BundleError(f"{at}: bucket_axes.{ax}_bins has a non-number: {b!r}")
        edges = tuple(float(x) for x in b)
        if any(hi <= lo for lo, hi in zip(edges, edges[1:], strict=False)):
            raise BundleError(
                f"{at}: bucket_axes.{ax}_bins must increase strictly (got {b!r}); sort the "
                "edges and drop duplicates"
            )
        bins[ax] = edges
        labels[ax] = tuple(str(x) for x in lab)
    return BucketAxes(bins=bins, labels=labels)


def _load_skew_table(path: Path) -> dict[str, float]:
    fix = "Re-run the alpha fit (columns pc, n_label, skew_rate_label, kv_big_label, kp_label, alpha)."
    cols = {"pc": "int", "n_label": "str", "skew_rate_label": "str", "kv_big_label": "str",
            "kp_label": "str", "alpha": "alpha"}
    with path.open(newline="") as fh:
        header = next(csv.reader(fh), [])
    if "raw_key" in [h.strip() for h in header]:
        cols["raw_key"] = "str"
    data = _read_numeric_csv(path, cols, fix)
    table: dict[str, float] = {}
    for i, alpha in enumerate(data["alpha"]):
        raw = data["raw_key"][i] if "raw_key" in data else ""
        key = raw or (
            f"pc={data['pc'][i]}|{data['n_label'][i]}|{data['skew_rate_label'][i]}"
            f"|{data['kv_big_label'][i]}|{data['kp_label'][i]}"
        )
        table.setdefault(key, alpha)
    return table


def _load_skew_fit(meta: dict, variant_dir: Path, where: _MetaLines) -> SkewFit:
    block = meta.get("skew_fit")
    if not isinstance(block, dict) or not block.get("enabled", False):
        return SkewFit(enabled=False, alpha_default=None, per_tp={})
    block_axes = _bucket_axes(block.get("bucket_axes"), None, where, ("skew_fit", "bucket_axes"))
    block_default = block.get("alpha_default")
    per_tp_block = block.get("per_tp") or {}
    if not isinstance(per_tp_block, dict):
        raise BundleError(f"{where('skew_fit', 'per_tp')}: skew_fit.per_tp must be a mapping "
                          "from TP degree to its fit")
    per_tp: dict[int, SkewTpEntry] = {}
    for tp_key, entry in per_tp_block.items():
        at = where("skew_fit", "per_tp", tp_key)
        try:
            tp = int(tp_key)
        except (TypeError, ValueError):
            raise BundleError(f"{at}: skew_fit.per_tp key {tp_key!r} is not a TP degree") from None
        if not isinstance(entry, dict):
            raise BundleError(f"{at}: skew_fit.per_tp.{tp} must be a mapping")
        default = _alpha(entry.get("alpha_default", 0.0),
                         where("skew_fit", "per_tp", tp_key, "alpha_default"),
                         f"skew_fit.per_tp.{tp}.alpha_default")
        table: dict[str, float] = {}
        if entry.get("bucket_table"):
            tpath = variant_dir / str(entry["bucket_table"])
            at_table = where("skew_fit", "per_tp", tp_key, "bucket_table")
            if not tpath.resolve().is_relative_to(variant_dir.resolve()):
                raise BundleError(
                    f"{at_table}: skew_fit.per_tp.{tp}.bucket_table names {tpath}, outside the "
                    "bundle; name a file inside it (e.g. tp1/skew_fit.csv)"
                )
            if not tpath.is_file():
                raise BundleError(
                    f"{at_table}: skew_fit.per_tp.{tp}.bucket_table names {tpath}, which is "
                    "missing. Restore the file or remove the bucket_table entry."
                )
            table = _load_skew_table(tpath)
        axes = _bucket_axes(entry.get("bucket_axes"), block_axes, where,
                            ("skew_fit", "per_tp", tp_key, "bucket_axes"))
        per_tp[tp] = SkewTpEntry(alpha_default=default, axes=axes, table=table)
    if block_default is not None:
        block_default = _alpha(block_default, where("skew_fit", "alpha_default"),
                               "skew_fit.alpha_default")
    return SkewFit(enabled=True, alpha_default=block_default, per_tp=per_tp)


def _engine_limit(eng: dict, key: str, where: _MetaLines) -> int | None:
    """``engine_effective.<key>``: the profiled limit, a positive int (or absent)."""
    value = eng.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_KEY:
        raise BundleError(
            f"{where('engine_effective', key)}: engine_effective.{key} = {value!r} must be an "
            f"int in [1, {MAX_KEY}] (the limit the bundle was profiled with) or absent"
        )
    return value


# ------------------------------------------------------------------------------------ bundle


def _load_tp(folder: Path, tp: int) -> TpTables:
    for name in REQUIRED_TABLES:
        if not (folder / name).is_file():
            raise BundleError(
                f"{folder / name}: file missing; every tp<N>/ folder needs {', '.join(REQUIRED_TABLES)}. "
                "Re-run the profiler for this TP degree or remove the folder."
            )
    moe_path = folder / "moe.csv"
    return TpTables(
        tp=tp,
        folder=folder,
        dense=_load_layer_table(folder / "dense.csv", "tokens"),
        per_sequence=_load_layer_table(folder / "per_sequence.csv", "sequences"),
        attention=_load_attention(folder / "attention.csv"),
        moe=_load_moe(moe_path) if moe_path.is_file() else None,
    )


def _load_variant_dir(variant_dir: Path) -> ProfileBundle:
    meta_path = variant_dir / "meta.yaml"
    if not meta_path.is_file():
        raise BundleError(
            f"{meta_path}: missing. A bundle directory is <root>/<hardware>/<org>/<model>/<variant>/ "
            "with meta.yaml and tp<N>/ folders; check the root, hardware, model name and variant."
        )
    try:
        text = meta_path.read_text()
    except UnicodeDecodeError as exc:
        raise BundleError(f"{meta_path}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                          "re-export meta.yaml from the profiler") from exc
    try:
        meta = safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise BundleError(f"{meta_path}: invalid YAML ({exc}); fix the syntax") from exc
    if not isinstance(meta, dict):
        raise BundleError(f"{meta_path}: top level must be a mapping")
    where = _MetaLines(meta_path, text)
    eng = meta.get("engine_effective") or {}
    if not isinstance(eng, dict):
        raise BundleError(f"{where('engine_effective')}: engine_effective must be a mapping "
                          "(the engine settings the bundle was profiled with)")
    max_num_batched_tokens = _engine_limit(eng, "max_num_batched_tokens", where)
    max_num_seqs = _engine_limit(eng, "max_num_seqs", where)
    skew_fit = _load_skew_fit(meta, variant_dir, where)
    tps: dict[int, TpTables] = {}
    for sub in sorted(variant_dir.glob("tp*")):
        if sub.is_dir() and sub.name[2:].isdigit():
            tp = int(sub.name[2:])
            if tp < 1:
                raise BundleError(f"{sub}: TP degree must be >= 1; rename the folder")
            tps[tp] = _load_tp(sub, tp)
    if not tps:
        raise BundleError(f"{variant_dir}: no tp<N>/ folders with profile CSVs; run the profiler first")
    return ProfileBundle(
        path=variant_dir,
        hardware=str(meta.get("hardware", variant_dir.parents[2].name if len(variant_dir.parents) > 2 else "")),
        model=str(meta.get("model", "")),
        variant=str(meta.get("variant", variant_dir.name)),
        meta=meta,
        tps=tps,
        skew_fit=skew_fit,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
    )


_CACHE: dict[Path, ProfileBundle] = {}


def bundle_dir(root: str | Path, hardware: str, model_name: str, variant: str = "bf16") -> Path:
    """``<root>/<hardware>/<org>/<model>/<variant>`` for a model name like ``org/model``."""
    if not model_name or model_name.startswith("/") or ".." in model_name.split("/"):
        raise BundleError(f"model_name {model_name!r}: expected '<org>/<model>', e.g. 'meta-llama/Llama-3.1-8B'")
    return Path(root) / hardware / model_name / variant


def load_bundle(root: str | Path, hardware: str | None = None, model_name: str | None = None,
                variant: str = "bf16") -> ProfileBundle:
    """Load (once per directory, then from cache) a profile bundle.

    Either ``load_bundle(root, "RTXPRO6000", "meta-llama/Llama-3.1-8B", "bf16")`` or
    ``load_bundle(variant_dir)`` with the variant directory itself.
    """
    if hardware is None and model_name is None:
        path = Path(root)
    elif hardware is None or model_name is None:
        raise BundleError("load_bundle: give both hardware and model_name, or only a variant directory")
    else:
        path = bundle_dir(root, hardware, model_name, variant)
    if not path.is_dir():
        raise BundleError(
            f"{path}: profile bundle directory not found. Check the profiles root, the hardware "
            f"label, the model name (org/model) and the variant (e.g. bf16, bf16-kvfp8)."
        )
    key = path.resolve()
    bundle = _CACHE.get(key)
    # A bundle may gain tp<N>/ folders after it was cached (another process generating a
    # roofline degree into a shared cache): reload when the folder set changed.
    present = {int(p.name[2:]) for p in key.glob("tp*") if p.is_dir() and p.name[2:].isdigit()}
    if bundle is None or set(bundle.tps) != present:
        bundle = _load_variant_dir(key)
        _CACHE[key] = bundle
        log.debug("loaded profile bundle %s (tp %s)", key, sorted(bundle.tps))
    return bundle


def clear_bundle_cache() -> None:
    """Forget every cached bundle (tests, or after a bundle was rewritten on disk)."""
    _CACHE.clear()
