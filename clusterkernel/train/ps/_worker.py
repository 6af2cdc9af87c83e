"""The worker side of the parameter server: push gradients, fetch parameters.

Each step the worker adds its gradient to an accumulator. Every ``push_every``
steps it sends the mean of the accumulated gradients, shard by shard, to the
servers (one server update per push); every ``fetch_every`` steps it asks for
fresh parameters (riding on the push when both fall on one step). Between
fetches the worker's replica learns on with its own optimizer (Downpour SGD).
Reads are

- consistent (default): the worker waits for the parameters and uses them from
  the next step on; with a staleness bound the servers hold the answer back
  until the slowest worker has caught up;
- inconsistent (AsySG-InCon): the worker never waits and never steps by
  itself; each shard replaces the replica's values whenever it lands, so a
  gradient may come from a mix of versions (each shard's read version goes back
  with the push).
"""

from __future__ import annotations

import torch
from mpi4py import MPI

from clusterkernel.train.ps._client import ServerClient
from clusterkernel.train.ps._codec import GradientCodec
from clusterkernel.train.ps._flat import FlatParams
from clusterkernel.train.ps._link import Poller
from clusterkernel.train.ps._serverloop import PULL, PUSH, WANT_REPLY, StepProgress


class PSClient(ServerClient):
    """A worker's connection to the parameter servers.

    Example (what :class:`ParameterServerMode` does on a worker)::

        client = PSClient(comm, [0], [(0, flat.numel)], flat, [GradientCodec(None, ...)])
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
        super().__init__(comm, servers, ranges, flat, [c.max_bytes for c in codecs], poller)
        self.codecs = codecs
        self.push_every = push_every
        self.fetch_every = fetch_every
        self.inconsistent = inconsistent
        self.grad = flat.empty()
        self.acc = flat.empty().zero_() if push_every > 1 else None
        self.steps = 0

    def _push(self, i: int, grad: torch.Tensor, flags: int, progress: StepProgress) -> None:
        s, codec = self.peers[i], self.codecs[i]
        encode = lambda out: codec.encode(grad[s.lo : s.hi], out)  # noqa: E731
        self.send_data(s, PUSH, flags, progress, encode, "ps_push")

    def step(self, optimizer: torch.optim.Optimizer, progress: StepProgress) -> None:
        """After backward: accumulate, push, fetch, as the schedule says."""
        self.blocked = 0.0
        self.steps += 1
        grad = self.flat.read_grads(self.grad)
        push = self.steps % self.push_every == 0
        if self.acc is not None:
            grad = self.acc.add_(grad)
            if push:
                grad.div_(self.push_every)  # the mean: one server step per push
        fetch = self.steps % self.fetch_every == 0
        if not (fetch or self.inconsistent):
            # Downpour: between fetches the replica learns on by itself (a fetch
            # overwrites it; asynchronous SGD proper only ever computes gradients)
            optimizer.step()
        for i, s in enumerate(self.peers):
            want = fetch and s.recv_req is None  # at most one read in flight per shard
            if want:
                self.ask(s)
            if push:
                self._push(i, grad, WANT_REPLY if want else 0, progress)
            elif want:
                self.send_ctrl(s, PULL, progress)
        if push and self.acc is not None:
            self.acc.zero_()
        if self.inconsistent:
            self.poll_answers()
        elif fetch:
            self.wait_answers()

    def finish(self, progress: StepProgress) -> None:
        """Push what is left in the accumulator, then the common done protocol."""
        left = self.steps % self.push_every
        if self.acc is not None and left:
            self.acc.div_(left)
            for i in range(len(self.peers)):
                self._push(i, self.acc, 0, progress)
        super().finish(progress)
