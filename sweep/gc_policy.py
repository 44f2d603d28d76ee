"""The driver's garbage-collector policy: long-lived objects kept out of its walks.

A driver (``python -m sweep``, ``python -m sweep.capacity``) imports MLflow, SQLAlchemy,
pandas, pyarrow and Ray (and the capacity search matplotlib): about 430,000 objects that
live until the process ends, against a few thousand a point creates. CPython's cyclic collector walks all of them
on every full collection (0.22-0.26 CPU-s each, measured on the 4-point ``mem_util_grid``
driver) and twice more while the interpreter shuts down (1.3 s of the 1.5 s between the last
``atexit`` handler and the process's end). ``gc.freeze`` moves the objects alive at that
moment to the permanent generation, which no collection walks:

- ``long_lived`` around what creates the objects the driver keeps for the whole run (the
  app's modules in ``sweep.__main__``, MLflow's import in ``sweep.tracking``, the open
  recorder in ``SweepRecorder.start``): the collector is off while any such block runs, in
  any thread (an import makes hardly any cyclic garbage, and its full collections were 0.7
  of the 0.9 CPU-s the 4-point driver spent collecting), and what is alive at a block's end
  is frozen unless the block raised, so later full collections walk only what the points
  create. A process that runs several launches (Hydra's ``max_batch_size``, a test session)
  calls ``launch_ended`` as each recorder closes: the next block first unfreezes the heap
  and collects it whole (one full walk, about 0.25 CPU-s, once per later launch), so the
  finished launch's cyclic garbage, the objects frozen with its open recorder (tracker,
  store engine, claims) included, is freed rather than kept for good;
- ``freeze_at_exit``, registered when the driver starts, runs after every ``atexit``
  handler registered later (Ray's, MLflow's): the shutdown collections find nothing to walk.
  What the driver writes is closed explicitly before (results table, MLflow runs and the
  store's connections, ``Tracker.close``; logging's handlers, which ``logging`` flushes
  from its own ``atexit`` handler), since no finaliser of a frozen object runs.

Frozen objects are still freed when their last reference goes; only cyclic garbage among
them stays. The simulator's own policy for a run (``engine.simulate``: what is alive before
the run frozen while it runs, unfrozen after) stands aside once anything is frozen, so in a
driver that simulates in its own process (``hydra/launcher=basic``, a single run, a
capacity search with ``pool.num_actors=0``) a run's full collections also walk what the
driver made since its last freeze (some 25,000 objects in a single run).
"""

from __future__ import annotations

import atexit
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_registered = False
# Guards the counters only: collections and freezes run outside it (a finaliser that a
# collection runs may itself enter a block, or wait on a thread that waits for the lock).
_lock = threading.Lock()
_depth = 0  # long_lived blocks running, in any thread
_was_enabled = False  # whether the collector was on when the first of them began
_launch_ended = False  # a launch ended since the last freeze: collect its garbage first


@contextmanager
def long_lived() -> Iterator[None]:
    """Run the block with the cyclic collector off, then move every object alive to the
    permanent generation (never walked again: use it only where what is alive at the end
    is what the process keeps); nothing is frozen when the block raised. Blocks may nest
    or run in several threads at once: the collector is switched back on when the last of
    them ends, and only if it was on when the first began."""
    global _depth, _was_enabled, _launch_ended
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
        _depth += 1
        gc.disable()
    ok = False
    try:
        yield
        ok = True
    finally:
        if ok:
            with _lock:
                collect, _launch_ended = _launch_ended, False
            if collect:
                gc.unfreeze()
                gc.collect()
            gc.freeze()
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def launch_ended() -> None:
    """Say that a launch's recorder closed: what it and its jobs made may now be cyclic
    garbage, frozen or not, which the next ``long_lived`` block collects before it
    freezes."""
    global _launch_ended
    _launch_ended = True


def freeze_at_exit() -> None:
    """Freeze the heap as late as possible in the interpreter's exit (after every
    ``atexit`` handler registered later); registered once per process."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
