"""Running a call: the async :class:`Work` handle, the sync path, and the timing record.

Every call is described by a :class:`Call` and ends in :func:`run` (one MPI call,
blocking or nonblocking) or :func:`drive` (a multi-step algorithm written as a
generator, such as the ring). Both close the call in the ledger through :func:`note`
(:func:`~clusterkernel.comm._ledger.close`: the call's flight entry marked done, its
timing record written).

A step generator yields a list of MPI requests to wait for, or ``None`` to be
polled again later (e.g. a probe found nothing yet), and returns the call's result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from mpi4py import MPI

from clusterkernel.comm._errors import peer_died
from clusterkernel.comm._ledger import abandon, close

_now = time.perf_counter
_waitall = MPI.Request.Waitall
_testall = MPI.Request.Testall

# Generator-driven works not yet complete. A rank blocked in one of them keeps the
# others stepping, so two outstanding ring calls waited in different orders on
# different ranks cannot deadlock.
_ACTIVE: set[Work] = set()


class Call(NamedTuple):
    """One communication call: its timing record's fields and its flight entry."""

    name: str
    nbytes: int
    alg: str
    gsize: int
    entry: int | None = None  # the flight recorder's entry (None when it is off)
    record: bool = True  # False: a step of another call (hier), timed as part of it


def note(call: Call, t0: float, wait: float | None) -> None:
    """Close a finished call in the ledger; ``wait=None``: a sync call (blocked throughout)."""
    name, nbytes, alg, gsize, entry, record = call
    if record:
        close(entry, name, nbytes, alg, gsize, t0, wait)
    else:  # a step of another call: that call writes the record
        abandon(entry)


class Work:
    """Handle of a call made with ``async_op=True``, as in ``torch.distributed``.

    ``wait()`` blocks until the call is done (and runs its post-processing: AVG
    division, copying staged or non-contiguous results back); ``is_completed()``
    checks without blocking. Many may be outstanding at once.

    Example::

        a, b = torch.ones(4), torch.ones(1000)
        w1 = comm.all_reduce(a, async_op=True)
        w2 = comm.all_reduce(b, async_op=True)   # both in flight
        w1.wait(); w2.wait()
    """

    __slots__ = (
        "_reqs",
        "_steps",
        "_finish",
        "_keep",
        "_info",
        "_t0",
        "_waited",
        "_wait_from",
        "_done",
        "_error",
        "_result",
        "_sync",
        "_statuses",
    )

    def __init__(
        self,
        reqs: list | None,
        info: Call,
        t0: float,
        finish: Callable[[], Any] | None = None,
        steps: Generator | None = None,
        keep: object = None,
        sync: bool = False,
        statuses: list | None = None,
    ):
        self._reqs = reqs or []
        self._steps = steps
        self._finish = finish
        self._keep = keep  # buffers MPI is still reading or writing
        self._info = info
        self._t0 = t0
        self._waited = 0.0
        self._wait_from: float | None = None  # when the wait() now blocking began
        self._done = False
        self._error: BaseException | None = None
        self._result: Any = None
        self._sync = sync
        self._statuses = statuses  # filled by MPI for receives (source, count)
        if steps is not None:
            _ACTIVE.add(self)
            self._step(block=False)

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<Work {self._info[0]} {self._info[1]} bytes {state}>"

    def is_completed(self) -> bool:
        """True once the call has finished (advances multi-step calls without blocking)."""
        if not self._done:
            self._step(block=False)
        if self._error is not None:
            raise self._error
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; re-raises the call's error. Returns True (as torch does).

        With ``timeout`` (seconds), raises ``TimeoutError`` if not done by then; the
        call stays pending and can be waited on again.
        """
        if timeout is None:
            self._block()
        elif not self._done:
            self._wait_from = t = _now()
            try:
                deadline = t + timeout
                while not self._step(block=False):
                    if _now() > deadline:
                        raise TimeoutError(
                            f"{self._info[0]} not completed within {timeout} s; still "
                            "pending: are all ranks of the group calling it?"
                        )
            finally:
                self._waited += _now() - t
                self._wait_from = None
        if self._error is not None:
            raise self._error
        return True

    def _block(self) -> None:
        """Block until done, the time counted as waited; an error stays for ``wait()``."""
        if self._done:
            return
        self._wait_from = t = _now()
        try:
            self._step(block=True)
        finally:
            self._waited += _now() - t
            self._wait_from = None

    def result(self) -> Any:
        """Wait, then return the call's result (the received object, the sender rank...)."""
        self.wait()
        return self._result

    def _block_on(self, reqs: list) -> None:
        if not _ACTIVE or (len(_ACTIVE) == 1 and self in _ACTIVE):
            _waitall(reqs, self._statuses)
            return
        while not _testall(reqs, self._statuses):
            self._poll_others()

    def _poll_others(self) -> None:
        for other in tuple(_ACTIVE):
            if other is not self and not other._done:
                other._step(block=False)

    def _step(self, block: bool) -> bool:
        if self._done:
            return True
        try:
            while True:
                reqs = self._reqs
                if reqs:
                    if block:
                        self._block_on(reqs)
                    elif not _testall(reqs, self._statuses):
                        return False
                    self._reqs = []
                if self._steps is None:
                    if self._finish is not None:
                        self._result = self._finish()
                    break
                try:
                    nxt = self._steps.send(None)
                except StopIteration as stop:
                    self._result = stop.value
                    break
                if nxt is None:
                    if not block:
                        return False
                    self._poll_others()
                self._reqs = nxt or []
        except MPI.Exception as exc:
            self._error = _clear_mpi_error(self._info[0], exc, self._statuses)
        except BaseException as exc:
            self._error = exc
        self._complete()
        return True

    def _complete(self) -> None:
        self._done = True
        self._keep = None
        _ACTIVE.discard(self)
        waited = self._waited
        if self._wait_from is not None:  # done inside a wait(): its time so far counts
            waited += _now() - self._wait_from
        note(self._info, self._t0, None if self._sync else waited)


def _clear_mpi_error(name: str, exc: MPI.Exception, statuses: list | None) -> BaseException:
    codes = {exc.Get_error_class()}
    if MPI.ERR_IN_STATUS in codes and statuses:
        codes.update(MPI.Get_error_class(s.Get_error()) for s in statuses)
    if MPI.ERR_TRUNCATE in codes:
        return ValueError(
            f"{name}: the incoming message is larger than the receive tensor; receive "
            "into a tensor with the sender's shape and dtype"
        )
    return peer_died(exc, name)


def run(
    call: Call,
    blocking: Callable,
    nonblocking: Callable,
    args: tuple,
    *,
    finish: Callable[[], Any] | None = None,
    async_op: bool = False,
    keep: object = None,
    statuses: list | None = None,
) -> Any:
    """One MPI call: ``blocking(*args)`` now, or ``nonblocking(*args)`` behind a Work.

    ``keep`` holds the tensors behind raw buffers in ``args`` alive until an async
    call completes (a raw address does not keep its tensor alive).
    """
    t0 = _now()
    if async_op:
        req = nonblocking(*args)
        return Work([req], call, t0, finish, keep=(args, keep), statuses=statuses)
    try:
        blocking(*args)
    except MPI.Exception as exc:
        raise peer_died(exc, call.name) from None
    result = finish() if finish is not None else None
    note(call, t0, None)
    return result


def drive(call: Call, steps: Generator, async_op: bool) -> Any:
    """Run a step generator to completion now, or return a Work that steps it."""
    t0 = _now()
    work = Work(None, call, t0, steps=steps, sync=not async_op)
    if async_op:
        return work
    work.wait()
    return work._result
