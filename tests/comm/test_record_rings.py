"""The comm records' preallocated rings on their own, in one process (no mpiexec): the
timing ring (metrics._ring.CommRing) and the flight ring (comm._flight.FlightRecorder)."""

from __future__ import annotations

import sys
import threading

from clusterkernel.metrics._ring import CommRing


def test_timing_ring_keeps_every_record_of_two_writing_threads():
    # A DDP hook's future (a torch thread) and the main thread both write the ring:
    # the GIL may pass between any two calls of a write, and no record may be lost.
    n, ring = 20000, CommRing(capacity=40000)
    go = threading.Barrier(2)

    def writer(who: int) -> None:
        go.wait()
        for i in range(n):
            ring.write("all_reduce", who * n + i, "mpi", 2, 0.0, 0.0, 0.0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as the interpreter can
    try:
        threads = [threading.Thread(target=writer, args=(w,)) for w in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert ring.total() == 2 * n
    assert sorted(row[1] for row in ring.rows(0, ring.total())) == list(range(2 * n))


def test_timing_ring_bad_value_records_nothing():
    ring = CommRing(capacity=4)
    ring.write("all_reduce", 8, "mpi", 2, 1.0, 1e-6, 1e-6)
    try:
        ring.write("all_reduce", 8.5, "mpi", 2, 1.0, 1e-6, 1e-6)  # bytes as a float
    except Exception:
        pass
    assert ring.total() == 1
    assert ring.rows(0, 4) == [("all_reduce", 8, "mpi", 2, 1.0, 1e-6, 1e-6)]


def test_flight_late_close_after_a_resize_leaves_the_newer_call():
    from clusterkernel.comm._flight import FlightRecorder
    from clusterkernel.comm._groups import WORLD

    fr = FlightRecorder(size=4)
    for _ in range(3):
        fr.done(fr.record(WORLD, "barrier", 0, None))
    late = fr.record(WORLD, "all_reduce", 8, None)  # an async call, still open
    fr.resize(4)
    newer = [fr.record(WORLD, "broadcast", 8, None) for _ in range(late + 1)]
    fr.done(late)  # its wait() comes now: the resize forgot it
    assert [e["done"] for e in fr.snapshot()] == [False] * min(len(newer), 4)


def test_flight_call_noted_while_a_call_is_being_noted_keeps_both():
    # Writing a slot lets its old objects go, which may run Python code (a finalizer;
    # another thread, given the GIL then) that notes a call of its own.
    from clusterkernel.comm._flight import FlightRecorder
    from clusterkernel.comm._groups import WORLD

    fr = FlightRecorder(size=4)

    class NotesOnDel:
        def __del__(self):
            fr.record(WORLD, "barrier", 0, None)

    fr.record(WORLD, "all_reduce", 8, NotesOnDel())  # its dtype: let go when written over
    for _ in range(3):
        fr.record(WORLD, "broadcast", 8, None)
    fr.record(WORLD, "all_gather", 8, None)  # over the first slot: the finalizer runs
    ops = [e["op"] for e in fr.snapshot()]
    assert ops == ["broadcast", "broadcast", "all_gather", "barrier"], ops


def test_timing_ring_is_not_shared_with_a_forked_process():
    # A DataLoader worker is forked from the rank: what it records is its own.
    import os

    ring = CommRing(capacity=4)
    ring.write("all_reduce", 8, "mpi", 2, 1.0, 1e-6, 1e-6)
    pid = os.fork()
    if pid == 0:  # the child: writes over the ring, then leaves without cleanup
        for _ in range(4):
            ring.write("broadcast", 99, "mpi", 2, 2.0, 1e-6, 1e-6)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert ring.total() == 1
    assert ring.rows(0, 4) == [("all_reduce", 8, "mpi", 2, 1.0, 1e-6, 1e-6)]


def test_the_c_writers_write_what_the_python_writers_write():
    # Where the extension is built, the Python path writes both rings through the C
    # path's writers (_fastpath.writers); forced off, through the Python ones: the
    # same bytes and objects either way.
    import pytest

    from clusterkernel.comm import _fast, _fastpath, _flight, _ledger
    from clusterkernel.comm._flight import FlightRecorder
    from clusterkernel.comm._groups import WORLD

    if not _fastpath.available():
        pytest.skip("the C extension is not built here")

    def note(fr, op, nbytes, dtype, peer):  # one call site: the same code and offset
        return fr.record(WORLD, op, nbytes, dtype, peer, depth=1)

    calls = [("all_reduce", 64, "f32", None), ("send", 8, None, 1), ("recv", 0, "i8", -1)]
    ring, vals = _ledger.RING, (ring_code := _ledger.code("all_reduce"), 64, 0, 2, 1.5, 2e-6, 3e-6)
    rows, flights = {}, {}
    was = _fastpath.writers(True)
    try:
        for on in (True, False):
            _fastpath.writers(on)
            assert (_flight._c_write, _ledger._c_write) == (
                (_fast.flight_write, _fast.record_write) if on else (None, None)
            )
            fr, calls_before = FlightRecorder(size=4), WORLD._calls
            entries = [note(fr, *call) for call in calls * 2]  # laps the ring of 4
            fr.done(entries[-2])
            WORLD._calls = calls_before  # the same sequence numbers both times
            flights[on] = (entries, bytes(fr.ints), fr.objs, fr.snapshot())
            n = ring.total()
            (_fast.record_write if on else lambda r, *v: r.write_codes(*v))(ring, *vals)
            at = ring.header + (n % ring.capacity) * ring.row_size
            rows[on] = (ring.total() - n, ring.mem[at : at + ring.row_size])
    finally:
        _fastpath.writers(was)
    assert flights[True] == flights[False]
    assert flights[True][0] == list(range(6)) and flights[True][3][-2]["done"]
    assert rows[True] == rows[False] == (1, rows[False][1])
    assert ring.rows(ring.total() - 1, ring.total())[0][:2] == ("all_reduce", 64)
    assert ring_code == ring.code("all_reduce")
    # a bad value is refused before anything is written (as the Python writers do)
    n = ring.total()
    with pytest.raises(TypeError):
        _fast.record_write(ring, ring_code, 8.5, 0, 2, 1.0, 1e-6, 1e-6)
    with pytest.raises(ValueError, match="configured ring"):
        _fast.record_write(CommRing(capacity=4), ring_code, 8, 0, 2, 1.0, 1e-6, 1e-6)
    assert ring.total() == n
