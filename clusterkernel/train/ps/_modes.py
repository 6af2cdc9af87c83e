"""Parameter-server training: ``Trainer(mode="ps")`` and ``Trainer(mode="async")``.

The first ``servers`` ranks hold the parameters, split by size into contiguous
shards (one per server), and apply an update rule to their shard; the other
ranks are workers that push gradients and pull parameters with non-blocking
point-to-point messages, never a global barrier.

Fault tolerance: run the job with Open MPI's ``--with-ft ulfm``
(``mpiexec --with-ft ulfm -n 4 python train.py``), or set its environment
equivalent ``OMPI_MCA_mpi_ft_enable=1 PRTE_MCA_state_base_recoverable=1
PRTE_MCA_state_base_notify_errors=1``. A worker killed by a signal (SIGKILL, a
crash, the OOM killer) is then reported to the servers promptly (the delay:
BENCHMARKS.md, "Killed worker"); they log it (``clusterkernel.train``
logger and a ``worker_failed`` metric), drop it from the staleness bound and finish
with the others. Without that Open MPI ends the
whole job when any rank dies. Not covered (Open MPI 5.0 here): a rank that
leaves with ``os._exit`` is not reported, and its job cannot end.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from clusterkernel import comm
from clusterkernel.train._modes import LossFn, register_mode
from clusterkernel.train.ps._codec import COMPRESSIONS, GradientCodec
from clusterkernel.train.ps._flat import shard_ranges
from clusterkernel.train.ps._momentum import MomentumPlan, compensated_momentum
from clusterkernel.train.ps._served import ServedMode
from clusterkernel.train.ps._shard import ShardServer, make_rule
from clusterkernel.train.ps._worker import PSClient


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class ParameterServerMode(ServedMode):
    """Sharded parameter server with bounded staleness, Downpour schedules, compression.

    Options (``Trainer(..., mode="ps", mode_options={...})``):

    - ``servers`` (1): server ranks; parameters are split over them by size;
    - ``staleness`` (None): bound ``s`` on how many pushes a worker may be ahead of
      the slowest (``0`` = synchronous rounds); ``None`` = no bound;
    - ``inconsistent`` (False): workers never wait for parameters (AsySG-InCon);
    - ``push_every`` / ``fetch_every`` (1): Downpour SGD's n_push / n_fetch;
    - ``compression`` (None | ``"fp16"`` | ``"topk"``), ``topk_ratio`` (0.01);
    - ``update`` (None = the workers' optimizer | ``"sgd"`` | ``"adam"``) and
      ``update_options``: the rule each server applies to its shard;
    - ``poll_spin`` (2e-4 s): how long a waiting rank spins before it sleeps.

    Every applied gradient's ``staleness`` and ``delay`` are logged on the server
    (see :mod:`clusterkernel.train.ps._shard`); workers record ``ps_push`` and
    ``ps_pull`` timings. After ``fit`` every worker holds the final parameters;
    ``trainer.mode.stats`` on a server has updates/s, max staleness and failed workers.

    Example (on every rank; rank 0 serves, the others train)::

        trainer = Trainer(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                          F.cross_entropy, digits(), mode="ps",
                          mode_options={"staleness": 2})
        trainer.fit(epochs=5)
    """

    name = "ps"

    def __init__(
        self,
        servers: int = 1,
        staleness: int | None = None,
        inconsistent: bool = False,
        push_every: int = 1,
        fetch_every: int = 1,
        compression: str | None = None,
        topk_ratio: float = 0.01,
        update: str | None = None,
        update_options: dict | None = None,
        poll_spin: float = 2e-4,
    ):
        super().__init__(_positive_int("servers", servers), poll_spin)
        if staleness is not None:
            if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
                raise ValueError(f"staleness must be None or an int >= 0, got {staleness!r}")
            if inconsistent:
                raise ValueError(
                    "staleness bounds consistent reads; inconsistent=True never waits, so "
                    "the two cannot be combined"
                )
            if fetch_every != push_every:
                raise ValueError(
                    "a staleness bound holds back the read that follows each push, so it "
                    f"needs fetch_every == push_every (got {fetch_every} and {push_every})"
                )
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        GradientCodec(compression, 1, torch.float32, topk_ratio)  # checks topk_ratio now
        self.staleness = staleness
        self.inconsistent = bool(inconsistent)
        self.push_every = _positive_int("push_every", push_every)
        self.fetch_every = _positive_int("fetch_every", fetch_every)
        self.compression = compression
        self.topk_ratio = topk_ratio
        self.update = update
        self.update_options = update_options

    def _codec(self, lo: int, hi: int) -> GradientCodec:
        return GradientCodec(self.compression, hi - lo, self.flat.dtype, self.topk_ratio)

    def setup(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, group: comm.Group | None = None
    ) -> nn.Module:
        workers = comm.size(group) - self.servers
        self._rule = make_rule(optimizer, self.update, self._rule_options(optimizer, workers))
        return super().setup(model, optimizer, group)

    def _rule_options(self, optimizer: torch.optim.Optimizer, workers: int) -> dict | None:
        """``update_options`` of the servers' rule (a subclass may adjust them)."""
        return self.update_options

    def _ranges(self) -> list[tuple[int, int]]:
        return shard_ranges(self.flat.numel, self.servers)

    def _make_handler(self) -> ShardServer:
        lo, hi = self._ranges()[self.index]
        values = self.flat.read()[lo:hi]
        return ShardServer(
            values, lo, self._rule, self._codec(lo, hi), self.staleness, self.worker_ranks
        )

    def _message_bytes(self) -> tuple[int, int]:
        lo, hi = self._ranges()[self.index]
        return self._codec(lo, hi).max_bytes, (hi - lo) * self.flat.empty().element_size()

    def _setup_worker(self) -> None:
        ranges = self._ranges()
        self.client = PSClient(
            self.link,
            self.server_ranks,
            ranges,
            self.flat,
            [self._codec(lo, hi) for lo, hi in ranges],
            self.push_every,
            self.fetch_every,
            self.inconsistent,
            self.poller,
        )

    # -- worker hooks -----------------------------------------------------------
    def _start_worker(self) -> None:
        self.client.fetch(self.progress(ahead=0))

    def _finish_worker(self) -> None:
        self.client.finish(self.progress(ahead=0))

    def _ask_save(self) -> None:
        self.client.save(self.progress(ahead=0))

    def forward_backward(
        self, module: nn.Module, batch: Any, loss_fn: LossFn, weight: float = 1.0
    ) -> float:
        if self.inconsistent:
            self.client.poll_answers()  # whatever parameters have landed since the last step
        return super().forward_backward(module, batch, loss_fn, weight)

    def step(self, step: int) -> None:
        self.client.step(self.optimizer, self.progress())
        self.last_comm_seconds = self.client.blocked


class AsyncMode(ParameterServerMode):
    """Asynchronous SGD, the baseline: a parameter server with inconsistent reads.

    Workers push every gradient and never wait for parameters (Hogwild style
    over MPI); the same options as :class:`ParameterServerMode` apply, and one more:

    - ``compensate_momentum`` (True): asynchrony adds momentum of its own
      (Mitliagkas et al. 2016, "Asynchrony begets momentum"): about ``1 - 1/W``
      with ``W`` workers. On top of SGD's ``momentum=0.9`` that makes well over 1:
      on 3 workers (tests/train_async/test_momentum.py) the final loss came out
      anywhere from 0.65 to chance (2.3) depending on how the workers were
      scheduled, against 0.86-0.91 every time with compensation. So the servers apply
      ``max(0, momentum - (1 - 1/W))`` (0.9 on 3 workers: 0.23), keeping explicit
      + implicit near what the optimizer asks; the first worker warns once with
      the numbers. ``trainer.mode.momentum`` holds them (requested, implicit,
      explicit, workers), ``None`` when nothing was changed (no SGD momentum, or an
      ``update="adam"`` rule). ``compensate_momentum=False`` applies the
      optimizer's momentum as given. The servers' ``stats["mean_delay"]`` is the
      measured average staleness, to compare with the ``W - 1`` assumed here.

    Example::

        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        trainer = Trainer(net, opt, F.cross_entropy, digits(), mode="async")
        trainer.fit(3)          # servers apply momentum 0.23 on 3 workers (4 ranks)
        trainer.mode.momentum   # MomentumPlan(requested=0.9, implicit=0.67, ...)
    """

    name = "async"

    def __init__(self, compensate_momentum: bool = True, **options: Any):
        if not isinstance(compensate_momentum, bool):
            raise ValueError(
                f"compensate_momentum must be True or False, got {compensate_momentum!r}"
            )
        options.setdefault("inconsistent", True)
        super().__init__(**options)
        self.compensate_momentum = compensate_momentum
        self.momentum: MomentumPlan | None = None

    def _rule_options(self, optimizer: torch.optim.Optimizer, workers: int) -> dict | None:
        if not self.compensate_momentum or workers < 1:  # no worker: setup explains
            return self.update_options
        options, self.momentum = compensated_momentum(
            optimizer, self.update, self.update_options, workers
        )
        return options

    def setup(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, group: comm.Group | None = None
    ) -> nn.Module:
        model = super().setup(model, optimizer, group)
        plan = self.momentum
        if plan is not None and not self.is_server and self.index == 0:
            warnings.warn(plan.message(), UserWarning, stacklevel=4)
        return model


register_mode(ParameterServerMode.name, ParameterServerMode)
register_mode(AsyncMode.name, AsyncMode)
