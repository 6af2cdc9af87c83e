"""all_reduce's C fast path: taken for the common case, the same results, flight
entries and timing records as the Python path, and the Python path for the rest."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import torch
from _helpers import INTS, RANK, SIZE, WORLD, agree, as_ref, close, data, reduce_ref

from clusterkernel import comm, metrics
from clusterkernel.comm import _fastpath

FAST_DTYPES = [torch.float32, torch.float64, *INTS, torch.bool]


@pytest.fixture(autouse=True)
def _fast_on():
    if not _fastpath.available():
        # Built by every install with a C compiler; this machine has one.
        agree(not sys.platform.startswith("linux"), "the C fast path is not built")
        pytest.skip("no C fast path on this platform")
    was = _fastpath.enable(True)
    yield
    _fastpath.enable(was)


def _hits_of(fn) -> int:
    before = _fastpath.hits()
    fn()
    return _fastpath.hits() - before


def _reduce_both_ways(seed: int, count: int, dtype: torch.dtype) -> tuple[bool, str]:
    """The same SUM on the Python path and on the fast path: both match numpy.

    ``algorithm="mpi"``: the fast path runs MPI's own allreduce, and the default picks it
    only below the machine's measured crossover (a few KB at 4 ranks here, see the
    shipped table); explicit, every count takes it."""
    want = reduce_ref(
        comm.SUM, [as_ref(data(seed, r, (count,), dtype)) for r in range(SIZE)], dtype
    )
    results = {}
    for fast in (False, True):
        _fastpath.enable(fast)
        comm.all_reduce(data(seed, RANK, (count,), dtype), algorithm="mpi")  # agrees first
        t = data(seed, RANK, (count,), dtype)
        hits = _hits_of(lambda t=t: comm.all_reduce(t, algorithm="mpi"))
        results[fast] = (close(t, want, dtype), hits)
    ok = results == {False: (True, 0), True: (True, 1)}
    return ok, f"{dtype} x{count}: {results}"


@pytest.mark.parametrize("dtype", FAST_DTYPES, ids=str)
def test_every_fast_dtype_matches_numpy_on_both_paths(dtype):
    for seed, count in enumerate((1, 7, 1000, 30_000)):
        ok, what = _reduce_both_ways(seed, count, dtype)
        agree(ok, what)


def test_flight_entry_and_timing_record_are_the_python_paths():
    t = torch.ones(300)
    comm.all_reduce(t)  # agree the signature
    got = {}
    for fast in (False, True):
        _fastpath.enable(fast)
        store = metrics.recorder().comm
        before = time.perf_counter()
        line = sys._getframe().f_lineno + 1
        hits = _hits_of(lambda: comm.all_reduce(t))
        after = time.perf_counter()
        entry = comm.flight()[-1]
        rec = store[-1]
        got[fast] = (
            {k: v for k, v in entry.items() if k not in ("seq", "line")},
            entry["line"] == line,
            rec[:4],
            before <= rec[4] <= after and 0 < rec[5] == rec[6] <= after - before,
            hits,
            entry["seq"],
        )
    (py, fast) = got[False], got[True]
    ok = py[:4] == fast[:4] and py[1] and py[3] and (py[4], fast[4]) == (0, 1)
    ok = ok and fast[5] == py[5] + 1  # one sequence, whichever path took the call
    agree(ok, repr(got))


def test_the_rest_takes_the_python_path():
    # Every case runs once first (its plan is made in Python on a new key), then is
    # counted: what the plan says, not a first call, decides the path.
    t = torch.ones(64)
    pair = comm.new_group(list(range(SIZE)))
    cases = {
        "common case": lambda: comm.all_reduce(t),
        "op MAX": lambda: comm.all_reduce(t, op=comm.MAX),
        "group given": lambda: comm.all_reduce(t, group=pair),
        "MPI asked for": lambda: comm.all_reduce(t, algorithm="mpi"),
        "half": lambda: comm.all_reduce(torch.ones(64, dtype=torch.float16)),
        "non-contiguous": lambda: comm.all_reduce(torch.ones(8, 16).t()),
        "op AVG": lambda: comm.all_reduce(t, op=comm.AVG),
        "op given as text": lambda: comm.all_reduce(t, op="sum"),
        "async": lambda: comm.all_reduce(t, async_op=True).wait(),
        "algorithm ring": lambda: comm.all_reduce(t, algorithm="ring"),
        "over the size limit": lambda: comm.all_reduce(torch.zeros(1 << 20)),
    }
    for fn in cases.values():
        fn()
    hits = {name: _hits_of(fn) for name, fn in cases.items()}
    # a signature not agreed yet: begin() exchanges it (a second call is fast)
    hits["new signature"] = _hits_of(lambda: comm.all_reduce(torch.ones(65)))
    comm.set_check("every")
    try:
        hits["check mode every"] = _hits_of(lambda: comm.all_reduce(t))
    finally:
        comm.set_check("new")
    comm.force_staging(True)
    try:
        hits["staging forced"] = _hits_of(lambda: comm.all_reduce(t))
    finally:
        comm.force_staging(False)
    _fastpath.enable(False)
    hits["turned off"] = _hits_of(lambda: comm.all_reduce(t))
    served = ("common case", "op MAX", "group given", "MPI asked for")
    if SIZE == 1:
        served += ("op AVG",)  # divides by 1: nothing to do after MPI
    want = {name: 0 for name in hits} | dict.fromkeys(served, 1)
    comm.destroy_group(pair)
    agree(hits == want, repr(hits))


def test_a_call_from_clusterkernel_names_the_users_line():
    # A training mode's call: its caller's frame is clusterkernel's, so the fast path
    # leaves it to the Python path, which walks out to the user's line.
    from clusterkernel.comm._flight import OURS

    ns = {"comm": comm}
    source = "def reduce_for_user(t):\n    comm.all_reduce(t)\n"
    exec(compile(source, sorted(OURS)[0], "exec"), ns)  # a function "in" clusterkernel
    t = torch.ones(4)
    comm.all_reduce(t)
    line = sys._getframe().f_lineno + 1
    hits = _hits_of(lambda: ns["reduce_for_user"](t))
    entry = comm.flight()[-1]
    ok = entry["file"] == __file__ and entry["line"] == line and hits == 0
    agree(ok and _hits_of(lambda: comm.all_reduce(t)) == 1, f"{entry} {hits}")


def test_the_gil_is_free_while_a_rank_waits_in_the_call():
    if SIZE < 2:
        pytest.skip("needs two ranks")
    t = torch.ones(16)
    comm.all_reduce(t)
    # Rank 0 waits in the call until its thread, which needs the GIL for each stamp, has
    # stamped TICKS times inside it: only then does the last rank join (the file
    # `ticked`). Holding the GIL in MPI would stop the thread for the whole wait, and the
    # last rank would join at its one-minute cap with too few stamps.
    ticked = WORLD.bcast(tempfile.mkdtemp(prefix="ck-gil-") if RANK == 0 else None)
    ticked = os.path.join(ticked, "ticked")
    stamps: list[float] = []
    stop = threading.Event()
    enter = [float("inf")]

    def tick() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())
            if sum(s > enter[0] for s in stamps) == TICKS:
                open(ticked, "w").close()
            time.sleep(0.005)

    inside = None
    if RANK == 0:
        th = threading.Thread(target=tick, daemon=True)
        th.start()
        enter[0] = time.perf_counter()
        hits = _hits_of(lambda: comm.all_reduce(t))
        leave = time.perf_counter()
        stop.set()
        th.join()
        inside = sum(enter[0] < s < leave for s in stamps)
    else:
        if RANK == SIZE - 1:
            for _ in range(12000):  # at most a minute: a failure, not a measure
                if os.path.exists(ticked):
                    break
                time.sleep(0.005)
        hits = _hits_of(lambda: comm.all_reduce(t))
    WORLD.Barrier()
    if RANK == 0:
        shutil.rmtree(os.path.dirname(ticked))
    agree(hits == 1 and (inside is None or inside >= TICKS), f"{hits} {inside}")


TICKS = 10


def test_the_common_case_spelled_out_is_still_fast():
    t = torch.ones(32)
    comm.all_reduce(t)
    spellings = {
        "positional": lambda: comm.all_reduce(t, comm.SUM, None, False, "auto"),
        "keywords": lambda: comm.all_reduce(
            t, op=comm.SUM, group=None, async_op=False, algorithm="auto"
        ),
        "some of each": lambda: comm.all_reduce(t, comm.SUM, algorithm="auto"),
        "world given": lambda: comm.all_reduce(t, comm.SUM, comm.WORLD),
    }
    hits = {name: _hits_of(fn) for name, fn in spellings.items()}
    agree(hits == dict.fromkeys(spellings, 1), repr(hits))


def test_a_wrong_argument_gets_the_python_paths_error():
    import inspect

    from clusterkernel.comm import _reductions

    t = torch.ones(4)
    comm.all_reduce(t)
    for bad in (np.ones(4, dtype=np.float32), [1.0, 2.0], None):
        with pytest.raises(TypeError):
            comm.all_reduce(bad)
    with pytest.raises(TypeError, match="unexpected keyword"):
        comm.all_reduce(t, opp=comm.SUM)
    with pytest.raises(TypeError, match="positional"):
        comm.all_reduce(t, comm.SUM, None, False, "auto", "extra")
    with pytest.raises(TypeError, match="multiple values"):
        comm.all_reduce(t, comm.SUM, op=comm.SUM)
    # what help() and IDEs read is the Python function's
    python_fn = comm.all_reduce.__wrapped__
    same = inspect.signature(comm.all_reduce) == inspect.signature(python_fn)
    same = same and comm.all_reduce.__doc__ == python_fn.__doc__
    # sent to engines by reference, as functions are (ipyparallel's apply)
    same = same and pickle.loads(pickle.dumps(comm.all_reduce)) is comm.all_reduce
    agree(same and _reductions.all_reduce is comm.all_reduce, repr(comm.all_reduce))


def test_a_late_close_never_marks_a_newer_call():
    # The ring's slots are reused in place: an entry closed after the ring came round
    # (an async Work waited on late) must leave the newer, still open call in its slot.
    from clusterkernel.comm import _ledger
    from clusterkernel.comm._flight import FLIGHT

    late = FLIGHT.record(comm.WORLD, "late", 8, None, -1)  # -1: no collective number
    newer = [FLIGHT.record(comm.WORLD, "newer", 8, None, -1) for _ in range(FLIGHT.size)]
    _ledger.abandon(late)
    open_now = [(e["op"], e["done"]) for e in comm.flight()]
    for entry in newer:
        _ledger.abandon(entry)
    t = torch.ones(8)
    comm.all_reduce(t)
    hits = _hits_of(lambda: comm.all_reduce(t))
    ok = open_now == [("newer", False)] * FLIGHT.size and all(e["done"] for e in comm.flight())
    agree(ok and hits == 1, f"{open_now[:2]} {hits}")


def test_records_allocate_nothing_on_the_fast_path():
    # Issue 37 item 4: the flight entry and the timing record are written in place into
    # preallocated rings. Measured with tracemalloc's count of live Python blocks over
    # many calls: a record kept per call would grow it by thousands.
    import tracemalloc

    t = torch.ones(16)
    comm.all_reduce(t)
    comm.all_reduce(t)
    calls = 5000
    tracemalloc.start()
    try:
        before = len(tracemalloc.take_snapshot().traces)
        hits = _hits_of(lambda: [comm.all_reduce(t) for _ in range(calls)])
        grown = len(tracemalloc.take_snapshot().traces) - before
    finally:
        tracemalloc.stop()
    rec = metrics.recorder().comm[-1]
    agree(hits == calls and grown < 50 and rec[0] == "all_reduce", f"{hits} {grown} {rec}")


def test_a_plan_follows_the_groups_auto_rules():
    # tune() replaces a group's rules and forgets its plans: the next call plans again
    # (here "ring" for this size, which the C path does not run).
    from clusterkernel.comm import _plan
    from clusterkernel.comm._groups import WORLD

    t = torch.ones(16)
    comm.all_reduce(t)
    rules = WORLD._auto
    kept = rules["all_reduce"]
    rules["all_reduce"] = ([1e9], ("ring", "mpi"))  # limits may be floats: bisect in Python
    _plan.forget(WORLD)
    try:
        t = torch.ones(16)
        comm.all_reduce(t)
        hits = _hits_of(lambda: comm.all_reduce(t))
        alg = WORLD._plans[(torch.float32, 16, comm.SUM, "auto", True)].alg
    finally:
        rules["all_reduce"] = kept
        _plan.forget(WORLD)
    agree(hits == 0 and alg == "ring" and bool((t == SIZE**2).all()), f"{hits} {alg} {t[:2]}")


def test_a_tensor_resized_in_place_takes_its_new_sizes_plan():
    # The C path remembers plans by their key's parts (issue 37 item 4): a tensor
    # resized between calls is reduced, and recorded, at its new size.
    t = torch.ones(16)
    comm.all_reduce(t)
    comm.all_reduce(t)
    t.resize_(4)
    comm.all_reduce(t.fill_(1.0))
    hits = _hits_of(lambda: comm.all_reduce(t.fill_(1.0)))
    rec = metrics.recorder().comm[-1]
    agree(hits == 1 and rec[1] == 16 and bool((t == SIZE).all()), f"{hits} {rec} {t}")


def test_a_cleared_plan_cache_is_not_run_from_the_c_paths_memory():
    # A plan the C path remembers leaves the group's cache when it fills up: the next
    # call plans again in Python, the one after runs the new plan in C.
    from clusterkernel.comm import _plan
    from clusterkernel.comm._groups import WORLD

    t = torch.ones(16)
    comm.all_reduce(t)
    comm.all_reduce(t)
    key = (torch.float32, 16, comm.SUM, "auto", True)
    old = WORLD._plans[key]
    kept = _plan.MAX_PLANS
    _plan.MAX_PLANS = len(WORLD._plans)  # the next new plan clears the cache
    try:
        comm.all_reduce(torch.ones(7919))
    finally:
        _plan.MAX_PLANS = kept
    first = _hits_of(lambda: comm.all_reduce(t))
    second = _hits_of(lambda: comm.all_reduce(t))
    new = WORLD._plans.get(key)
    agree(
        first == 0 and second == 1 and new is not None and new is not old and old.fast is None,
        f"{first} {second} {new} {old.fast}",
    )


def test_an_error_reading_the_dtype_is_not_swallowed():
    class RaisesOnce:  # e.g. a KeyboardInterrupt landing in a property
        calls = 0

        @property
        def dtype(self):
            RaisesOnce.calls += 1
            if RaisesOnce.calls == 1:
                raise RuntimeError("raised once")
            return torch.float32

    with pytest.raises(RuntimeError, match="raised once"):
        comm.all_reduce(RaisesOnce())
    agree(True)


def test_mpi_is_found_through_mpi4py_whatever_its_library_is_named():
    # dlsym on mpi4py's module searches the MPI library it links, by any name
    found = _fastpath._libmpi_symbol("MPI_Allreduce")
    agree(found != 0 and _fastpath._libmpi_symbol("MPI_No_such_call") == 0, hex(found))


def test_a_thread_recording_beside_the_fast_path_loses_no_record():
    # A DDP hook's future writes timing records from a torch thread while this thread's
    # all_reduces write theirs in C: a write the other came in on was lost before.
    t = torch.ones(16)
    comm.all_reduce(t)
    rec = metrics.recorder()
    before = rec.total("comm")
    stop, written = threading.Event(), []

    def hook_records() -> None:
        n = 0
        while not stop.is_set():
            rec.timing("hook", 8, 0.0, 0.0, 0.0)
            n += 1
        written.append(n)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as the interpreter can
    try:
        th = threading.Thread(target=hook_records)
        th.start()
        hits = _hits_of(lambda: [comm.all_reduce(t) for _ in range(200)])
        stop.set()
        th.join()
    finally:
        sys.setswitchinterval(old)
    got = rec.total("comm") - before
    agree(hits == 200 and got == 200 + written[0], f"{hits} {got} {written}")


def test_the_python_path_writes_the_same_records_through_the_c_writers():
    # The Python path (the C path off: async calls, DataParallel's hooks) writes both
    # rings through the C path's writers where the extension is built; forced back to
    # its Python writers it leaves the same flight entries and timing records.
    t = torch.ones(300)
    store = metrics.recorder().comm
    got = {}
    _fastpath.enable(False)
    try:
        for on in (True, False):
            was = _fastpath.writers(on)
            try:
                comm.all_reduce(t)
                comm.all_reduce(t, op=comm.AVG, async_op=True).wait()
                comm.barrier()
            finally:
                _fastpath.writers(was)
            entries = [{k: v for k, v in e.items() if k != "seq"} for e in comm.flight()[-3:]]
            records = [(r[:4], 0 < r[5] and 0 <= r[6] <= r[5]) for r in store[-3:]]
            got[on] = (entries, records, [e["seq"] for e in comm.flight()[-3:]])
    finally:
        _fastpath.enable(True)
    on, off = got[True], got[False]
    ok = on[:2] == off[:2] and all(e["done"] for e in on[0])
    ok = ok and [s + 3 for s in on[2]] == off[2]  # one sequence across both
    agree(ok, repr(got))
