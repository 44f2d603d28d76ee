"""CPU cost of vLLM 0.19.1's own front-end code paths, per request and per token.

Times vLLM's real objects (no re-implementation) on this machine's CPU, for the front-end
latency model (client -> API server -> engine core -> back):

- ``request_us``: the API server's fixed work per request before the engine core sees it:
  ``CompletionRequest`` validation (``entrypoints/openai/completion/protocol.py``),
  ``CompletionRequest.build_tok_params`` / ``to_sampling_params``, the renderer's work around the
  tokenizer call (``renderers/base.py`` ``BaseRenderer.render_cmpl``), ``InputProcessor.process_inputs``
  + ``assign_request_id`` (``v1/engine/input_processor.py``), ``OutputProcessor.add_request``
  (``v1/engine/output_processor.py``, builds the ``FastIncrementalDetokenizer``) and the
  ``MsgpackEncoder`` encoding of the ``EngineCoreRequest`` (``v1/serial_utils.py``, called by
  ``AsyncMPClient._send_input`` in ``v1/engine/core_client.py``). The engine core's intake of it
  (``MsgpackDecoder(EngineCoreRequest).decode`` + ``Request.from_engine_core_request`` with the
  prefix-caching block hasher, ``EngineCoreProc.process_input_sockets`` / ``preprocess_add_request``
  in ``v1/engine/core.py``) is reported separately: it runs in the engine-core process's input
  thread, not in the API server. Every part is fitted as ``a + b * prompt_tokens``.
- ``tokenize_us_per_token``: ``tokenizer.encode`` of an English prompt (100..8000 tokens) with a
  Hugging Face fast tokenizer (vLLM's ``CachedTokenizer`` around ``PreTrainedTokenizerFast``).
  No tokenizer files exist offline, so a byte-level BPE (Llama 3 pre-tokenizer regex) is trained
  with ``tokenizers`` on the venv's own .py/.md/.txt/.rst files (32k and 128,256 vocab), and timed
  on held-out English (docstrings of the Python standard library).
- ``output_us_per_step`` / ``output_us_per_request``: one ``AsyncLLM.output_handler`` iteration
  (``v1/engine/async_llm.py``) for n running requests with one new token each:
  ``MsgpackDecoder(EngineCoreOutputs).decode``, ``OutputProcessor.process_outputs`` in chunks of
  ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` (incremental detokenisation, stop checks, stats,
  ``RequestOutput`` creation, ``RequestOutputCollector.put``), ``update_scheduler_stats`` and
  ``StatLoggerManager.record`` (Prometheus + logging stat loggers, as ``vllm serve`` runs them),
  fitted as ``a + b * n``.
- ``stream_us_per_token``: per request-token, the OpenAI server's streaming work after the
  output handler: the request's ``generate()`` task draining its collector and the completion
  stream generator building ``CompletionStreamResponse`` + ``model_dump_json`` + the SSE string
  (the vLLM protocol classes; the loop body is written here because ``serving.py`` imports
  FastAPI, which the venv lacks), measured on uvloop with n concurrent request tasks.

Not covered: HTTP (uvicorn/starlette request parsing, ASGI send), the kernel's sockets, the ZMQ
hop between processes, the network and the client.

Run in the fidelity venv (it has vLLM 0.19.1's CPU build, tokenizers, transformers, msgspec):

    venv="$(bash scripts/install_fidelity.sh)"
    "$venv/bin/python" benchmarks/frontend_costs.py [--repeat 7] [--json OUT.json]

The trained tokenizers and a tiny model directory (config.json, no weights) are cached under
``${XDG_CACHE_HOME:-~/.cache}/servesweep/frontend-costs`` (about 20 s to train, once). Each timing
is repeated ``--repeat`` times (>= 5) and timed in process CPU time (the machine is shared;
wall time is recorded beside it). The reported value is the minimum over repeats (least
disturbed by other processes); the spread is min..median..max over repeats, and for a fitted
coefficient the range of the fits of each repeat. Fits use the per-point minima.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

VOCABS = (32000, 128256)
PROMPT_LENS = (100, 250, 500, 1000, 2000, 4000, 8000)
REQUEST_PROMPT_LENS = (100, 1000, 8000)
BATCH_SIZES = (1, 8, 32, 128, 256)
CORPUS_MIB = 40
# Llama 3's pre-tokenizer split (its tokenizer.json), so words split as Llama 3 splits them.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>")
# What each measured part runs (files under vllm/), recorded in the JSON.
FUNCTIONS = {
    "parse_validate": "entrypoints/openai/completion/protocol.py CompletionRequest.model_validate"
                      " (of json.loads of the body)",
    "sampling_params": "CompletionRequest.build_tok_params, CompletionRequest.to_sampling_params",
    "render_cmpl": "renderers/base.py BaseRenderer.render_cmpl (text prompt, tokenises)",
    "render_overhead": "renderers/base.py BaseRenderer.render_cmpl (token-id prompt)",
    "tokenizer_encode": "tokenizers/hf.py CachedTokenizer.encode (PreTrainedTokenizerFast)",
    "process_inputs": "v1/engine/input_processor.py InputProcessor.process_inputs, "
                      "assign_request_id",
    "output_processor_add_request": "v1/engine/output_processor.py OutputProcessor.add_request"
                                    " (RequestState, FastIncrementalDetokenizer)",
    "msgpack_encode": "v1/serial_utils.py MsgpackEncoder.encode(EngineCoreRequest)",
    "core_msgpack_decode": "v1/serial_utils.py MsgpackDecoder(EngineCoreRequest).decode",
    "core_decode_and_request": "MsgpackDecoder.decode + v1/request.py "
                               "Request.from_engine_core_request (sha256 block hasher)",
    "output_handler_step": "v1/engine/async_llm.py output_handler body: MsgpackDecoder("
                           "EngineCoreOutputs).decode, OutputProcessor.process_outputs (chunked),"
                           " update_scheduler_stats, v1/metrics/loggers.py "
                           "StatLoggerManager.record",
    "engine_core_output_encode": "v1/serial_utils.py MsgpackEncoder.encode_into"
                                 "(EngineCoreOutputs)",
    "api_server_step_with_streaming": "output_handler_step + per request: AsyncLLM.generate "
                                      "loop, utils/async_utils.py merge_async_iterators, "
                                      "CompletionStreamResponse.model_dump_json, SSE string",
    "chunk_objects": "CompletionStreamResponse / ChatCompletionStreamResponse + model_dump_json",
}


# ---------------------------------------------------------------------------- statistics


@dataclass
class Sample:
    """Per-call microseconds, one value per repeat: process CPU time (``values``) and wall time."""

    values: list[float]
    wall: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        """The reported statistic: the minimum over repeats (least disturbed by other load)."""
        return min(self.values)

    def spread(self) -> dict[str, float]:
        out = {"min": self.best, "median": statistics.median(self.values),
               "max": max(self.values)}
        if self.wall:
            out["wall_median"] = statistics.median(self.wall)
            out["wall_min"] = min(self.wall)
        return out


class Clock:
    """Process CPU time and wall time of a block (the machine is shared, so CPU time is the
    cost; wall time also counts the time other processes held the cores)."""

    def __enter__(self) -> Clock:
        self.c0, self.w0 = time.process_time_ns(), time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu = time.process_time_ns() - self.c0
        self.wall = time.perf_counter_ns() - self.w0


def timed(fn: Callable[[], Any], inner: int, repeat: int, setup: Callable[[], Any] | None = None
          ) -> Sample:
    """Median-of-repeats timing: each repeat runs ``fn`` ``inner`` times (after ``setup``)."""
    fn()  # warm-up
    cpu, wall = [], []
    for _ in range(repeat):
        if setup is not None:
            setup()
        gc.collect()
        with Clock() as c:
            for _ in range(inner):
                fn()
        cpu.append(c.cpu / inner / 1e3)
        wall.append(c.wall / inner / 1e3)
    return Sample(cpu, wall)


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def linfit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """``y = a + b x`` by least squares on relative residuals (weights 1/y^2), so the points
    at small x (tens of us) count as much as those at large x (ms) and ``a`` is meaningful."""
    w = [1.0 / max(y, 1e-9) ** 2 for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs, strict=True))
    sy = sum(wi * y for wi, y in zip(w, ys, strict=True))
    sxx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys, strict=True))
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return (sy - b * sx) / sw, b


def fit_samples(xs: list[int], samples: list[Sample]) -> dict[str, Any]:
    """Fit on the per-point minima; also on the medians, and the range of per-repeat fits."""
    a, b = linfit([float(x) for x in xs], [s.best for s in samples])
    am, bm = linfit([float(x) for x in xs], [statistics.median(s.values) for s in samples])
    per_rep = [
        linfit([float(x) for x in xs], [s.values[i] for s in samples])
        for i in range(min(len(s.values) for s in samples))
    ]
    return {
        "a": a, "b": b, "a_median_fit": am, "b_median_fit": bm,
        "a_range": [min(p[0] for p in per_rep), max(p[0] for p in per_rep)],
        "b_range": [min(p[1] for p in per_rep), max(p[1] for p in per_rep)],
        "points": {str(x): s.spread() for x, s in zip(xs, samples, strict=True)},
    }


# ---------------------------------------------------------------------------- fixtures


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    d = base / "servesweep" / "frontend-costs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def site_packages() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parents[1]


def train_tokenizer(vocab: int, out: Path) -> None:
    """Byte-level BPE with Llama 3's split regex, trained on the venv's own text files."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(
        p for p in site_packages().rglob("*")
        if p.suffix in {".py", ".md", ".txt", ".rst"} and p.is_file()
    )

    def texts():
        n = 0
        for p in files:
            try:
                t = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            n += len(t)
            yield t
            if n >= CORPUS_MIB * 2**20:
                return

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(SPECIALS), show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer)
    tok.save(str(out))


