"""The ledger of comm calls: each call's flight entry and timing record, by name.

Every comm call leaves two traces: a *flight entry* (a list in the flight
recorder's ring, opened as the call starts and marked done when it ends; the hang
report reads it) and a *timing record* (one tuple in the metrics recorder, written
when it ends; the dashboard and the Chrome trace read it). Their layouts are named
here once: :data:`ENTRY` and :data:`clusterkernel.protocol.records.COMM_FIELDS`. Python reads
and writes them through the index names below; the C fast path (``_fast.c``) is
handed the same names when it is configured and finds its indices from them, so no
layout is written out twice.

Calls open entries with :meth:`FlightRecorder.record
<clusterkernel.comm._flight.FlightRecorder.record>` (or :func:`~._begin.begin`) and
close them with :func:`close`, which is the only writer of the comm layer's timing
records.

Example::

    from clusterkernel.comm import _ledger
    t0 = _ledger.now()
    ...  # one MPI call
    _ledger.close(entry, "all_reduce", 4096, "mpi", comm.size(), t0)
"""

from __future__ import annotations

import time

from clusterkernel import metrics
from clusterkernel.protocol.records import COMM_FIELDS

# A flight entry is a list, so completion flips ``done`` in place without a lookup.
# The caller is kept as code and instruction offset (not the frame, which would keep
# the caller's tensors alive); the line is worked out only when someone reads it.
ENTRY = ("seq", "op", "group", "nbytes", "dtype", "peer", "code", "lasti", "done")
SEQ, OP, GROUP, NBYTES, DTYPE, PEER, CODE, LASTI, DONE = range(len(ENTRY))
# The timing record's layout is the metric record's (protocol/records.py, both sides share it).
RECORD = COMM_FIELDS

now = time.perf_counter
REC = metrics.recorder()


def close(
    entry: list | None,
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
        entry[DONE] = True
    rec = REC
    if rec.enabled:
        dur = now() - t0
        rec.timing(name, nbytes, t0, dur, dur if wait is None else wait, alg, gsize)


def abandon(entry: list | None) -> None:
    """Mark a flight entry done without a timing record: the call raised on every
    member before moving data (nobody waits in it), or it was a step of another call
    whose own record covers it."""
    if entry is not None:
        entry[DONE] = True
