"""The ``vllm serve`` command a user ran, as the one engine-settings object we simulate.

The tokens are walked here rather than by ``argparse`` so that every flag is classified
(modelled, ignored, not modelled, unknown) and named in one message; argparse would accept
abbreviated flags and report only the first unknown one.

``read_server_args`` parses the pasted command (``vllm serve MODEL --tensor-parallel-size 2
...``; ``--flag value`` and ``--flag=value``, underscores or dashes as vLLM's
``FlexibleArgumentParser`` accepts them, the short forms ``-tp``/``-pp``/``-dp``/``-ep``) into
:class:`ServerArgs`: the flags given, by vLLM 0.19's ``EngineArgs`` names. ``settings`` then
resolves vLLM's defaults for the hardware it ran on and converts them once into
``engine.specs.EngineConfig`` (which checks every value).

Defaults as vLLM 0.19 resolves them for ``vllm serve`` (``vllm/engine/arg_utils.py``,
usage context ``OPENAI_API_SERVER``):

- ``max_num_seqs`` / ``max_num_batched_tokens`` (``EngineArgs.get_batch_defaults``): 1024 /
  8192 on a device with >= 70 GiB of memory whose name does not contain ``a100``, else
  256 / 2048. Then (``_set_default_max_num_seqs_and_batched_tokens_args``) with chunked
  prefill off the token budget is raised to ``max_model_len``; a default budget is capped at
  ``max_num_seqs * max_model_len`` and a default ``max_num_seqs`` at the budget;
- ``enable_prefix_caching`` and ``enable_chunked_prefill`` on (V1 generative models),
  ``block_size`` 16 (CUDA), ``gpu_memory_utilization`` 0.9, ``kv_cache_dtype`` / ``dtype``
  ``auto``, ``long_prefill_token_threshold`` 0, ``max_model_len`` the model's context;
- ``async_scheduling`` on unless the executor cannot (``vllm/config/vllm.py``: the Ray
  executor does not support it, so ``--distributed-executor-backend ray`` turns it off);
- ``enable_expert_parallel``: the MoE experts spread over TP x DP ranks (dense models ignore it).

Flags that do not change what we simulate (host, port, API key, logging, tokenizer, ...) are
accepted and listed in ``ServerArgs.ignored``. A flag that changes serving performance and
that we do not model (quantization, speculative decoding, LoRA, CPU offload, eager mode, ...),
or a flag we do not know, is one ``ConfigError`` naming the flag and the fix.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from engine.specs import GIB, ConfigError, EngineConfig, HardwareSpec, ModelSpec, SettingError

WHERE = "--server-args"

# vLLM 0.19 EngineArgs flags we model: flag -> (dest, kind). kind: int, float, str, bool
# (argparse.BooleanOptionalAction, as vLLM's ``get_kwargs`` gives every bool field), len
# (``human_readable_int``: 32k, 1M).
MODELLED: dict[str, tuple[str, str]] = {
    "--model": ("model", "str"),
    "--tensor-parallel-size": ("tensor_parallel_size", "int"),
    "--pipeline-parallel-size": ("pipeline_parallel_size", "int"),
    "--data-parallel-size": ("data_parallel_size", "int"),
    "--enable-expert-parallel": ("enable_expert_parallel", "bool"),
    "--max-num-seqs": ("max_num_seqs", "int"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", "len"),
    "--gpu-memory-utilization": ("gpu_memory_utilization", "float"),
    "--block-size": ("block_size", "int"),
    "--enable-prefix-caching": ("enable_prefix_caching", "bool"),
    "--enable-chunked-prefill": ("enable_chunked_prefill", "bool"),
    "--max-model-len": ("max_model_len", "len"),
    "--kv-cache-dtype": ("kv_cache_dtype", "str"),
    "--dtype": ("dtype", "str"),
    "--num-gpu-blocks-override": ("num_gpu_blocks_override", "int"),
    "--async-scheduling": ("async_scheduling", "bool"),
    "--long-prefill-token-threshold": ("long_prefill_token_threshold", "int"),
    "--scheduler-reserve-full-isl": ("scheduler_reserve_full_isl", "bool"),
    "--distributed-executor-backend": ("distributed_executor_backend", "str"),
    "--served-model-name": ("served_model_name", "names"),
    "--max-num-partial-prefills": ("max_num_partial_prefills", "int"),
}
SHORT = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
         "-dp": "--data-parallel-size", "-ep": "--enable-expert-parallel"}

# Flags that do not change the timing we simulate. Value-taking ones consume one argument.
IGNORED_WITH_VALUE = frozenset({
    "--host", "--port", "--api-key", "--uvicorn-log-level", "--download-dir", "--load-format",
    "--tokenizer", "--tokenizer-mode", "--revision", "--code-revision", "--tokenizer-revision",
    "--seed", "--allowed-origins", "--allowed-methods", "--allowed-headers", "--ssl-keyfile",
    "--ssl-certfile", "--ssl-ca-certs", "--root-path", "--chat-template", "--response-role",
    "--tool-call-parser", "--reasoning-parser", "--max-logprobs", "--hf-token",
    "--hf-config-path", "--generation-config", "--override-generation-config",
    "--middleware", "--lora-modules", "--disable-log-stats-interval", "--log-config-file",
    "--api-server-count", "--data-parallel-address", "--data-parallel-rpc-port",
    "--data-parallel-size-local", "--data-parallel-start-rank", "--worker-cls",
    "--tool-parser-plugin", "--chat-template-content-format", "--max-log-len",
    "--swap-space", "--disable-log-stats-every",
})
IGNORED_SWITCHES = frozenset({
    "--disable-log-requests", "--enable-log-requests", "--disable-log-stats",
    "--trust-remote-code", "--enable-auto-tool-choice", "--disable-fastapi-docs",
    "--enable-prompt-tokens-details", "--enable-server-load-tracking",
    "--disable-uvicorn-access-log", "--headless", "--enable-log-outputs",
    "--enable-force-include-usage", "--disable-frontend-multiprocessing",
    "--enable-request-id-headers", "--return-tokens-as-token-ids", "--skip-tokenizer-init",
})
# Flags that change serving performance in ways servesweep does not model.
NOT_MODELLED = {
    "--quantization": "weight quantization changes every kernel's cost",
    "-q": "weight quantization changes every kernel's cost",
    "--speculative-config": "speculative decoding changes the step shapes",
    "--enable-lora": "LoRA adapters add work to every step",
    "--cpu-offload-gb": "weights offloaded to the CPU stream over PCIe every step",
    "--enforce-eager": "the profiles are measured with CUDA graphs",
    "--kv-transfer-config": "KV connectors (P/D, offloading) are modelled by the sweep's "
                            "cluster group, not from vllm serve flags",
    "--kv-offloading-size": "KV offloading to the CPU is modelled by the sweep's "
                            "prefix_storage, not from vllm serve flags",
    "--kv-offloading-backend": "KV offloading to the CPU is modelled by the sweep's "
                               "prefix_storage, not from vllm serve flags",
    "--disable-custom-all-reduce": "the collectives are priced with vLLM's custom all-reduce",
    "--decode-context-parallel-size": "decode context parallelism is not modelled",
    "-dcp": "decode context parallelism is not modelled",
    "--prefill-context-parallel-size": "prefill context parallelism is not modelled",
    "--compilation-config": "the profiles are measured with vLLM's default compilation",
    "-O": "the profiles are measured with vLLM's default optimization level",
    "--optimization-level": "the profiles are measured with vLLM's default optimization level",
    "--config": "a YAML config file's settings cannot be read here",
    "--max-num-scheduled-tokens": "a scheduled-token cap below the batch budget is not "
                                  "modelled",
    "--scheduling-policy": "only vLLM's default FCFS scheduling is modelled",
    "--performance-mode": "only vLLM's default (balanced) batch defaults are modelled",
}
DTYPES = {"auto": "auto", "half": "float16", "float16": "float16", "bfloat16": "bfloat16",
          "float": "float32", "float32": "float32"}


@dataclass(frozen=True)
class ServerArgs:
    """The flags of one ``vllm serve`` command (see the module docstring).

    ``given`` maps vLLM's setting names (``EngineArgs`` fields) to the values the command set
    explicitly; ``ignored`` lists the flags accepted as not changing the simulation."""

    command: str
    model: str
    given: dict[str, Any]
    ignored: tuple[str, ...] = ()
    served_model_names: tuple[str, ...] = ()

    def get(self, name: str, default: Any = None) -> Any:
        return self.given.get(name, default)

    @property
    def data_parallel_size(self) -> int:
        return int(self.given.get("data_parallel_size", 1))

    @property
    def names(self) -> tuple[str, ...]:
        """The names a client may send as ``model``: the served names, else the model."""
        return self.served_model_names or (self.model,)

    def settings(self, model: ModelSpec, hardware: HardwareSpec,
                 base: EngineConfig | None = None) -> ServerSettings:
        """vLLM's settings for this command on ``hardware`` with ``model`` (defaults resolved as
        the module docstring says), converted once into ``EngineConfig`` on top of ``base``
        (the simulator's own fields: host overhead); a refused value names its flag."""
        g = self.given
        notes: list[str] = []
        dtype = DTYPES[g.get("dtype", "auto")]
        if dtype != "auto" and dtype != model.dtype:
            model = replace(model, dtype=dtype)
        max_model_len = g.get("max_model_len")
        model_len = max_model_len or model.max_position_embeddings
        chunked = bool(g.get("enable_chunked_prefill", True))
        seqs_default, tokens_default = batch_defaults(hardware)
        seqs = g.get("max_num_seqs", seqs_default)
        tokens = g.get("max_num_batched_tokens")
        if tokens is None:
            tokens = tokens_default if chunked else max(model_len, tokens_default)
            tokens = min(seqs * model_len, tokens)
        if "max_num_seqs" not in g:
            seqs = min(seqs, tokens)
        if g.get("max_num_partial_prefills", 1) != 1:
            raise ConfigError(f"{WHERE}: --max-num-partial-prefills="
                              f"{g['max_num_partial_prefills']} is not modelled (only vLLM's "
                              "default 1); drop the flag")
        backend = g.get("distributed_executor_backend")
        async_default = backend != "ray"
        if backend == "ray" and g.get("async_scheduling"):
            # vllm/config/vllm.py refuses an explicit --async-scheduling on an executor
            # without support for it.
            raise ConfigError(f"{WHERE}: --async-scheduling with --distributed-executor-backend "
                              "ray: vLLM refuses it (the Ray executor does not support async "
                              "scheduling); drop one of them")
        tp = int(g.get("tensor_parallel_size", 1))
        dp = self.data_parallel_size
        ep = 1
        if g.get("enable_expert_parallel"):
            if model.is_moe:
                ep = tp * dp
            else:
                notes.append(f"--enable-expert-parallel ignored: {model.name} is dense")
        values: dict[str, Any] = {
            "max_num_seqs": seqs,
            "max_num_batched_tokens": tokens,
            "block_size": g.get("block_size", 16),
            "gpu_memory_utilization": g.get("gpu_memory_utilization", 0.9),
            "enable_prefix_caching": bool(g.get("enable_prefix_caching", True)),
            "enable_chunked_prefill": chunked,
            "max_model_len": max_model_len,
            "kv_cache_dtype": g.get("kv_cache_dtype", "auto"),
            "tensor_parallel_size": tp,
            "pipeline_parallel_size": int(g.get("pipeline_parallel_size", 1)),
            "expert_parallel_size": ep,
            "num_gpu_blocks_override": g.get("num_gpu_blocks_override"),
            "async_scheduling": bool(g.get("async_scheduling", async_default)),
            "long_prefill_token_threshold": g.get("long_prefill_token_threshold", 0),
            "reserve_full_isl": bool(g.get("scheduler_reserve_full_isl", True)),
        }
        try:
            config = replace(base or EngineConfig(), **values)
            config.check_model(model)
        except SettingError as err:
            raise ConfigError(f"{WHERE}: {flag_of(err.field)}: {err}") from None
        if dp < 1:
            raise ConfigError(f"{WHERE}: --data-parallel-size={dp}; allowed: an integer >= 1")
        return ServerSettings(self, model, config, dp, tuple(notes))


@dataclass(frozen=True)
class ServerSettings:
    """A ``vllm serve`` command resolved for one hardware: the model (its dtype as served),
    the engine settings of each engine (``config``) and the number of DP engines."""

    args: ServerArgs
    model: ModelSpec
    config: EngineConfig
    data_parallel_size: int
    notes: tuple[str, ...] = field(default=())


def batch_defaults(hardware: HardwareSpec) -> tuple[int, int]:
    """vLLM 0.19's ``vllm serve`` defaults ``(max_num_seqs, max_num_batched_tokens)`` for a
    device (``EngineArgs.get_batch_defaults``, usage context ``OPENAI_API_SERVER``): large ones
    for >= 70 GiB devices other than the A100 (vLLM PR #17885 found them slower there)."""
    big = hardware.mem_gib * GIB >= 70 * GIB and "a100" not in hardware.name.lower()
    return (1024, 8192) if big else (256, 2048)


def flag_of(name: str) -> str:
    """The ``vllm serve`` flag of an ``EngineConfig`` field or vLLM setting name."""
    name = {"reserve_full_isl": "scheduler_reserve_full_isl",
            "expert_parallel_size": "enable_expert_parallel"}.get(name, name)
    return "--" + name.replace("_", "-")


def _len_value(text: str, flag: str) -> int:
    """vLLM's ``human_readable_int``: ``32768``, ``32k`` (x1000), ``32K`` (x1024), ``1m``/``1M``."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not m:
        raise ConfigError(f"{WHERE}: {flag}={text!r}; give an integer (or 32k / 32K)")
    number, unit = float(m.group(1)), m.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    value = number * scale
    if not value.is_integer():
        raise ConfigError(f"{WHERE}: {flag}={text!r} is not a whole number of tokens")
    return int(value)


def _convert(flag: str, kind: str, raw: str) -> Any:
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError
            return value
    except ValueError:
        raise ConfigError(f"{WHERE}: {flag}={raw!r}; give a{'n integer' if kind == 'int' else ' number'}"
                          ) from None
    if kind == "len":
        if raw.strip() == "-1":
            raise ConfigError(f"{WHERE}: {flag}=-1 (fit to memory) is not modelled; give the "
                              "length vLLM chose (the server log's 'Maximum concurrency for N "
                              "tokens per request' line)")
        return _len_value(raw, flag)
    return raw


def _normalise(token: str) -> str:
    """``--max_num_seqs=8`` -> ``--max-num-seqs=8`` (vLLM accepts either spelling)."""
    if not token.startswith("--"):
        return token
    name, eq, value = token.partition("=")
    return name.replace("_", "-") + eq + value


class _Cursor:
    """The command's tokens, consumed left to right."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i = tokens, 0

    def done(self) -> bool:
        return self.i >= len(self.tokens)

    def peek(self) -> str:
        return self.tokens[self.i]

    def next(self) -> str:
        self.i += 1
        return self.tokens[self.i - 1]

    def value(self, flag: str, inline: str | None) -> str:
        """A flag's value: written inline (``--flag=v``) or the next token (a negative number
        counts as a value, another flag does not)."""
        if inline is not None:
            return inline
        if self.done() or (self.peek().startswith("-") and not re.fullmatch(r"-\d.*", self.peek())):
            raise ConfigError(f"{WHERE}: {flag} needs a value; write {flag} VALUE")
        return self.next()


def read_server_args(command: str) -> ServerArgs:
    """Parse a pasted ``vllm serve`` command (see the module docstring). Raises
    ``ConfigError`` naming the flag for an unknown flag, one we do not model, a missing or
    malformed value, or a command without a model."""
    try:
        tokens = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"{WHERE}: cannot split the command ({exc}); check its quotes") from None
    if tokens[:2] == ["vllm", "serve"]:
        tokens = tokens[2:]
    elif tokens[:1] in (["serve"], ["vllm"]):
        raise ConfigError(f"{WHERE}: the command starts with {tokens[0]!r}; paste the whole "
                          "'vllm serve MODEL --flag ...' command")
    given: dict[str, Any] = {}
    ignored: list[str] = []
    positional: list[str] = []
    cur = _Cursor(tokens)
    while not cur.done():
        tok = _normalise(cur.next())
        if not tok.startswith("-") or re.fullmatch(r"-\d.*", tok):
            positional.append(tok)
            continue
        name, eq, inline = tok.partition("=")
        name = SHORT.get(name, name)
        negated = name.startswith("--no-") and name[:2] + name[5:] in MODELLED
        key = name[:2] + name[5:] if negated else name
        given_inline = inline if eq else None
        if key in MODELLED:
            dest, kind = MODELLED[key]
            if kind == "bool":
                if eq:
                    raise ConfigError(f"{WHERE}: {name} takes no value; write {key} or "
                                      f"--no-{key[2:]}")
                given[dest] = not negated
            elif negated:
                raise ConfigError(f"{WHERE}: {name} is not a vLLM flag; {key} takes a value")
            elif kind == "names":
                names = [cur.value(name, given_inline)]
                while given_inline is None and not cur.done() and not cur.peek().startswith("-"):
                    names.append(cur.next())
                given[dest] = tuple(names)
            else:
                given[dest] = _convert(key, kind, cur.value(name, given_inline))
            continue
        if name == "--optimization-level" or (name.startswith("-O") and name[1:2] == "O"):
            level = name[2:].lstrip("=") if len(name) > 2 and name[1] == "O" else ""
            level = level or cur.value(name, given_inline)
            if level in ("2", "3"):  # vLLM 0.19's default -O2 (-O3 is currently the same)
                ignored.append(f"-O{level}")
                continue
            raise ConfigError(f"{WHERE}: -O{level} is not modelled by servesweep "
                              f"({NOT_MODELLED['-O']}); drop it to simulate the server without it")
        if name in NOT_MODELLED:
            raise ConfigError(f"{WHERE}: {name} is not modelled by servesweep "
                              f"({NOT_MODELLED[name]}); drop it to simulate the server without it")
        base = name[:2] + name[5:] if name.startswith("--no-") else name
        if base in IGNORED_SWITCHES:
            ignored.append(name)
            continue
        if name in IGNORED_WITH_VALUE:
            ignored.append(f"{name}={cur.value(name, given_inline)}")
            continue
        raise ConfigError(f"{WHERE}: {name} is not a vllm serve flag servesweep knows; check "
                          "its spelling, or drop it if it does not change serving performance")
    model = given.pop("model", None)
    if len(positional) > 1:
        raise ConfigError(f"{WHERE}: more than one positional argument {positional}; give "
                          "'vllm serve MODEL --flag value ...'")
    if positional:
        if model is not None and model != positional[0]:
            raise ConfigError(f"{WHERE}: the model is given twice ({positional[0]!r} and "
                              f"--model {model!r}); give it once")
        model = positional[0]
    if not model:
        raise ConfigError(f"{WHERE}: no model; give 'vllm serve MODEL ...'")
    if "dtype" in given and given["dtype"] not in DTYPES:
        raise ConfigError(f"{WHERE}: --dtype={given['dtype']!r}; allowed: {sorted(DTYPES)}")
    names = tuple(given.pop("served_model_name", ()))
    return ServerArgs(command, str(model), given, tuple(ignored), names)
