"""A worker's side of the server protocol: sends, reads, done, final parameters.

:class:`ServerClient` keeps, per server, a message buffer for data, one for
control messages and one for answers, with at most one of each in flight. The
parameter-server worker and the EASGD worker build their exchanges on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from mpi4py import MPI

from clusterkernel.train.ps._flat import FlatParams
from clusterkernel.train.ps._link import (
    HEADER_BYTES,
    TO_SERVER,
    TO_WORKER,
    TO_WORKER_ABORT,
    PeerFailedError,
    Poller,
    is_failure,
    message_buffer,
    note,
    wait_all,
)
from clusterkernel.train.ps._serverloop import (
    CLOCK,
    DONE,
    FINAL,
    KIND,
    PULL,
    REPLY,
    SAVE,
    VERSION,
    StepProgress,
)

_now = time.perf_counter


class ServerPeer:
    """What a worker keeps per server: buffers, requests in flight, the last read."""

    def __init__(self, rank: int, lo: int, hi: int, send_bytes: int, itemsize: int):
        self.rank, self.lo, self.hi = rank, lo, hi
        self.data_buf, self.data_head = message_buffer(send_bytes)
        self.ctrl_buf, self.ctrl_head = message_buffer(0)
        self.recv_buf, self.recv_head = message_buffer((hi - lo) * itemsize)
        self.abort_buf, _ = message_buffer(0)
        self.data_req: MPI.Request | None = None
        self.ctrl_req: MPI.Request | None = None
        self.recv_req: MPI.Request | None = None
        self.abort_req: MPI.Request | None = None  # completes if the server fails
        self.asked_at = 0.0
        self.clock = 0  # of the values this worker last read from this server
        self.version = 0


class ServerClient:
    """Talks to the servers ``servers`` (ranks of ``comm``), each owning ``ranges[i]``.

    ``send_bytes[i]`` is the largest data payload for server ``i``. Subclasses
    send data with :meth:`send_data` and may override :meth:`take` (what to do
    with an answer's values; default: write them into the model).
    """

    pull_op = "ps_pull"

    def __init__(
        self,
        comm: MPI.Intracomm,
        servers: list[int],
        ranges: list[tuple[int, int]],
        flat: FlatParams,
        send_bytes: list[int],
        poller: Poller | None = None,
    ):
        self.comm = comm
        self.flat = flat
        itemsize = flat.empty().element_size()
        self.peers = [
            ServerPeer(r, lo, hi, n, itemsize)
            for r, (lo, hi), n in zip(servers, ranges, send_bytes)
        ]
        self.poller = poller or Poller()
        self.blocked = 0.0  # seconds of the current step spent waiting on servers

    # -- primitives -------------------------------------------------------------
    def _wait(self, req: MPI.Request | None, s: ServerPeer, what: str) -> float:
        if req is None:
            return 0.0
        t0 = _now()
        wait_all([req], what, [s.rank], self.poller, abort=s.abort_req)
        return _now() - t0

    def _isend(self, s: ServerPeer, buf) -> MPI.Request:
        try:
            return self.comm.Isend([buf, MPI.BYTE], s.rank, TO_SERVER)
        except MPI.Exception as exc:
            if is_failure(exc):
                raise PeerFailedError(f"server rank {s.rank} has failed") from None
            raise

    def send_ctrl(self, s: ServerPeer, kind: int, progress: StepProgress) -> None:
        """A header-only message (PULL, SAVE, DONE) carrying this worker's progress."""
        self.blocked += self._wait(s.ctrl_req, s, "sending to a server")
        s.ctrl_head[:] = [kind, 0, s.clock, s.version, *progress, 0]
        s.ctrl_req = self._isend(s, s.ctrl_buf)

    def send_data(
        self,
        s: ServerPeer,
        kind: int,
        flags: int,
        progress: StepProgress,
        encode: Callable[[np.ndarray], int],
        op: str,
    ) -> None:
        """A header plus the payload ``encode(buffer) -> bytes written`` fills in."""
        t0 = _now()
        waited = self._wait(s.data_req, s, "sending to a server")
        n = encode(s.data_buf[HEADER_BYTES:])
        s.data_head[:] = [kind, flags, s.clock, s.version, *progress, 0]
        s.data_req = self._isend(s, s.data_buf[: HEADER_BYTES + n])
        self.blocked += waited
        note(op, n, len(self.peers), t0, waited)

    def ask(self, s: ServerPeer) -> None:
        """Post the receive for the next answer from ``s`` (before asking for it)."""
        s.asked_at = _now()
        s.recv_req = self.comm.Irecv([s.recv_buf, MPI.BYTE], s.rank, TO_WORKER)

    def take(self, s: ServerPeer, kind: int, values: torch.Tensor) -> None:
        """Use the values of an answer; the default writes them into the model."""
        self.flat.write(values, s.lo)

    def _arrived(self, s: ServerPeer, waited: float, expect: int) -> None:
        head = s.recv_head
        if head[KIND] != expect:
            raise RuntimeError(f"server rank {s.rank} answered kind {head[KIND]}, not {expect}")
        s.clock, s.version = int(head[CLOCK]), int(head[VERSION])
        n = s.hi - s.lo
        values = torch.from_numpy(s.recv_buf[HEADER_BYTES:]).view(self.flat.dtype)[:n]
        s.recv_req = None
        self.take(s, expect, values)
        note(self.pull_op, values.nbytes, len(self.peers), s.asked_at, waited)

    def wait_answers(self, expect: int = REPLY) -> None:
        """Block until every answer asked for has arrived, and take it."""
        for s in self.peers:
            if s.recv_req is not None:
                waited = self._wait(s.recv_req, s, "waiting for a server's answer")
                self.blocked += waited
                self._arrived(s, waited, expect)

    def poll_answers(self) -> None:
        """Take whichever answers have arrived; never wait."""
        for s in self.peers:
            if s.recv_req is None:
                continue
            try:
                arrived = s.recv_req.Test()
            except MPI.Exception as exc:
                if is_failure(exc):
                    raise PeerFailedError(f"server rank {s.rank} has failed") from None
                raise
            if arrived:
                self._arrived(s, 0.0, REPLY)
            elif s.abort_req is not None and s.abort_req.Test():
                self._wait(s.recv_req, s, "waiting for a server's answer")  # raises

    # -- the common protocol ----------------------------------------------------
    def fetch(self, progress: StepProgress) -> None:
        """Ask every server for its values and wait (a worker's first read of a fit)."""
        for s in self.peers:
            if s.abort_req is None:
                s.abort_req = self.comm.Irecv([s.abort_buf, MPI.BYTE], s.rank, TO_WORKER_ABORT)
            self.ask(s)
            self.send_ctrl(s, PULL, progress)
        self.wait_answers()

    def save(self, progress: StepProgress) -> None:
        """Ask every server to write its checkpoint now."""
        for s in self.peers:
            self.send_ctrl(s, SAVE, progress)

    def finish(self, progress: StepProgress) -> None:
        """Say done, and load the servers' final values when every worker is done."""
        self.wait_answers()  # answers still in flight
        for s in self.peers:
            self.ask(s)
            self.send_ctrl(s, DONE, progress)
        self.wait_answers(expect=FINAL)
        for s in self.peers:
            self._wait(s.data_req, s, "sending to a server")
            self._wait(s.ctrl_req, s, "sending to a server")
            s.data_req = s.ctrl_req = None
            s.abort_req.Cancel()  # the server finished well: no abort is coming
            s.abort_req.Wait()
            s.abort_req = None
