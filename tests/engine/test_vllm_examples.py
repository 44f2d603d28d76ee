"""The worked examples of vLLM 0.19.1's real Scheduler/KVCacheManager (traces recorded on a
CPU, see docs/reference-semantics.md §15-§17), replayed on our engine."""

from __future__ import annotations

from tests.engine_harness import Harness, toks


def test_prefix_hit_of_shared_32_tokens() -> None:
    h = Harness(10)
    h.add("A", toks(0, 40), 2)
    assert h.step() == ({"A": 40}, [])
    assert h.table("A") == [1, 2, 3]
    assert h.kv.pool.free_block_ids() == [4, 5, 6, 7, 8, 9]
    assert abs(h.kv.usage() - 3 / 9) < 1e-12
    h.add("B", toks(0, 32) + toks(1000, 8), 2)
    sched, _ = h.step()
    assert sched == {"A": 1, "B": 8}
    b = h.requests["B"]
    assert b.num_cached_tokens == 32 and b.prefix_hit_tokens == 32
    assert h.table("B") == [1, 2, 4]
    # A reached max_tokens in step 2: freed tail-first, only block 3 reaches ref 0.
    assert h.requests["A"].is_finished
    assert h.kv.pool.free_block_ids() == [5, 6, 7, 8, 9, 3]
    assert h.kv.pool.ref_cnt[1] == 1 and h.kv.pool.ref_cnt[2] == 1
    h.check()
    assert h.step() == ({"B": 1}, [])
    assert h.kv.pool.free_block_ids() == [5, 6, 7, 8, 9, 3, 4, 2, 1]
    assert h.kv.usage() == 0.0
    h.check()


def test_full_prompt_hit_recomputes_last_block() -> None:
    h = Harness(10)
    h.add("A", toks(0, 40), 1)
    h.step()
    h.add("C", toks(0, 32), 1)
    sched, _ = h.step()
    assert sched == {"C": 16}  # hit capped at num_tokens - 1 -> only the first block
    assert h.requests["C"].num_cached_tokens == 16
    # Block 2 and C's new block now both carry h1 (vLLM keeps duplicates).
    h1 = h.requests["A"].block_hashes[1]
    assert len(h.kv.pool.blocks_with_hash(h1)) == 2
    h.check()


def test_fcfs_preemption_under_memory_pressure() -> None:
    h = Harness(8)
    for i, name in enumerate(("R0", "R1", "R2")):
        h.add(name, toks(100 * i, 24), 14)
    assert h.step() == ({"R0": 24, "R1": 24, "R2": 24}, [])
    assert h.kv.pool.num_free == 1
    for _ in range(8):  # decode steps 2..9: up to 32 tokens, no new block
        sched, pre = h.step()
        assert sched == {"R0": 1, "R1": 1, "R2": 1} and pre == []
    sched, pre = h.step()
    assert sched == {"R0": 1, "R1": 1} and pre == ["R2"]
    r2 = h.requests["R2"]
    assert r2.num_computed_tokens == 0 and r2.num_preemptions == 1
    assert h.sched.waiting[0] is r2
    h.check()
    # R2 stays waiting (its 16-token hit plus 2 new blocks don't fit) until R0/R1 finish.
    while not (h.requests["R0"].is_finished and h.requests["R1"].is_finished):
        sched, pre = h.step()
        assert "R2" not in sched
        h.check()
    sched, _ = h.step()
    assert sched == {"R2": 33 - 16}  # resumed: recompute prompt + outputs minus the hit
    h.check()


def test_same_step_sharing() -> None:
    h = Harness(20, budget=256)
    h.add("a", toks(0, 40), 2)
    h.add("b", toks(0, 40), 2)
    assert h.step() == ({"a": 40, "b": 8}, [])
    assert h.table("a") == [1, 2, 3] and h.table("b") == [1, 2, 4]


def test_chunked_prefill_budget_sequence() -> None:
    h = Harness(100, budget=64)
    h.add("a", toks(0, 100), 3)
    h.add("b", toks(500, 100), 3)
    seq = [h.step()[0] for _ in range(6)]
    assert seq == [
        {"a": 64},
        {"a": 36, "b": 28},
        {"a": 1, "b": 63},
        {"a": 1, "b": 9},
        {"b": 1},
        {"b": 1},
    ]


def test_long_prefill_threshold_caps_chunks() -> None:
    h = Harness(100, budget=64, threshold=24)
    h.add("a", toks(0, 100), 3)
    h.add("b", toks(500, 10), 3)
    assert [h.step()[0] for _ in range(3)] == [{"a": 24, "b": 10}, {"a": 24, "b": 1}, {"a": 24, "b": 1}]


def test_full_isl_gate_on_refuses_second_prompt() -> None:
    h = Harness(11, budget=128)
    h.add("x", toks(0, 100), 2)
    h.add("y", toks(500, 100), 2)
    assert h.step() == ({"x": 100}, [])
    assert h.step() == ({"x": 1}, [])
    assert h.step() == ({"y": 100}, [])


def test_full_isl_gate_off_thrashes() -> None:
    h = Harness(11, budget=128, reserve_full_isl=False)
    h.add("x", toks(0, 100), 3)
    h.add("y", toks(500, 100), 3)
    assert h.step() == ({"x": 100, "y": 28}, [])
    assert h.step() == ({"x": 1}, ["y"])  # y is the tail: it preempts itself
    h.check()
    h.step()  # x's last token
    assert h.requests["x"].is_finished
    sched, _ = h.step()
    assert sched == {"y": 84}  # resumes with a 16-token hit


def test_async_scheduling_skips_certainly_finished_step() -> None:
    h = Harness(20, async_scheduling=True)
    h.add("r", toks(0, 40), 3)
    assert h.async_step() == {"r": 40}
    assert h.async_step() == {"r": 1}
    assert h.async_step() == {"r": 1}
    assert h.async_step() == {}
    h.sched.update_from_output(h.inflight.pop(0), h.t)
    r = h.requests["r"]
    assert r.is_finished and r.num_output_tokens == 3
    h.check()


def test_chunked_prefill_off_requires_whole_prompt_in_budget() -> None:
    # docs/reference-semantics.md §15 case 3: budget 64, c1 = 50, c2 = 30 tokens, chunked prefill
    # off.
    h = Harness(100, budget=64, max_model_len=64)
    h.sched.chunked_prefill = False
    h.add("c1", toks(0, 50), 3)
    h.add("c2", toks(500, 30), 3)
    assert h.step()[0] == {"c1": 50}
    assert h.step()[0] == {"c1": 1, "c2": 30}
