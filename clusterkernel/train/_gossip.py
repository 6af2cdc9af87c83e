"""Gossip SGD: ``Trainer(mode="gossip")`` (GoSGD, Blot et al. 2016), no server.

Every rank trains its own replica ``x_i`` and carries a weight ``w_i`` (all
start at ``1/n`` and always sum to 1). After each step, with probability
``rate``, a rank halves its weight and sends ``(x_i, w_i)`` to a random peer; a
rank that receives ``(x_j, w_j)`` mixes it in::

    x_i = (w_i x_i + w_j x_j) / (w_i + w_j);   w_i = w_i + w_j

Sends never wait (a small pool of buffers; a step whose pool is full skips its
gossip), so a rank blocked elsewhere (e.g. in a checkpoint collective) never
stalls the others. At the end every rank tells every peer it is done and drains
what is still coming; with ``average_at_end`` the ranks then take the weighted
average ``sum(w_i x_i)`` (one ``all_reduce``), so every rank ends with one model.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import numpy as np
import torch
from mpi4py import MPI
from torch import nn

from clusterkernel import comm
from clusterkernel.train._checkpoint import Progress
from clusterkernel.train._modes import TrainingMode, register_mode
from clusterkernel.train._sync import sync_parameters, world_rank
from clusterkernel.train.ps._flat import FlatParams
from clusterkernel.train.ps._link import (
    HEADER_BYTES,
    Poller,
    check_same_model,
    free_comm,
    message_buffer,
    note,
    private_comm,
)

_TAG = 3
_MIX, _DONE = 1, 3
_POOL = 4
_now = time.perf_counter


class GossipMode(TrainingMode):
    """Gossip SGD: random pairwise mixing of replicas at a given rate.

    Options: ``rate`` (probability that a rank gossips after a step, 0.1),
    ``average_at_end`` (True), ``seed`` (peer choices; each rank draws its own
    stream from it), ``poll_spin``. A higher rate is not better where ranks run in
    bursts (more ranks than cores): each send halves the sender's weight, so what a
    rank learns in a burst of sends barely counts (``benchmarks/bench_gossip_rate.py``).

    Example::

        Trainer(net, opt, F.cross_entropy, digits(), mode="gossip",
                mode_options={"rate": 0.1, "seed": 1}).fit(5)
    """

    name = "gossip"

    def __init__(
        self,
        rate: float = 0.1,
        average_at_end: bool = True,
        seed: int = 0,
        poll_spin: float = 2e-4,
    ):
        if not (isinstance(rate, float | int) and 0 < rate <= 1):
            raise ValueError(f"rate must be in (0, 1], got {rate!r}")
        self.rate = float(rate)
        self.average_at_end = bool(average_at_end)
        self.seed = seed
        self.poller = Poller(spin=poll_spin)
        self.sent = 0
        self.mixed = 0

    def setup(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, group: comm.Group | None = None
    ) -> nn.Module:
        super().setup(model, optimizer, group)
        n, me = comm.size(group), comm.rank(group)
        if n < 2:
            raise ValueError("gossip needs at least 2 ranks to mix; use mode='local' on one rank")
        self.n, self.me = n, me
        self.peers = [r for r in range(n) if r != me]
        self.link = private_comm(group)
        self.flat = FlatParams(model)
        check_same_model(self.flat.numel, self.flat.dtype, group)
        sync_parameters(model, src=world_rank(group, 0), group=group)
        self.weight = 1.0 / n
        self.rng = random.Random(f"{self.seed}/{me}")
        nbytes = self.flat.numel * self.flat.empty().element_size()
        self.pool = [message_buffer(nbytes) for _ in range(_POOL)]
        self.pool_req: list[MPI.Request | None] = [None] * _POOL
        self.inbox, self.inbox_head = message_buffer(nbytes)
        self.x = self.flat.empty()
        return model

    # -- one step -------------------------------------------------------------------
    def step(self, step: int) -> None:
        self.optimizer.step()
        t0 = _now()
        self._receive()
        if self.rng.random() < self.rate:
            self._send()
        self.last_comm_seconds = _now() - t0

    def _free_slot(self) -> int | None:
        for i, req in enumerate(self.pool_req):
            if req is None or req.Test():
                self.pool_req[i] = None
                return i
        return None

    def _send(self) -> None:
        slot = self._free_slot()
        if slot is None:
            return  # every buffer still in flight: skip, keep the weight
        t0 = _now()
        peer = self.rng.choice(self.peers)
        self.weight /= 2
        buf, head = self.pool[slot]
        head[0] = _MIX
        head.view(np.float64)[1] = self.weight
        payload = torch.from_numpy(buf[HEADER_BYTES:]).view(self.flat.dtype)
        self.flat.read(payload)
        self.pool_req[slot] = self.link.Isend([buf, MPI.BYTE], peer, _TAG)
        self.sent += 1
        note("gossip_send", payload.nbytes, 2, t0, 0.0)

    @torch.no_grad()
    def _receive(self) -> None:
        status = MPI.Status()
        while True:
            msg = self.link.Improbe(MPI.ANY_SOURCE, _TAG, status)
            if msg is None:
                return
            t0 = _now()
            msg.Recv([self.inbox, MPI.BYTE])
            if self.inbox_head[0] == _DONE:
                self._done_from.add(status.Get_source())
                if self.inbox_head[1]:
                    self._failed_peers.append(status.Get_source())
                continue
            w = float(self.inbox_head.view(np.float64)[1])
            theirs = torch.from_numpy(self.inbox[HEADER_BYTES:]).view(self.flat.dtype)
            x = self.flat.read(self.x)
            x.mul_(self.weight).add_(theirs, alpha=w).div_(self.weight + w)
            self.flat.write(x)
            self.weight += w
            self.mixed += 1
            note("gossip_recv", theirs.nbytes, 2, t0, 0.0)

    # -- fit ------------------------------------------------------------------------
    def run(self, trainer: Progress, train: Callable[[], None]) -> None:
        self._done_from: set[int] = set()
        self._failed_peers: list[int] = []
        try:
            train()
        except BaseException:
            self._drain(failed=True)  # the others must not wait for this rank
            raise
        self._drain(failed=False)
        if self._failed_peers:
            raise RuntimeError(
                f"gossip: rank(s) {sorted(self._failed_peers)} failed during training (see "
                "their output); the final average was skipped"
            )
        if self.average_at_end:
            self._average()

    def _drain(self, failed: bool) -> None:
        """Tell every peer we are done; take what still comes until they all are."""
        done, head = message_buffer(0)
        head[0] = _DONE
        head[1] = int(failed)
        reqs = [self.link.Isend([done, MPI.BYTE], p, _TAG) for p in self.peers]
        pending = [r for r in self.pool_req if r is not None] + reqs
        self.poller.busy()
        while len(self._done_from) < len(self.peers) or not MPI.Request.Testall(pending):
            before = self.mixed + len(self._done_from)
            self._receive()
            if self.mixed + len(self._done_from) > before:
                self.poller.busy()
            else:
                self.poller.idle()
        self.pool_req = [None] * _POOL

    @torch.no_grad()
    def _average(self) -> None:
        x = self.flat.read(self.x)
        both = torch.cat([x * self.weight, torch.tensor([self.weight], dtype=x.dtype)])
        comm.all_reduce(both, op=comm.SUM, group=self.group)
        self.flat.write(both[:-1] / both[-1])
        self.weight = 1.0 / self.n

    def teardown(self) -> None:
        free_comm(getattr(self, "link", None))
        self.link = None

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["mode"] = {"weight": self.weight}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.weight = float(state["mode"].get("weight", 1.0 / self.n))


register_mode(GossipMode.name, GossipMode)
