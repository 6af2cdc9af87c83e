"""The worker side of the parameter server: push gradients, fetch parameters.

Each step the worker adds its gradient to an accumulator. Every ``push_every``
steps it sends the accumulated gradient, shard by shard, to the servers; every
``fetch_every`` steps it asks for fresh parameters (riding on the push when both
fall on one step). Between fetches the worker's replica keeps learning with its
own optimizer (Downpour SGD). Reads are

- consistent (default): the worker waits for the parameters, and uses them
  from the next step on; with a staleness bound the servers hold the answer back
  until the slowest worker has caught up;
- inconsistent (AsySG-InCon): the worker never waits; each shard replaces the
  replica's values whenever it lands, so a gradient may come from a mix of
  versions (the read versions sent back are those of each shard).
"""

from __future__ import annotations

import time

import torch
from mpi4py import MPI

from clusterkernel.train._codec import GradientCodec
from clusterkernel.train._flat import FlatParams
from clusterkernel.train._link import (
    HEADER_BYTES,
    TO_SERVER,
    TO_WORKER,
    PeerFailedError,
    Poller,
    is_failure,
    message_buffer,
    note,
    wait_all,
)
from clusterkernel.train._serverloop import (
    CLOCK,
    DONE,
    FINAL,
    KIND,
    PULL,
    PUSH,
    REPLY,
    SAVE,
    VERSION,
    WANT_REPLY,
)

_now = time.perf_counter


class _Server:
    """What a worker keeps per server: buffers, pending requests, the last read."""

    def __init__(self, rank: int, lo: int, hi: int, codec: GradientCodec, itemsize: int):
        self.rank, self.lo, self.hi = rank, lo, hi
        self.codec = codec
        self.push_buf, self.push_head = message_buffer(codec.max_bytes)
        self.ctrl_buf, self.ctrl_head = message_buffer(0)
        self.recv_buf, self.recv_head = message_buffer((hi - lo) * itemsize)
        self.push_req: MPI.Request | None = None
        self.ctrl_req: MPI.Request | None = None
        self.recv_req: MPI.Request | None = None
        self.asked_at = 0.0
        self.clock = 0
        self.version = 0


