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
