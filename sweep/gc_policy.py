"""The driver's garbage-collector policy: long-lived objects kept out of its walks.

A driver (``python -m sweep``, ``python -m sweep.capacity``) imports MLflow, SQLAlchemy,
pandas, pyarrow, matplotlib and Ray: about 430,000 objects that live until the process
ends, against a few thousand a point creates. CPython's cyclic collector walks all of them
on every full collection (0.22-0.26 CPU-s each, measured on the 4-point ``mem_util_grid``
driver) and twice more while the interpreter shuts down (1.3 s of the 1.5 s between the last
``atexit`` handler and the process's end). ``gc.freeze`` moves the objects alive at that
moment to the permanent generation, which no collection walks:

- ``long_lived`` around what creates the objects the driver keeps for the whole run (its
  imports, the open recorder: MLflow and SQLAlchemy load there): the collector is off in the
  block (an import makes hardly any cyclic garbage, and its full collections were 0.7 of the
  0.9 CPU-s the 4-point driver spent collecting) and what is alive at its end is frozen, so
  later full collections walk only what the points create;
- ``freeze_at_exit``, registered when the driver starts, as the last ``atexit`` handler:
  the shutdown collections find nothing to walk. Everything the driver writes is closed
  explicitly before (results table, MLflow runs, logging's handlers, which ``logging``
  flushes from its own ``atexit`` handler), so no result waits on a finaliser.

The simulator keeps its own policy for a run (``engine.simulate``); this one is for the
processes that record.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager

_registered = False


@contextmanager
def long_lived() -> Iterator[None]:
    """Run the block with the cyclic collector off, then move every object alive to the
    permanent generation (never collected again: use it only where what is alive at the end
    is what the process keeps). The collector is switched back on only if it was on, so a
    block nested in another (or running beside one in another thread) leaves it to the
    outer one."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def freeze_at_exit() -> None:
    """Freeze the heap as late as possible in the interpreter's exit (the first handler
    registered runs last); registered once per process."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
