"""The front end in front of an engine core: vLLM's API-server process as one FIFO server.

A client's request does not reach the engine core when the client sends it, and a token the
engine core produces does not reach the client when the step ends. vLLM 0.19 runs the path in
between in one Python process per engine (``vllm serve`` with the default
``--api-server-count 1``; a data-parallel group shares it), driven by one asyncio loop:

- **Request in** (``vllm/entrypoints/openai/serving_completion.py`` / ``serving_chat.py``):
  the HTTP request is parsed and validated, the prompt rendered and tokenised, then
  ``AsyncLLM.add_request`` (``vllm/v1/engine/async_llm.py``) runs the ``InputProcessor``, builds
  an ``EngineCoreRequest`` and sends it msgpack-encoded over ZMQ to the engine-core process,
  whose input thread decodes it for the busy loop (``vllm/v1/engine/core.py``). Cost: a fixed
  part (``request_us``; with HTTP ``http_request_us`` on top) and a part per prompt token
  (``request_us_per_prompt_token``, plus ``tokenize_us_per_token`` when the prompt arrives as
  text); the engine core's intake (``intake_us`` and per prompt token) follows in its own
  thread.
- **Tokens out**: after each step the engine core sends one ``EngineCoreOutputs`` message;
  the API server's ``output_handler`` task decodes it and runs
  ``OutputProcessor.process_outputs`` (``vllm/v1/engine/output_processor.py``: incremental
  detokenisation, ``RequestOutput``, the request's queue) in chunks of
  ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE``; each request's streaming generator then formats its SSE
  chunk and writes it. Cost: ``output_step_us`` per message plus ``output_token_us`` per
  request in it (``stream_token_us`` more with HTTP streaming).

Because it is one process, this work queues: requests arriving while the server streams the
tokens of a large batch wait for it (a known vLLM bottleneck at high request rates). The model
is exactly that: one server, jobs served in the order they arrive, each for its cost. A
request reaches the engine core ``ipc_us`` plus its intake after its job ends; a step's tokens
reach the server ``ipc_us`` after the step ends and the client ``network_us`` after their job
ends (every token of a step when the whole message is processed: the handler
yields to the streaming generators only between chunks).

Modes (``FrontEndSpec.mode``): ``api_server`` (``vllm serve`` with an HTTP client sending
text, as ``vllm bench serve`` does), ``in_process`` (``AsyncLLM`` in the client's own process
given token ids: no HTTP, no tokenisation, no network; the shared ground-truth runs were made
this way) and ``none`` (the client sees the engine core's own instants).

The front end belongs to the deployment (``engine.deployment.Deployment.frontend``; one
server per engine unit: an instance, or a DP group behind one API server). The engine runs the
servers inside its event clock (``engine.cluster.run_cluster``): a request's engine arrival
depends on the output work queued before it, which depends on the engine's steps. Without a
``FrontEndSpec`` (the engine library's default) the client sees the engine's own instants.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, fields

from engine.specs import ConfigError

FRONTEND_MODES = ("api_server", "in_process", "none")
_NS_PER_US = 1000
_REQUEST, _OUTPUT = 0, 1
# A front-end cost's bound: 1000 s a job is beyond any server, and the server's clock and
# costs are 64-bit integer ns when compiled (frontend.pxd).
_MAX_US = 1e9


@dataclass(frozen=True, slots=True)
class FrontEndSpec:
    """The front end of every engine of a deployment: its mode and the cost of each part (µs).

    The one definition of these figures. The defaults are vLLM 0.19.1's own code paths timed
    in CPU time by ``benchmarks/frontend_costs.py`` (docs/frontend.md, "Measured costs": the
    minimum over 9 repeats on this repository's 2-core Xeon; run-to-run spread up to 25 %).
    ``mode`` selects which parts apply (module docstring): ``http_request_us``,
    ``tokenize_us_per_token``, ``stream_token_us`` and ``network_us`` only with
    ``api_server``. ``ipc_us`` and ``network_us`` (the ZMQ hop, the client's link) were not
    measured and default to 0; set them for a remote client or a measured host.
    """

    mode: str = "api_server"
    # AsyncLLM.add_request: InputProcessor.process_inputs, OutputProcessor.add_request,
    # msgpack of the EngineCoreRequest (40 % of the measured 126 µs request path at P = 100).
    request_us: float = 50.0
    # The request path's growth with the prompt (not tokenising): pydantic/JSON over the text,
    # the prompt-id checks, the detokenizer's priming, msgpack of the ids.
    request_us_per_prompt_token: float = 0.090
    # JSON body -> CompletionRequest, tokenisation parameters, SamplingParams, the renderer
    # (60 % of the 126 µs). Not in it: uvicorn / Starlette (not installed, not measured).
    http_request_us: float = 76.0
    # tokenizer.encode of a text prompt, byte-level BPE with Llama 3's 128,256-token vocabulary.
    tokenize_us_per_token: float = 3.36
    # The engine core's input thread: msgpack decode and Request.from_engine_core_request with
    # the prefix-caching block hashes (runs beside the API server, before the scheduler).
    intake_us: float = 24.0
    intake_us_per_prompt_token: float = 0.19
    # One output_handler iteration (stats logging on, vllm serve's default): fixed, and per
    # request that got a token (detokenise, RequestOutput, the collector, stat loggers).
    output_step_us: float = 27.0
    output_token_us: float = 12.6
    # Per request-token of a stream: waking its task, the CompletionStreamResponse chunk
    # (model_dump_json) and its SSE framing. Not in it: the ASGI send / socket write.
    stream_token_us: float = 17.1
    ipc_us: float = 0.0  # API server <-> engine core over ZMQ, one way (not measured)
    network_us: float = 0.0  # client <-> API server, one way (not measured; loopback ~0)

    def __post_init__(self) -> None:
        if self.mode not in FRONTEND_MODES:
            raise ConfigError(f"frontend={self.mode!r} is not allowed; allowed: "
                              f"{list(FRONTEND_MODES)}")
        for f in fields(self):
            if f.name == "mode":
                continue
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < _MAX_US:
                raise ConfigError(f"frontend {f.name}={v!r} is not allowed; allowed: a number "
                                  f"of microseconds >= 0 and below {_MAX_US:.0e} (1000 s)")

    def costs(self) -> FrontEndCosts | None:
        """The per-job costs in ns this mode implies, or None for ``none``."""
        if self.mode == "none":
            return None
        http = self.mode == "api_server"

        def ns(us: float) -> int:
            return round(us * _NS_PER_US)

        return FrontEndCosts(
            request_ns=ns(self.request_us + (self.http_request_us if http else 0.0)),
            request_ns_per_token=(self.request_us_per_prompt_token
                                  + (self.tokenize_us_per_token if http else 0.0)) * _NS_PER_US,
            intake_ns=ns(self.intake_us),
            intake_ns_per_token=self.intake_us_per_prompt_token * _NS_PER_US,
            output_step_ns=ns(self.output_step_us),
            output_token_ns=ns(self.output_token_us + (self.stream_token_us if http else 0.0)),
            ipc_ns=ns(self.ipc_us),
            network_ns=ns(self.network_us) if http else 0,
        )


@dataclass(frozen=True, slots=True)
class FrontEndCosts:
    """Per-job costs of one API server, ns (see the module docstring)."""

    request_ns: int  # the server's fixed work per request
    request_ns_per_token: float  # its work per prompt token (tokenising included for text)
    intake_ns: int  # the engine core's input thread, per request (not the server's work)
    intake_ns_per_token: float  # ... per prompt token
    output_step_ns: int  # per EngineCoreOutputs message
    output_token_ns: int  # per request-token in a message
    ipc_ns: int  # API server <-> engine core, one way
    network_ns: int  # client <-> API server, one way


class ApiServer:
    """One front-end process: a FIFO server of request and output jobs.

    ``submit`` queues a request at its send time, ``outputs`` a step's output message; ``run``
    serves every job that has reached the server by a given instant, in arrival order (ties:
    in the order they were queued), and returns the requests it handed to the engine core.
    Jobs are always queued no later than they reach the server (a request travels
    ``network_ns`` and an output message ``ipc_ns`` first), so serving them when the clock
    reaches their arrival is exact.
    """

    __slots__ = ("costs", "free_at", "_jobs", "_seq", "_requests", "client_ns", "busy_ns",
                 "_ipc_ns", "_network_ns", "_output_step_ns", "_output_token_ns")

    def __init__(self, costs: FrontEndCosts) -> None:
        self.costs = costs
        # The costs read at every step, as fields (C integers when compiled: frontend.pxd).
        self._ipc_ns = costs.ipc_ns
        self._network_ns = costs.network_ns
        self._output_step_ns = costs.output_step_ns
        self._output_token_ns = costs.output_token_ns
        self.free_at = 0
        # (arrival at the server, seq, cost, kind, a, b): a request job carries (request,
        # member), an output job (the member's delivery list, step index).
        self._jobs: list[tuple[int, int, int, int, object, object]] = []
        self._seq = 0
        # Arrivals of the request jobs not yet served, in order (requests are queued in send
        # order, so they are served in this order too).
        self._requests: deque[int] = deque()
        # Per member (keyed by the caller): the client delivery ns of each of its steps
        # (-1: the step streamed nothing).
        self.client_ns: dict[int, list[int]] = {}
        self.busy_ns = 0  # total work served (utilisation = busy_ns / makespan)

    def next_arrival(self) -> int | None:
        """When the next queued job reaches the server (None: nothing queued)."""
        return self._jobs[0][0] if self._jobs else None

    def next_request_arrival(self) -> int | None:
        """When the earliest request still held reached (or reaches) the server: no request
        it holds can reach the engine core before then."""
        return self._requests[0] if self._requests else None

    def submit(self, send_ns: int, prompt_len: int, request: object, member: object) -> None:
        """Queue ``request`` (for ``member``) sent by the client at ``send_ns``."""
        c = self.costs
        cost = c.request_ns + round(c.request_ns_per_token * prompt_len)
        # After the server's job: the socket hop and the engine core's intake of it.
        after = c.ipc_ns + c.intake_ns + round(c.intake_ns_per_token * prompt_len)
        self._push(send_ns + c.network_ns, cost, _REQUEST, request, (member, after))
        self._requests.append(send_ns + c.network_ns)

    def outputs(self, key: int, step: int, end_ns: int, num_tokens: int) -> None:
        """The output message of step ``step`` of member ``key``: sent when the step ends at
        ``end_ns``, carrying ``num_tokens`` new tokens (one per request that sampled)."""
        log = self.client_ns.get(key)
        if log is None:
            log = self.client_ns[key] = []
        have = len(log)
        if have <= step:
            log.extend([-1] * (step + 1 - have))
        if num_tokens == 0:
            return  # nothing to stream (only prefill chunks that sampled no token)
        self._push(end_ns + self._ipc_ns,
                   self._output_step_ns + self._output_token_ns * num_tokens, _OUTPUT, log, step)

    def _push(self, arrival: int, cost: int, kind: int, a: object, b: object) -> None:
        self._seq += 1
        heapq.heappush(self._jobs, (arrival, self._seq, cost, kind, a, b))

    def run(self, t: int) -> list[tuple[int, object, object]]:
        """Serve the jobs that reached the server by ``t``; returns ``(engine arrival ns,
        request, member)`` of each request job served, in order."""
        handed: list[tuple[int, object, object]] = []
        jobs = self._jobs
        while jobs and jobs[0][0] <= t:
            job = heapq.heappop(jobs)
            arrival, cost, kind, a, b = job[0], job[2], job[3], job[4], job[5]
            start = arrival if arrival > self.free_at else self.free_at
            done = start + cost
            self.free_at = done
            self.busy_ns += cost
            if kind == _OUTPUT:  # the client receives the step's tokens
                a[b] = done + self._network_ns  # type: ignore[index]
            else:
                member, after = b  # type: ignore[misc]
                handed.append((done + after, a, member))
                self._requests.popleft()
        return handed