class PSClient:
    """A worker's connection to the parameter servers ``servers`` (ranks of ``comm``).

    Example (what :class:`ParameterServerMode` does on a worker)::

        client = PSClient(comm, [0], [(0, flat.numel)], flat, GradientCodec(None, ...))
        client.fetch(progress)            # start from the server's parameters
        ... backward ...
        client.step(optimizer, progress)  # push, maybe fetch
        client.finish(progress)           # done; load the final parameters
    """

    def __init__(
        self,
        comm: MPI.Intracomm,
        servers: list[int],
        ranges: list[tuple[int, int]],
        flat: FlatParams,
        codecs: list[GradientCodec],
        push_every: int = 1,
        fetch_every: int = 1,
        inconsistent: bool = False,
        poller: Poller | None = None,
    ):
        self.comm = comm
        self.flat = flat
        itemsize = flat.empty().element_size()
        self.servers = [
            _Server(r, lo, hi, c, itemsize) for r, (lo, hi), c in zip(servers, ranges, codecs)
        ]
        self.push_every = push_every
        self.fetch_every = fetch_every
        self.inconsistent = inconsistent
        self.poller = poller or Poller()
        self.grad = flat.empty()
        self.acc = flat.empty().zero_() if push_every > 1 else None
        self.steps = 0
        self.blocked = 0.0  # seconds this step spent waiting on the servers

    # -- messages ---------------------------------------------------------------
    def _wait(self, req: MPI.Request | None, s: _Server, what: str) -> float:
        """Wait for one request; returns the seconds spent blocked."""
        if req is None:
            return 0.0
        t0 = _now()
        wait_all([req], what, [s.rank], self.poller)
        return _now() - t0

    def _send_ctrl(self, s: _Server, kind: int, progress) -> None:
        self.blocked += self._wait(s.ctrl_req, s, "sending to a parameter server")
        s.ctrl_head[:] = [kind, 0, s.clock, s.version, *progress, 0]
        s.ctrl_req = self._isend(s, s.ctrl_buf)

    def _isend(self, s: _Server, buf) -> MPI.Request:
        try:
            return self.comm.Isend([buf, MPI.BYTE], s.rank, TO_SERVER)
        except MPI.Exception as exc:
            if is_failure(exc):
                raise PeerFailedError(f"parameter server rank {s.rank} has failed") from None
            raise

    def _push(self, s: _Server, values: torch.Tensor, flags: int, progress) -> None:
        t0 = _now()
        waited = self._wait(s.push_req, s, "pushing to a parameter server")
        n = s.codec.encode(values[s.lo : s.hi], s.push_buf[HEADER_BYTES:])
        s.push_head[:] = [PUSH, flags, s.clock, s.version, *progress, 0]
        s.push_req = self._isend(s, s.push_buf[: HEADER_BYTES + n])
        self.blocked += waited
        note("ps_push", n, len(self.servers), t0, waited)

    def _ask(self, s: _Server) -> None:
        s.asked_at = _now()
        s.recv_req = self.comm.Irecv([s.recv_buf, MPI.BYTE], s.rank, TO_WORKER)

    def _load(self, s: _Server, waited: float, expect: int = REPLY) -> None:
        """The reply from ``s`` has arrived: put its values into the model."""
        head = s.recv_head
        if head[KIND] != expect:
            raise RuntimeError(f"parameter server rank {s.rank} sent kind {head[KIND]}")
        s.clock, s.version = int(head[CLOCK]), int(head[VERSION])
        n = s.hi - s.lo
        values = torch.from_numpy(s.recv_buf[HEADER_BYTES:]).view(self.flat.dtype)[:n]
        self.flat.write(values, s.lo)
        s.recv_req = None
        note("ps_pull", values.nbytes, len(self.servers), s.asked_at, waited)

    def _wait_replies(self, expect: int = REPLY) -> None:
        for s in self.servers:
            if s.recv_req is not None:
                waited = self._wait(s.recv_req, s, "waiting for parameters")
                self.blocked += waited
                self._load(s, waited, expect)

    def poll(self) -> None:
        """Inconsistent reads: take whichever shards have landed, never wait."""
        for s in self.servers:
            if s.recv_req is None:
                continue
            try:
                arrived = s.recv_req.Test()
            except MPI.Exception as exc:
                if is_failure(exc):
                    raise PeerFailedError(f"parameter server rank {s.rank} has failed") from None
                raise
            if arrived:
                self._load(s, 0.0)

    # -- the protocol -------------------------------------------------------------
    def fetch(self, progress) -> None:
        """Ask every server for its shard and wait (the first read of a fit)."""
        for s in self.servers:
            self._ask(s)
            self._send_ctrl(s, PULL, progress)
        self._wait_replies()

    def step(self, optimizer: torch.optim.Optimizer, progress) -> None:
        """After backward: accumulate, push, fetch, as the schedule says."""
        self.blocked = 0.0
        self.steps += 1
        grad = self.flat.read_grads(self.grad)
        if self.acc is not None:
            grad = self.acc.add_(grad)
        push = self.steps % self.push_every == 0
        fetch = self.steps % self.fetch_every == 0
        if self.inconsistent or not fetch:
            optimizer.step()  # the replica learns on until fresh parameters arrive
        for s in self.servers:
            want = fetch and s.recv_req is None  # at most one read in flight per shard
            if want:
                self._ask(s)
            if push:
                self._push(s, grad, WANT_REPLY if want else 0, progress)
            elif want:
                self._send_ctrl(s, PULL, progress)
        if push and self.acc is not None:
            self.acc.zero_()
        if fetch and not self.inconsistent:
            self._wait_replies()
        elif self.inconsistent:
            self.poll()

    def save(self, progress) -> None:
        """Ask every server to write its checkpoint now."""
        for s in self.servers:
            self._send_ctrl(s, SAVE, progress)

    def finish(self, progress) -> None:
        """Push what is left, say done, and load the servers' final parameters."""
        if self.acc is not None and self.steps % self.push_every:
            for s in self.servers:
                self._push(s, self.acc, 0, progress)
        self._wait_replies()  # reads still in flight (inconsistent mode)
        for s in self.servers:
            self._ask(s)
            self._send_ctrl(s, DONE, progress)
        self._wait_replies(expect=FINAL)
        for s in self.servers:
            self._wait(s.push_req, s, "pushing to a parameter server")
            self._wait(s.ctrl_req, s, "sending to a parameter server")
            s.push_req = s.ctrl_req = None
