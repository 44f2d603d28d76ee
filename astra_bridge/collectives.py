"""Analytical collective and point-to-point timing, as ASTRA-Sim's congestion-unaware backend.

Everything returns integer nanoseconds and reproduces ASTRA-Sim (``e941257``, analytical
congestion-unaware binary) to the nanosecond on the golden table in
``shared/data/astra-sim/collectives.csv``. The model has three layers:

1. **Building blocks** (per dimension with ``n`` NPUs): one message of ``m`` bytes over ``h`` hops,
   ``D(h, m) = floor(h*latency + m/beta)`` (see :mod:`astra_bridge.topology`); the system layer's
   endpoint delay ``E`` charged once per message step; the local reduction of ``m`` received
   bytes ``P(m) = 3*floor(m / (B_mem*1e9) * 1e9)`` (three passes over local memory, each truncated,
   ``B_mem`` = ``local-mem-bw`` with GB = 1e9 B).
2. **One phase** (one chunk on one dimension, :func:`phase_ns`): closed forms per algorithm
   (``ring``, ``direct``, ``halvingDoubling``, ``doubleBinaryTree``) and collective, in terms of
   the building blocks. ``bytes`` means: all-reduce C in / C out; reduce-scatter C in / C/n out;
   all-gather C is each NPU's contribution (n*C out); all-to-all C per NPU in total.
   ``doubleBinaryTree`` always runs an all-reduce tree on the full size, whatever the collective.
3. **Composition**: a collective over several dimensions is a sequence of phases (all-reduce with
   ``localBWAware``: reduce-scatter up the dimensions, all-reduce on the last, all-gather back
   down; ``baseline``: all-reduce on every dimension; reduce-scatter ascending; all-gather
   descending; all-to-all ascending with the full size). The data is split into chunks
   (``preferred-dataset-splits``, with a minimum chunk of one byte per NPU except for all-gather);
   each dimension runs at most ``active-chunks-per-dimension`` chunks at once from a FIFO queue
   shared by all phases on that dimension, which :func:`_list_schedule` simulates. A collective
   on a single ``doubleBinaryTree`` dimension is simulated per NPU (:func:`_dbt_chunked`),
   because its NPUs finish (and release) each chunk at different times.

Point-to-point send/recv (:func:`p2p_ns`) is ``D(h, bytes)`` on the lowest dimension in which the
two NPU ids differ (no endpoint delay), even if they also differ in higher dimensions.

Cases the simulator aborts or rejects raise :class:`UnsupportedCollective`: halvingDoubling
all-to-all (not implemented), halvingDoubling all-reduce on a chunk under ``2n`` bytes (zero-byte
message), halvingDoubling / doubleBinaryTree on a non-power-of-two dimension.

Results are memoised on the collective's route (collective, topology, system config, involved
dimensions: :func:`route`) and its bytes.

Beyond the golden data (extrapolations of the same rules, not verified against the simulator):
NPU counts that are not powers of two (ring / direct only), more than two dimensions,
doubleBinaryTree on a non-last dimension or with several chunks in a multi-dimensional
collective (its phases are then list-scheduled with the tree's single-chunk time, and the
first-NPU time uses the root's time), collectives over a subset of dimensions (the minimum chunk
is one byte per NPU of the group), and concurrent collectives sharing dimension queues (each call
prices an isolated collective started at t = 0 on every NPU).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from astra_bridge.topology import Dimension, DimKind, SystemConfig, Topology
from engine.specs import ConfigError

ALL_REDUCE = "all-reduce"
ALL_GATHER = "all-gather"
REDUCE_SCATTER = "reduce-scatter"
ALL_TO_ALL = "all-to-all"
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL)

_OP_ALIASES = {c.replace("-", ""): c for c in COLLECTIVES}


class UnsupportedCollective(ConfigError):
    """ASTRA-Sim would abort or refuse this collective; the message says why and what to change."""


def parse_collective(op: str) -> str:
    """Canonical collective name from any common spelling (``ALLREDUCE``, ``all_reduce``, ...)."""
    if type(op) is str and op in COLLECTIVES:
        return op
    key = str(op).replace("-", "").replace("_", "").replace(" ", "").lower()
    if key not in _OP_ALIASES:
        raise ConfigError(f"collective: unknown {op!r}; use one of {COLLECTIVES}")
    return _OP_ALIASES[key]


def reduction_ns(nbytes: int, local_mem_bw_gbps: float) -> int:
    """``P(m)``: three truncated passes over ``nbytes`` of local memory at ``local-mem-bw``."""
    return 3 * int(nbytes / (local_mem_bw_gbps * 1e9) * 1e9)


def _log2_exact(n: int, algo: str) -> int:
    if n & (n - 1):
        raise UnsupportedCollective(
            f"{algo} needs a power-of-two NPU count per dimension, got {n}; use ring or direct"
        )
    return n.bit_length() - 1


# --------------------------------------------------------------------------- one phase


def _ring_phase(op: str, dim: Dimension, c: int, e: int, bw: float) -> int:
    n = dim.npus
    h1 = dim.hops(1)
    m = c // n
    if op == ALL_REDUCE:
        return 2 * (n - 1) * dim.message_ns(h1, m) + (2 * n - 1) * e + (n - 1) * reduction_ns(m, bw)
    if op == REDUCE_SCATTER:
        return (n - 1) * (dim.message_ns(h1, m) + e + reduction_ns(m, bw)) + e
    if op == ALL_GATHER:
        return (n - 1) * (dim.message_ns(h1, c) + e) + e
    # all-to-all: n(n-1)/2 sequential neighbour steps of C/n bytes
    return n * (n - 1) // 2 * (dim.message_ns(h1, m) + e) + e


def _direct_phase(op: str, dim: Dimension, c: int, e: int, bw: float) -> int:
    n = dim.npus
    m = c // n
    hmax = dim.max_hops
    if op == REDUCE_SCATTER:
        return dim.message_ns(hmax, m) + 2 * e + reduction_ns(m, bw)
    if op == ALL_GATHER:
        return dim.message_ns(hmax, c) + 2 * e
    if op == ALL_TO_ALL:
        return dim.message_ns(hmax, m) + 2 * e
    p = reduction_ns(m, bw)
    if dim.kind is not DimKind.RING:
        return 2 * dim.message_ns(hmax, m) + 3 * e + p
    # Ring all-reduce: the second-phase message to the peer at distance j leaves when the j-th
    # reduction is done, but not before every first-phase message has arrived.
    arrivals = sorted(e + dim.message_ns(dim.hops(d), m) for d in range(1, n))
    ready = [r + e + p for r in arrivals]
    last = arrivals[-1]
    j_star = next(i for i, g in enumerate(ready) if g >= last)
    return e + max(ready[max(j, j_star)] + dim.message_ns(dim.hops(j + 1), m) for j in range(n - 1))


def _hd_phase(op: str, dim: Dimension, c: int, e: int, bw: float) -> int:
    n = dim.npus
    levels = _log2_exact(n, "halvingDoubling")
    if op == ALL_TO_ALL:
        raise UnsupportedCollective(
            "halvingDoubling has no all-to-all in ASTRA-Sim (it exits with 'unknown communication "
            "type'); use ring or direct for all-to-all"
        )
    if op == ALL_GATHER:
        return (
            sum(dim.message_ns(dim.hops(n >> k), c << (k - 1)) for k in range(1, levels + 1))
            + (levels + 1) * e
        )
    sizes = [c >> k for k in range(1, levels + 1)]
    offsets = [1 << (k - 1) for k in range(1, levels + 1)]
    reduce_charge = sum(reduction_ns(s, bw) for s in sizes[1:])
    if op == REDUCE_SCATTER:
        net = sum(dim.message_ns(dim.hops(o), s) for o, s in zip(offsets, sizes, strict=True))
        return net + (levels + 1) * e + reduce_charge
    half = sizes[-1] // 2
    if half == 0:
        raise UnsupportedCollective(
            f"halvingDoubling all-reduce of a {c}-byte chunk on {n} NPUs generates a zero-byte "
            f"message (ASTRA-Sim asserts chunk_size > 0); the chunk must be at least {2 * n} bytes "
            "(fewer dataset splits, more bytes, or another algorithm)"
        )
    sizes += [half << j for j in range(1, levels + 1)]
    offsets += [1 << (levels - j) for j in range(1, levels + 1)]
    net = sum(dim.message_ns(dim.hops(o), s) for o, s in zip(offsets, sizes, strict=True))
    return net + (2 * levels + 1) * e + reduce_charge


def _dbt_phase(dim: Dimension, c: int, e: int, bw: float) -> int:
    n = dim.npus
    levels = _log2_exact(n, "doubleBinaryTree")
    edges = sum(dim.message_ns(dim.hops(1 << (lv - 1)), c) for lv in range(1, levels))
    edges += dim.message_ns(dim.hops(n // 2), c)
    return 2 * e + 2 * edges + (2 * levels - 1) * (e + reduction_ns(c, bw))


def dbt_root_ns(dim: Dimension, nbytes: int, system: SystemConfig) -> int:
    """Finish time of the doubleBinaryTree root (the first NPU done) for one chunk."""
    n = dim.npus
    levels = _log2_exact(n, "doubleBinaryTree")
    e, p = system.endpoint_delay_ns, reduction_ns(nbytes, system.local_mem_bw_gbps)
    up = sum(dim.message_ns(dim.hops(1 << (lv - 1)), nbytes) + e + p for lv in range(1, levels))
    return e + up + dim.message_ns(dim.hops(n // 2), nbytes) + e + p


def phase_ns(op: str, algorithm: str, dim: Dimension, nbytes: int, system: SystemConfig) -> int:
    """``T1``: one chunk of ``nbytes`` through one collective phase on one dimension.

    For doubleBinaryTree this is the leaves' (last) finish time.
    """
    e, bw = system.endpoint_delay_ns, system.local_mem_bw_gbps
    if algorithm == "ring":
        return _ring_phase(op, dim, nbytes, e, bw)
    if algorithm == "direct":
        return _direct_phase(op, dim, nbytes, e, bw)
    if algorithm == "halvingDoubling":
        return _hd_phase(op, dim, nbytes, e, bw)
    if algorithm == "doubleBinaryTree":
        return _dbt_phase(dim, nbytes, e, bw)
    raise ConfigError(f"algorithm: unknown {algorithm!r}")


# --------------------------------------------------------------------------- composition


@dataclass(frozen=True, slots=True)
class Phase:
    """One step of a multi-dimensional collective: which dimension, what runs, on how many bytes."""

    dim: int
    op: str
    algorithm: str
    nbytes: int
    ns: int  # last NPU's finish
    min_ns: int  # first NPU's finish (differs from ns only for doubleBinaryTree)


def _steps(
    op: str, topology: Topology, system: SystemConfig, dims: Sequence[int]
) -> tuple[tuple[int, str, str, Dimension], ...]:
    """``(dimension index, phase collective, algorithm, dimension)`` of each phase of ``op`` on
    the (non-trivial) dimensions ``dims``, in order; the bytes do not change them."""
    algos = system.algorithms_for(op, len(topology.dims))
    if op == ALL_REDUCE and system.collective_optimization == "localBWAware" and len(dims) > 1:
        order = [(d, REDUCE_SCATTER) for d in dims[:-1]]
        order.append((dims[-1], ALL_REDUCE))
        order += [(d, ALL_GATHER) for d in reversed(dims[:-1])]
    elif op == ALL_GATHER:
        order = [(d, op) for d in reversed(dims)]
    else:
        order = [(d, op) for d in dims]
    return tuple((d, step_op, algos[d], topology.dims[d]) for d, step_op in order)


def _phases(
    steps: tuple[tuple[int, str, str, Dimension], ...], nbytes: int, system: SystemConfig
) -> list[Phase]:
    """The phases one chunk of ``nbytes`` goes through ``steps`` (:func:`_steps`)."""
    phases = []
    size = nbytes
    for d, step_op, algo, dim in steps:
        t = phase_ns(step_op, algo, dim, size, system)
        t_min = dbt_root_ns(dim, size, system) if algo == "doubleBinaryTree" else t
        phases.append(Phase(d, step_op, algo, size, t, t_min))
        if algo == "doubleBinaryTree":
            continue  # the tree all-reduces the full size: nothing shrinks or grows
        if step_op == REDUCE_SCATTER:
            size //= dim.npus
        elif step_op == ALL_GATHER:
            size *= dim.npus
    return phases


def plan_phases(
    op: str, nbytes: int, topology: Topology, system: SystemConfig, dims: Sequence[int]
) -> list[Phase]:
    """The phases one chunk of ``nbytes`` goes through on the (non-trivial) dimensions ``dims``."""
    return _phases(_steps(op, topology, system, dims), nbytes, system)


def split_chunks(op: str, nbytes: int, group_npus: int, splits: int) -> tuple[int, int]:
    """``(chunk_bytes, num_chunks)`` for ``preferred-dataset-splits`` = ``splits``.

    Chunk = ``nbytes // splits``; except for all-gather a chunk is at least one byte per NPU of
    the group (then there are exactly ``splits`` chunks). Every chunk, including the last,
    carries the full chunk size.
    """
    chunk = nbytes // splits
    if op != ALL_GATHER and chunk < group_npus:
        return group_npus, splits
    if chunk == 0:
        raise UnsupportedCollective(
            f"all-gather of {nbytes} bytes cannot be split into {splits} chunks (zero-byte "
            "chunks); lower preferred-dataset-splits"
        )
    return chunk, -(-nbytes // chunk)


def _list_schedule(
    phases: Sequence[Phase], num_chunks: int, active: int, durations: Sequence[int]
) -> int:
    """Finish time of ``num_chunks`` chunks through ``phases`` (phase i lasting ``durations[i]``).

    Each dimension is one FIFO queue running at most ``active`` chunks; all phases on a dimension
    share it. All chunks join the first queue at t = 0 in order. When a chunk finishes a phase it
    joins the tail of its next phase's queue; then the freed queue, then the next queue, start
    waiting chunks. Events at equal times are handled in the order they were scheduled.
    """
    queues = {p.dim for p in phases}
    waiting: dict[int, deque[tuple[int, int]]] = {q: deque() for q in queues}
    running = dict.fromkeys(queues, 0)
    events: list[tuple[int, int, int, int]] = []
    seq = 0

    def start(q: int, now: int) -> None:
        nonlocal seq
        while running[q] < active and waiting[q]:
            chunk, idx = waiting[q].popleft()
            running[q] += 1
            heapq.heappush(events, (now + durations[idx], seq, chunk, idx))
            seq += 1

    first = phases[0].dim
    waiting[first].extend((c, 0) for c in range(num_chunks))
    start(first, 0)
    finish = 0
    while events:
        now, _, chunk, idx = heapq.heappop(events)
        q = phases[idx].dim
        running[q] -= 1
        if idx + 1 < len(phases):
            nxt = phases[idx + 1].dim
            waiting[nxt].append((chunk, idx + 1))
            start(q, now)
            start(nxt, now)
        else:
            start(q, now)
            finish = max(finish, now)
    return finish


def _dbt_tree(n: int) -> tuple[list[int], list[list[int]], list[int]]:
    """Tree rooted at ``n-1``: parent per NPU (-1 for root), children per NPU, bottom-up order.

    NPUs ``0..n-2`` form a complete binary tree in in-order numbering (leaves are the even ids,
    level-l nodes have children at distance 2**(l-1)); its top ``n/2-1`` is the root's only child.
    """
    parent = [-1] * n
    children: list[list[int]] = [[] for _ in range(n)]
    level = [0] * n
    for i in range(n - 1):
        lv = ((i + 1) & -(i + 1)).bit_length() - 1
        level[i] = lv
        if lv:
            for ch in (i - (1 << (lv - 1)), i + (1 << (lv - 1))):
                parent[ch] = i
                children[i].append(ch)
    top = n // 2 - 1
    parent[top] = n - 1
    children[n - 1].append(top)
    level[n - 1] = max(level) + 1
    order = sorted(range(n), key=lambda v: level[v])
    return parent, children, order


def _dbt_chunked(
    dim: Dimension, chunk: int, num_chunks: int, system: SystemConfig
) -> tuple[int, int]:
    """``(min, max)`` over NPUs of the finish time of a chunked doubleBinaryTree on one dimension.

    Even chunks use the tree rooted at NPU n-1, odd chunks its mirror image (rooted at NPU 0).
    Each NPU runs at most ``active`` chunks: chunk j starts on an NPU once that NPU has finished
    j-a+1 of the earlier chunks. Upward pass: a leaf sends after E; an inner node reduces after
    its children's data has arrived (E + P); the root completes the reduction. Downward pass: each
    node forwards after receiving from its parent (E + P for inner nodes, E for leaves).
    """
    n = dim.npus
    _log2_exact(n, "doubleBinaryTree")
    e = system.endpoint_delay_ns
    p = reduction_ns(chunk, system.local_mem_bw_gbps)
    a = system.active_chunks
    parent0, children0, order0 = _dbt_tree(n)

    def link(x: int, y: int) -> int:
        return dim.message_ns(dim.hops(abs(x - y)), chunk)

    done: list[list[int]] = [[] for _ in range(n)]  # per NPU, finish times of its chunks so far
    for j in range(num_chunks):
        mirror = j % 2 == 1

        def role(v: int, mirror: bool = mirror) -> int:
            return n - 1 - v if mirror else v

        start = [0 if j < a else sorted(done[v])[j - a] for v in range(n)]
        up = [0] * n
        fin = [0] * n
        for r in order0:  # roles bottom-up
            v = role(r)
            kids = children0[r]
            if parent0[r] == -1:
                ch = role(kids[0])
                fin[v] = max(start[v], up[ch] + link(ch, v)) + e + p
            elif not kids:
                up[v] = start[v] + e
            else:
                ready = max(up[role(k)] + link(role(k), v) for k in kids)
                up[v] = max(start[v], ready) + e + p
        for r in reversed(order0):  # top-down
            if parent0[r] == -1:
                continue
            v, par = role(r), role(parent0[r])
            fin[v] = max(up[v], fin[par] + link(par, v)) + e + (p if children0[r] else 0)
        for v in range(n):
            done[v].append(fin[v])
    last = [max(ts) for ts in done]
    return min(last), max(last)


@dataclass(frozen=True, slots=True)
class CollectiveTime:
    """Completion time of a collective started at t = 0 on every NPU: max and min over NPUs."""

    ns: int
    min_ns: int


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    """What a collective's time depends on besides its bytes (:func:`route`): the collective,
    the dimensions it runs on, the size of its group, its phases' steps and the system config.

    Compared and hashed by identity: :func:`route` returns the same object for equal inputs,
    so the time memo (:func:`time_on`) is keyed on it without hashing a topology or a system
    config per call."""

    op: str
    dims: tuple[int, ...]
    group: int
    steps: tuple[tuple[int, str, str, Dimension], ...]
    system: SystemConfig


@lru_cache(maxsize=1 << 10)
def route(
    op: str, topology: Topology, system: SystemConfig, involved: tuple[bool, ...]
) -> Route | None:
    """The route of canonical ``op`` over ``involved`` (one flag per dimension); ``None`` when
    no dimension with more than one NPU takes part (the collective costs nothing)."""
    if len(involved) != len(topology.dims):
        raise ConfigError(
            f"involved dims: {len(involved)} flags for a {len(topology.dims)}-dimension topology"
        )
    dims = tuple(
        i
        for i, (d, on) in enumerate(zip(topology.dims, involved, strict=True))
        if on and d.npus > 1
    )
    if not dims:
        return None
    group = math.prod(topology.dims[i].npus for i in dims)
    return Route(op, dims, group, _steps(op, topology, system, dims), system)


def check_bytes(nbytes: int) -> None:
    """Refuse a byte count that is not a non-negative integer."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ConfigError(f"collective bytes: {nbytes!r} must be a non-negative integer")


