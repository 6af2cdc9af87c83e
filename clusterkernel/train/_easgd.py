"""Elastic averaging SGD: ``Trainer(mode="easgd")`` (Zhang, Choromanska, LeCun 2015).

Every worker trains its own replica ``x_i`` with its own optimizer; a center
variable ``c`` ties them together. Every ``tau`` steps a worker and the center
pull towards each other with strength ``alpha``::

    d = alpha * (x_i - c);   x_i -= d;   c += d

- asynchronous (default, the round-robin form of Theano-MPI): ``c`` lives on a
  server rank (group rank 0); a worker sends ``x_i``, the server answers with
  ``c`` and moves it, serving waiting workers in turn;
- synchronous (``synchronous=True``): every rank is a worker and keeps a copy of
  ``c``; the ``d``'s of all ranks are summed with one ``all_reduce``.

The trained model is the center: after ``fit`` every rank's model holds it.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from mpi4py import MPI
from torch import nn

from clusterkernel import comm, metrics
from clusterkernel.train._modes import register_mode
from clusterkernel.train.ps._client import ServerClient, ServerPeer
from clusterkernel.train.ps._flat import FlatParams
from clusterkernel.train.ps._link import Poller
from clusterkernel.train.ps._served import ServedMode
from clusterkernel.train.ps._serverloop import (
    EXCHANGE,
    KIND,
    PULL,
    REPLY,
    SAVE,
    StepProgress,
    header_progress,
)


class CenterServer:
    """:class:`ServerLoop` handler holding the center variable (asynchronous EASGD)."""

    def __init__(self, center: torch.Tensor, alpha: float, workers: list[int]):
        self.center = center.detach().clone()
        self.alpha = alpha
        self.exchanges = 0
        self.progress = {w: (0, 0, 0) for w in workers}
        self.send = None  # set by the mode to the loop's send
        self.request_save = None
        self._rec = metrics.recorder()

    @torch.no_grad()
    def on_message(self, w: int, header: np.ndarray, payload: np.ndarray) -> None:
        kind = header[KIND]
        if kind == EXCHANGE:
            x = torch.from_numpy(payload).view(self.center.dtype)
            self.send(w, [REPLY, 0, 0, self.exchanges], self.center)  # copied out now
            distance = float((x - self.center).norm())
            self.center.add_(x - self.center, alpha=self.alpha)
            self.exchanges += 1
            self.progress[w] = header_progress(header)
            self._rec.log(step=self.exchanges, elastic_distance=distance, worker=w)
        elif kind == PULL:
            self.send(w, [REPLY, 0, 0, self.exchanges], self.center)
        elif kind == SAVE:
            self.request_save()
        else:
            raise RuntimeError(f"EASGD server: unexpected message kind {kind} from rank {w}")

    def after_events(self) -> None:
        pass

    def on_done(self, w: int, header: np.ndarray) -> None:
        pass

    def on_failure(self, w: int) -> None:
        pass

    def final_payload(self) -> torch.Tensor:
        return self.center

    def summary(self, seconds: float) -> dict:
        rate = self.exchanges / seconds if seconds > 0 else 0.0
        return {"updates": self.exchanges, "updates_per_s": rate}

    def install(self, flat: FlatParams) -> None:
        flat.write(self.center)

    def state(self) -> dict:
        return {
            "center": self.center.clone(),
            "exchanges": self.exchanges,
            "progress": dict(self.progress),
        }

    def load_state(self, state: dict) -> None:
        if state["center"].shape != self.center.shape:
            raise ValueError("the saved center does not match this model")
        self.center.copy_(state["center"])
        self.exchanges = state["exchanges"]
        self.progress.update(state["progress"])


class _ElasticClient(ServerClient):
    """Worker side of asynchronous EASGD: exchange with the center every ``tau`` steps."""

    pull_op = "easgd_center"

    def __init__(self, comm_: MPI.Intracomm, flat: FlatParams, alpha: float, poller: Poller):
        n = flat.numel * flat.empty().element_size()
        super().__init__(comm_, [0], [(0, flat.numel)], flat, [n], poller)
        self.alpha = alpha
        self.x = flat.empty()
        self._exchanging = False

    def exchange(self, progress: StepProgress) -> None:
        self.blocked = 0.0
        s = self.peers[0]
        x = self.flat.read(self.x)

        def encode(out):
            dst = torch.from_numpy(out[: x.numel() * x.element_size()]).view(x.dtype)
            dst.copy_(x)
            return x.numel() * x.element_size()

        self.ask(s)
        self.send_data(s, EXCHANGE, 0, progress, encode, "easgd_exchange")
        self._exchanging = True
        try:
            self.wait_answers()
        finally:
            self._exchanging = False

    @torch.no_grad()
    def take(self, s: ServerPeer, kind: int, values: torch.Tensor) -> None:
        if self._exchanging:  # values: the center before this exchange moved it
            self.x.sub_(self.x - values, alpha=self.alpha)
            self.flat.write(self.x)
        else:
            self.flat.write(values)  # the first read, or the final center


class EASGDMode(ServedMode):
    """Elastic averaging SGD with a center variable.

    Options: ``alpha`` (elastic strength; default ``0.9 / workers``, the paper's
    moving rate beta = 0.9), ``tau`` (communication period in steps, 4),
    ``synchronous`` (False: center on server rank 0, asynchronous round-robin;
    True: every rank trains, centers stay equal through ``all_reduce``).

    Example::

        Trainer(net, opt, F.cross_entropy, digits(), mode="easgd",
                mode_options={"tau": 4, "synchronous": True}).fit(5)
    """

    name = "easgd"

    def __init__(
        self,
        alpha: float | None = None,
        tau: int = 4,
        synchronous: bool = False,
        poll_spin: float = 2e-4,
    ):
        super().__init__(0 if synchronous else 1, poll_spin)
        if alpha is not None and not (isinstance(alpha, float | int) and 0 < alpha < 1):
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            raise ValueError(f"tau must be an int >= 1, got {tau!r}")
        self.alpha = alpha
        self.tau = tau
        self.synchronous = bool(synchronous)
        self.lockstep = self.synchronous  # the all_reduce every tau steps is collective
        self.steps = 0

    def setup(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, group: comm.Group | None = None
    ) -> nn.Module:
        if self.alpha is None:  # the paper's moving rate beta = workers * alpha = 0.9
            self.alpha = 0.9 / max(1, comm.size(group) - self.servers)
        return super().setup(model, optimizer, group)

    def _make_handler(self) -> CenterServer:
        return CenterServer(self.flat.read(), self.alpha, self.worker_ranks)

    def _message_bytes(self) -> tuple[int, int]:
        n = self.flat.numel * self.flat.empty().element_size()
        return n, n

    def _setup_worker(self) -> None:
        if self.synchronous:
            self.center = self.flat.read()
            self.x = self.flat.empty()
        else:
            self.client = _ElasticClient(self.link, self.flat, self.alpha, self.poller)

    def _start_worker(self) -> None:
        if not self.synchronous:
            self.client.fetch(self.progress(ahead=0))  # start from the center

    def _finish_worker(self) -> None:
        if self.synchronous:
            self.flat.write(self.center)
        else:
            self.client.finish(self.progress(ahead=0))

    def _ask_save(self) -> None:
        self.client.save(self.progress(ahead=0))

    def step(self, step: int) -> None:
        self.optimizer.step()
        self.steps += 1
        self.last_comm_seconds = 0.0
        if self.steps % self.tau:
            return
        if self.synchronous:
            self._elastic_allreduce()
        else:
            self.client.exchange(self.progress())
            self.last_comm_seconds = self.client.blocked

    @torch.no_grad()
    def _elastic_allreduce(self) -> None:
        x = self.flat.read(self.x)
        d = (x - self.center).mul_(self.alpha)
        x.sub_(d)
        self.flat.write(x)
        t0 = time.perf_counter()
        comm.all_reduce(d, op=comm.SUM, group=self.group)
        self.last_comm_seconds = time.perf_counter() - t0
        self.center.add_(d)

    def state_dict(self) -> dict:
        # the synchronous form's shared checkpoint (see ServedMode.save_state) holds
        # each rank's copy of the center too
        state = super().state_dict()
        if self.synchronous:
            state["mode"] = {"center": self.center.clone()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.synchronous and "center" in state["mode"]:
            self.center.copy_(state["mode"]["center"])


register_mode(EASGDMode.name, EASGDMode)
