"""The driver's collector policy: what it freezes, and that it leaves the collector as found."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

from sweep.gc_policy import long_lived


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


def test_long_lived_switches_back_on_after_an_error(clean_gc):
    gc.enable()
    with pytest.raises(RuntimeError), long_lived():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_freeze_at_exit_freezes_after_the_other_exit_handlers():
    # A handler registered before freeze_at_exit runs after it (atexit is last in, first
    # out): it sees the heap frozen, and a handler registered after it ran first, unfrozen.
    code = textwrap.dedent("""
        import atexit, gc
        atexit.register(lambda: print("last", gc.get_freeze_count() > 0))
        from sweep.gc_policy import freeze_at_exit
        freeze_at_exit()
        freeze_at_exit()  # registered once
        atexit.register(lambda: print("first", gc.get_freeze_count() > 0))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["first", "False", "last", "True"]