@lru_cache(maxsize=1 << 16)
def time_on(on: Route | None, nbytes: int) -> CollectiveTime:
    """Time of one collective of ``nbytes`` (checked by the caller) along ``on`` (memoised:
    the collective memo every network model shares)."""
    if nbytes == 0 or on is None:
        return CollectiveTime(0, 0)
    system = on.system
    chunk, num_chunks = split_chunks(on.op, nbytes, on.group, system.dataset_splits)
    steps = on.steps
    if len(steps) == 1 and steps[0][2] == "doubleBinaryTree":
        lo, hi = _dbt_chunked(steps[0][3], chunk, num_chunks, system)
        return CollectiveTime(hi, lo)
    if len(steps) == 1:
        _, step_op, algo, dim = steps[0]
        t = phase_ns(step_op, algo, dim, chunk, system)
        rounds = -(-num_chunks // system.active_chunks)
        return CollectiveTime(rounds * t, rounds * t)
    phases = _phases(steps, chunk, system)
    if num_chunks == 1:
        return CollectiveTime(sum(p.ns for p in phases), sum(p.min_ns for p in phases))
    a = system.active_chunks
    t = _list_schedule(phases, num_chunks, a, [p.ns for p in phases])
    t_min = _list_schedule(phases, num_chunks, a, [p.min_ns for p in phases])
    return CollectiveTime(t, t_min)


def collective_time(
    op: str,
    nbytes: int,
    topology: Topology,
    system: SystemConfig,
    involved: tuple[bool, ...] | None = None,
) -> CollectiveTime:
    """Time of one collective (memoised, :func:`time_on`). ``involved``: per-dimension flags,
    ``None`` = all.

    ``nbytes == 0`` costs 0 ns (there is nothing to send; the engine emits no such collective).
    A collective whose involved dimensions all have one NPU also costs 0 ns.
    """
    op = parse_collective(op)
    check_bytes(nbytes)
    if involved is None:  # every dimension, spelt as NetworkModel does (one route object)
        involved = (True,) * len(topology.dims)
    return time_on(route(op, topology, system, involved), nbytes)


def collective_ns(
    op: str,
    nbytes: int,
    topology: Topology,
    system: SystemConfig,
    involved: tuple[bool, ...] | None = None,
) -> int:
    """Completion time (max over NPUs) of one collective, integer ns."""
    return collective_time(op, nbytes, topology, system, involved).ns


@lru_cache(maxsize=1 << 16)
def p2p_ns(nbytes: int, src: int, dst: int, topology: Topology) -> int:
    """Send/recv of ``nbytes`` from NPU ``src`` to ``dst``: one message on the lowest differing dim.

    ``src == dst`` costs 0 ns. No endpoint delay or other system-layer charge applies.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ConfigError(f"send/recv bytes: {nbytes!r} must be a non-negative integer")
    a, b = topology.coords(src), topology.coords(dst)
    for dim, xa, xb in zip(topology.dims, a, b, strict=True):
        if xa != xb:
            return dim.message_ns(dim.hops(abs(xa - xb)), nbytes)
    return 0
