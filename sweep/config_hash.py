"""A content hash of one grid point: what makes two points the same simulation.

``point_hash(point)`` hashes the resolved job config (plain containers, ``hydra`` node
removed, as ``sweep.recorder.task_config`` returns it) without the keys that only say where
results go or how the study is labelled (``tracking``, ``study``, ``groundtruth``) or configure
the capacity-search driver (``capacity``). Everything
else that reaches ``sweep.job.run_point`` is included: model, hardware (and bundle source),
cluster knobs, workload (including its seed) and SLOs. A replayed trace file
(``workload.kind=trace``) is also identified by the SHA-256 of its bytes, so editing the
file in place changes the hash. A measured bundle directory is identified by its path
only.

The hash is canonical: key order, ``1`` vs ``1.0`` in a float field after schema
composition, and the process computing it do not matter. ``HASH_VERSION`` is part of the
hashed text; bump it when the simulator's results for an unchanged config change on
purpose, so old runs are no longer taken as finished by a resumed sweep.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# 2: vLLM's prefix_hit_rate (hits / queried tokens), the SLO-met cost over a steady-state
# window, the SLO verdict metrics: stored runs of version 1 hold other numbers.
# 3: the client's view (cluster.frontend, metrics from the send time through the API server).
# 4: KV capacity is vLLM 0.19's budget by default (engine.kv_budget; cluster.kv_capacity_model).
HASH_VERSION = 4
# Config subtrees that do not change what a point simulates (``capacity`` configures the
# capacity-search driver; it is present only when sweep.capacity extended the schema).
NOT_HASHED = ("tracking", "study", "groundtruth", "capacity")
HASH_KEY = "config_hash"  # MLflow tag, MLflow param and results-table column


def _canonical(value: Any) -> Any:
    """Plain JSON-able form: sorted keys, floats that JSON can carry (NaN/inf as text)."""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return f"float:{value!r}"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"config value {value!r} of type {type(value).__name__} cannot be hashed")


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (read in 1 MiB pieces)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for piece in iter(lambda: fh.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()


def hashed_view(point: Mapping[str, Any], base_dir: Path | None = None) -> dict[str, Any]:
    """What ``point_hash`` hashes: the point without ``NOT_HASHED`` keys, plus input digests.

    ``base_dir`` resolves a relative trace path (default: the current directory).
    """
    view: dict[str, Any] = {k: v for k, v in point.items() if k not in NOT_HASHED and k != "hydra"}
    workload = point.get("workload")
    if isinstance(workload, Mapping) and workload.get("kind") == "trace" and workload.get("path"):
        path = Path(str(workload["path"]))
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        view["_inputs"] = {"workload.path": file_digest(path) if path.is_file() else "missing"}
    return view


def point_hash(point: Mapping[str, Any], base_dir: Path | None = None) -> str:
    """24-hex-digit SHA-256 content hash of a resolved grid point (see the module docstring)."""
    blob = json.dumps(
        {"hash_version": HASH_VERSION, "point": _canonical(hashed_view(point, base_dir))},
        sort_keys=True,
        separators=(",", ":"),
        allow_nan=False,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]
