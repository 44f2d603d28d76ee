"""What a ``vllm serve`` log says about the server that ran: KV capacity and settings.

vLLM 0.19 prints, each line behind its logging prefix (``(EngineCore_DP0 pid=4242) INFO 04-25
18:47:30 [kv_cache_utils.py:1087] ...``):

- ``GPU KV cache size: 585,248 tokens`` (``vllm/v1/core/kv_cache_utils.py``,
  ``_report_kv_cache_config``): ``num_blocks // num_groups * block_size``, the null block
  included; for a model with one KV-cache group (every model in our catalog) that is
  ``num_gpu_blocks * block_size``, so the block count is the tokens over the block size;
- ``Maximum concurrency for 131,072 tokens per request: 4.47x`` (same function): the
  ``max_model_len`` the engine ran with;
- ``Available KV cache memory: 71.66 GiB`` (``vllm/v1/worker/gpu_worker.py``);
- ``Overriding num_gpu_blocks=N with num_gpu_blocks_override=M`` when the override is set;
- ``non-default args: {...}`` (``vllm/entrypoints/utils.py``, ``log_non_default_args``): the
  ``EngineArgs`` the command set, as a Python dict;
- ``Initializing a V1 LLM engine (v0.19.0) with config: model=..., tensor_parallel_size=1, ...``
  (``vllm/v1/engine/core.py``): the resolved config (``max_seq_len``, parallel sizes,
  ``kv_cache_dtype``, ``enable_prefix_caching``, ``enable_chunked_prefill``).

Older vLLM (V0) printed ``# GPU blocks: N, # CPU blocks: M``; it is read as well.
:func:`read_server_log` collects these; :func:`check_against` refuses a log whose settings
differ from the ``--server-args`` given, naming both.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.server_args import ServerSettings, flag_of
from engine.specs import ConfigError

_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_V0_BLOCKS = re.compile(r"# GPU blocks: (\d+)")
_AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
_ENGINE = re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\) with config: (.*)$")
# Keys of the engine config line we compare, to the vLLM setting they are.
_ENGINE_KEYS = {
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "data_parallel_size": "data_parallel_size",
    "max_seq_len": "max_model_len",
    "kv_cache_dtype": "kv_cache_dtype",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_chunked_prefill": "enable_chunked_prefill",
}
# non-default args keys we compare with --server-args (vLLM's EngineArgs names).
_COMPARED = (
    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
    "enable_expert_parallel", "max_num_seqs", "max_num_batched_tokens",
    "gpu_memory_utilization", "block_size", "enable_prefix_caching", "enable_chunked_prefill",
    "max_model_len", "kv_cache_dtype", "num_gpu_blocks_override", "async_scheduling",
    "long_prefill_token_threshold",
)


@dataclass(frozen=True)
class ServerLog:
    """What one ``vllm serve`` log recorded (``None``: the log does not say). Each fact keeps
    the line it came from (``lines[name]``) for messages."""

    path: Path
    kv_tokens: int | None = None
    v0_num_blocks: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    available_kv_gib: float | None = None
    override_blocks: int | None = None
    vllm_version: str | None = None
    non_default: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)

    def where(self, name: str) -> str:
        return f"{self.path}:{self.lines[name]}" if name in self.lines else str(self.path)

    def num_gpu_blocks(self, block_size: int) -> int | None:
        """vLLM's block count (null block included): ``# GPU blocks`` when printed, else the
        KV cache size in tokens over ``block_size``; ``None`` when the log gives neither."""
        if self.v0_num_blocks is not None:
            return self.v0_num_blocks
        if self.kv_tokens is None:
            return None
        if self.kv_tokens % block_size:
            raise ConfigError(
                f"{self.where('kv_tokens')}: GPU KV cache size {self.kv_tokens:,} tokens is not "
                f"a whole number of {block_size}-token blocks; check --block-size in "
                "--server-args"
            )
        return self.kv_tokens // block_size


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _scalar(text: str) -> Any:
    """A value of the engine config line as Python: ``True``, ``2``, ``auto``."""
    text = text.strip().strip("'\"")
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


def _engine_pairs(text: str) -> dict[str, Any]:
    """``key=value, key=value`` pairs of the engine config line (values with commas inside
    brackets are skipped: only flat scalars are compared)."""
    out: dict[str, Any] = {}
    for m in re.finditer(r"(\w+)=([^,{}\[\]()]*)(?:,|$)", text):
        out.setdefault(m.group(1), _scalar(m.group(2)))
    return out


def read_server_log(path: str | Path) -> ServerLog:
    """Collect the lines the module docstring lists from a ``vllm serve`` log. Several DP
    engines each print their KV size: they must agree (else an error naming both lines). A
    log with none of the lines is an error naming the file."""
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except FileNotFoundError:
        raise ConfigError(f"{p}: server log not found; check --server-log") from None
    facts: dict[str, Any] = {}
    lines: dict[str, int] = {}
    non_default: dict[str, Any] = {}
    engine: dict[str, Any] = {}

    def put(name: str, value: Any, lineno: int) -> None:
        if name in facts and facts[name] != value:
            raise ConfigError(
                f"{p}:{lineno}: {name.replace('_', ' ')} {value} differs from "
                f"{facts[name]} at line {lines[name]}; give the log of one server run"
            )
        if name not in facts:
            facts[name], lines[name] = value, lineno

    for lineno, line in enumerate(text.splitlines(), start=1):
        if m := _KV_TOKENS.search(line):
            put("kv_tokens", _int(m.group(1)), lineno)
        if m := _CONCURRENCY.search(line):
            put("max_model_len", _int(m.group(1)), lineno)
            put("max_concurrency", float(m.group(2)), lineno)
        if m := _V0_BLOCKS.search(line):
            put("v0_num_blocks", int(m.group(1)), lineno)
        if m := _AVAILABLE.search(line):
            put("available_kv_gib", float(m.group(1)), lineno)
        if m := _OVERRIDE.search(line):
            put("override_blocks", int(m.group(2)), lineno)
        if m := _NON_DEFAULT.search(line):
            try:
                parsed = ast.literal_eval(m.group(1))
            except (ValueError, SyntaxError):
                parsed = None  # a value without a literal repr: the dict cannot be compared
            if isinstance(parsed, dict):
                non_default = parsed
                lines["non_default"] = lineno
        if m := _ENGINE.search(line):
            put("vllm_version", m.group(1), lineno)
            engine = _engine_pairs(m.group(2))
            lines["engine"] = lineno
    if not facts and not non_default and not engine:
        raise ConfigError(
            f"{p}: no vLLM start-up lines found (GPU KV cache size, Maximum concurrency, "
            "non-default args, Initializing a V1 LLM engine); give the log vllm serve printed"
        )
    return ServerLog(p, non_default=non_default, engine=engine, lines=lines, **facts)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return str(a).lower() == str(b).lower()
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def check_against(log: ServerLog, settings: ServerSettings) -> list[str]:
    """Refuse a log whose settings differ from ``settings`` (the ``--server-args``): one
    ``ConfigError`` naming the setting, the log line and both values. Returns notes of what
    was checked."""
    given = settings.args.given
    c = settings.config
    resolved: dict[str, Any] = {
        "tensor_parallel_size": c.tensor_parallel_size,
        "pipeline_parallel_size": c.pipeline_parallel_size,
        "data_parallel_size": settings.data_parallel_size,
        "max_model_len": c.model_len(settings.model),
        "kv_cache_dtype": c.kv_cache_dtype,
        "enable_prefix_caching": c.enable_prefix_caching,
        "enable_chunked_prefill": c.enable_chunked_prefill,
    }

    def fail(setting: str, where: str, theirs: Any, ours: Any) -> ConfigError:
        flag = flag_of(setting)
        if setting not in given:
            return ConfigError(
                f"{where}: the server log has {setting}={theirs!r} but --server-args does not "
                f"set {flag} (servesweep resolves {ours!r}); add {flag} {theirs} to "
                "--server-args, or give the log of the server that command started"
            )
        return ConfigError(
            f"{where}: the server log has {setting}={theirs!r} but --server-args gives "
            f"{flag} {ours!r}; paste the command of the server that wrote this log"
        )

    model = log.non_default.get("model")
    if model is not None and model != settings.args.model:
        raise ConfigError(f"{log.where('non_default')}: the server log served model {model!r} but "
                          f"--server-args serves {settings.args.model!r}; paste the command of "
                          "the server that wrote this log")
    for key in _COMPARED:
        if key not in log.non_default:
            continue
        theirs = log.non_default[key]
        ours = given.get(key, resolved.get(key))
        if ours is None or not _same(theirs, ours):
            raise fail(key, log.where("non_default"), theirs, ours)
    for key, setting in _ENGINE_KEYS.items():
        if key in log.engine and not _same(log.engine[key], resolved[setting]):
            raise fail(setting, log.where("engine"), log.engine[key], resolved[setting])
    notes = []
    if log.max_model_len is not None and log.max_model_len != resolved["max_model_len"]:
        raise fail("max_model_len", log.where("max_model_len"), log.max_model_len,
                   resolved["max_model_len"])
    override = given.get("num_gpu_blocks_override")
    if log.override_blocks is not None and override is not None and log.override_blocks != override:
        raise fail("num_gpu_blocks_override", log.where("override_blocks"), log.override_blocks,
                   override)
    if log.non_default or log.engine:
        notes.append(f"server log {log.path}: settings agree with --server-args")
    return notes
