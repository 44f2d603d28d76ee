"""A cluster of serving instances under one event clock: routing, DP groups, P/D hand-off.

Instances are grouped into engine units (``engine.instance.EngineUnit``): a plain instance is a
unit of one; the members of a data-parallel group form one unit and step in lock-step. The
loop jumps from event to event — the next arrival, the next KV hand-off, the next step
completion of a busy unit — and never polls.

Prefill/decode disaggregation: a request is routed to a prefill instance, which runs it with
``max_tokens = 1`` (as a P/D proxy asks vLLM's prefill instance to); when its first token is
produced the request leaves the prefill instance, its KV travels for ``kv_transfer_ns`` and it
joins a decode instance chosen by the same router policy (separate round-robin counter), whose
scheduler starts it once a seat and blocks are free.

Front ends (``engine.frontend``): with an ``ApiServer`` per unit, a request the client sends
is routed at its send time, queues at its unit's API server and reaches the engine core when
the server hands it over (``Request.arrival_ns`` becomes that instant); every step's output
message queues at the same server, whose delivery times give the client's token times.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.deployment import KvTransfer
from engine.frontend import ApiServer
from engine.instance import EngineUnit, LoadBoard, Member
from engine.request import Request, RequestStatus
from engine.specs import ConfigError

ROUTER_POLICIES = ("round_robin", "least_loaded", "random", "prefix_aware")
# Policies that read no more of an instance than its load (Member.load): a unit may hold a
# decode span past their sends (EngineUnit.poll's defer_ns). prefix_aware reads the caches.
_LOAD_ONLY_POLICIES = ("round_robin", "least_loaded", "random")
_LOAD_POLICIES = ("least_loaded", "prefix_aware")  # policies that read loads (a LoadBoard)


class Router:
    """Chooses the instance for a new request (and the decode instance for a prefilled one).

    - ``round_robin``: in turn.
    - ``least_loaded``: the vLLM-router-style load score ``(4·waiting + running) / max_num_seqs``,
      scanning from the round-robin position and keeping the first minimum (the reference
      simulator's LOAD policy).
    - ``random``: uniformly, from a generator seeded with ``seed``.
    - ``prefix_aware``: the instance whose NPU prefix cache holds the longest prefix of the
      request (vLLM's ``get_computed_blocks`` walk, read-only), ties broken by load score.
    """

    def __init__(self, policy: str = "least_loaded", seed: int = 0) -> None:
        if policy not in ROUTER_POLICIES:
            raise ConfigError(f"router policy {policy!r} unknown; use one of {ROUTER_POLICIES}")
        self.policy = policy
        self.rng = random.Random(seed)
        self.counters: dict[str, int] = {}

    def _least_loaded(self, side: str, candidates: Sequence[Member], now_ns: int,
                      board: LoadBoard | None) -> int:
        if board is None:
            board = LoadBoard(candidates)
        return board.pick(self.counters.get(side, 0) % len(candidates), now_ns)

    def pick(self, side: str, candidates: Sequence[Member], req: Request,
             now_ns: int = -1, board: LoadBoard | None = None,
             directory: PrefixDirectory | None = None) -> Member:
        """The member of ``candidates`` that gets ``req``, sent at ``now_ns`` (the time the
        loads are read at: see :meth:`engine.instance.Member.load`). ``board``: the
        candidates' :class:`engine.instance.LoadBoard`, which the caller keeps told of their
        changes (without one, every load is read for this pick). ``directory``: the
        candidates' :class:`PrefixDirectory` for ``prefix_aware`` (without one, every
        candidate's prefix cache is looked up for this pick)."""
        n = len(candidates)
        if n == 1:
            return candidates[0]
        if self.policy == "round_robin":
            idx = self.counters.get(side, 0) % n
        elif self.policy == "random":
            idx = self.rng.randrange(n)
        elif self.policy == "least_loaded":
            idx = self._least_loaded(side, candidates, now_ns, board)
        else:  # prefix_aware
            holders = directory.holders if directory is not None else _CacheLookups(candidates)
            depth, best = _longest_prefix(holders, req, candidates[0].scheduler.kv.block_size,
                                          (1 << n) - 1)
            if depth == 0:
                idx = self._least_loaded(side, candidates, now_ns, board)
            else:  # the first lowest load among those holding the longest prefix
                idx = -1
                low: float = 0.0
                while best:
                    i = (best & -best).bit_length() - 1
                    best &= best - 1
                    load = candidates[i].load(now_ns)
                    if idx < 0 or load < low:
                        idx, low = i, load
        self.counters[side] = idx + 1
        return candidates[idx]


def _longest_prefix(holders: Any, req: Request, block_size: int, everyone: int,
                    ) -> tuple[int, int]:
    """vLLM's ``get_computed_blocks`` walk over several caches at once, read-only: how many
    leading full blocks of ``req`` (all but its last token, as vLLM leaves one to compute) the
    candidates that cache the most of them hold, and those candidates (a bit mask of
    positions). ``holders.get(h, 0)``: the mask of candidates whose prefix cache finds hash
    ``h`` (a :class:`PrefixDirectory`'s map, or :class:`_CacheLookups`)."""
    n = (req.num_tokens - 1) // block_size
    hashes = req.hashes(n)
    mask = everyone
    depth = 0
    while depth < n:
        held = holders.get(hashes[depth], 0) & mask
        if not held:
            break
        mask = held
        depth += 1
    return depth, mask


class _CacheLookups:
    """``holders`` read from the caches themselves: each candidate's prefix index looked up
    (the truth a :class:`PrefixDirectory` keeps in step with)."""

    def __init__(self, candidates: Sequence[Member]) -> None:
        self.pools = [(1 << pos, m.scheduler.kv.pool) for pos, m in enumerate(candidates)
                      if m.scheduler.kv.enable_caching]

    def get(self, h: int, default: int = 0) -> int:
        mask = default
        for bit, pool in self.pools:
            if pool.lookup(h) >= 0:
                mask |= bit
        return mask


class _HeldBy:
    """One candidate's cache reporting to a :class:`PrefixDirectory` (its pool's
    ``index_listener``)."""

    __slots__ = ("holders", "bit", "others")

    def __init__(self, holders: dict[int, int], bit: int) -> None:
        self.holders = holders
        self.bit = bit
        self.others = ~bit

    def indexed(self, h: int) -> None:
        holders = self.holders
        holders[h] = holders.get(h, 0) | self.bit

    def unindexed(self, h: int) -> None:
        holders = self.holders
        left = holders[h] & self.others
        if left:
            holders[h] = left
        else:
            del holders[h]


class PrefixDirectory:
    """Which candidates' NPU prefix caches hold each block hash (``holders``: hash -> bit mask
    of positions in ``candidates``), kept by the caches themselves: each pool tells it every
    hash entering or leaving its prefix index (``BlockPool.index_listener``). A
    ``prefix_aware`` pick then walks the request's blocks once for all candidates, as a
    cluster router's KV-event index does, instead of looking each block up in every
    instance. :meth:`close` detaches it from the pools; a pool reports to one directory at a
    time, so a directory built over caches that still report to an earlier one (a run that
    raised before closing its own) takes them over."""

    def __init__(self, candidates: Sequence[Member]) -> None:
        self.holders: dict[int, int] = {}
        self.pools = []
        for pos, m in enumerate(candidates):
            kv = m.scheduler.kv
            if not kv.enable_caching:
                continue
            pool = kv.pool
            held = _HeldBy(self.holders, 1 << pos)
            for h in pool.indexed_hashes():
                held.indexed(h)
            pool.index_listener = held
            self.pools.append(pool)

    def close(self) -> None:
        for pool in self.pools:
            pool.index_listener = None
        self.pools = []


class PrefillHorizon:
    """The earliest instant a P/D prefill unit may hand a request over (the horizon's share of
    ``run_cluster``'s prefill units), without reading every prefill unit per event.

    The truth stays the loop's: ``wake`` (each unit's next step end, None when idle) and
    ``dirty`` (new work marked for a unit: it steps at the current instant). A prefill unit
    counts as the current instant when dirty, else as its wake. The loop reports a unit
    marked (:meth:`dirtied`) and a unit's wake set (:meth:`woke`, after a poll clears its
    mark or an interrupt moves its wake); the wakes of clean units sit in a heap whose entries
    are checked against ``wake`` and ``dirty`` when they reach the top (an entry of a unit
    since marked or woken again is dropped: the unit's next :meth:`woke` pushes it anew)."""

    def __init__(self, units: Sequence[int], wake: list[int | None], dirty: list[bool]) -> None:
        self.wake = wake
        self.dirty = dirty
        self.is_prefill = [False] * len(wake)
        for i in units:
            self.is_prefill[i] = True
        self.heap: list[tuple[int, int]] = []
        self.marked: set[int] = set()  # the dirty prefill units

    def dirtied(self, i: int) -> None:
        if self.is_prefill[i]:
            self.marked.add(i)

    def woke(self, i: int) -> None:
        if self.is_prefill[i]:
            if not self.dirty[i]:
                self.marked.discard(i)
            w = self.wake[i]
            if w is not None:
                heapq.heappush(self.heap, (w, i))

    def earliest(self, now_ns: int) -> int:
        """min over the prefill units of (``now_ns`` if dirty else its wake); ``_NO_EVENT``
        when none is dirty or busy."""
        heap, wake, dirty = self.heap, self.wake, self.dirty
        while heap:
            w, i = heap[0]
            if wake[i] == w and not dirty[i]:
                break
            heapq.heappop(heap)
        h = heap[0][0] if heap else _NO_EVENT
        if self.marked and now_ns < h:
            h = now_ns
        return h


@dataclass(slots=True)
class ClusterRun:
    """What :func:`run_cluster` leaves behind (besides the mutated requests)."""

    end_ns: int
    num_requests: int  # how many requests arrived (and finished)
    # With front ends: per member (in unit order), the client's delivery ns of each step the
    # member logged (-1: the step streamed nothing); empty without front ends.
    client_step_ns: list[list[int]] = field(default_factory=list)


def run_cluster(
    units: Sequence[EngineUnit],
    requests: Iterable[Request],
    router: Router,
    *,
    kv_transfer_ns: KvTransfer | None = None,
    frontends: Sequence[ApiServer | None] | None = None,
    on_done: Callable[[Request, Member], None] | None = None,
) -> ClusterRun:
    """Replay ``requests`` (sorted by arrival) on ``units`` to completion.

    ``requests`` is read lazily, one request ahead of the clock (a generator may create each
    when it is due), and the loop runs until it is exhausted and every request it gave has
    finished. ``on_done(request, member)`` is called once per request when it finishes for
    good (``member`` finished it; a P/D prefill hand-off is not a finish): after it the loop
    keeps no reference to the request. ``frontends`` gives each unit its API server (None:
    requests reach the engine when sent, the client sees the engine's instants)."""
    members = [m for u in units for m in u.members]
    front = [m for m in members if m.role != "decode"]
    decode = [m for m in members if m.role == "decode"]
    if not front:
        raise ConfigError("the cluster has no instance that accepts new requests (all decode)")
    if any(m.role == "prefill" for m in members):
        if not decode:
            raise ConfigError("prefill instances need at least one decode instance")
        if kv_transfer_ns is None:
            raise ConfigError("P/D disaggregation needs a KV transfer model (kv_transfer_ns)")
    original_max: dict[int, int] = {}
    deliveries: list[tuple[int, int, int, Request]] = []  # (time, seq, member idx, req)
    member_index = {id(m): i for i, m in enumerate(members)}
    seq = 0
    finished = 0
    wake: list[int | None] = [None] * len(units)
    dirty = [False] * len(units)
    # P/D: a prefill unit's step end may hand a request to a decode unit (see the horizon).
    prefill_units = [i for i, u in enumerate(units) if any(m.role == "prefill" for m in u.members)]
    pf_horizon = PrefillHorizon(prefill_units, wake, dirty) if prefill_units else None

    def on_finished(m: Member, req: Request, t: int) -> None:
        nonlocal finished, seq
        if m.role == "prefill":
            # First token produced: hand the request (and its KV) to a decode instance.
            req.max_tokens = original_max.pop(req.index)
            req.finish_ns = -1
            if req.num_output_tokens >= req.max_tokens:  # a one-token request ends here
                req.finish_ns = t
                req.status = RequestStatus.FINISHED
                finished += 1
                if on_done is not None:
                    on_done(req, m)
                return
            req.status = RequestStatus.WAITING
            dst = router.pick("decode", decode, req, -1, decode_board, decode_dir)
            assert kv_transfer_ns is not None
            when = t + int(kv_transfer_ns(m.name, dst.name, req.num_computed_tokens))
            seq += 1
            heapq.heappush(deliveries, (when, seq, member_index[id(dst)], req))
            return
        finished += 1
        if on_done is not None:
            on_done(req, m)

    for u in units:
        u.on_finished = on_finished

    servers = list(frontends) if frontends is not None else [None] * len(units)
    if len(servers) != len(units):
        raise ConfigError(f"{len(servers)} front ends for {len(units)} engine units")
    fe_units = [(i, fe) for i, fe in enumerate(servers) if fe is not None]
    # Per unit with a front end: (member index, member) and how many of its steps were fed.
    fe_members = {i: [(member_index[id(m)], m) for m in units[i].members] for i, _ in fe_units}
    fed = [0] * len(members)
    handoffs: list[tuple[int, int, int, Request]] = []  # (engine arrival, seq, member, req)
    u_poll = [u.poll for u in units]
    # Sends may pass a unit's decode span (EngineUnit.poll's defer_ns) when a send reads no
    # more of a unit than its load, and nothing else but sends reaches a unit: several
    # front instances, a router that reads loads at most (prefix_aware reads the caches), no
    # API servers, no P/D hand-offs. A send that reaches a unit holding a span interrupts it.
    defer = (len(front) > 1 and router.policy in _LOAD_ONLY_POLICIES and not decode
             and all(fe is None for fe in servers))

    # The event loop's own cost must not grow with the number of units: busy units wait in a
    # heap by wake time, units with new work are listed as they get it, API servers are
    # visited when a job reaches them (a heap of their next arrivals; an entry may be stale:
    # visiting a server with nothing due is harmless).
    unit_of_member = [i for i, u in enumerate(units) for _ in u.members]  # as `members`
    # The least-loaded rule's boards (engine.instance.LoadBoard): every change the loop makes
    # to a unit's requests (work marked for it: a request added, a KV hand-off arriving; a poll
    # of it; an interrupt is followed by the request it makes room for) is told to its
    # members' boards, so a pick reads only the members that changed.
    # Per unit, (board, position there) of each of its members on a board.
    front_board = decode_board = None
    # prefix_aware: each side's directory of which members' caches hold each block hash.
    front_dir = decode_dir = None
    if router.policy == "prefix_aware":
        if len(front) > 1:
            front_dir = PrefixDirectory(front)
        if len(decode) > 1:
            decode_dir = PrefixDirectory(decode)
    unit_slots: list[list[tuple[LoadBoard, int]]] = [[] for _ in units]
    if router.policy in _LOAD_POLICIES:
        if len(front) > 1:
            front_board = LoadBoard(front)
        if len(decode) > 1:
            decode_board = LoadBoard(decode)
        for board in (front_board, decode_board):
            if board is not None:
                for pos, m in enumerate(board.members):
                    unit_slots[unit_of_member[member_index[id(m)]]].append((board, pos))
    # (wake ns, unit): an entry per busy unit's wake; an interrupted held span adds one for
    # its earlier wake and leaves the old one, skipped when popped (wake[] says which holds).
    wake_heap: list[tuple[int, int]] = []
    fresh: list[int] = []  # idle units that got work this round
    fe_due: list[tuple[int, int]] = []  # (next job arrival at its server, unit)

    def mark(ui: int) -> None:
        for board, pos in unit_slots[ui]:
            board.touch(pos)
        if not dirty[ui]:
            dirty[ui] = True
            if pf_horizon is not None:
                pf_horizon.dirtied(ui)
            if wake[ui] is None:
                fresh.append(ui)

    def fe_next(ui: int, fe: ApiServer) -> None:
        a = fe.next_arrival()
        if a is not None:
            heapq.heappush(fe_due, (a, ui))

    # Arrivals: `upcoming` is the next request not yet sent (None once the input is
    # exhausted), `n` how many were sent; the run ends when all sent have finished.
    arrivals = iter(requests)
    upcoming = next(arrivals, None)
    # its send time, read once (_NO_EVENT once the input is exhausted)
    upcoming_ns = upcoming.arrival_ns if upcoming is not None else _NO_EVENT
    n = 0
    t = upcoming_ns if upcoming is not None else 0
    while upcoming is not None or finished < n:
        # The next event: a send, a job reaching an API server, a request reaching its engine,
        # a KV delivery, or a busy unit's step completion.
        t_next = _NO_EVENT
        if wake_heap:
            t_next = wake_heap[0][0]
        if upcoming_ns < t_next:
            t_next = upcoming_ns
        if deliveries and deliveries[0][0] < t_next:
            t_next = deliveries[0][0]
        if handoffs and handoffs[0][0] < t_next:
            t_next = handoffs[0][0]
        if fe_due and fe_due[0][0] < t_next:
            t_next = fe_due[0][0]
        if t_next == _NO_EVENT:
            _raise_stuck(units)
        if t_next > t:
            t = t_next
        while upcoming is not None and upcoming_ns <= t:
            req = upcoming
            n += 1
            upcoming = next(arrivals, None)
            upcoming_ns = upcoming.arrival_ns if upcoming is not None else _NO_EVENT
            m = router.pick("front", front, req, t, front_board, front_dir)
            if m.role == "prefill":
                original_max[req.index] = req.max_tokens
                req.max_tokens = 1
            ui = unit_of_member[member_index[id(m)]]
            if defer and units[ui].deferred is not None:
                w = wake[ui] = units[ui].interrupt(t)
                heapq.heappush(wake_heap, (w, ui))
                if pf_horizon is not None:
                    pf_horizon.woke(ui)
            fe = servers[ui]
            if fe is not None:
                fe.submit(req.arrival_ns, req.prompt_len, req, m)
                fe_next(ui, fe)
                continue
            m.scheduler.add_request(req)
            mark(ui)
        if fe_due and fe_due[0][0] <= t:
            due: set[int] = set()
            while fe_due and fe_due[0][0] <= t:
                due.add(heapq.heappop(fe_due)[1])
            for ui in sorted(due):  # in unit order, as every server was visited before
                fe = servers[ui]
                assert fe is not None
                for when, req, m in fe.run(t):
                    seq += 1
                    heapq.heappush(handoffs, (when, seq, member_index[id(m)], req))
                fe_next(ui, fe)
        while handoffs and handoffs[0][0] <= t:
            when, _, mi, req = heapq.heappop(handoffs)
            req.arrival_ns = when  # the engine core receives it now
            members[mi].scheduler.add_request(req)
            mark(unit_of_member[mi])
        while deliveries and deliveries[0][0] <= t:
            _, _, mi, req = heapq.heappop(deliveries)
            members[mi].arrived_kv.append(req)
            mark(unit_of_member[mi])
        # The horizon: the earliest time anything outside a unit may reach or read it (the next
        # send or KV delivery; with P/D, a prefill unit's next step end; behind an API server,
        # also a request it still holds or is handing over). Before it a unit may run steady
        # decode steps in bulk (EngineUnit.poll); its output messages then reach the server
        # ahead of the clock, which serves jobs by arrival, so the order is the same.
        horizon = upcoming_ns
        if deliveries and deliveries[0][0] < horizon:
            horizon = deliveries[0][0]
        if pf_horizon is not None:
            w = pf_horizon.earliest(t)
            if w < horizon:
                horizon = w
        if handoffs and handoffs[0][0] < horizon:
            horizon = handoffs[0][0]
        # Units due now, in unit order (as the loop visited them before it kept a heap).
        polls = fresh
        fresh = []
        while wake_heap and wake_heap[0][0] <= t:
            polls.append(heapq.heappop(wake_heap)[1])
        if len(polls) > 1:
            polls.sort()
        for i in polls:
            w = wake[i]
            if not ((w is not None and w <= t) or (w is None and dirty[i])):
                continue  # listed as fresh, then polled at its wake in the same round
            dirty[i] = False
            fe = servers[i]
            h = horizon
            if fe is not None:
                pending = fe.next_request_arrival()
                if pending is not None and pending < h:
                    h = pending
            w = wake[i] = u_poll[i](t, h, _NO_EVENT) if defer else u_poll[i](t, h)
            if pf_horizon is not None:
                pf_horizon.woke(i)
            for board, pos in unit_slots[i]:
                board.touch(pos)
            if w is not None:
                heapq.heappush(wake_heap, (w, i))
            if fe is not None:
                _feed_outputs(fe, fe_members[i], fed)
                fe_next(i, fe)
        if (
            not polls
            and upcoming is None
            and not deliveries
            and not handoffs
            and not fe_due
            and not wake_heap
            and finished < n
        ):
            _raise_stuck(units)
    for directory in (front_dir, decode_dir):
        if directory is not None:
            directory.close()
    client: list[list[int]] = []
    if fe_units:
        # Stream what is still queued (output work never delays the engine from here on).
        for _, fe in fe_units:
            fe.run(2**62)
        by_member: dict[int, list[int]] = {}
        for i, fe in fe_units:
            for mi, _ in fe_members[i]:
                by_member[mi] = fe.client_ns.get(mi, [])
        client = [by_member.get(mi, []) for mi in range(len(members))]
    return ClusterRun(end_ns=t, num_requests=n, client_step_ns=client)


def _feed_outputs(fe: ApiServer, members: list[tuple[int, Member]], fed: list[int]) -> None:
    """Queue at ``fe`` the output message of every step its members logged since last time."""
    for mi, m in members:
        log = m.log
        ends, gens = log.end_ns, log.gen_tokens
        end = len(ends)
        for k in range(fed[mi], end):
            fe.outputs(mi, k, ends[k], gens[k])
        fed[mi] = end


_NO_EVENT = 1 << 62  # a horizon no simulation reaches


def _raise_stuck(units: Sequence[EngineUnit]) -> None:
    for u in units:
        stuck = u.stuck_request()
        if stuck is not None:
            m, req = stuck
            raise ConfigError(
                f"simulation cannot make progress: request {req.request_id!r} "
                f"({req.num_tokens} tokens) never fits in the KV cache of instance {m.name!r} "
                f"({m.kv.pool.num_blocks - 1} usable blocks); raise gpu_memory_utilization / "
                "num_gpu_blocks_override or shorten the request"
            )
    raise ConfigError("simulation cannot make progress: no request can be scheduled")
