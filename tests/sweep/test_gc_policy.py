"""The driver's collector policy: what it freezes, and that it leaves the collector as found."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest

import sweep.gc_policy as gc_policy
from sweep.gc_policy import launch_ended, long_lived


@pytest.fixture
def clean_gc():
    was_enabled = gc.isenabled()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


def test_long_lived_freezes_what_the_block_made_and_switches_the_collector_back_on(clean_gc):
    gc.enable()
    kept = None
    with long_lived():
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]  # objects the process keeps
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)
    walked = {id(obj) for obj in gc.get_objects()}  # the generations a collection walks
    assert not any(id(obj) in walked for obj in kept)


def test_long_lived_leaves_a_disabled_collector_disabled(clean_gc):
    gc.disable()
    with long_lived(), long_lived():
        pass
    assert not gc.isenabled()


def test_long_lived_switches_back_on_after_an_error_and_freezes_nothing(clean_gc):
    gc.enable()
    with pytest.raises(RuntimeError), long_lived():
        made = [[i] for i in range(100)]
        raise RuntimeError("boom")
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0  # neither the block's objects nor the traceback
    del made


def test_blocks_in_two_threads_keep_the_collector_off_until_the_last_ends(clean_gc):
    gc.enable()
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with long_lived():
            entered.set()
            release.wait(5)

    t = threading.Thread(target=other)
    with long_lived():
        t.start()
        assert entered.wait(5)
    assert not gc.isenabled()  # the other thread's block still runs
    release.set()
    t.join(5)
    assert gc.isenabled()


class _Node:
    pass


def test_garbage_of_an_ended_launch_is_collected_not_frozen(clean_gc, monkeypatch):
    monkeypatch.setattr(gc_policy, "_launch_ended", False)
    gc.disable()  # keep the cycle uncollected until the policy acts

    def cycle() -> weakref.ref:
        a, b = _Node(), _Node()
        a.b, b.a = b, a
        return weakref.ref(a)

    kept = cycle()
    with long_lived():
        pass
    assert kept() is not None  # without launch_ended the garbage is frozen with the rest
    gc.unfreeze()
    dropped = cycle()
    launch_ended()
    with long_lived():
        pass
    assert dropped() is None and not gc_policy._launch_ended


def test_an_ended_launchs_frozen_objects_are_collected_too(clean_gc, monkeypatch):
    """What a launch kept while it ran (its open recorder, frozen at the end of
    ``SweepRecorder.start``'s block) is cyclic garbage once it ends: the next launch's
    block frees it rather than keeping it in the permanent generation."""
    monkeypatch.setattr(gc_policy, "_launch_ended", False)
    gc.disable()
    holder = []
    with long_lived():
        holder.append(_Node())
        holder[0].self = holder[0]  # a cycle kept while the launch runs: frozen with it
        recorder = weakref.ref(holder[0])
    holder.clear()  # the launch ends; its recorder is garbage now, and frozen
    launch_ended()
    with long_lived():
        pass
    assert recorder() is None


def test_freeze_at_exit_freezes_after_the_handlers_registered_later():
    # atexit runs last in, first out: a handler registered after freeze_at_exit runs
    # before it (heap not yet frozen), one registered before it runs after (frozen).
    code = textwrap.dedent("""
        import atexit, gc
        atexit.register(lambda: print("last", gc.get_freeze_count() > 0))
        from sweep.gc_policy import freeze_at_exit
        before = atexit._ncallbacks()
        freeze_at_exit()
        freeze_at_exit()
        print("registered", atexit._ncallbacks() - before)
        atexit.register(lambda: print("first", gc.get_freeze_count() > 0))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["registered", "1", "first", "False", "last", "True"]
