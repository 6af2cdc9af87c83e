"""Calls that run in the order they were made, per queue: a ticket each, and their
steps run inline (nothing else outstanding) or behind a :class:`Work`.

A queue is an object with ``issued`` (tickets handed out), ``done`` (call ``k`` runs
once ``done == k``) and ``last`` (the latest async Work): a group's shared-memory
segment (:mod:`._shm.segment`) or its hierarchy (:mod:`._hier`). Calls on one queue
run in the same order on every member, so their steps (which share buffers or
sub-communicators) never interleave; calls on other queues progress meanwhile.
"""

from __future__ import annotations

from collections.abc import Generator

from mpi4py import MPI

from clusterkernel.comm._errors import peer_died
from clusterkernel.comm._handle import _ACTIVE, Call, Work, _now, drive, note

_waitall = MPI.Request.Waitall


def issue(q, steps: Generator) -> Generator:
    """Give ``steps`` the queue's next ticket: they run after every earlier call."""
    ticket = q.issued
    q.issued = ticket + 1
    return _in_turn(q, ticket, steps)


def _in_turn(q, ticket: int, steps: Generator) -> Generator:
    try:
        while q.done != ticket:
            yield None  # an earlier call on this queue is still running: poll again
        yield from steps
    finally:
        if q.done == ticket:
            q.done = ticket + 1


def inline(q, first: int, async_op: bool) -> bool:
    """Whether a call whose first ticket is ``first`` can run now, without a Work."""
    return not async_op and q.done == first and not _ACTIVE


def run(q, call: Call, gen: Generator, async_op: bool, first: int) -> Work | None:
    """Run issued steps: inline when :func:`inline`, else behind a Work (kept in
    ``q.last`` when async, so freeing the queue can wait for it)."""
    if inline(q, first, async_op):
        t0 = _now()
        try:
            for reqs in gen:
                if reqs:
                    _waitall(reqs)
        except MPI.Exception as exc:
            raise peer_died(exc, call.name) from None
        note(call, t0, None)
        return None
    work = drive(call, gen, async_op)
    if async_op:
        q.last = work
    return work
