"""The loop a server rank runs: serve worker ranks until each is done or dead.

One receive is posted per worker (source-specific, one tag, so a worker's
messages arrive in the order it sent them). The loop tests them round-robin and
hands each message to a handler; the handler answers through :meth:`ServerLoop.send`.
A receive that fails with a process-failure error means that worker died: the
loop logs it, tells the handler, and goes on with the others. When every worker
has said done (or died), each live worker gets a final message.

Header fields (int64): ``[kind, flags, clock, version, epoch, step_in_epoch,
global_step, extra]``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from mpi4py import MPI

from clusterkernel import metrics
from clusterkernel.train.ps._link import (
    HEADER_BYTES,
    TO_SERVER,
    TO_WORKER,
    TO_WORKER_ABORT,
    Poller,
    is_failure,
    message_buffer,
)

# message kinds
PUSH, PULL, DONE, SAVE, EXCHANGE, REPLY, FINAL, ABORT = 1, 2, 3, 4, 5, 10, 11, 12
# header field positions
KIND, FLAGS, CLOCK, VERSION, EPOCH, STEP_IN_EPOCH, GLOBAL_STEP, EXTRA = range(8)
WANT_REPLY = 1  # flag on a push: answer with parameters

log = logging.getLogger("clusterkernel.train")

#: ``(epoch, step_in_epoch, global_step)``: how far a worker got, sent in every header
StepProgress = tuple[int, int, int]


def header_progress(header: np.ndarray) -> StepProgress:
    """``(epoch, step_in_epoch, global_step)`` a worker sent in a header."""
    return int(header[EPOCH]), int(header[STEP_IN_EPOCH]), int(header[GLOBAL_STEP])


class Handler(Protocol):
    """What a server does with messages (the parameter server, the EASGD center)."""

    def on_message(self, worker: int, header: np.ndarray, payload: np.ndarray) -> None: ...

    def on_done(self, worker: int, header: np.ndarray) -> None: ...

    def on_failure(self, worker: int) -> None: ...

    def after_events(self) -> None: ...

    def final_payload(self) -> torch.Tensor: ...


class ServerLoop:
    """Serve ``workers`` (ranks of ``comm``) with ``handler`` until all are done or dead.

    ``recv_bytes``/``send_bytes`` are the largest payloads each way.

    Example (on a server rank)::

        loop = ServerLoop(comm, workers=[1, 2, 3], recv_bytes=n * 4, send_bytes=n * 4,
                          handler=shard_server)
        loop.serve()
        print(loop.failed)        # e.g. [2] if rank 2 died
    """

    def __init__(
        self,
        comm: MPI.Intracomm,
        workers: Sequence[int],
        recv_bytes: int,
        send_bytes: int,
        handler: Handler,
        poller: Poller | None = None,
    ):
        self.comm = comm
        self.workers = list(workers)
        self.handler = handler
        self.poller = poller or Poller()
        self._inbox = {w: message_buffer(recv_bytes) for w in self.workers}
        self._outbox = {w: message_buffer(send_bytes) for w in self.workers}
        self._sending: dict[int, MPI.Request | None] = dict.fromkeys(self.workers)
        self._active: list[int] = []
        self.failed: list[int] = []
        self.messages = 0

    # -- receiving --------------------------------------------------------------
    def _post(self, w: int) -> MPI.Request:
        return self.comm.Irecv([self._inbox[w][0], MPI.BYTE], w, TO_SERVER)

    def serve(self) -> None:
        """Run until every worker has sent DONE or died, then send each live one FINAL."""
        self._active = list(self.workers)
        reqs = {w: self._post(w) for w in self._active}
        try:
            self._loop(reqs)
        except BaseException:
            self._abort()
            raise
        self._finish()

    def _loop(self, reqs: dict[int, MPI.Request]) -> None:
        status = MPI.Status()
        turn = 0
        while self._active:
            got = False
            n = len(self._active)
            for w in [self._active[(turn + j) % n] for j in range(n)]:
                if w not in self._active:
                    continue  # died while an earlier message was handled
                try:
                    arrived = reqs[w].Test(status)
                except MPI.Exception as exc:
                    if not is_failure(exc):
                        raise
                    self._fail(w)
                    continue
                if not arrived:
                    continue
                got = True
                self.messages += 1
                buf, header = self._inbox[w]
                if header[KIND] == DONE:
                    self._active.remove(w)
                    self.handler.on_done(w, header)
                    continue
                self.handler.on_message(w, header, buf[HEADER_BYTES : status.Get_count(MPI.BYTE)])
                reqs[w] = self._post(w)
            self.handler.after_events()
            if got:
                turn += 1
                self.poller.busy()
            else:
                self.poller.idle()

    def _abort(self) -> None:
        """This server failed: tell every live worker, so none waits for it forever.

        The workers' posted receives stay matched by ours (left posted), so a
        worker's send in flight completes and it then sees the abort.
        """
        buf, header = message_buffer(0)
        header[KIND] = ABORT
        reqs = []
        for w in self.workers:
            if w not in self.failed:
                try:
                    reqs.append(self.comm.Isend([buf, MPI.BYTE], w, TO_WORKER_ABORT))
                except MPI.Exception:
                    continue  # best effort: that worker is gone too
        deadline = time.monotonic() + 1.0  # a header goes out eagerly; do not hang here
        try:
            while not MPI.Request.Testall(reqs) and time.monotonic() < deadline:
                time.sleep(1e-3)
        except MPI.Exception:
            pass
        log.error(
            "server rank %d failed; told workers %s to stop",
            self.comm.Get_rank(),
            [w for w in self.workers if w not in self.failed],
        )

    def _finish(self) -> None:
        final = self.handler.final_payload()
        for w in self.workers:
            if w not in self.failed:
                self.send(w, [FINAL], final)
        for w in self.workers:
            self._complete_send(w)

    # -- sending ----------------------------------------------------------------
    def send(self, w: int, fields: Sequence[int], payload: torch.Tensor | None = None) -> None:
        """Send header ``fields`` (+ a flat ``payload``) to worker ``w``, without waiting.

        The previous message to ``w`` must have left its buffer first; a dead
        ``w`` is noted as failed instead of raising.
        """
        if not self._complete_send(w):
            return
        buf, header = self._outbox[w]
        header[:] = 0
        header[: len(fields)] = fields
        n = 0
        if payload is not None:
            n = payload.numel() * payload.element_size()
            dst = torch.from_numpy(buf[HEADER_BYTES : HEADER_BYTES + n]).view(payload.dtype)
            dst.copy_(payload)
        try:
            self._sending[w] = self.comm.Isend([buf[: HEADER_BYTES + n], MPI.BYTE], w, TO_WORKER)
        except MPI.Exception as exc:
            if not is_failure(exc):
                raise
            self._fail(w)

    def _complete_send(self, w: int) -> bool:
        req = self._sending[w]
        if req is None:
            return w not in self.failed
        self.poller.busy()
        try:
            while not req.Test():
                self.poller.idle()
        except MPI.Exception as exc:
            if not is_failure(exc):
                raise
            self._fail(w)
            return False
        finally:
            self._sending[w] = None
        return True

    # -- failures ---------------------------------------------------------------
    def _fail(self, w: int) -> None:
        if w in self.failed:
            return
        self.failed.append(w)
        if w in self._active:
            self._active.remove(w)
        self._sending[w] = None
        log.warning(
            "server rank %d: worker rank %d failed; continuing with ranks %s",
            self.comm.Get_rank(),
            w,
            self._active,
        )
        metrics.log(worker_failed=w, at_time=time.time())
        self.handler.on_failure(w)
