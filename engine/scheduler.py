"""The vLLM V1 two-phase scheduler (``vllm/v1/core/sched/scheduler.py``), FCFS policy.

There are no prefill/decode phases: every step each request is given
``num_tokens (+ placeholders) − num_computed_tokens`` tokens, chunked by the token budget
(and ``long_prefill_token_threshold``). Phase A serves running requests in admission order,
preempting from the tail (recompute) when blocks run out; Phase B admits waiting requests
FCFS while budget and ``max_num_seqs`` allow, stopping at the first that does not fit, and
is skipped entirely in a step that preempted. ``num_computed_tokens`` advances at schedule
time. With async scheduling (vLLM 0.19's default) a non-final step adds an output
placeholder so the next step can be scheduled before this one's token is known.
With lower KV tiers (:mod:`engine.kv_tiers`) an admission's NPU prefix hit is extended by
the tiers' hit (vLLM connector semantics); the recall time is added to the step's
``extra_ns``.

:meth:`Scheduler.decode_span` is an exact shortcut for runs of identical pure-decode steps
(no admission, no finish, no preemption): the same KV calls in the same order as
step-by-step scheduling, each request's counters advanced once. ``engine.instance`` drives it.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

from engine.batch import BatchShape
from engine.kv_cache import KVCacheManager
from engine.request import FINISHED, PREEMPTED, RUNNING, Request, TokenLog


class DecodeSpan:
    """A run of pure-decode steps as :meth:`Scheduler.steady_decode` found it: how many
    completions it may run to, and each running request's start state, its last schedule in
    the span and its first KV checks (for :meth:`Scheduler.decode_span`). Step ``i`` holds the
    requests whose ``stop`` is at least ``i``, each ``i`` tokens further than at the start
    (:meth:`Scheduler.span_segment` gives its batch shape).

    A plain class with fixed fields (compiled, an extension type: the span planner and the
    hold read its fields per span and per segment, as C fields rather than attribute
    lookups)."""

    __slots__ = ("max_completions", "lag", "c0", "room", "stop", "fin", "next_s", "next_u",
                 "openers")

    def __init__(self, max_completions: int, lag: int, c0: array, room: array, stop: array,
                 fin: array, next_s: array, next_u: array, openers: list[int]) -> None:
        self.max_completions = max_completions
        self.lag = lag  # num_tokens - num_computed_tokens of every request (sync 1, async 0)
        self.c0 = c0  # num_computed_tokens of each running request, in order (int64)
        # Per request: completions left until it finishes (max_tokens or max_model_len) and
        # the last schedule that includes it (sync room - 1; async room - 2: its final token
        # is then in flight, and schedule() skips it).
        self.room = room
        self.stop = stop
        # The operation of its final completion, if it finishes in the span (else _NO_OP).
        self.fin = fin
        self.next_s = next_s  # per request: the operation of its next schedule-side KV check
        # ... of its next completion-side check (async caching; else _NO_OP)
        self.next_u = next_u
        # Requests (positions) whose token at the span's first completion starts a new run of
        # their token times: async, those whose prompt (or recompute) finished in the step in
        # flight, so that completion is their first token since admission.
        self.openers = openers


@dataclass(slots=True)
class SpanOutcome:
    """What :meth:`Scheduler.decode_span` did, for the engine loop to log and hand on: per
    completion done (C_1, C_2, ...), the tokens it gave, the requests still running after it
    and the KV usage after it; the requests that finished, each with its completion's number,
    in the order step-by-step finishes them; the span's schedules still in flight at the end
    (its last ``len(tail)`` schedules, oldest first)."""

    ops: int
    gen: array  # int64
    running: array  # int64
    usage: array  # float64
    finished: list[tuple[int, Request]]
    tail: list[ScheduledStep]


_TUPLE_NEW = tuple.__new__


def _shape(total: int, seqs: int, pc: int, kp: int, nd: int, dsum: int, dmin: int,
           dmax: int) -> BatchShape:
    """``BatchShape(total, seqs, pc, kp, nd, dsum, dmin, dmax)`` (``moe_tokens`` 0), built as
    the tuple it is: a NamedTuple's own ``__new__`` is a Python function, about half a
    microsecond a step here."""
    return _TUPLE_NEW(BatchShape, (total, seqs, pc, kp, nd, dsum, dmin, dmax, 0))


def _first_kv_schedule(r: Request, c0: int, async_: bool) -> int:
    """The first schedule S_i of a decode span (``c0``: the request's computed tokens at its
    start) at which :meth:`Scheduler.schedule` calls ``allocate_slots`` for ``r``: ``after =
    c0 + i + 1`` reaches ``kv_check_at`` and passes the slots held, or the tokens reached
    (sync ``after``, async ``after - 1``) fill the first uncached block."""
    if async_:  # after >= min(kv_slots, kv_cache_at) + 1
        s, c = r.kv_slots, r.kv_cache_at
        return (s if s < c else c) - c0
    return r.kv_check_at - c0 - 1


# An operation no decode span reaches (a request's completion-side check without async
# prefix caching).
_NO_OP = 1 << 62
# One-element prototypes of the per-request arrays a span plan fills and of the
# per-completion columns ``decode_span`` writes (``_ZEROS * n``: one copy, cheaper than
# building an array from a list each time); never written to.
_ZEROS = array("q", [0])
_NO_OPS = array("q", [_NO_OP])
_ZERO_FLOATS = array("d", [0.0])


def _next_checks(r: Request, op: int, c0: int, lag: int, cache_async: bool) -> tuple[int, int]:
    """After request ``r``'s KV thresholds may have moved at operation ``op`` of a decode
    span, the operations of its next schedule-side and completion-side checks (each strictly
    after ``op``; ``c0``: its computed tokens at the span's start, ``lag``: num_tokens minus
    computed tokens then, 0 in async)."""
    s = 2 * _first_kv_schedule(r, c0, lag == 0)
    if s <= op:
        s = op + 1 + (op + 1) % 2  # the next schedule after op
    u = _NO_OP
    if cache_async:
        u = 2 * (r.kv_cache_at - c0 - lag + 1) - 1
        if u <= op:
            u = op + 1 + op % 2  # the next completion after op
    return s, u


def _schedules_of(stop: int, n_s: int) -> int:
    """How many of a span's first ``n_s`` schedules include a request whose last is S_stop."""
    sc = stop + 1
    if sc > n_s:
        return n_s
    return sc if sc > 0 else 0


