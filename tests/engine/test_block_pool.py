"""The block pool's prefix-cache index (an open-addressing table in C columns) behaves as a
dict from hash to the first block cached under it, whatever the probe sequences: hashes are
drawn to collide on their low bits, and enough blocks are cached and evicted that deletions
shift long probe runs back many times (``check_invariants`` finds every live hash from its
home slot and checks each block's slot)."""

from __future__ import annotations

import itertools
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_pool import BlockPool, BlockPoolError

# Few distinct low bits, many high ones (hashes that share a home slot and make long probe
# runs), at the table's start or at its end (a 12-block pool has 32 slots: runs from slots
# 28-31 wrap around to slot 0), or anywhere.
HASHES = st.one_of(
    st.builds(lambda lo, hi: (hi << 40) | lo, st.integers(0, 3), st.integers(0, 2**23)),
    st.builds(lambda lo, hi: (hi << 40) | (31 - lo), st.integers(0, 3), st.integers(0, 2**23)),
    st.integers(0, 2**64 - 7),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["cache", "free"]), HASHES, st.integers(1, 6)),
                    max_size=400))
def test_prefix_index_is_a_dict_of_first_blocks(ops) -> None:
    pool = BlockPool(12)
    model: dict[int, list[int]] = {}  # hash -> blocks carrying it, first inserted first
    held: list[list[int]] = []
    for op, h, k in ops:
        if op == "cache" and pool.num_free:
            k = min(k, pool.num_free)
            got = pool.get_new_blocks(k)
            for b in got:  # an allocation evicts what the block carried
                for key, blocks in list(model.items()):
                    if b in blocks:
                        blocks.remove(b)
                        if not blocks:
                            del model[key]
            hashes = [h + i for i in range(k)]  # a request's chain: distinct within it
            pool.cache_full_blocks(array("i", got), array("Q", hashes), 0, k)
            for b, hh in zip(got, hashes, strict=True):
                model.setdefault(hh, []).append(b)
            held.append(got)
        elif op == "free" and held:
            pool.free_blocks(list(reversed(held.pop(h % len(held)))))
        for key, blocks in model.items():
            assert pool.lookup(key) == blocks[0]
            assert pool.blocks_with_hash(key) == blocks
        absent = h ^ (1 << 63)
        if absent not in model:
            assert pool.lookup(absent) == -1
        assert pool.num_cached_blocks() == sum(len(v) for v in model.values())
        assert [pool.ref_of(b) for b in range(pool.num_blocks)] == pool.ref_cnt
        pool.check_invariants(held)


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_deleting_from_a_run_that_wraps_keeps_every_hash_found(order) -> None:
    """Hashes 31 and 63 share home slot 31 of the 32 (a 12-block pool's); 63 wraps to slot 0 and pushes 32
    (home 0) to slot 1. Evicting them in any order leaves the others found from their home
    slots (a deletion at the table's end shifts entries from its start back)."""
    pool = BlockPool(12)
    hashes = [31, 63, 32]
    blocks = pool.get_new_blocks(3)
    held = pool.get_new_blocks(pool.num_free)  # so the three are the only free blocks
    pool.cache_full_blocks(array("i", blocks), array("Q", hashes), 0, 3)
    pool.free_blocks([blocks[i] for i in order])  # evicted in this order
    left = dict(zip(hashes, blocks, strict=True))
    taken: list[int] = []
    for i in order:
        taken += pool.get_new_blocks(1)
        del left[hashes[i]]
        for h, b in left.items():
            assert pool.lookup(h) == b, (order, h)
        assert pool.lookup(hashes[i]) == -1
        pool.check_invariants([held, taken])


def test_a_block_carries_one_hash_until_evicted() -> None:
    """Caching a block that carries a hash again is refused, as a duplicate too; once the block
    is evicted (reallocated) it may be cached again. ``ref_cnt`` is a copy."""
    pool = BlockPool(6)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks(array("i", [a, b]), array("Q", [7, 7]), 0, 2)  # b: a duplicate of 7
    for blk in (a, b):
        with pytest.raises(BlockPoolError, match="cached twice"):
            pool.cache_full_blocks(array("i", [blk]), array("Q", [9]), 0, 1)
    refs = pool.ref_cnt
    refs[a] = 5
    assert pool.ref_of(a) == 1
    pool.free_blocks([b, a])  # b is evicted first, then a
    again = pool.get_new_blocks(pool.num_free)
    assert again[-2:] == [b, a] and pool.lookup(7) == -1
    pool.cache_full_blocks(array("i", [b]), array("Q", [9]), 0, 1)
    assert pool.lookup(9) == b
    pool.check_invariants([again])
