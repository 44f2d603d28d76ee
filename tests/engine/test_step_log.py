"""The step log (``engine.instance.StepLog``) holds every step logged, in order, whatever mix
of single steps (``add``) and runs of steps (``extend``) logged them and wherever its pending
arrays were moved to the columns or grew (they double while the columns hold twice as many
steps): a hypothesis property against a plain list per column."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.instance import StepLog

# A batch: one step (add) or a run of steps (extend), short or longer than the pending arrays.
BATCHES = st.lists(st.one_of(st.just(1), st.integers(0, 40), st.integers(200, 1500)),
                   min_size=1, max_size=40)


def _step(k: int) -> tuple[int, int, int, float, int, int]:
    return 10 * k + 3, k % 64, k % 5, (k % 97) / 97, k % 11, k % 2


@settings(max_examples=60, deadline=None)
@given(batches=BATCHES, read_every=st.integers(1, 8))
def test_the_log_holds_every_step_in_order(batches: list[int], read_every: int) -> None:
    log = StepLog()
    want: list[list[float]] = [[] for _ in StepLog.COLUMNS]
    k = 0
    for b, size in enumerate(batches):
        steps = [_step(k + i) for i in range(size)]
        k += size
        if size == 1:
            log.add(*steps[0])
        else:
            cols = list(zip(*steps, strict=True)) if steps else [()] * 6
            log.extend(*(array("d" if c == 3 else "q", cols[c]) for c in range(6)))
        for c in range(6):
            want[c].extend(s[c] for s in steps)
        if b % read_every == 0:  # a read moves the pending steps; logging goes on after it
            assert list(log.end_ns) == want[0]
    for c, name in enumerate(StepLog.COLUMNS):
        assert list(getattr(log, name)) == want[c], name

