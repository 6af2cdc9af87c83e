"""The ledger of comm calls: each call's flight entry and timing record, by name.

Every comm call leaves two traces: a *flight entry* (a slot of the flight recorder's
preallocated ring, opened as the call starts and marked done when it ends; the hang
report reads it) and a *timing record* (one row of the metrics recorder's
preallocated ring, written when it ends; the dashboard and the Chrome trace read it).
Their layouts are declared once: :data:`~._flight.ENTRY_LAYOUT` and
:data:`clusterkernel.protocol.records.COMM_LAYOUT`. The C fast path (``_fast.c``) is
handed both rings when it is configured and finds where each field goes from them, so
no layout is written out twice.

Calls open entries through their plan (:func:`~._begin.enter`) and close them with
:func:`close` (through :func:`~._handle.note`) or :func:`close_plan` (a blocking
call whose plan holds every field), the only writers of the comm layer's timing
records (besides the C path, which writes the same rows).

Example::

    from clusterkernel.comm import _ledger
    t0 = _ledger.now()
    ...  # one MPI call
    _ledger.close(entry, "all_reduce", 4096, "mpi", comm.size(), t0)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from clusterkernel import metrics
from clusterkernel.comm._flight import ENTRY_LAYOUT, FLIGHT
from clusterkernel.protocol.records import COMM_FIELDS

ENTRY = tuple(name for name, _ in ENTRY_LAYOUT)
# The timing record's layout is the metric record's (protocol/records.py, both sides share it).
RECORD = COMM_FIELDS
if TYPE_CHECKING:
    from clusterkernel.comm._plan import Plan  # _plan imports this module

now = time.perf_counter
REC = metrics.recorder()
# the recorder's ring of timing records (preallocated; the C path writes it too)
RING = REC.ring
code = RING.code  # a name's code in the ring (plans keep their op's and algorithm's)
_done = FLIGHT.done
_write = RING.write
_write_codes = RING.write_codes
# The C extension's writer of a record (``_fast.record_write``), where it is built and
# configured (use_writer, from _fastpath): RING.write_codes done in C. None: Python's.
_c_write: Callable[..., None] | None = None


def use_writer(write: Callable[..., None] | None = None) -> Callable[..., None] | None:
    """Write :func:`close`'s and :func:`close_plan`'s records with ``write``
    (``_fast.record_write``: the ring, then op, nbytes, algorithm, group_size, start,
    duration and wait, names as their codes) or in Python (None); returns the writer
    used until now. Both write the same row (``tests/comm``).

    Example: ``was = use_writer(None)`` (Python's) ... ``use_writer(was)``.
    """
    global _c_write
    was, _c_write = _c_write, write
    return was


def close(
    entry: int | None,
    name: str,
    nbytes: int,
    alg: str,
    gsize: int,
    t0: float,
    wait: float | None = None,
) -> None:
    """A call has ended: mark its flight entry done and write its timing record.

    ``wait=None`` for a blocking call (it waited throughout, so ``wait`` equals the
    duration); an async call passes the seconds spent in ``Work.wait()``.
    """
    if entry is not None:
        _done(entry)
    if REC.enabled:  # Recorder.timing's write, without its call
        dur = now() - t0
        if _c_write is not None:  # as close_plan's, the names given as their codes
            wait = dur if wait is None else wait
            _c_write(RING, code(name), nbytes, code(alg), gsize, t0, dur, wait)
            return
        _write(
            op=name,
            nbytes=nbytes,
            algorithm=alg,
            group_size=gsize,
            start=t0,
            duration=dur,
            wait=dur if wait is None else wait,
        )


def close_plan(plan: Plan, entry: int | None, t0: float) -> None:
    """:func:`close` for a blocking call that ran as ``plan`` says (its name, bytes,
    algorithm and group size): the record is written with the codes the plan keeps, so
    nothing is looked up or made per call (all_reduce's Python path)."""
    if entry is not None:
        _done(entry)
    if REC.enabled:
        dur = now() - t0
        if _c_write is not None:  # op, nbytes, algorithm, group_size, start, duration, wait
            _c_write(RING, plan.op_code, plan.size, plan.alg_code, plan.gsize, t0, dur, dur)
            return
        _write_codes(
            op=plan.op_code,
            nbytes=plan.size,
            algorithm=plan.alg_code,
            group_size=plan.gsize,
            start=t0,
            duration=dur,
            wait=dur,
        )


def abandon(entry: int | None) -> None:
    """Mark a flight entry done without a timing record: the call raised on every
    member before moving data (nobody waits in it), or it was a step of another call
    whose own record covers it."""
    if entry is not None:
        _done(entry)
