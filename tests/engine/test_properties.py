"""Property tests: block-pool and scheduler invariants hold on every step of random runs."""

from __future__ import annotations

from array import array

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.block_pool import BlockPool
from engine.request import RequestStatus
from tests.engine_harness import Harness

PREFIXES = [list(range(1000 * k, 1000 * k + 64)) for k in range(3)]


@st.composite
def scenarios(draw):
    n_req = draw(st.integers(1, 12))
    reqs = []
    for i in range(n_req):
        prefix = draw(st.sampled_from([[], *PREFIXES]))
        prefix = prefix[: draw(st.integers(0, len(prefix)))]
        tail = draw(st.integers(1, 80))
        prompt = prefix + list(range(100_000 + 1000 * i, 100_000 + 1000 * i + tail))
        reqs.append((f"r{i}", prompt, draw(st.integers(1, 30)), draw(st.integers(0, 6))))
    return dict(
        reqs=reqs,
        num_blocks=draw(st.integers(12, 60)),
        budget=draw(st.integers(8, 200)),
        max_num_seqs=draw(st.integers(1, 8)),
        threshold=draw(st.sampled_from([0, 0, 8, 32])),
        reserve_full_isl=draw(st.booleans()),
        async_scheduling=draw(st.booleans()),
        caching=draw(st.booleans()),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_scheduler_invariants(sc) -> None:
    h = Harness(
        sc["num_blocks"],
        budget=sc["budget"],
        max_num_seqs=sc["max_num_seqs"],
        threshold=sc["threshold"],
        reserve_full_isl=sc["reserve_full_isl"],
        async_scheduling=sc["async_scheduling"],
        caching=sc["caching"],
        max_model_len=10_000,
    )
    pending = sorted(sc["reqs"], key=lambda r: r[3])
    finished_at: dict[str, int] = {}
    for step_no in range(3000):
        while pending and pending[0][3] <= step_no:
            name, prompt, out, _ = pending.pop(0)
            # A request that can never fit is not the scheduler's concern: vLLM rejects it
            # at start-up (max_model_len fit check). Keep only feasible ones.
            need = -(-(len(prompt) + out) // 16)
            if need <= sc["num_blocks"] - 1:
                h.add(name, prompt, out)
        if not pending and not h.sched.has_requests() and not h.inflight:
            break
        if sc["async_scheduling"]:
            out = h.sched.schedule(step_no)
            h.inflight.append(out)
            if len(h.inflight) > 1:
                done = h.sched.update_from_output(h.inflight.pop(0), step_no)
            else:
                done = []
        else:
            out = h.sched.schedule(step_no)
            done = h.sched.update_from_output(out, step_no)
        if not out.reqs and not h.sched.running and h.sched.waiting and not h.inflight:
            break  # nothing runnable, nothing in flight: handled by Instance as an error
        # Budget and concurrency limits.
        assert sum(out.num_tokens) <= sc["budget"]
        assert len(h.sched.running) <= sc["max_num_seqs"]
        assert len(set(map(id, out.reqs))) == len(out.reqs)
        for r, n in zip(out.reqs, out.num_tokens, strict=True):
            assert n >= 1
            if sc["threshold"]:
                assert n <= sc["threshold"]
            assert r.num_computed_tokens <= r.prompt_len + r.max_tokens
        if out.preempted:  # a step that preempted admitted nobody new
            assert all(r.status == RequestStatus.RUNNING or r.is_finished for r in out.reqs)
        for r in done:
            assert r.request_id not in finished_at
            finished_at[r.request_id] = step_no
        # Ledger invariants: ref counts = owners, free queue exact, cache index consistent.
        h.check()
        for r in h.sched.waiting:
            assert r.index not in h.kv.req_blocks or r.num_computed_tokens > 0
        for r in h.sched.running:
            held = len(h.kv.block_tables().get(r.index, []))
            assert held * 16 >= r.num_computed_tokens
    while h.inflight:
        for r in h.sched.update_from_output(h.inflight.pop(0), 10_000):
            finished_at[r.request_id] = 10_000
    for name, r in h.requests.items():
        if r.is_finished:
            assert r.num_output_tokens == r.max_tokens
            assert len(r.token_times_ns) == r.max_tokens
            assert name in finished_at
    if not h.sched.has_requests():
        assert h.kv.pool.num_free == sc["num_blocks"] - 1  # nothing leaked
        assert set(finished_at) == set(h.requests)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "touch"]), st.integers(1, 5)), max_size=60))
def test_block_pool_ledger(ops) -> None:
    pool = BlockPool(16)
    owned: list[list[int]] = []
    next_hash = 0
    for op, k in ops:
        if op == "alloc" and k <= pool.num_free:
            blocks = pool.get_new_blocks(k)
            hashes = list(range(next_hash, next_hash + k))
            next_hash += k
            pool.cache_full_blocks(array("i", blocks), array("Q", hashes), 0, k)
            owned.append(blocks)
        elif op == "free" and owned:
            blocks = owned.pop(k % len(owned))
            pool.free_blocks(list(reversed(blocks)))
        elif op == "touch" and owned:
            blocks = list(owned[k % len(owned)])
            pool.touch(blocks)
            owned.append(blocks)
        pool.check_invariants(owned)
        assert 0 <= pool.num_free <= 15
        assert all(r >= 0 for r in pool.ref_cnt)
