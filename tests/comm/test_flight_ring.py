"""The flight recorder's ring in C behaves as the deque(maxlen) it stands in for."""

from __future__ import annotations

import sys
from collections import deque

import pytest

fast = pytest.importorskip("clusterkernel.comm._fast")
if not hasattr(fast, "FlightRing"):
    pytest.skip("the fast path needs Python 3.11", allow_module_level=True)


@pytest.mark.parametrize("maxlen", [1, 3, 64])
def test_appends_iteration_length_and_clear_match_a_deque(maxlen):
    ring, want = fast.FlightRing(maxlen=maxlen), deque(maxlen=maxlen)
    for i in range(3 * maxlen + 2):
        item = [i]
        ring.append(item)
        want.append(item)
        assert list(ring) == list(want) and len(ring) == len(want)
        assert all(a is b for a, b in zip(ring, want))
    assert ring.maxlen == maxlen
    ring.clear()
    assert list(ring) == [] and len(ring) == 0
    ring.append("again")
    assert list(ring) == ["again"]


def test_dropped_entries_are_released_and_iteration_is_a_copy():
    ring = fast.FlightRing(maxlen=2)
    first = object()
    ring.append(first)
    held = sys.getrefcount(first)
    it = iter(ring)
    ring.append(1)
    ring.append(2)  # drops `first` from the ring
    assert list(it) == [first]  # the iterator kept its own copy
    del it
    assert sys.getrefcount(first) == held - 1


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        fast.FlightRing(maxlen=0)
    with pytest.raises(TypeError):
        fast.FlightRing()


GROWS_WHILE_COPIED = """
import gc
from clusterkernel.comm._fast import FlightRing

ring = FlightRing(maxlen=10000)
ring.append([0])

class AppendsWhenCollected:
    def __del__(self):
        for i in range(5000):
            ring.append((i,))

def make_cycle():
    c = AppendsWhenCollected()
    c.self = c

make_cycle()
keep = [[] for _ in range(200)]  # enough allocations that the next one collects
gc.set_threshold(1)
copy = list(iter(ring))
gc.set_threshold(700)
junk = [[] for _ in range(20000)]  # heap damage, if any, shows by now
assert all(item is not None for item in copy), "holes"
assert copy == list(ring)[: len(copy)] and len(copy) in (1, 5001), len(copy)
print("whole", len(copy))
"""


def test_a_copy_stays_whole_when_the_ring_grows_while_it_is_made():
    # Making the copy's list may run the garbage collector, and a finalizer may
    # append meanwhile (another thread may too): the copy must never be written past
    # its end (which crashed the process) or keep holes. In a child process, so a
    # crash fails this test only.
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", GROWS_WHILE_COPIED], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "whole" in out.stdout, (out.returncode, out.stderr[-2000:])
