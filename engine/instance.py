"""One engine core: a scheduler (or a data-parallel group of schedulers stepping in lock-step)
with its KV cache and latency model, advanced by a global event clock.

Time is event-driven: a step starts the moment the previous one frees the GPU; an idle engine
does nothing until a request reaches it (vLLM's engine core blocks on its input queue, it does
not poll).

Async scheduling (vLLM 0.19 default, ``EngineCore.step_with_batch_queue`` with a batch queue of
depth 2): step k+1 is scheduled when step k is launched, i.e. at the end of step k−1, before
step k's output is processed. So a request arriving while step k runs is first seen by the
schedule of step k+2, and blocks freed by step k become visible to step k+2. With
``async_scheduling=False`` the engine schedules, executes and processes each step in turn.

Pipeline parallelism: up to ``pp`` batches are in flight (the batch queue is at least ``pp``
deep); a new batch starts ``latency.stage_ns`` after the previous one (its busiest stage's
time), and completes after ``latency.iteration_ns``.

Data parallelism (vLLM DP): the members of a group step together; an idle member runs a dummy
batch, the batches are padded as ``dp_pad`` says, and the group's step lasts as long as its
slowest member.

Steady decode spans: while only the requests' own progress changes the schedule (no request
reaches the engine or can be admitted, none is in prefill, the free blocks serve every block
boundary crossed), the steps are pure-decode batches of the running requests; one that
finishes drops out of them, nothing waiting to take its seat (with every seat taken and
requests queued, a span ends before the first finish). In async scheduling the step in flight
when a span starts may hold prefill chunks that end their prompts. :meth:`EngineUnit.poll`
runs such steps in bulk (:meth:`engine.scheduler.Scheduler.decode_span` for the requests and
the KV cache, the step latencies at once when the latency model offers ``decode_steps_ns``),
with the same result as step by step: one :class:`StepLog` entry and one token-log time per
step, the same KV calls (frees included) in the same order, each finish reported at its time.
A DP group spans when each member with requests is steady (a member without any runs its
dummy batch each round): every member runs the same operations at the same times, each
round lasting as long as its slowest member's lined-up batch. The caller bounds the span
with ``horizon_ns``, the earliest time anything outside the unit may reach or read it;
without it (or with ``fast_forward`` off, pipeline parallelism, lower KV tiers, a P/D
decode queue) every step is simulated.

Deferred spans (one engine core per unit): behind a router that reads no more of an instance
than its load (several replicas, no API servers, no P/D), every send would otherwise bound
every unit's span, though it reaches one unit. There the caller passes ``defer_ns`` too, and
the unit plans its span about ``_DEFER_STEPS`` steps ahead (at least to the next send) and
holds it unrun (:class:`SpanPlan`): when its free blocks serve every block boundary the span
crosses, which operations the span runs, which requests finish at which completion and when
the unit next needs attention are known before it runs. The router reads the load at the
send from the plan (:meth:`Member.load`); a send that reaches the unit first calls
:meth:`EngineUnit.interrupt`, which runs the operations before the send, as a span bounded
by it would. A plan that reaches its wake untouched is priced further and held on
(:meth:`EngineUnit._extend`) rather than run and planned again, so a span is run once, when
a send reaches the unit or the span ends, and only the stretch past that send is priced for
nothing. Any horizon gives the step-by-step result, so this one does too
(``tests/engine/test_fast_forward.py``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from operator import itemgetter

from engine.batch import BatchShape, LatencyModel, decode_advanced
from engine.deployment import DpPad
from engine.kv_cache import KVCacheManager
from engine.request import Request, RequestStatus
from engine.scheduler import DecodeSpan, ScheduledStep, Scheduler, SpanOutcome, span_finishes

FAST_FORWARD = True  # the default of EngineUnit.fast_forward
_NO_ROUND = 1 << 62  # a span round no span reaches
_MAX_CHUNK = 1 << 20  # decode-span steps priced at once, at most (C ints: no doubling overflow)
# A deferred span (EngineUnit.poll's defer_ns) is priced about this many steps past its next
# completion, and as far again each time it reaches its wake untouched (EngineUnit._extend);
# a send that reaches the unit first makes the rest of the plan wasted pricing, a shorter
# stretch costs more extensions (a pass over the running requests for the block check, a
# wake). Measured (callgrind, benchmarks/engine_scale.py's load, 8,000 requests; instructions
# in millions, 2 / 8 replicas): 4 steps 3,260 / 3,466, 8 steps 3,307 / 3,394, 12 steps
# 3,411 (8 replicas), 16 steps 3,458 (8 replicas); before extension (24 steps, each plan run
# at its wake) 3,614 / 3,652. (Results never depend on it.)
_DEFER_STEPS = 8
# Steps a StepLog holds before moving them to its arrays, at first; the pending arrays double
# (up to _PENDING_MAX) while the columns hold at least twice as many, so a column grows by
# moves of at least half its length: a logarithmic number of reallocations, each of which may
# copy the column (behind 64 replicas, where each column stays below the allocator's mmap
# threshold, growth by the array's own 1/16 over-allocation copied every column ~25 times).
_PENDING_STEPS = 256
_PENDING_MAX = 1 << 16
_ZEROS = array("q", [0])  # a one-element prototype (``_ZEROS * n``); never written to
_ZERO_FLOATS = array("d", [0.0])
_INF = float("inf")
_NEVER = 1 << 62  # a time no simulation reaches


class StepLog:
    """Per-step samples for the time series, as compact arrays (8 bytes a value: a million
    requests take ten million steps); converted once at the end.

    A step logged one at a time (:meth:`add`) is first written in place into pending arrays
    (compiled: through typed views, where an ``array.append`` parses its argument), a run of
    steps (:meth:`extend`) copied into them, and moved to the columns in bulk (:meth:`flush`)
    when they fill or a column is read; reading a column (``COLUMNS``) gives every step
    logged."""

    __slots__ = ("_end_ns", "_running", "_waiting", "_usage", "_prompt_tokens", "_gen_tokens",
                 "_pend_q", "_qv", "_pend_d", "_dv", "_n", "_cap")

    COLUMNS = ("end_ns", "running", "waiting", "usage", "prompt_tokens", "gen_tokens")

    def __init__(self) -> None:
        self._end_ns = array("q")
        self._running = array("q")
        self._waiting = array("q")
        self._usage = array("d")
        self._prompt_tokens = array("q")
        self._gen_tokens = array("q")
        self._n = 0
        self._cap = 0
        self._new_pending(_PENDING_STEPS)

    def _new_pending(self, cap: int) -> None:
        """Fresh pending arrays for ``cap`` steps (none pending): the int columns one after
        another (``cap`` values each, COLUMNS' order less usage), usage apart. Never resized."""
        self._cap = cap
        self._pend_q = _ZEROS * (5 * cap)
        self._qv = self._pend_q  # (compiled: typed views of the same arrays)
        self._pend_d = _ZERO_FLOATS * cap
        self._dv = self._pend_d

    def add(self, end_ns: int, running: int, waiting: int, usage: float, prompt_tokens: int,
            gen_tokens: int) -> None:
        """Log one step."""
        n = self._n
        p = self._cap
        qv = self._qv
        qv[n] = end_ns
        qv[p + n] = running
        qv[2 * p + n] = waiting
        qv[3 * p + n] = prompt_tokens
        qv[4 * p + n] = gen_tokens
        self._dv[n] = usage
        self._n = n + 1
        if n + 1 == p:
            self.flush()

    def flush(self) -> None:
        """Move the pending steps to the columns."""
        n = self._n
        if n == 0:
            return
        q = self._pend_q
        p = self._cap
        self._end_ns.extend(q[:n])
        self._running.extend(q[p : p + n])
        self._waiting.extend(q[2 * p : 2 * p + n])
        self._prompt_tokens.extend(q[3 * p : 3 * p + n])
        self._gen_tokens.extend(q[4 * p : 4 * p + n])
        self._usage.extend(self._pend_d[:n])
        self._n = 0
        if p < _PENDING_MAX and len(self._end_ns) >= 2 * p:
            self._new_pending(2 * p)

    def extend(self, end_ns: array, running: array, waiting: array, usage: array,
               prompt_tokens: array, gen_tokens: array) -> None:
        """Log a run of steps at once, after the steps logged before (one array per column,
        int64 but ``usage`` float64, all of one length): copied into the pending arrays
        when they have room, else moved to the columns with them."""
        k = len(end_ns)
        if k == 0:  # (an empty slice assignment resizes: refused while the views export)
            return
        if self._n + k > self._cap:
            self.flush()
        n = self._n
        p = self._cap
        if n + k > p:  # longer than the pending arrays: straight to the columns
            self._end_ns.extend(end_ns)
            self._running.extend(running)
            self._waiting.extend(waiting)
            self._usage.extend(usage)
            self._prompt_tokens.extend(prompt_tokens)
            self._gen_tokens.extend(gen_tokens)
            return
        q = self._pend_q
        q[n : n + k] = end_ns
        q[p + n : p + n + k] = running
        q[2 * p + n : 2 * p + n + k] = waiting
        q[3 * p + n : 3 * p + n + k] = prompt_tokens
        q[4 * p + n : 4 * p + n + k] = gen_tokens
        self._pend_d[n : n + k] = usage
        self._n = n + k
        if n + k == p:
            self.flush()

    def __reduce__(self) -> tuple:
        """Pickled as its columns (a compiled log's typed views cannot be pickled)."""
        self.flush()
        return (_unpickled_step_log, (self._end_ns, self._running, self._waiting, self._usage,
                                      self._prompt_tokens, self._gen_tokens))

    @property
    def end_ns(self) -> array:
        """Each step's end, ns (int64)."""
        self.flush()
        return self._end_ns

    @property
    def running(self) -> array:
        """Running requests after each step (int64)."""
        self.flush()
        return self._running

    @property
    def waiting(self) -> array:
        """Waiting requests after each step (int64)."""
        self.flush()
        return self._waiting

    @property
    def usage(self) -> array:
        """KV cache usage after each step, 0..1 (float64)."""
        self.flush()
        return self._usage

    @property
    def prompt_tokens(self) -> array:
        """Prefill-chunk tokens of each step (int64)."""
        self.flush()
        return self._prompt_tokens

    @property
    def gen_tokens(self) -> array:
        """Tokens sampled by each step (int64)."""
        self.flush()
        return self._gen_tokens


def _unpickled_step_log(*columns: array) -> StepLog:
    log = StepLog()
    log.extend(*columns)
    return log


class Member:
    """One serving instance (one vLLM engine / DP rank).

    A plain class with fixed fields (compiled, an extension type whose fields the router's
    scan and the engine loop read as C struct members: ``engine/instance.pxd``)."""

    __slots__ = ("name", "scheduler", "latency", "role", "log", "arrived_kv", "num_steps",
                 "deferred")

    def __init__(self, name: str, scheduler: Scheduler, latency: LatencyModel,
                 role: str = "colocated") -> None:
        self.name = name
        self.scheduler = scheduler
        self.latency = latency
        self.role = role  # "colocated", "prefill" or "decode"
        self.log = StepLog()
        # P/D decode side: requests whose KV has arrived, waiting for a slot.
        self.arrived_kv: deque[Request] = deque()
        self.num_steps = 0
        # A decode span its unit planned but has not run yet (EngineUnit.poll's ``defer_ns``).
        self.deferred: SpanPlan | None = None

    def __repr__(self) -> str:
        return f"Member({self.name!r}, role={self.role!r})"

    @property
    def kv(self) -> KVCacheManager:
        return self.scheduler.kv

    def load(self, now_ns: int = -1) -> float:
        """vLLM-router-style load score: (4·waiting + running) / max_num_seqs, at ``now_ns``
        (what the instance holds after its operations before then: a held span's finishes
        count once their completion is before ``now_ns``; the default -1 reads the state the
        span was planned from)."""
        return _load_score(self, now_ns)


def _load_score(m: Member, now_ns: int) -> float:
    """:meth:`Member.load` (its one formula, which :class:`LoadBoard` reads directly)."""
    sched = m.scheduler
    running = len(sched.running)
    deferred = m.deferred
    if deferred is not None:
        running -= deferred.finished_before(now_ns)
    return (4 * (len(sched.waiting) + len(m.arrived_kv)) + running) / sched.max_num_seqs


def _set_leaf(tree: array, j: int, value: float) -> None:
    """Set leaf ``j`` of a tree of minima (node ``k`` holds the lower of its children ``2k``
    and ``2k + 1``; the root is node 1) to ``value``, and the minima above it."""
    if tree[j] == value:
        return
    tree[j] = value
    j >>= 1
    while j:
        a = tree[2 * j]
        b = tree[2 * j + 1]
        low = a if a <= b else b
        if tree[j] == low:
            return  # the minima above are unchanged
        tree[j] = low
        j >>= 1


class LoadBoard:
    """The least-loaded router's view of its candidates (the least-loaded rule of
    ``engine.cluster.Router``: the first candidate with the lowest :meth:`Member.load`,
    scanning from a start position), kept as a tree of minima so that a pick costs O(log n)
    instead of a read of every candidate per send: the event loop's cost must not grow with
    the number of instances (callgrind: behind 64 replicas the scan of every member's load
    per send was 3.7 % of the run's instructions and 9 % of its L1 data misses, behind 512
    replicas 6.8 % of the instructions).

    A candidate's score is read again (:func:`_load_score`, the formula's one owner) only
    when it may have changed: after the caller reports a change of its requests
    (:meth:`touch`: a request added, a poll of its unit, a KV hand-off arriving), or, while it
    holds a deferred span (:class:`SpanPlan`), once a pick comes after the completion of the
    span's next finisher (a second tree of minima over those times). So every pick sees the
    scores a scan would read at its time. Picks come at non-decreasing times; an earlier one
    reads every candidate again."""

    __slots__ = ("members", "_size", "_tree", "_due", "_dirty", "_pending", "_last_ns")

    def __init__(self, members: Sequence[Member]) -> None:
        n = len(members)
        self.members = list(members)
        size = 1
        while size < n:
            size *= 2
        self._size = size
        # Node j holds the lowest value of its subtree (children 2j, 2j + 1); leaf i at
        # size + i. ``_tree``: the scores (leaves past the candidates hold infinity, so they
        # are never picked); ``_due``: per candidate holding a deferred span, the completion
        # time of the span's first finisher its score does not count yet (_NEVER: none).
        self._tree = array("d", [_INF]) * (2 * size)
        self._due = array("q", [_NEVER]) * (2 * size)
        self._dirty = array("b", [1]) * max(n, 1)  # 1: read its score before the next pick
        self._pending = list(range(n))  # the dirty ones, in the order they became dirty
        self._last_ns = -_NEVER  # the time of the last pick

    def touch(self, i: int) -> None:
        """Candidate ``i``'s requests may have changed: read its score before the next pick."""
        if not self._dirty[i]:
            self._dirty[i] = 1
            self._pending.append(i)

    def _read(self, i: int, now_ns: int) -> None:
        """Candidate ``i``'s score at ``now_ns`` and its next finisher's time into their
        leaves and the minima above them."""
        m = self.members[i]
        _set_leaf(self._tree, self._size + i, _load_score(m, now_ns))
        plan = m.deferred
        nxt = _NEVER
        if plan is not None:
            nxt = plan.next_finish_ns(now_ns)
            if nxt < 0:
                nxt = _NEVER
        _set_leaf(self._due, self._size + i, nxt)

    def pick(self, start: int, now_ns: int) -> int:
        """The first candidate from position ``start`` on (cyclically) with the lowest score at
        ``now_ns``."""
        if now_ns < self._last_ns:  # an earlier time: every held span counts fewer finishes
            for i in range(len(self.members)):
                self.touch(i)
        self._last_ns = now_ns
        due = self._due
        size = self._size
        while due[1] < now_ns:  # a held span's finisher completed: its score dropped
            first = due[1]
            j = 1
            while j < size:  # down to the first candidate due then
                j *= 2
                if due[j] != first:
                    j += 1
            self._read(j - size, now_ns)  # (its leaf now holds a later time, or none)
        pending = self._pending
        dirty = self._dirty
        for i in pending:
            dirty[i] = 0
            self._read(i, now_ns)
        pending.clear()
        low = self._tree[1]
        i = self._first_at_most(start, low)
        if i < 0:
            i = self._first_at_most(0, low)
        return i

    def _first_at_most(self, start: int, low: float) -> int:
        """The first leaf from ``start`` on whose score is at most ``low``, or -1."""
        tree = self._tree
        size = self._size
        j = size + start
        while tree[j] > low:
            while j & 1:  # a right child: its parent's subtree reaches left of start
                j >>= 1
            if j == 0:
                return -1  # climbed past the root along the right edge
            j += 1  # the subtree just right of the ones seen
        while j < size:
            j *= 2
            if tree[j] > low:
                j += 1
        return j - size


class SpanPlan:
    """A steady decode span planned by :meth:`EngineUnit._plan_span` and not yet run: each
    member's span (None for a DP member with no requests, which runs dummy batches), the
    schedule and completion times priced so far (``times[i]``: when C_i and S_i happen), each
    schedule's end, each member's prompt tokens in the step in flight, and what the caller
    needs before it runs: the completions ending requests (for :meth:`finished_before`) and
    when the unit next needs attention if it runs as priced.

    The rest is where the pricing stopped, so that :meth:`EngineUnit._price` can go on from
    there (a held plan extended past its wake: :meth:`EngineUnit._extend`): the steps in flight
    before the span (their ends), the span's limit (its last completion), the step latencies
    priced (``durs``, possibly ahead of ``ends``) and the current segment of schedules that
    hold the same requests (``seg_start`` .. ``seg_end - 1``, its batch ``shape`` for one
    member; ``raw`` / ``padded`` for a DP group, as :meth:`EngineUnit._group_segment` fills
    them)."""

    __slots__ = ("spans", "times", "ends", "first_prompt", "finish_at_c", "wake",
                 "_k", "_done", "fins", "counted", "served", "queue", "last", "durs", "seg_start",
                 "seg_end", "shape", "raw", "padded")

    def __init__(self, spans: list[DecodeSpan | None], times: list[int],
                 first_prompt: list[int], queue: list[int], last: int) -> None:
        self.spans = spans
        self.times = times
        self.ends: list[int] = []
        self.first_prompt = first_prompt
        # Sorted: the completion each finisher ends at, for the completions the plan runs
        # (C_1 .. C_counted; the same list in ``fins``).
        self.finish_at_c: array = array("q")
        self.fins: list[int] | None = None
        self.counted = 0
        self.served = 0  # schedules S_0 .. S_{served - 1} the free blocks are known to serve
        self.wake = 0
        self._k = 0  # completions before the last time asked (times[1 .. _k] < it)
        self._done = 0  # finishes at those completions
        self.queue = queue
        self.last = last
        self.durs: list[int] = []
        self.seg_start = 0
        self.seg_end = 0
        self.shape: BatchShape | None = None
        self.raw: list[BatchShape | None] | None = None  # (made for a DP group's first segment)
        self.padded: list[BatchShape | None] | None = None

    def finished_before(self, now_ns: int) -> int:
        """Requests of the span that finish at a completion before ``now_ns`` (C_1 .. C_k
        with ``times[k] < now_ns``). The router asks at non-decreasing times, so both counts
        only move forward (a cursor each; an earlier time restarts them)."""
        times = self.times
        n = len(times)
        k = self._k
        if k:
            tk = times[k]  # (compiled: a C integer, so the comparisons below are C's)
            if tk >= now_ns:
                k = self._done = 0
        while k + 1 < n:
            tk = times[k + 1]
            if tk >= now_ns:
                break
            k += 1
        self._k = k
        fins = self.finish_at_c
        d = self._done
        while d < len(fins) and fins[d] <= k:
            d += 1
        self._done = d
        return d

    def next_finish_ns(self, now_ns: int) -> int:
        """When :meth:`finished_before` next grows after ``now_ns``: the completion time of
        the span's first finisher it does not count at ``now_ns`` (a time from ``now_ns`` on;
        any later time counts it), or -1 when it counts every finisher."""
        d = self.finished_before(now_ns)
        fins = self.finish_at_c
        times = self.times
        if d < len(fins) and fins[d] < len(times):
            return times[fins[d]]
        return -1


class EngineUnit:
    """Drives one engine core (``len(members) == 1``) or one DP group in lock-step."""

    def __init__(
        self,
        members: Sequence[Member],
        *,
        step_overhead_ns: int = 0,
        overhead_hidden_ns: int = 0,
        pp: int = 1,
        dp_pad: DpPad | None = None,
        on_finished: Callable[[Member, Request, int], None] | None = None,
    ) -> None:
        self.members = list(members)
        # Steady decode spans in bulk (see the module docstring); False simulates every step
        # (the reference the fast-forward tests compare against).
        self.fast_forward = FAST_FORWARD
        self.step_overhead_ns = step_overhead_ns
        self.overhead_hidden_ns = overhead_hidden_ns
        self.pp = pp
        self.dp_pad = dp_pad
        self.on_finished = on_finished
        async_ = self.members[0].scheduler.async_scheduling
        self.depth = max(pp, 2 if async_ else 1)
        self.inflight: deque[tuple[list[ScheduledStep], int]] = deque()
        self.gpu_free_at = 0
        self.num_finished = 0
        self.waiting_for: int | None = None
        self._span_step_ns = 0  # the first step's latency in the last decode span
        self.deferred: SpanPlan | None = None  # a span planned and held unrun (see poll)
        # Spans held unrun, how many of them a send interrupted, and how many times a held
        # span was priced further at its wake (_extend)
        self.num_deferred = 0
        self.num_interrupted = 0
        self.num_extended = 0

    # -- helpers ---------------------------------------------------------------------------
    def _admit_arrived_kv(self, m: Member) -> None:
        """P/D decode side: start requests whose KV arrived, FIFO, while seats and blocks allow
        (the prompt's KV is external: no prefix lookup, no recompute)."""
        sched = m.scheduler
        q = m.arrived_kv
        while q and len(sched.running) < sched.max_num_seqs:
            req = q[0]
            computed = req.num_computed_tokens
            req.num_computed_tokens = 0
            if not sched.kv.allocate_slots(req, req.num_tokens - computed, computed):
                req.num_computed_tokens = computed
                break
            q.popleft()
            req.num_computed_tokens = computed
            req.status = RequestStatus.RUNNING
            sched.running.append(req)

    def _overhead(self, t_gpu: int) -> int:
        """Exposed host overhead of a step whose GPU work takes ``t_gpu`` ns."""
        c = self.step_overhead_ns
        h = self.overhead_hidden_ns
        if c == 0 or h == 0:
            return c
        return c * (h - t_gpu) // h if t_gpu < h else 0

    def _duration(self, steps: list[ScheduledStep]) -> tuple[int, int]:
        """(iteration ns, ns until the next launch may start) of a launch."""
        if len(steps) == 1:
            step = steps[0]
            assert step.shape is not None
            lat = self.members[0].latency
            it = int(lat.iteration_ns(step.shape))
            stage = int(lat.stage_ns(step.shape)) if self.pp > 1 else it
            extra = self._overhead(it) + step.extra_ns
            return it + extra, stage + extra
        # A DP group's lock-step round: its slowest member's, each member's batch (None:
        # idle) lined up by dp_pad and priced with its own model (a span's rounds in bulk:
        # _group_rounds_ns).
        shapes = [s.shape for s in steps]
        padded = self.dp_pad(shapes) if self.dp_pad else shapes
        it = stage = 0
        for m, shape, step in zip(self.members, padded, steps, strict=True):
            if shape is None:
                continue
            t_it = int(m.latency.iteration_ns(shape)) + step.extra_ns
            t_st = int(m.latency.stage_ns(shape)) + step.extra_ns if self.pp > 1 else t_it
            it, stage = max(it, t_it), max(stage, t_st)
        extra = self._overhead(it)
        return it + extra, stage + extra

    def _record(self, m: Member, step: ScheduledStep, end_ns: int) -> None:
        sched = m.scheduler
        gen = 0  # the step's sampled tokens (a loop: sum() over bools is slow, compiled)
        for s in step.samples:
            if s:
                gen += 1
        m.log.add(end_ns, len(sched.running), len(sched.waiting) + len(m.arrived_kv),
                  sched.kv.pool.usage(), step.prompt_tokens, gen)

    # -- the engine loop -----------------------------------------------------------------
    def _complete_oldest(self) -> None:
        steps, end = self.inflight.popleft()
        members = self.members
        assert len(steps) == len(members), "a launch has one step per member"
        for j in range(len(members)):  # (an index loop: zip(strict=True) costs per step)
            m = members[j]
            step = steps[j]
            if not step.reqs:
                continue
            for req in m.scheduler.update_from_output(step, end):
                self.num_finished += 1
                if self.on_finished is not None:
                    self.on_finished(m, req, end)
            self._record(m, step, end)

    def poll(self, t: int, horizon_ns: int | None = None,
             defer_ns: int | None = None) -> int | None:
        """Do everything this engine does at time ``t`` and return when it next needs
        attention (the end of the in-flight step it waits for), or None when it is idle.

        Call it when an idle engine receives work, and at the time it returned (while a span
        is held, work reaches the unit only after :meth:`interrupt`).
        ``horizon_ns``: no request, KV hand-off or reader reaches this unit before that time,
        so steady decode steps scheduled before it may run in bulk (None: step by step).
        ``defer_ns`` (beyond ``horizon_ns``): nothing but sends reaches the unit before it,
        and a send reads only the unit's load (:meth:`Member.load`) unless the caller first
        calls :meth:`interrupt`. A span may then be planned past the next send and held unrun
        (:attr:`deferred`): a send the router gives to another unit leaves it whole, one that
        reaches this unit runs only its operations before the send (any horizon gives the
        step-by-step result, so the same)."""
        plan = self.deferred
        if plan is not None:
            if t < plan.wake:
                return plan.wake
            if (defer_ns is not None and horizon_ns is not None
                    and self._extend(plan, t, horizon_ns, defer_ns)):
                return plan.wake
            self.deferred = None
            self.members[0].deferred = None
            done = self._run_span(plan, len(plan.times))
            assert done is not None
            reached = self._end_span(done)
            if reached is not None:
                t = reached
        if self.waiting_for is not None:
            if t < self.waiting_for:
                return self.waiting_for
            self.waiting_for = None
            self._complete_oldest()
        members = self.members
        inflight = self.inflight
        span_ok = horizon_ns is not None and self.fast_forward and self.pp == 1
        if span_ok:
            for m in members:
                if m.scheduler.kv.tiers is not None:
                    span_ok = False
        single = len(members) == 1
        while True:
            # How far a span may be planned: past the sends up to defer_ns when held unrun
            # (_reach: the part a send interrupts is priced for nothing; a held plan is priced
            # further at its wake). A DP group's span is bounded by the horizon (Member.load
            # reads one member's plan).
            reach = horizon_ns
            hold = span_ok and single and defer_ns is not None and self._span_step_ns > 0
            if hold:  # from the next completion on (a plan of S_0 alone is held too)
                reach = self._reach(inflight[0][1] if inflight else t, horizon_ns,
                                    defer_ns)  # type: ignore[arg-type]
            # A span whose next completion comes at or after the horizon would be one schedule
            # (S_0) only: an ordinary schedule is the same and cheaper.
            if (span_ok and t < horizon_ns  # type: ignore[operator]
                    and not (inflight and inflight[0][1] >= reach)
                    and not self._kv_arrived()):
                if not hold:
                    done = self._decode_span(t, horizon_ns)  # type: ignore[arg-type]
                else:
                    done = None
                    plan = self._plan_span(t, reach)  # type: ignore[arg-type]
                    if plan is not None:
                        if self._hold(plan):
                            return plan.wake
                        # Run now, bounded by the next send as _decode_span(t, horizon_ns).
                        done = self._run_span(plan, bisect_left(plan.times, horizon_ns))
                if done is not None:
                    reached = self._end_span(done)
                    if reached is None:
                        return self.waiting_for
                    t = reached
            if self._can_schedule():
                for m in members:
                    if m.arrived_kv:
                        self._admit_arrived_kv(m)
                steps = [m.scheduler.schedule(t) for m in members]
                busy = False  # any member with a batch (a loop: no generator in cpdef)
                for s in steps:
                    if s.reqs:
                        busy = True
                        break
                if busy:
                    it, stage = self._duration(steps)
                    start = t if t > self.gpu_free_at else self.gpu_free_at
                    self.gpu_free_at = start + stage
                    for j in range(len(members)):
                        if steps[j].reqs:
                            members[j].num_steps += 1
                    inflight.append((steps, start + it))
                    if len(inflight) < self.depth:
                        continue  # async/PP: schedule the next step while this one runs
            if inflight:
                end = inflight[0][1]
                if end > t:
                    self.waiting_for = end
                    return end
                self._complete_oldest()
                continue
            return None

    def _decode_span(self, t: int, horizon: int) -> tuple[int, bool] | None:
        """Run the steady decode span starting at ``t`` (see the module docstring), bounded by
        ``horizon``. Returns (the time reached, whether its last operation was a schedule), or
        None when no span starts here. The operations are those of the polls at the span's
        step boundaries T_0 = t < T_1 < ... < horizon: at T_i the oldest step completes (i >= 1)
        and the next is scheduled."""
        plan = self._plan_span(t, horizon)
        if plan is None:
            return None
        return self._run_span(plan, len(plan.times))

    def _end_span(self, done: tuple[int, bool]) -> int | None:
        """After a span ran (``done`` from :meth:`_run_span`): if its last operation was a
        schedule the unit waits for the oldest step in flight (:attr:`waiting_for`, returns
        None); else it returns the time the span reached, where the next schedule is due."""
        if done[1]:
            self.waiting_for = self.inflight[0][1]
            return None
        return done[0]

    def _plan_span(self, t: int, horizon: int) -> SpanPlan | None:
        """The times of the span that starts at ``t``, up to ``horizon`` (nothing run yet).

        A DP group spans when every member with requests is steady (members with none run
        dummy batches throughout: nothing reaches them before the horizon). Its rounds are
        priced as :meth:`_duration` prices them, in bulk per segment
        (:meth:`_group_rounds_ns`); the span ends at the first member's limit, and only where
        every member's free blocks serve the block boundaries it crosses (so that each
        member's :meth:`~engine.scheduler.Scheduler.decode_span` runs the same operations)."""
        members = self.members
        inflight = self.inflight
        group = len(members) > 1
        spans: list[DecodeSpan | None] = []
        first_prompt: list[int] = []
        last = 0  # S_0 .. S_last and C_1 .. C_last at most (the least member limit)
        lead = None  # the first member's span (whose limit then is every member's)
        for j in range(len(members)):
            sched = members[j].scheduler
            if group and not sched.running and not sched.waiting:
                for entry in inflight:
                    if entry[0][j].reqs:
                        return None
                spans.append(None)
                first_prompt.append(0)
                continue
            span = sched.steady_decode([s[0][j] for s in inflight])
            if span is None:
                return None
            spans.append(span)
            first_prompt.append(inflight[0][0][j].prompt_tokens if inflight else 0)
            if lead is None or span.max_completions < last:
                last = span.max_completions
            if lead is None:
                lead = span
        if lead is None:
            return None
        if group:  # a shorter span is still a span: every member ends at the group's limit
            for span in spans:
                if span is not None:
                    span.max_completions = last
        # The steps in flight, oldest first: those before the span (their ends), then the
        # span's schedules (``plan.ends``); C_{i+1} completes the (i+1)-th of them.
        plan = SpanPlan(spans, [t], first_prompt, [e for _, e in inflight], last)
        self._price(plan, horizon)
        if group:
            n_s = (members[0].scheduler.span_ops(lead, len(plan.times)) + 1) // 2
            for j in range(len(members)):
                span = spans[j]
                if span is not None and not members[j].scheduler.span_blocks_serve(span, n_s):
                    return None
        self._span_step_ns = max(plan.durs[0], 1)
        return plan

    def _price(self, plan: SpanPlan, horizon: int) -> None:
        """Price ``plan``'s schedules from where its pricing stopped (S_0 for a new plan) while
        their times stay before ``horizon`` and the span's limit allows: ``times[i] = T_i``,
        the poll at which S_i (and C_i, i >= 1) happen, ``ends[i]``: S_i's end, when the GPU
        is free after it (pp = 1). A new plan is priced to its first horizon; a held one may
        be priced further later (:meth:`_extend`), with the same integers as if priced at
        once."""
        members = self.members
        group = len(members) > 1
        spans = plan.spans
        times = plan.times
        ends = plan.ends
        durs = plan.durs
        queue = plan.queue
        nq = len(queue)
        last = plan.last
        i = len(ends)  # the next schedule to price
        if i:  # S_{i-1} was priced: is C_i (and S_i) before the horizon?
            if i - 1 == last:
                return
            nxt = queue[i - 1] if i - 1 < nq else ends[i - 1 - nq]
            if nxt >= horizon:
                return
            times.append(nxt)
        gpu = ends[i - 1] if i else self.gpu_free_at
        if not group:
            span = spans[0]
            sched = members[0].scheduler
            lat = members[0].latency
        # Latencies are priced in chunks, each within one segment of schedules that hold the
        # same requests: first about as many steps as the last span's step length says fit
        # before the horizon.
        t_i = times[i]
        chunk = (horizon - t_i) // self._span_step_ns + 2 if self._span_step_ns else 8
        if chunk > _MAX_CHUNK:
            chunk = _MAX_CHUNK
        seg_end = plan.seg_end  # the first schedule beyond the current segment
        seg_start = plan.seg_start
        while True:
            if group and i == len(durs):
                if i >= seg_end:  # a segment of the group: no member's requests change in it
                    if plan.raw is None:
                        plan.raw = []
                        plan.padded = []
                    seg_end = self._group_segment(spans, i, plan.raw, plan.padded)
                    seg_start = i
                k = min(chunk, last + 1 - i, seg_end - i)
                durs.extend(self._group_rounds_ns(plan.raw, plan.padded, i - seg_start, k))
                if chunk < _MAX_CHUNK:
                    chunk *= 2
            elif i == len(durs):
                if i >= seg_end:
                    plan.shape, seg_end = sched.span_segment(span, i)
                    seg_start = i
                shape = plan.shape
                k = min(chunk, last + 1 - i, seg_end - i)
                if shape.num_seqs:
                    durs.extend(_decode_latencies(lat, shape, i - seg_start, k))
                else:  # async S_last with every request's final token in flight: it is never
                    durs.extend([0] * k)  # scheduled, and a model need not price an empty batch
                if chunk < _MAX_CHUNK:
                    chunk *= 2
            it = durs[i]
            t_i = times[i]
            start = t_i if t_i > gpu else gpu
            gpu = start + it + self._overhead(it)
            ends.append(gpu)
            nxt = queue[i] if i < nq else ends[i - nq]  # C_{i+1}: the oldest in flight completes
            if i == last or nxt >= horizon:
                break
            times.append(nxt)
            i += 1
        plan.seg_start = seg_start
        plan.seg_end = seg_end

    def _group_segment(self, spans: list[DecodeSpan | None], i: int,
                       raw: list[BatchShape | None], padded: list[BatchShape | None]) -> int:
        """A DP group's span segment from round S_i: fills ``raw`` with each member's batch
        at S_i (None: no request scheduled) and ``padded`` with them lined up by ``dp_pad``;
        returns the first later round in which some member's requests differ."""
        members = self.members
        raw.clear()
        padded.clear()
        end = _NO_ROUND
        busy = False
        for j in range(len(members)):
            span = spans[j]
            if span is None:
                raw.append(None)
                continue
            shape, seg_end = members[j].scheduler.span_segment(span, i)
            if shape.num_seqs:
                raw.append(shape)
                busy = True
            else:  # async S_last with every final token in flight: nothing scheduled
                raw.append(None)
            if seg_end < end:
                end = seg_end
        if busy:
            padded.extend(self.dp_pad(raw) if self.dp_pad else raw)
        return end

    def _group_rounds_ns(self, raw: list[BatchShape | None], padded: list[BatchShape | None],
                         first: int, k: int) -> list[int]:
        """GPU ns of rounds ``first .. first + k - 1`` of a DP group's span segment (``raw``,
        ``padded``: from :meth:`_group_segment`): per round the slowest member's, as
        :meth:`_duration` prices a round. A busy member's lined-up batch advances with its decodes
        (the pad leaves the decode fields alone: ``engine.deployment.DpPad``), so its rounds
        are priced in bulk; an idle member's dummy batch stays the same."""
        if not padded:  # never scheduled (see the single-member case of _plan_span)
            return [0] * k
        out = [0] * k
        members = self.members
        for j in range(len(members)):
            shape = padded[j]
            if shape is None:
                continue
            lat = members[j].latency
            if raw[j] is None:
                c = int(lat.iteration_ns(shape))
                for r in range(k):
                    if c > out[r]:
                        out[r] = c
            else:
                prices = _decode_latencies(lat, shape, first, k)
                for r in range(k):
                    c = prices[r]
                    if c > out[r]:
                        out[r] = c
        return out

    def _run_span(self, plan: SpanPlan, n_times: int) -> tuple[int, bool] | None:
        """Run ``plan``'s operations at its first ``n_times`` times (see :meth:`_decode_span`):
        each member's span (the same operations for every member of a DP group)."""
        members = self.members
        inflight = self.inflight
        times = plan.times if n_times == len(plan.times) else plan.times[:n_times]
        ends = plan.ends
        outs: list[SpanOutcome | None] = []
        ops = -1
        for j in range(len(members)):
            span = plan.spans[j]
            if span is None:
                outs.append(None)
                continue
            out = members[j].scheduler.decode_span(span, times)
            if ops < 0:
                ops = out.ops
            elif out.ops != ops:
                raise AssertionError(f"DP span: member {j} ran {out.ops} operations, not {ops}")
            outs.append(out)
        if ops <= 0:
            return None
        n_s = (ops + 1) // 2  # schedules S_0 .. S_{n_s - 1}
        n_c = ops // 2  # completions C_1 .. C_{n_c}
        self.gpu_free_at = ends[n_s - 1]
        done = None  # the completions' times (C_1 .. C_n_c), as an int64 array
        if n_c:
            done = _ZEROS * n_c
            done_v = done
            for c in range(n_c):
                done_v[c] = times[c + 1]
        finished: list[tuple[int, int, Request]] = []
        n_tail = 0
        for j in range(len(members)):
            out = outs[j]
            if out is None:
                continue
            m = members[j]
            sched = m.scheduler
            m.num_steps += n_s
            # Completed steps are only logged (as _complete_oldest / _record would log them).
            if n_c:  # (in bulk: one extend per column, each an int64 / float64 array)
                sched.token_log.times.extend(done)
                # C_1 completes the step in flight before the span (its prefill chunks, if
                # any, ended their prompts); every later one, a span step of decodes only.
                prompt = _ZEROS * n_c
                prompt[0] = plan.first_prompt[j]
                m.log.extend(done, out.running,
                             array("q", [len(sched.waiting) + len(m.arrived_kv)]) * n_c,
                             out.usage, prompt, out.gen)
            for c, req in out.finished:
                finished.append((c, j, req))
            n_tail = len(out.tail)
        if finished:
            # As _complete_oldest reports them: by completion, members in order, each
            # member's in its own order (a stable sort).
            if len(members) > 1:
                finished.sort(key=itemgetter(0, 1))
            for c, j, req in finished:
                self.num_finished += 1
                if self.on_finished is not None:
                    self.on_finished(members[j], req, times[c])
        # Still in flight: the steps before the span and the span's schedules, less the n_c
        # oldest (completed); a DP member with no requests has an empty step in each.
        for _ in range(min(n_c, len(inflight))):
            inflight.popleft()
        first = n_s - n_tail
        for k in range(n_tail):
            steps = [ScheduledStep() if out is None else out.tail[k] for out in outs]
            inflight.append((steps, ends[first + k]))
        return times[n_c], ops % 2 == 1

    # -- deferred spans ------------------------------------------------------------------
    def _hold(self, plan: SpanPlan) -> bool:
        """Hold ``plan`` unrun (see :meth:`poll`'s ``defer_ns``) if the operations it runs
        as priced are known now (:meth:`_wake_of`). Sets the plan's finishes (for
        :meth:`Member.load`) and its wake: when the unit next needs attention if nothing
        reaches it first."""
        if not self._wake_of(plan):
            return False
        self.deferred = plan
        self.members[0].deferred = plan
        self.num_deferred += 1
        return True

    def _wake_of(self, plan: SpanPlan) -> bool:
        """Set the wake of a plan held (or to be held) unrun, when the unit next needs
        attention if it runs as priced, and its finishes (for :meth:`Member.load`). False when
        its operations are not known now: only with enough free blocks for every block
        boundary its schedules cross does :meth:`engine.scheduler.Scheduler.decode_span` stop
        at the span's limit or past its times, and nowhere before."""
        sched = self.members[0].scheduler
        span = plan.spans[0]
        ops = sched.span_ops(span, len(plan.times))
        n_s = (ops + 1) // 2
        n_c = ops // 2
        if n_s > plan.served:
            # Nothing changes the free blocks while the plan is held: check the whole span
            # once (its limit's schedules; the free blocks usually serve it), so that an
            # extension needs no check of its own.
            whole = (sched.span_ops(span, span.max_completions + 1) + 1) // 2
            if sched.span_blocks_serve(span, whole):
                plan.served = whole
            elif sched.span_blocks_serve(span, n_s):
                plan.served = n_s
            else:
                return False
        if ops % 2 == 1:  # ends with a schedule: then the oldest step in flight completes
            queue = plan.queue
            plan.wake = queue[n_c] if n_c < len(queue) else plan.ends[n_c - len(queue)]
        else:  # ends with a completion (async, at the span's limit): the next schedule is due
            plan.wake = plan.times[n_c]
        if n_c > plan.counted:
            more = span_finishes(span, plan.counted, n_c)
            if more:
                if plan.fins is None:
                    plan.fins = more
                else:
                    plan.fins.extend(more)
                plan.finish_at_c = array("q", plan.fins)
            plan.counted = n_c
        return True

    def _extend(self, plan: SpanPlan, t: int, horizon_ns: int, defer_ns: int) -> bool:
        """The held ``plan`` reached its wake ``t`` untouched (no send reached the unit): price
        it further, to the reach a new plan at ``t`` would have (:meth:`_reach`), and keep it
        held, instead of running it and planning the same span again from its end (any
        horizon gives the step-by-step result). False, the plan as it was, when it cannot
        go on: at the span's limit, or without the free blocks its longer run needs."""
        n_times = len(plan.times)
        n_ends = len(plan.ends)
        # (At the span's limit _price prices nothing: the plan is returned as it was.)
        self._price(plan, self._reach(t, horizon_ns, defer_ns))
        if len(plan.ends) == n_ends or not self._wake_of(plan):
            del plan.times[n_times:]
            del plan.ends[n_ends:]
            return False
        self.num_extended += 1
        return True

    def _reach(self, t: int, horizon_ns: int, defer_ns: int) -> int:
        """How far a span held unrun is priced, from its next completion at ``t``: about
        _DEFER_STEPS steps of the last span (a send that reaches the unit before makes the
        rest priced for nothing), between the horizon and ``defer_ns``."""
        reach = t + _DEFER_STEPS * self._span_step_ns
        if reach > defer_ns:
            reach = defer_ns
        if reach < horizon_ns:
            reach = horizon_ns
        return reach

    def interrupt(self, t: int) -> int | None:
        """A send reaches this unit at ``t`` while a deferred span is held: run the span's
        operations before ``t`` (as a span bounded by ``t`` would) and return when the unit
        next needs attention (the oldest step in flight then)."""
        plan = self.deferred
        if plan is None:
            return self.waiting_for
        self.deferred = None
        self.members[0].deferred = None
        self.num_interrupted += 1
        done = self._run_span(plan, bisect_left(plan.times, t))
        assert done is not None
        reached = self._end_span(done)
        assert reached is None, "an interrupted span ends with a schedule"
        return self.waiting_for

    def _kv_arrived(self) -> bool:
        """Whether a member holds P/D hand-offs to admit (a span cannot start then)."""
        for m in self.members:  # noqa: SIM110 (a loop: no generator in cpdef)
            if m.arrived_kv:
                return True
        return False

    def _can_schedule(self) -> bool:
        return any(m.scheduler.has_requests() or m.arrived_kv for m in self.members)

    def stuck_request(self) -> tuple[Member, Request] | None:
        for m in self.members:
            if m.scheduler.waiting:
                return m, m.scheduler.waiting[0]
            if m.arrived_kv:
                return m, m.arrived_kv[0]
        return None


def _decode_latencies(lat: LatencyModel, shape: BatchShape, first: int, k: int) -> list[int]:
    """Iteration ns of steps ``first .. first + k - 1`` of a decode span from ``shape``: the
    model's ``decode_steps_ns`` when it has one (the same integers), else one call per step."""
    bulk = getattr(lat, "decode_steps_ns", None)
    if bulk is not None:
        return bulk(decode_advanced(shape, first), k)
    return [int(lat.iteration_ns(decode_advanced(shape, first + i))) for i in range(k)]