def model_dir(vocab: int) -> Path:
    """A weightless Llama-3.1-8B-shaped model directory with the trained tokenizer."""
    d = cache_dir() / f"llama-shaped-{vocab}"
    d.mkdir(exist_ok=True)
    tj = d / "tokenizer.json"
    if not tj.exists():
        print(f"training a {vocab}-token byte-level BPE on {CORPUS_MIB} MiB of the venv's files",
              file=sys.stderr)
        train_tokenizer(vocab, d / "tokenizer.json.tmp")
        (d / "tokenizer.json.tmp").rename(tj)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_hidden_layers": 32, "vocab_size": vocab, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "bos_token_id": 0, "eos_token_id": 1,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False, "hidden_act": "silu",
    }
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0],
        "eos_token": SPECIALS[1], "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer_config.json").write_text(json.dumps(tcfg))
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    return d


def heldout_english() -> str:
    """Docstrings of the base interpreter's standard library (not in the training corpus)."""
    stdlib = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    parts: list[str] = []
    for p in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Module):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    parts.append(doc)
    return "\n\n".join(parts)


@dataclass
class Stack:
    """vLLM 0.19.1's API-server objects for one tokenizer, built as AsyncLLM builds them."""

    vocab: int
    vllm_config: Any
    renderer: Any
    tokenizer: Any
    input_processor: Any
    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    notes: list[str] = field(default_factory=list)

    def prompt(self, n_tokens: int, start: int = 0) -> str:
        """Held-out English text that the tokenizer splits into ``n_tokens`` tokens."""
        s = self.offsets[start][0]
        e = self.offsets[start + n_tokens - 1][1]
        return self.text[s:e]


