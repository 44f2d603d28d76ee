"""Compact request state: on-demand block hashes, token-time runs, the KV-call skip."""

from __future__ import annotations

import pickle
from array import array

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.kv_cache import KVCacheManager
from engine.request import Request, chained_block_hashes, synthetic_output_ids
from engine.results import requests_frame
from engine.workload import RequestSpec
from tests.engine_harness import Harness, toks


def _req(prompt, out_len: int = 40, out_ids=None, index: int = 0) -> Request:
    return Request(RequestSpec("r", 0, prompt, out_len, out_ids), index, 16, True)


def test_hashes_depend_on_the_id_values_only() -> None:
    ids = toks(1000, 100)
    forms = [tuple(ids), range(1000, 1100), array("q", ids), np.arange(1000, 1100)]
    hashes = [_req(f).hashes(6)[:6] for f in forms]
    assert all(h == hashes[0] for h in hashes) and len(hashes[0]) == 6
    assert hashes[0] == chained_block_hashes(ids, 16)
    # One changed id changes its block's hash and every later one, never an earlier one.
    other = _req(tuple(ids[:40] + [7] + ids[41:])).hashes(6)[:6]
    assert other[:2] == hashes[0][:2] and all(a != b for a, b in zip(other[2:], hashes[0][2:], strict=True))


def test_the_first_ask_hashes_the_whole_sequence() -> None:
    """Every full block of the prompt and all the outputs at the first ask (its ids are
    known), so a later ask, one per block boundary the request crosses, only reads them;
    ``block_hashes`` still gives only the blocks the tokens reached fill."""
    r = _req(range(0, 40), out_len=30, index=3)
    full = list(range(0, 40)) + list(synthetic_output_ids(3, 30))
    h = r.hashes(1)
    assert h == chained_block_hashes(full, 16) and len(h) == 70 // 16
    assert r.hashes(4) is h
    assert r.block_hashes == h[:2]


@settings(max_examples=200, deadline=None)
@given(start=st.integers(-(1 << 41), 1 << 41), step=st.sampled_from([1, 2, -1, -3]),
       prompt_len=st.integers(0, 70), out_len=st.integers(1, 60), index=st.integers(0, 10**6))