def _first_due(next_s: array, next_u: array, fin: array) -> int:
    """The earliest operation at which any request of a span has a KV check or its finish
    due."""
    m = _NO_OP
    for p in range(len(next_s)):
        if next_s[p] < m:
            m = next_s[p]
        if next_u[p] < m:
            m = next_u[p]
        if fin[p] < m:
            m = fin[p]
    return m


def span_finishes(span: DecodeSpan, after: int, upto: int) -> list[int]:
    """The completions at which the requests that finish in ``span`` end (C_room for each),
    those from C_{after + 1} to C_upto, sorted (read before :meth:`Scheduler.decode_span`
    runs the span)."""
    fin, room = span.fin, span.room
    out = []
    for p in range(len(fin)):
        if fin[p] != _NO_OP:
            c = room[p]
            if after < c <= upto:
                out.append(c)
    out.sort()
    return out


class ScheduledStep:
    """One engine step: who runs, how many tokens each, and whether it samples a token.

    A plain class with fixed fields (compiled, an extension type: the scheduler makes one a
    step, and a dataclass's generated ``__init__`` is a Python function)."""

    __slots__ = ("reqs", "num_tokens", "samples", "preempted", "shape", "total_tokens",
                 "prompt_tokens", "extra_ns")

    def __init__(self, reqs: list[Request] | None = None, num_tokens: list[int] | None = None,
                 samples: list[bool] | None = None, preempted: list[Request] | None = None,
                 shape: BatchShape | None = None, total_tokens: int = 0,
                 prompt_tokens: int = 0, extra_ns: int = 0) -> None:
        self.reqs: list[Request] = [] if reqs is None else reqs
        self.num_tokens: list[int] = [] if num_tokens is None else num_tokens
        self.samples: list[bool] = [] if samples is None else samples
        self.preempted: list[Request] = [] if preempted is None else preempted
        self.shape = shape
        self.total_tokens = total_tokens
        self.prompt_tokens = prompt_tokens  # tokens of entries that are prefill chunks (n > 1)
        # Time this step spends beyond the batch's compute, on its critical path (e.g.
        # recalling prefix-cache KV from a lower memory tier). Added by whoever causes it.
        self.extra_ns = extra_ns

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"ScheduledStep({len(self.reqs)} requests, total_tokens={self.total_tokens}, "
                f"prompt_tokens={self.prompt_tokens}, extra_ns={self.extra_ns})")


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        long_prefill_token_threshold: int = 0,
        reserve_full_isl: bool = True,
        async_scheduling: bool = False,
        enable_chunked_prefill: bool = True,
        pipeline_parallel: bool = False,
    ) -> None:
        self.kv = kv
        # vLLM 0.19 runs async scheduling with PP only if no request has two tokens in flight
        # (vllm-project/vllm#32359): a request waiting for its sampled token is skipped.
        self.one_token_in_flight = pipeline_parallel and async_scheduling
        self.chunked_prefill = enable_chunked_prefill
        self.max_num_seqs = max_num_seqs
        self.token_budget = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.threshold = long_prefill_token_threshold
        self.reserve_full_isl = reserve_full_isl
        self.async_scheduling = async_scheduling
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Added since the last schedule(): the engine loop has not picked them up yet.
        self._unqueued: list[Request] = []
        self.num_preemptions = 0
        self.num_finished = 0
        # Steps scheduled in bulk by decode_span (of them, with requests waiting): how much of
        # the run was fast-forwarded.
        self.span_steps = 0
        self.span_steps_queued = 0
        # When each applied step ended: the requests' output token times index into it.
        self.token_log = TokenLog()

    # -- queue management ------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        self.waiting.append(req)
        if req.queued_ns < 0:
            self._unqueued.append(req)

    def has_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, victim: Request) -> None:
        """Recompute preemption: free blocks (they stay cached), reset progress, requeue
        at the front of ``waiting`` (vLLM ``_preempt_request``)."""
        self.kv.free(victim)
        victim.status = PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_output_placeholders = 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    # -- schedule ------------------------------------------------------------------------
    def schedule(self, now_ns: int) -> ScheduledStep:
        if self._unqueued:
            # vLLM's engine core drains its input queue at the top of each busy-loop
            # iteration, right before it schedules: that instant is the request's QUEUED
            # timestamp (``queued_ts``), whether or not this step admits it.
            for r in self._unqueued:
                r.queued_ns = now_ns
            self._unqueued.clear()
        kv = self.kv
        budget = self.token_budget
        thr = self.threshold
        max_len_m1 = self.max_model_len - 1
        async_ = self.async_scheduling
        one_in_flight = self.one_token_in_flight
        step = ScheduledStep()
        reqs, ntoks, samples = step.reqs, step.num_tokens, step.samples
        running = self.running
        # The batch shape the latency model sees, accumulated entry by entry.
        total = pc = kp = nd = dsum = dmin = dmax = 0

        # Phase A: running requests, in admission order (a for loop over ``running`` sees
        # the list shrink when preemption pops its tail). Each scheduled entry is advanced
        # at once (vLLM's _update_after_schedule runs after both phases, but nothing later
        # in this schedule reads a scheduled running request's state).
        add_req, add_n, add_sample = reqs.append, ntoks.append, samples.append
        for req in running:
            if budget <= 0:
                break
            computed = req.num_computed_tokens
            ph = req.num_output_placeholders
            if ph > 0 and (one_in_flight or computed + 2 - ph >= req.finish_at):
                continue  # async: certainly at max_tokens already (or PP: a token in flight)
            num_tokens = req.num_tokens
            n = num_tokens + ph - computed
            if 0 < thr < n:
                n = thr
            if n > budget:
                n = budget
            if n > max_len_m1 - computed:
                n = max_len_m1 - computed
            if n <= 0:
                continue
            after = computed + n
            # allocate_slots changes something only past the slots held or when a block
            # becomes full (kv_check_at is the smaller of the two bounds: one compare).
            if after >= req.kv_check_at and (
                after > req.kv_slots
                or (after if after < num_tokens else num_tokens) >= req.kv_cache_at
            ):
                scheduled = True
                while not kv.allocate_slots(req, n):
                    victim = running.pop()  # FCFS: the most recently admitted
                    self._preempt(victim)
                    step.preempted.append(victim)
                    if victim is req:
                        scheduled = False
                        break
                if not scheduled:
                    break
            add_req(req)
            add_n(n)
            budget -= n
            total += n
            if n > 1:
                pc += n
                kp += computed
            else:
                if nd == 0:
                    dmin = dmax = computed
                elif computed < dmin:
                    dmin = computed
                elif computed > dmax:
                    dmax = computed
                nd += 1
                dsum += computed
            req.num_computed_tokens = after
            if after >= num_tokens + ph:
                add_sample(True)
                if async_:
                    req.num_output_placeholders = ph + 1
            else:
                add_sample(False)

        # Phase B: admission, only in a step that preempted nobody.
        tiered = kv.tiers is not None
        if not step.preempted:
            waiting = self.waiting
            while waiting and budget > 0:
                if len(running) >= self.max_num_seqs:
                    break
                req = waiting[0]
                looked_up = req.num_computed_tokens == 0
                if looked_up:
                    hit_blocks, computed = kv.get_computed_blocks(req)
                    if tiered:
                        # Continue below the NPU (connector-style external hit tokens).
                        computed += kv.get_external_computed_tokens(req, computed)
                else:
                    hit_blocks, computed = [], req.num_computed_tokens
                n = req.num_tokens - computed
                if 0 < thr < n:
                    n = thr
                if n > budget:
                    if not self.chunked_prefill:
                        break  # vLLM: without chunked prefill the whole prompt must fit
                    n = budget
                if self.reserve_full_isl and not kv.can_fit_full_sequence(req, hit_blocks):
                    break
                if not kv.allocate_slots(req, n, computed, hit_blocks):
                    break  # head-of-line blocking: nothing behind it is tried
                if tiered and looked_up:
                    kv.admit_external(req)
                waiting.popleft()
                resumed = req.status == PREEMPTED
                running.append(req)
                req.status = RUNNING
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = computed
                if req.first_scheduled_ns < 0:
                    req.first_scheduled_ns = now_ns
                req.prefix_hit_tokens += computed
                if resumed:
                    req.recomputed_tokens += n
                reqs.append(req)
                ntoks.append(n)
                budget -= n
                # _update_after_schedule, as for the running entries above.
                total += n
                if n > 1:
                    pc += n
                    kp += computed
                else:
                    if nd == 0:
                        dmin = dmax = computed
                    elif computed < dmin:
                        dmin = computed
                    elif computed > dmax:
                        dmax = computed
                    nd += 1
                    dsum += computed
                after = computed + n
                req.num_computed_tokens = after
                if after >= req.num_tokens + req.num_output_placeholders:
                    samples.append(True)
                    if async_:
                        req.num_output_placeholders += 1
                else:
                    samples.append(False)

        if tiered:
            # Lower-tier KV recalled for this step's admissions is on its critical path.
            step.extra_ns += kv.take_recall_ns()
        step.total_tokens = total
        step.prompt_tokens = pc
        if reqs:
            step.shape = _shape(total, len(reqs), pc, kp, nd, dsum, dmin, dmax)
        return step

    # -- steady decode spans ---------------------------------------------------------------
    def steady_decode(self, inflight: list[ScheduledStep]) -> DecodeSpan | None:
        """The span that starts here if the next steps are identical pure decodes, else None.

        Called where the engine loop would call :meth:`schedule` next, with the steps it has in
        flight (async: the one step scheduled before this one; sync: none). Steady means:
        nothing waiting (or every seat taken: with ``max_num_seqs`` running, admission stops
        before it looks at the queue), every running request one decode token behind (sync:
        ``num_computed_tokens == num_tokens - 1``; async: ``== num_tokens`` with one output
        placeholder, and the step in flight is exactly the running requests, each sampling a
        token: a decode, or a prefill chunk that ends its prompt), and the token budget
        covering one token each. A request whose token run is not contiguous (its first token
        since admission comes at the span's first completion) opens a new run there, as
        :meth:`update_from_output` would.
        The same pass files each request's first KV check of the span (see
        :meth:`decode_span`).

        With nothing waiting, requests may finish inside the span (no admission can follow a
        finish before the caller's horizon): each drops out of the schedules once its final
        token is in flight and finishes at its completion; the span ends before the last
        request's finish. With requests waiting (every seat taken), it ends before the first.
        """
        if self.one_token_in_flight:
            return None
        running = self.running
        n = len(running)
        if n == 0 or n > self.token_budget:
            return None
        if self.waiting and n < self.max_num_seqs:
            return None  # admission may happen (with every seat taken, phase B stops at once)
        nxt = self.token_log.base + len(self.token_log.times)  # the next completion's number
        async_ = self.async_scheduling
        if async_:
            if len(inflight) != 1:
                return None
            prev = inflight[0]
            # A prefill entry of the step in flight that samples ends its prompt: its request
            # now stands where a decoding one does (computed == num_tokens, one placeholder).
            if prev.reqs != running or not all(prev.samples):
                return None
            lag, ph = 0, 1
        else:
            if inflight:
                return None
            lag, ph = 1, 0
        last = running[n - 1]  # the most recently admitted: the likeliest to be in prefill
        if last.num_output_placeholders != ph or last.num_tokens - last.num_computed_tokens != lag:
            return None
        cache_async = async_ and self.kv.enable_caching
        finishes = not self.waiting
        max_len = self.max_model_len
        lo_room = hi_room = 0
        c0 = _ZEROS * n
        rooms = _ZEROS * n
        stops = _ZEROS * n
        fins = _NO_OPS * n
        next_s = _ZEROS * n
        next_u = _NO_OPS * n
        openers: list[int] = []
        for pos in range(n):
            r = running[pos]
            c = r.num_computed_tokens
            nt = r.num_tokens
            if r.num_output_placeholders != ph or nt - c != lag:
                return None
            if r.tok_next != nxt:
                openers.append(pos)
            fa = r.finish_at
            room = (fa if fa < max_len else max_len) - nt
            rooms[pos] = room
            stops[pos] = room - 2 + lag
            if finishes:
                fins[pos] = 2 * room - 1  # the operation of its final completion
            if pos == 0 or room < lo_room:
                lo_room = room
            if room > hi_room:
                hi_room = room
            c0[pos] = c
            # Operations: a schedule S_i is number 2i, a completion C_i number 2i - 1.
            i = _first_kv_schedule(r, c, async_)
            next_s[pos] = 2 * i if i > 0 else 0
            if cache_async:
                q = r.kv_cache_at - nt + 1  # the first completion with upto >= kv_cache_at
                next_u[pos] = 2 * q - 1 if q > 1 else 1
        limit = hi_room if finishes else lo_room
        if limit < 2:
            return None
        return DecodeSpan(limit - 1, lag, c0, rooms, stops, fins, next_s, next_u, openers)

    def span_segment(self, span: DecodeSpan, i: int,
                     members: list[Request] | None = None) -> tuple[BatchShape, int]:
        """The batch shape of the span's schedule S_i and the first later schedule whose
        requests differ (S_i .. S_{end - 1} hold the same requests); ``members``, if given,
        receives S_i's requests in order (call it before the span is run: it reads
        :attr:`running`)."""
        stop, c0 = span.stop, span.c0
        n = dsum = dmin = dmax = 0
        end = _NO_OP
        for p in range(len(stop)):
            s = stop[p]
            if s >= i:
                if members is not None:
                    members.append(self.running[p])
                c = c0[p]
                if n == 0:
                    dmin = dmax = c
                elif c < dmin:
                    dmin = c
                elif c > dmax:
                    dmax = c
                n += 1
                dsum += c
                if s + 1 < end:
                    end = s + 1
        if n == 0:
            return _shape(0, 0, 0, 0, 0, 0, 0, 0), end
        return _shape(n, n, 0, 0, n, dsum + i * n, dmin + i, dmax + i), end

    def span_ops(self, span: DecodeSpan, n_times: int) -> int:
        """The operations :meth:`decode_span` runs of ``span`` at ``n_times`` times when no
        schedule would preempt: S_0, C_1, S_1, ... up to the last the times cover
        (``2 * n_times - 1``) and the span's limit allows (C_{max_completions}; sync: the
        schedule after it too, async: not, its outputs would be in flight past the limit)."""
        lim_c = span.max_completions
        ops = 2 * lim_c if self.async_scheduling else 2 * lim_c + 1
        if 2 * n_times - 1 < ops:
            ops = 2 * n_times - 1
        return ops

    def span_blocks_serve(self, span: DecodeSpan, n_s: int) -> bool:
        """Whether the free blocks serve every block boundary the span's schedules S_0 ..
        S_{n_s - 1} cross, so :meth:`decode_span` cannot stop early for want of blocks: the
        blocks each request needs beyond the slots it holds for the last schedule that
        includes it (after ``k`` schedules it holds ``c0 + k`` slots), summed, are free now
        (a finish inside the span only frees more)."""
        bs = self.kv.block_size
        running = self.running
        c0, stop = span.c0, span.stop
        need = 0
        for p in range(len(c0)):
            sc = _schedules_of(stop[p], n_s)
            if sc == 0:
                continue
            r = running[p]
            extra = c0[p] + sc - r.kv_slots
            if extra > 0:
                need += (extra + bs - 1) // bs
        return need <= self.kv.pool.num_free

    def decode_span(self, span: DecodeSpan, times: list[int]) -> SpanOutcome:
        """Run the steady span ``span`` (from :meth:`steady_decode`, nothing changed since) as
        step-by-step would: schedules S_0, S_1, ... and completions C_1, C_2, ... alternating
        (S_0, C_1, S_1, C_2, ...), where ``times[i]`` is when C_i and S_i happen
        (``times[0]``: now). It stops before the first operation that ``times`` does not cover,
        the span's limit forbids, or the free blocks cannot serve (a schedule that would
        preempt).

        Each request's KV calls (``allocate_slots`` on a schedule, ``cache_blocks`` on an async
        completion, ``free`` when it finishes) are made at the same operation, in the same
        request order, with the request's counters as step-by-step has them then (a request
        is looked at only at the operations where its KV thresholds may be reached or it
        finishes: each has its next event of either side filed as an operation number, and an
        operation where none is due costs nothing). Its counters are advanced once at the end
        and its token run extended; finished requests leave :attr:`running` then. The caller
        appends the completions' times to :attr:`token_log`, logs the completions, builds the
        step objects of :attr:`SpanOutcome.tail` and reports the finished requests."""
        running = self.running
        kv = self.kv
        pool = kv.pool
        async_ = self.async_scheduling
        cache_async = async_ and kv.enable_caching
        n_ops_max = self.span_ops(span, len(times))
        lag = span.lag
        c0, room, stop, fin = span.c0, span.room, span.stop, span.fin
        next_s, next_u = span.next_s, span.next_u
        n = len(running)
        # Per completion done: written in place (compiled: C stores through typed views),
        # handed on cut to the completions done, for the engine loop's logs to copy whole.
        max_c = n_ops_max // 2
        gen = _ZEROS * max_c
        run_after = _ZEROS * max_c
        usage = _ZERO_FLOATS * max_c
        gen_v = gen
        run_v = run_after
        usage_v = usage
        finished: list[tuple[int, Request]] = []
        sizes: list[int] = []  # requests of each schedule done
        n_run = n
        fin_state = FINISHED
        size = cut = 0  # requests of S_i, and the first later schedule with fewer
        due = _first_due(next_s, next_u, fin)  # the next operation with something due
        todo: list[int] = []
        op = 0
        while op < n_ops_max:
            i = (op + 1) // 2
            if op % 2 == 0:  # S_i
                if i == 0 or i >= cut:
                    shape, cut = self.span_segment(span, i)
                    size = shape.num_seqs
                todo.clear()
                if op == due:
                    need = 0
                    for p in range(n):  # in request order, as schedule() visits them
                        if next_s[p] == op:
                            if stop[p] < i:  # its final token is in flight: skipped from now on
                                next_s[p] = _NO_OP
                                continue
                            todo.append(p)
                            r = running[p]
                            if c0[p] + i + 1 > r.kv_slots:
                                need += 1
                    if need > pool.num_free:
                        break  # this schedule would preempt: leave it to schedule()
                if i == 0 and self._unqueued:  # picked up by this schedule (see schedule())
                    for r in self._unqueued:
                        r.queued_ns = times[0]
                    self._unqueued.clear()
                for p in todo:
                    r = running[p]
                    c = c0[p]
                    after = c + i + 1
                    nt = c + lag + i
                    if after >= r.kv_check_at and (
                        after > r.kv_slots or (after if after < nt else nt) >= r.kv_cache_at
                    ):
                        # The counters as step-by-step has them at S_i, for the call.
                        r.num_computed_tokens = c + i
                        r.num_tokens = nt
                        if not kv.allocate_slots(r, 1):
                            raise AssertionError("decode span: allocation failed after check")
                        r.num_computed_tokens = c
                        r.num_tokens = c + lag
                    next_s[p], next_u[p] = _next_checks(r, op, c, lag, cache_async)
                sizes.append(size)
            else:  # C_i: the output of S_{i-2+lag} (async C_1: of the step in flight before)
                if op == due:
                    for p in range(n):  # in the step's request order, as update_from_output
                        if next_u[p] == op:
                            r = running[p]
                            nt0 = c0[p]  # async: num_computed_tokens == num_tokens at the start
                            # upto = min(computed - placeholders, num_tokens) after this output
                            upto = nt0 + i - 1
                            if upto >= r.kv_cache_at:
                                kv.cache_blocks(r, upto)
                            next_s[p], next_u[p] = _next_checks(r, op, nt0, 0, cache_async)
                        if fin[p] == op:  # its final token: it finishes
                            r = running[p]
                            r.status = fin_state
                            r.finish_ns = times[i]
                            kv.free(r)
                            r.release()
                            self.num_finished += 1
                            finished.append((i, r))
                            next_s[p] = next_u[p] = fin[p] = _NO_OP
                            n_run -= 1
                k = i - 2 + lag
                gen_v[i - 1] = sizes[k] if k >= 0 else n
                run_v[i - 1] = n_run
                usage_v[i - 1] = pool.usage()
            if op == due:
                due = _first_due(next_s, next_u, fin)
            op += 1
        done_s = (op + 1) // 2  # schedules done
        done_c = op // 2  # completions done
        self.span_steps += done_s
        if self.waiting:
            self.span_steps_queued += done_s
        if done_c and span.openers:  # their first token of a new run comes at C_1
            log = self.token_log
            k1 = len(log.times)  # C_1's index (the caller appends the completions' times)
            nxt = log.base + k1
            for p in span.openers:
                r = running[p]
                r.open_run(log, k1)
                if r.first_token_ns < 0:
                    r.first_token_ns = times[1]
                r.tok_next = nxt
        tail: list[ScheduledStep] = []
        if op:
            for p in range(n):
                r = running[p]
                sc = _schedules_of(stop[p], done_s)
                cc = room[p]  # completions that gave it a token
                if cc > done_c:
                    cc = done_c
                r.num_computed_tokens += sc
                r.num_tokens += cc
                r.tok_next += cc
                if async_:
                    r.num_output_placeholders += sc - cc
            # The span's schedules still in flight: all but the done_c oldest steps, counting
            # the one in flight before the span (async).
            j = done_c - 1 + lag
            if j < 0:
                j = 0
            while j < done_s:
                members: list[Request] = []
                shape, _ = self.span_segment(span, j, members)
                k = len(members)
                tail.append(ScheduledStep(reqs=members, num_tokens=[1] * k, samples=[True] * k,
                                          shape=shape, total_tokens=k))
                j += 1
            if finished:
                kept: list[Request] = []
                for p in range(n):
                    r = running[p]
                    if r.status != fin_state:
                        kept.append(r)
                running[:] = kept
        return SpanOutcome(op, gen[:done_c], run_after[:done_c], usage[:done_c], finished, tail)

    # -- outputs -------------------------------------------------------------------------
    def update_from_output(self, step: ScheduledStep, now_ns: int) -> list[Request]:
        """Apply one finished step at ``now_ns``: sampled tokens, first-token and finish
        times, frees. Returns the requests that finished."""
        finished: list[Request] = []
        kv = self.kv
        async_ = self.async_scheduling
        cache_async = async_ and kv.enable_caching
        max_len = self.max_model_len
        log = self.token_log
        times = log.times
        times.append(now_ns)
        k = len(times) - 1  # this step's index in the log
        g = log.base + k  # its step number (see engine.request.TokenLog)
        fin, run = FINISHED, RUNNING
        reqs, samples = step.reqs, step.samples
        if len(reqs) != len(samples):
            raise AssertionError("a scheduled step has one sample flag per request")
        for j in range(len(reqs)):  # (an index loop: no zip of tuples per request)
            req = reqs[j]
            if not samples[j] or req.status == fin:
                continue
            # A request preempted after this step was scheduled keeps its token, as vLLM
            # appends the outputs of preempted-but-unfinished requests.
            nt = req.num_tokens + 1
            req.num_tokens = nt
            if req.tok_next != g:  # not the step after its last token: a new run
                req.open_run(log, k)
                if req.first_token_ns < 0:
                    req.first_token_ns = now_ns
            req.tok_next = g + 1
            if async_:
                ph = req.num_output_placeholders
                if ph > 0:
                    ph -= 1
                    req.num_output_placeholders = ph
                if cache_async and req.status == run:
                    upto = req.num_computed_tokens - ph
                    if upto > nt:
                        upto = nt
                    if upto >= req.kv_cache_at:  # a block became full
                        kv.cache_blocks(req, upto)
            if nt >= req.finish_at or nt >= max_len:  # max_tokens reached, or max_model_len
                req.status = fin
                req.finish_ns = now_ns
                kv.free(req)
                req.release()
                try:
                    self.running.remove(req)
                except ValueError:  # preempted after this step was scheduled
                    self.waiting.remove(req)
                self.num_finished += 1
                finished.append(req)
        return finished