def build_stack(vocab: int) -> Stack:
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.v1.engine.input_processor import InputProcessor

    d = model_dir(vocab)
    mc = ModelConfig(model=str(d), max_model_len=16384, dtype="bfloat16")
    cfg = VllmConfig(model_config=mc, device_config=DeviceConfig(device="cpu"))
    ip = InputProcessor(cfg)
    tok = ip.tokenizer
    text = heldout_english()
    enc = tok._tokenizer.encode(text, add_special_tokens=False)
    return Stack(vocab, cfg, ip.renderer, tok, ip, text, list(enc.ids), list(enc.offsets))


# ---------------------------------------------------------------------------- measurements


def measure_tokenize(st: Stack, repeat: int) -> dict[str, Any]:
    """``tokenizer.encode`` (vLLM's CachedTokenizer -> PreTrainedTokenizerFast) per prompt."""
    samples_hf, samples_raw = [], []
    for n in PROMPT_LENS:
        prompts = [st.prompt(n, start=k * 997) for k in range(8)]
        it = iter(range(10**9))

        def hf(prompts=prompts, it=it):
            st.tokenizer.encode(prompts[next(it) % 8], add_special_tokens=True)

        def raw(prompts=prompts, it=it):
            st.tokenizer._tokenizer.encode(prompts[next(it) % 8], add_special_tokens=True)

        inner = max(3, 20000 // n)
        samples_hf.append(timed(hf, inner, repeat))
        samples_raw.append(timed(raw, inner, repeat))
    return {
        "vllm_tokenizer_encode": fit_samples(list(PROMPT_LENS), samples_hf),
        "rust_tokenizer_encode": fit_samples(list(PROMPT_LENS), samples_raw),
    }


def completion_body(prompt: str) -> bytes:
    """The body ``vllm bench serve`` posts to /v1/completions (``async_request_openai_completions``
    in ``vllm/benchmarks/lib/endpoint_request_func.py``), with ``--ignore-eos``."""
    return json.dumps({
        "model": "m", "prompt": prompt, "repetition_penalty": 1.0, "max_tokens": 128,
        "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0.0, "ignore_eos": True,
    }).encode()


def measure_request(st: Stack, repeat: int) -> dict[str, Any]:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.renderers.inputs.preprocess import parse_model_prompt
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector
    from vllm.v1.request import Request
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    mc = st.vllm_config.model_config
    cache = st.vllm_config.cache_config
    defaults = mc.get_diff_sampling_param()
    encoder = MsgpackEncoder()
    decoder = MsgpackDecoder(EngineCoreRequest)
    hash_fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(cache.block_size, hash_fn)
    op = OutputProcessor(st.tokenizer, log_stats=True, stream_interval=1)
    ip = st.input_processor
    counter = iter(range(10**9))

    parts: dict[str, list[Sample]] = {}
    sizes: dict[str, int] = {}
    for n in REQUEST_PROMPT_LENS:
        text = st.prompt(n)
        body = completion_body(text)
        req = CompletionRequest.model_validate(json.loads(body))
        tok_params = req.build_tok_params(mc)
        sp = req.to_sampling_params(128, defaults)
        parsed = [parse_model_prompt(mc, req.prompt)]
        engine_input = st.renderer.render_cmpl(parsed, tok_params)[0]
        parsed_ids = [parse_model_prompt(mc, list(engine_input["prompt_token_ids"]))]
        ecr = ip.process_inputs("cmpl-x-0", engine_input, sp, supported_tasks=("generate",))
        ip.assign_request_id(ecr)
        frames = encoder.encode(ecr)
        sizes[str(n)] = sum(len(memoryview(f)) for f in frames)
        inner = max(5, 4000 // n)

        def parse(body=body):
            # FastAPI decodes the JSON body, then validates it into the route's pydantic model.
            CompletionRequest.model_validate(json.loads(body))

        def params(req=req):
            req.build_tok_params(mc)
            req.to_sampling_params(128, defaults)

        def render(parsed=parsed, tok_params=tok_params):
            st.renderer.render_cmpl(parsed, tok_params)

        def render_ids(parsed_ids=parsed_ids, tok_params=tok_params):
            # The same renderer call for a prompt given as token ids: its work minus tokenizing.
            st.renderer.render_cmpl(parsed_ids, tok_params)

        def encode_only(text=text, tok_params=tok_params):
            st.tokenizer.encode(text, **tok_params.get_encode_kwargs())

        def process(engine_input=engine_input, sp=sp):
            r = ip.process_inputs(f"cmpl-{next(counter)}-0", engine_input, sp,
                                  supported_tasks=("generate",))
            ip.assign_request_id(r)

        def add(ecr=ecr, text=text, sp=sp):
            ecr.request_id = f"r{next(counter)}"
            op.add_request(ecr, text, None, 0, RequestOutputCollector(sp.output_kind,
                                                                      ecr.request_id))

        def encode(ecr=ecr):
            encoder.encode(ecr)

        def decode(frames=frames):
            decoder.decode(frames)

        def intake(frames=frames):
            Request.from_engine_core_request(decoder.decode(frames), block_hasher)

        def clear():
            op.request_states.clear()
            op.external_req_ids.clear()

        for name, fn, setup in (
            ("parse_validate", parse, None), ("sampling_params", params, None),
            ("render_cmpl", render, None), ("render_overhead", render_ids, None),
            ("tokenizer_encode", encode_only, None),
            ("process_inputs", process, None), ("output_processor_add_request", add, clear),
            ("msgpack_encode", encode, None), ("core_msgpack_decode", decode, None),
            ("core_decode_and_request", intake, None),
        ):
            parts.setdefault(name, []).append(timed(fn, inner, repeat, setup))
        clear()
        progress(f"request path, {n}-token prompt")
    xs = list(REQUEST_PROMPT_LENS)
    fits = {k: fit_samples(xs, v) for k, v in parts.items()}
    api = ("parse_validate", "sampling_params", "render_overhead", "process_inputs",
           "output_processor_add_request", "msgpack_encode")
    total_api = [
        Sample([sum(parts[k][i].values[r] for k in api) for r in range(repeat)])
        for i in range(len(xs))
    ]
    core = ("core_decode_and_request",)
    return {
        "parts": fits,
        "api_server_parts": list(api),
        "engine_core_parts": list(core),
        "api_server_total": fit_samples(xs, total_api),
        "engine_core_total": fits["core_decode_and_request"],
        "engine_core_request_bytes": sizes,
    }


def _requests_in_flight(st: Stack, n: int, prompt_len: int, log_stats: bool = True
                        ) -> tuple[Any, list[Any], list[str]]:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.renderers.inputs.preprocess import parse_model_prompt
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector

    mc = st.vllm_config.model_config
    op = OutputProcessor(st.tokenizer, log_stats=log_stats,
                         stream_interval=st.vllm_config.scheduler_config.stream_interval)
    req = CompletionRequest.model_validate(json.loads(completion_body(st.prompt(prompt_len))))
    sp = req.to_sampling_params(1 << 20, mc.get_diff_sampling_param())
    parsed = [parse_model_prompt(mc, req.prompt)]
    engine_input = st.renderer.render_cmpl(parsed, req.build_tok_params(mc))[0]
    queues, rids = [], []
    for i in range(n):
        ecr = st.input_processor.process_inputs(f"cmpl-{i}-0", engine_input, sp,
                                                supported_tasks=("generate",))
        st.input_processor.assign_request_id(ecr)
        q = RequestOutputCollector(sp.output_kind, ecr.request_id)
        op.add_request(ecr, req.prompt, None, 0, q)
        queues.append(q)
        rids.append(ecr.request_id)
    return op, queues, rids


class StepSource:
    """EngineCoreOutputs for n decoding requests, one new (real English) token each per step."""

    def __init__(self, st: Stack, rids: list[str]) -> None:
        from vllm.v1.serial_utils import MsgpackEncoder

        self.st, self.rids, self.step = st, rids, 0
        self.encoder = MsgpackEncoder()

    def frames(self) -> tuple[list[Any], int]:
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
        from vllm.v1.metrics.stats import SchedulerStats

        ids, s = self.st.ids, self.step
        self.step += 1
        outs = EngineCoreOutputs(
            engine_index=0,
            outputs=[
                EngineCoreOutput(request_id=r, new_token_ids=[ids[(1000 + 131 * i + s) % len(ids)]])
                for i, r in enumerate(self.rids)
            ],
            scheduler_stats=SchedulerStats(num_running_reqs=len(self.rids)),
            timestamp=time.monotonic(),
        )
        t0 = time.process_time_ns()
        frames = self.encoder.encode_into(outs, bytearray())
        return frames, time.process_time_ns() - t0


def make_output_handler_step(st: Stack, op: Any, logger_manager: Any) -> Callable[[Any], None]:
    """One iteration of ``AsyncLLM._run_output_handler``'s loop body, minus the awaits."""
    import vllm.envs as envs
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.metrics.stats import IterationStats
    from vllm.v1.serial_utils import MsgpackDecoder

    decoder = MsgpackDecoder(EngineCoreOutputs)
    chunk = envs.VLLM_V1_OUTPUT_PROC_CHUNK_SIZE

    def step(frames: Any) -> None:
        outputs = decoder.decode(frames)  # AsyncMPClient.process_outputs_socket
        num = len(outputs.outputs)
        iteration_stats = IterationStats() if (logger_manager is not None and num) else None
        eco = outputs.outputs
        for start in range(0, num, chunk):
            processed = op.process_outputs(eco[start:start + chunk], outputs.timestamp,
                                           iteration_stats)
            assert not processed.request_outputs
        op.update_scheduler_stats(outputs.scheduler_stats)
        if logger_manager is not None:  # None with --disable-log-stats
            logger_manager.record(engine_idx=outputs.engine_index,
                                  scheduler_stats=outputs.scheduler_stats,
                                  iteration_stats=iteration_stats,
                                  mm_cache_stats=st.renderer.stat_mm_cache())

    return step


def make_logger_manager(st: Stack) -> Any:
    from vllm.v1.metrics.loggers import StatLoggerManager

    return StatLoggerManager(vllm_config=st.vllm_config, engine_idxs=[0],
                             enable_default_loggers=True)


def measure_output(st: Stack, logger_manager: Any, repeat: int, steps: int) -> dict[str, Any]:
    """The output handler with ``log_stats`` (vllm serve's default), then without."""
    out = _measure_output(st, logger_manager, repeat, steps)
    out["output_handler_step_no_stats"] = _measure_output(st, None, repeat, steps)[
        "output_handler_step"]
    return out


def _measure_output(st: Stack, logger_manager: Any, repeat: int, steps: int) -> dict[str, Any]:
    samples, enc_samples = [], []
    for n in BATCH_SIZES:
        op, queues, rids = _requests_in_flight(st, n, 256, logger_manager is not None)
        src = StepSource(st, rids)
        step = make_output_handler_step(st, op, logger_manager)
        for _ in range(3):  # warm-up
            step(src.frames()[0])
            for q in queues:
                q.get_nowait()
        per_rep, wall_rep, enc_rep = [], [], []
        for _ in range(repeat):
            pre = [src.frames() for _ in range(steps)]
            gc.collect()
            cpu = wall = 0
            for frames, _ in pre:
                with Clock() as c:
                    step(frames)
                cpu, wall = cpu + c.cpu, wall + c.wall
                for q in queues:  # the generate() tasks drain their collectors between steps
                    q.get_nowait()
            per_rep.append(cpu / steps / 1e3)
            wall_rep.append(wall / steps / 1e3)
            enc_rep.append(sum(e for _, e in pre) / steps / 1e3)
        progress(f"output handler n={n} stats={logger_manager is not None}: "
                 f"{min(per_rep):.0f} us/step")
        samples.append(Sample(per_rep, wall_rep))
        enc_samples.append(Sample(enc_rep))
    return {
        "output_handler_step": fit_samples(list(BATCH_SIZES), samples),
        "engine_core_output_encode": fit_samples(list(BATCH_SIZES), enc_samples),
    }


def measure_stream(st: Stack, logger_manager: Any, repeat: int, steps: int) -> dict[str, Any]:
    """Whole API-server step on uvloop: output handler + n request tasks writing SSE strings."""
    import uvloop
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponseStreamChoice,
        CompletionStreamResponse,
    )
    from vllm.utils.async_utils import merge_async_iterators

    def point(n: int) -> Sample:
        op, queues, rids = _requests_in_flight(st, n, 256)
        src = StepSource(st, rids)
        step = make_output_handler_step(st, op, logger_manager)
        sink: list[str] = []

        async def generate(q: Any):
            # AsyncLLM.generate's loop (v1/engine/async_llm.py)
            while True:
                out = q.get_nowait() or await q.get()
                yield out

        async def completion_stream(q: Any):
            # completion_stream_generator's per-output body (entrypoints/openai/completion/
            # serving.py) for text only: no logprobs, no echo, no continuous usage.
            created = int(time.time())
            async for _, res in merge_async_iterators(generate(q)):
                for output in res.outputs:
                    chunk = CompletionStreamResponse(
                        id="cmpl-x", created=created, model="m",
                        choices=[CompletionResponseStreamChoice(
                            index=output.index, text=output.text, logprobs=None,
                            finish_reason=output.finish_reason, stop_reason=output.stop_reason,
                            prompt_token_ids=None, token_ids=None,
                        )],
                    )
                    response_json = chunk.model_dump_json(exclude_unset=False)
                    yield f"data: {response_json}\n\n"

        async def stream(q: Any):
            # Starlette's StreamingResponse iterates the generator; its ASGI send is not timed.
            async for sse in completion_stream(q):
                sink.append(sse)

        async def run(total_steps: int) -> tuple[float, float]:
            tasks = [asyncio.create_task(stream(q)) for q in queues]
            await asyncio.sleep(0)
            pre = [src.frames()[0] for _ in range(total_steps)]
            gc.collect()
            with Clock() as c:
                for frames in pre:
                    step(frames)
                    # Let the request tasks run (the handler awaits the next output here).
                    while len(sink) < n:
                        await asyncio.sleep(0)
                        if any(t.done() for t in tasks):  # they only end by an error
                            await asyncio.gather(*tasks)
                    sink.clear()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return c.cpu / total_steps / 1e3, c.wall / total_steps / 1e3

        async def all_repeats() -> list[tuple[float, float]]:
            # One event loop for all repeats: the collectors' asyncio.Events bind to it.
            await run(3)
            return [await run(steps) for _ in range(repeat)]

        reps = uvloop.run(all_repeats())
        progress(f"streaming n={n}: {min(r[0] for r in reps):.0f} us/step")
        return Sample([r[0] for r in reps], [r[1] for r in reps])

    samples = [point(n) for n in BATCH_SIZES]
    return {"api_server_step_with_streaming": fit_samples(list(BATCH_SIZES), samples)}


def measure_chunk_objects(repeat: int) -> dict[str, Any]:
    """Building and dumping one streamed chunk (completions and chat), synchronously."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
    )
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponseStreamChoice,
        CompletionStreamResponse,
    )
    from vllm.entrypoints.openai.engine.protocol import DeltaMessage

    def cmpl():
        c = CompletionStreamResponse(id="cmpl-x", created=1, model="m", choices=[
            CompletionResponseStreamChoice(index=0, text=" word", logprobs=None,
                                           finish_reason=None, stop_reason=None)])
        _ = f"data: {c.model_dump_json(exclude_unset=False)}\n\n"

    def chat():
        c = ChatCompletionStreamResponse(id="chatcmpl-x", object="chat.completion.chunk",
                                         created=1, model="m", choices=[
            ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content=" word"),
                                               logprobs=None, finish_reason=None)])
        _ = f"data: {c.model_dump_json(exclude_unset=True)}\n\n"

    return {"completion_chunk": timed(cmpl, 2000, repeat).spread(),
            "chat_chunk": timed(chat, 2000, repeat).spread()}


def python_calibration(repeat: int) -> dict[str, float]:
    """A fixed pure-Python workload (object creation, dict and attribute access), so the
    figures can be scaled to another host CPU by running this script there."""

    @dataclass
    class P:
        a: int
        b: str

    def work():
        d: dict[int, P] = {}
        for i in range(1000):
            d[i] = P(i, "x")
        t = 0
        for p in d.values():
            t += p.a + len(p.b)
        return t

    return timed(work, 50, repeat).spread()


# ---------------------------------------------------------------------------- report


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def fmt_fit(f: dict[str, Any], unit_b: str) -> str:
    return (f"{f['a']:9.1f} us [{f['a_range'][0]:.1f}..{f['a_range'][1]:.1f}]  "
            f"+ {f['b']:.4f} us/{unit_b} [{f['b_range'][0]:.4f}..{f['b_range'][1]:.4f}]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="repeats per timing (>= 5)")
    ap.add_argument("--steps", type=int, default=40, help="engine steps per output repeat")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    args = ap.parse_args()
    if args.repeat < 5:
        ap.error("--repeat must be >= 5")
    import vllm

    t_start = time.time()
    stacks = {v: build_stack(v) for v in VOCABS}
    main_st = stacks[128256]
    res: dict[str, Any] = {
        "vllm_version": vllm.__version__, "python": platform.python_version(),
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "vllm_functions_timed": FUNCTIONS,
        "repeat": args.repeat, "statistic": "process CPU time, minimum over repeats (fits on per-point minima); "
                     "spread: min/median/max over repeats, coefficient range over per-repeat fits",
        "tokenizer": {"kind": "byte-level BPE, Llama 3 split regex, trained with tokenizers",
                      "corpus": f"first {CORPUS_MIB} MiB of .py/.md/.txt/.rst under {site_packages()}",
                      "eval_text": "docstrings of the base interpreter's standard library"},
    }
    progress("stacks built")
    res["tokenize"] = {}
    for v, st in stacks.items():
        res["tokenize"][str(v)] = measure_tokenize(st, args.repeat)
        progress(f"tokenize {v} done")
    res["request"] = measure_request(main_st, args.repeat)
    progress("request path done")
    lm = make_logger_manager(main_st)
    res["output"] = measure_output(main_st, lm, args.repeat, args.steps)
    res["stream"] = measure_stream(main_st, lm, args.repeat, args.steps)
    res["stream_chunk_objects"] = measure_chunk_objects(args.repeat)
    res["python_calibration_us"] = python_calibration(args.repeat)
    progress("done")

    out_fit = res["output"]["output_handler_step"]
    nostats = res["output"]["output_handler_step_no_stats"]
    all_fit = res["stream"]["api_server_step_with_streaming"]
    req = res["request"]
    tok = res["tokenize"]["128256"]["vllm_tokenizer_encode"]
    tok32 = res["tokenize"]["32000"]["vllm_tokenizer_encode"]

    def par(f: dict[str, Any], coef: str, covers: str, **extra: Any) -> dict[str, Any]:
        return {"value": f[coef], "range": f[f"{coef}_range"],
                "median_fit": f[f"{coef}_median_fit"], "covers": covers, **extra}

    res["parameters"] = {
        "request_us": par(req["api_server_total"], "a", ", ".join(req["api_server_parts"]),
                          per_prompt_token_us=req["api_server_total"]["b"]),
        "request_us_per_prompt_token": par(
            req["api_server_total"], "b", "slope of request_us parts (not tokenising)"),
        "tokenize_us_per_token": par(tok, "b", "CachedTokenizer.encode, vocab 128256",
                                     fixed_us=tok["a"]),
        "tokenize_fixed_us": par(tok, "a", "intercept of tokenize fit, vocab 128256"),
        "tokenize_us_per_token_32k": par(tok32, "b", "CachedTokenizer.encode, vocab 32000",
                                         fixed_us=tok32["a"]),
        "engine_core_intake_us": par(
            req["engine_core_total"], "a", ", ".join(req["engine_core_parts"]),
            per_prompt_token_us=req["engine_core_total"]["b"]),
        "engine_core_intake_us_per_prompt_token": par(req["engine_core_total"], "b",
                                                      "slope of engine_core_intake_us"),
        "output_us_per_step": par(out_fit, "a", "AsyncLLM output_handler iteration, log_stats"),
        "output_us_per_request": par(out_fit, "b", "per request-token, log_stats"),
        "output_us_per_step_no_stats": par(nostats, "a", "--disable-log-stats"),
        "output_us_per_request_no_stats": par(nostats, "b", "--disable-log-stats"),
        "stream_us_per_token": {
            "value": all_fit["b"] - out_fit["b"],
            "range": [all_fit["b_range"][0] - out_fit["b_range"][1],
                      all_fit["b_range"][1] - out_fit["b_range"][0]],
            "covers": "api_server_step_with_streaming slope minus output_us_per_request: "
                      "task wake-up, generate()/merge_async_iterators hops, "
                      "CompletionStreamResponse + model_dump_json + SSE string"},
        "api_server_us_per_step_with_streaming": par(all_fit, "a", "whole step, uvloop"),
        "api_server_us_per_request_token_with_streaming": par(all_fit, "b",
                                                              "whole step, uvloop"),
        "engine_core_output_encode_us_per_step": par(
            res["output"]["engine_core_output_encode"], "a", "MsgpackEncoder.encode_into"),
        "engine_core_output_encode_us_per_request": par(
            res["output"]["engine_core_output_encode"], "b", "MsgpackEncoder.encode_into"),
    }
    res["load_average_at_end"] = os.getloadavg()
    res["wall_s"] = time.time() - t_start

    print(f"vLLM {vllm.__version__} front-end CPU costs on {res['cpu_model']} "
          f"({os.cpu_count()} cores, load {res['load_average_at_start'][0]:.1f}); process CPU "
          f"time, min of {args.repeat} repeats; fits a + b*x, [range over per-repeat fits]")
    for v in VOCABS:
        f = res["tokenize"][str(v)]["vllm_tokenizer_encode"]
        print(f"  tokenizer.encode, vocab {v:6d}    {fmt_fit(f, 'token')}")
        f = res["tokenize"][str(v)]["rust_tokenizer_encode"]
        print(f"  tokenizers.Tokenizer.encode {v:6d} {fmt_fit(f, 'token')}")
    for k, f in req["parts"].items():
        print(f"  request {k:28s} {fmt_fit(f, 'prompt tok')}")
    print(f"  request API-server total         {fmt_fit(req['api_server_total'], 'prompt tok')}")
    print(f"  engine-core intake               {fmt_fit(req['engine_core_total'], 'prompt tok')}")
    print(f"  output_handler step (log stats)  {fmt_fit(out_fit, 'request')}")
    print(f"  output_handler step (no stats)   {fmt_fit(nostats, 'request')}")
    print(f"  API-server step + streaming      {fmt_fit(all_fit, 'request')}")
    print(f"  engine-core output encode        "
          f"{fmt_fit(res['output']['engine_core_output_encode'], 'request')}")
    for k, sp in {**res["stream_chunk_objects"],
                  "python_calibration": res["python_calibration_us"]}.items():
        print(f"  {k:32s} {sp['min']:9.2f} us [median {sp['median']:.2f}, max {sp['max']:.2f}]")
    print("parameters:")
    for k, p in res["parameters"].items():
        rng = p.get("range")
        rs = f" [{rng[0]:.4g}..{rng[1]:.4g}]" if rng else ""
        print(f"  {k:48s} {p['value']:10.4g}{rs}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