def test_range_sequences_hash_as_their_ids(start, step, prompt_len, out_len, index) -> None:
    """A prompt and outputs that are both ranges are hashed without laying them out: the
    same hashes as the ids written out."""
    prompt = range(start, start + prompt_len * step, step)
    r = _req(prompt, out_len=out_len, index=index)
    assert type(r.output_ids) is range
    r.num_tokens = prompt_len + out_len
    ids = list(prompt) + list(r.output_ids)
    assert r.block_hashes == chained_block_hashes(ids, 16)
    assert r.block_hashes == _req(tuple(prompt), out_len, tuple(r.output_ids), index).hashes(
        len(ids) // 16)


def test_block_hashes_cover_the_reached_tokens_and_outputs() -> None:
    r = _req(range(0, 40), out_len=30, index=3)
    assert len(r.block_hashes) == 2  # 40 prompt tokens: two full blocks
    r.num_tokens = 64  # 24 outputs reached: the third and fourth blocks are full
    full = list(range(0, 40)) + list(synthetic_output_ids(3, 30))
    assert r.block_hashes == chained_block_hashes(full[:64], 16)
    r.release()
    assert r.block_hashes == chained_block_hashes(full[:64], 16)  # recomputed, equal


def test_explicit_output_ids_are_used_up_to_output_len() -> None:
    r = _req(range(0, 16), out_len=16, out_ids=tuple(range(500, 540)))
    r.num_tokens = 32
    assert r.block_hashes == chained_block_hashes(list(range(16)) + list(range(500, 516)), 16)
    assert r.token_ids(10, 20) == tuple(range(10, 16)) + tuple(range(500, 504))


def test_token_times_survive_preemption_as_runs() -> None:
    h = Harness(8)
    for i, name in enumerate(("R0", "R1", "R2")):
        h.add(name, toks(100 * i, 24), 14)
    while any(not r.is_finished for r in h.requests.values()):
        h.step()
    reqs = list(h.requests.values())
    assert any(r.num_preemptions for r in reqs)
    frame = requests_frame(reqs)
    for r, times in zip(reqs, frame.token_times_ns, strict=True):
        assert list(times) == r.token_times_ns and len(times) == r.max_tokens
        assert r.first_token_ns == times[0] and r.finish_ns == times[-1]
        assert all(a < b for a, b in zip(times[:-1], times[1:], strict=True))
        assert not times.flags.writeable


class _AlwaysCall(KVCacheManager):
    """A KV manager that never lets the scheduler skip allocate_slots."""

    def _set_thresholds(self, req) -> None:  # type: ignore[no-untyped-def]
        super()._set_thresholds(req)
        req.kv_check_at = 0
        req.kv_slots = -1


@st.composite
def _scenarios(draw):  # type: ignore[no-untyped-def]
    reqs = []
    for i in range(draw(st.integers(1, 8))):
        share = draw(st.integers(0, 48))
        prompt = toks(0, share) + toks(10_000 * (i + 1), draw(st.integers(1, 60)))
        reqs.append((f"r{i}", prompt, draw(st.integers(1, 40)), draw(st.integers(0, 5))))
    return dict(
        reqs=reqs,
        num_blocks=draw(st.integers(10, 40)),
        budget=draw(st.integers(8, 128)),
        async_scheduling=draw(st.booleans()),
        caching=draw(st.booleans()),
        threshold=draw(st.sampled_from([0, 8])),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_skipping_kv_calls_changes_nothing(sc) -> None:  # type: ignore[no-untyped-def]
    """The scheduler's allocate_slots skip is exact: the same steps, block tables and ledger
    as calling it for every scheduled running request."""
    sides = []
    for always in (False, True):
        h = Harness(sc["num_blocks"], budget=sc["budget"], async_scheduling=sc["async_scheduling"],
                    caching=sc["caching"], threshold=sc["threshold"], max_model_len=10_000)
        if always:
            h.kv = _AlwaysCall(sc["num_blocks"], 16, 10_000, sc["caching"])
            h.sched.kv = h.kv
        sides.append(h)
    pending = sorted(sc["reqs"], key=lambda r: r[3])
    for t in range(600):
        while pending and pending[0][3] <= t:
            name, prompt, out, _ = pending.pop(0)
            if -(-(len(prompt) + out) // 16) <= sc["num_blocks"] - 1:
                for h in sides:
                    h.add(name, prompt, out)
        seen = []
        for h in sides:
            s = h.async_step() if sc["async_scheduling"] else h.step()
            seen.append((s, {n: h.table(n) for n in h.requests}, h.kv.pool.free_block_ids(),
                         sorted(h.kv.pool.cache_groups())))
        assert seen[0] == seen[1], f"step {t}"
        if not pending and not any(h.sched.has_requests() for h in sides):
            break


def test_asking_beyond_the_sequence_is_refused() -> None:
    r = _req(range(0, 40), out_len=30)
    with pytest.raises(ValueError, match="5 full blocks asked for"):
        r.hashes(5)  # 70 tokens: 4 full blocks


def test_the_hash_view_reads_the_hashes() -> None:
    """The KV manager's view and the hashes are the same values, also after a release."""
    r = _req(range(0, 40), out_len=30)
    assert list(r.hash_view(4)) == list(r.hashes(4)) == list(chained_block_hashes(
        list(range(40)) + list(r.output_ids), 16))
    r.release()
    assert list(r.hash_view(2)) == list(r.hashes(4))


def test_a_request_pickles_with_its_state_and_recomputes_its_hashes() -> None:
    r = _req(range(0, 40), out_len=30, index=3)
    r.num_tokens = 55
    r.num_computed_tokens = 48
    want = list(r.hashes(4))
    r.open_block_table(2)
    r.kv_table[0], r.kv_table[1], r.kv_num_blocks = 7, 9, 2
    back = pickle.loads(pickle.dumps(r))
    assert type(back) is Request
    for name in Request.__slots__:
        if name not in ("_block_hashes", "_hash_view", "_table_view"):
            assert getattr(back, name) == getattr(r, name), name
    assert list(back.hashes(4)) == want and list(back.hash_view(4)) == want
    back.reserve_blocks(5)  # a grown table keeps its ids
    assert back.block_ids() == [7, 9] and len(back.kv_table) >= 5
