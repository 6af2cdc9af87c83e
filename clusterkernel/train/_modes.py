"""Training modes: how ranks cooperate inside :class:`~clusterkernel.train.Trainer`.

A mode is a small strategy object. For every batch the Trainer's loop calls::

    loss = mode.forward_backward(module, batch, loss_fn, weight)
    mode.step(global_step)

and never needs to know which mode it runs. New modes (parameter server, async
SGD, EASGD, gossip, ...) subclass :class:`TrainingMode`, override the hooks they
need, and call :func:`register_mode`; the Trainer picks them up by name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from clusterkernel import comm
from clusterkernel.train._checkpoint import Progress, load_shared, save_shared
from clusterkernel.train._ddp import DataParallel
from clusterkernel.train._pipeline import PipelineParallel
from clusterkernel.train._sync import all_objects

#: ``loss_fn(outputs, targets) -> loss``, e.g. ``torch.nn.functional.cross_entropy``
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_MODES: dict[str, type[TrainingMode]] = {}


def register_mode(name: str, cls: type[TrainingMode]) -> type[TrainingMode]:
    """Make ``Trainer(..., mode=name)`` use ``cls`` (a :class:`TrainingMode` subclass).

    Example::

        class Elastic(TrainingMode):
            def __init__(self, tau: int = 8):   # mode_options are its arguments
                self.tau = tau

            def step(self, step):
                super().step(step)              # the local update; then, every tau
                ...                             # steps, your averaging

        register_mode("elastic", Elastic)
        Trainer(net, opt, loss_fn, data, mode="elastic", mode_options={"tau": 4}).fit(1)
    """
    if not (isinstance(cls, type) and issubclass(cls, TrainingMode)):
        raise TypeError(f"register_mode needs a TrainingMode subclass, got {cls!r}.")
    if not name or not isinstance(name, str):
        raise ValueError(f"mode name must be a non-empty string, got {name!r}.")
    _MODES[name] = cls
    return cls


def available_modes() -> list[str]:
    """Names accepted by ``Trainer(mode=...)``.

    Example::

        available_modes()   # ['allreduce', 'local', 'pipeline', ...]
    """
    return sorted(_MODES)


def make_mode(mode: str | TrainingMode, options: dict | None = None) -> TrainingMode:
    """A mode instance from a registered name (with options) or an instance."""
    if isinstance(mode, TrainingMode):
        if options:
            raise ValueError("mode_options only apply when mode is given by name.")
        return mode
    cls = _MODES.get(mode) if isinstance(mode, str) else None
    if cls is None:
        raise ValueError(f"unknown training mode {mode!r}; available: {available_modes()}.")
    return cls(**(options or {}))


class TrainingMode:
    """Base class of training modes; every hook has a working default.

    The Trainer calls these, on every rank, and never branches on which mode runs::

        module = mode.setup(model, optimizer, group)   # once
        index, count = mode.shard()                     # this rank's share of the data
        mode.check_batches(batches_per_epoch)           # before fit (collective)
        mode.run(trainer, train)                        # fit: train() is the epoch loop
        loss = mode.forward_backward(module, batch, loss_fn, weight)   # every batch
        mode.step(global_step)                                          # every batch
        out = mode.predict(module, x)                   # evaluate
        mode.save_state(trainer, path)                  # checkpoints (collective)
        mode.load_state(trainer, path)
        mode.teardown()                                 # Trainer.close

    and reads :attr:`serves` and :attr:`last_comm_seconds`. Checkpoints hold
    :meth:`state_dict` (model, optimizer and the mode's own state); by default
    every rank's is gathered into one file.

    Example (a mode that averages parameters every ``k`` steps)::

        class PeriodicAverage(TrainingMode):
            name = "periodic"

            def __init__(self, k: int = 8):
                self.k = k

            def step(self, step: int) -> None:
                super().step(step)
                if step % self.k == 0:               # your collective here
                    for p in self.model.parameters():
                        comm.all_reduce(p.data, op=comm.AVG)

        register_mode("periodic", PeriodicAverage)
        Trainer(net, opt, F.cross_entropy, data, mode="periodic").fit(1)
    """

    name: ClassVar[str] = "base"
    #: every step is collective, so all training ranks must run the same number
    #: of steps per epoch (checked before training starts)
    lockstep: ClassVar[bool] = True

    #: set by :meth:`setup`: this rank's model (what checkpoints hold), its
    #: optimizer, and the ranks taking part (a ``comm.new_group`` group; None: all)
    model: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    group: comm.Group | None = None
    #: seconds this rank spent communicating in the last step (0 if unknown)
    last_comm_seconds: float = 0.0

    @property
    def serves(self) -> bool:
        """This rank serves the others (a parameter server): it trains on no data."""
        return False

    # -- lifecycle --------------------------------------------------------------
    def setup(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, group: comm.Group | None = None
    ) -> nn.Module:
        """Prepare for training; return the module that forward passes go through.

        Subclasses call ``super().setup(model, optimizer, group)`` first.
        """
        self.model, self.optimizer, self.group = model, optimizer, group
        return model

    def run(self, trainer: Progress, train: Callable[[], None]) -> None:
        """Run ``train()``, the Trainer's epoch loop, on this rank.

        Modes whose ranks have other jobs override it: a parameter server serves
        the workers here instead of training; a worker fetches parameters first
        and says it is done after.
        """
        train()

    def teardown(self) -> None:
        """Undo ``setup`` side effects (hooks); called when the Trainer is closed."""

    # -- data -------------------------------------------------------------------
    def shard(self) -> tuple[int, int]:
        """``(index, count)``: which share of the training and evaluation data this rank takes."""
        return comm.rank(self.group), comm.size(self.group)

    def check_batches(self, count: int | None) -> None:
        """Raise on every rank if the ranks' batch counts cannot work (collective).

        ``count`` is this rank's batches per epoch (None: unknown, the caller
        vouches). Ranks that serve are not checked; every other rank needs at
        least one batch and, if the mode is :attr:`lockstep`, the same number.
        """
        reports = all_objects((self.serves, count), self.group)
        ranks = [r for r, (serves, _) in enumerate(reports) if not serves]
        counts = [reports[r][1] for r in ranks]
        if any(c is None for c in counts):
            return  # iterables without a length: the caller vouches for them
        empty = [r for r, c in zip(ranks, counts) if c == 0]
        if empty:
            raise ValueError(
                f"rank(s) {empty} have no training batches (an empty data shard); batch "
                f"counts per rank: {counts}. Give every rank data, e.g. with "
                "distributed_loader() or DistributedSampler, or use fewer ranks."
            )
        if self.lockstep and len(set(counts)) > 1:
            raise ValueError(
                f"ranks have different numbers of batches per epoch: {counts}; they would "
                "fall out of step in the collectives. Shard with distributed_loader() or "
                "DistributedSampler (equal shards by padding or dropping)."
            )

    # -- one batch --------------------------------------------------------------
    def forward_backward(
        self, module: nn.Module, batch: Any, loss_fn: LossFn, weight: float = 1.0
    ) -> float:
        """Clear the gradients, compute the loss of one batch and its gradients.

        ``weight`` is this rank's share of the global batch relative to an even
        split (1.0 unless the ranks' batches differ in size); modes that average
        gradients over ranks scale the loss by it. The default ignores it.
        Returns the loss.
        """
        self._optimizer().zero_grad()
        return self._backward(module, batch, loss_fn)

    def step(self, step: int) -> None:
        """Apply the update of global step ``step`` (1 for the first)."""
        self._optimizer().step()

    def predict(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """Outputs for evaluation, or ``None`` on ranks that produce none."""
        return module(x)

    def _optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError(
                f"mode {self.name!r} has no optimizer: its setup() must call "
                "super().setup(model, optimizer, group)."
            )
        return self.optimizer

    def _backward(
        self, module: nn.Module, batch: Any, loss_fn: LossFn, scale: float = 1.0
    ) -> float:
        x, y = batch
        loss = loss_fn(module(x), y)
        (loss * scale if scale != 1.0 else loss).backward()
        return loss.item()

    # -- state ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state: model, optimizer, and the mode's own under ``"mode"``."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self._optimizer().state_dict(),
            "mode": {},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.model.load_state_dict(state["model"])
        self._optimizer().load_state_dict(state["optimizer"])

    def save_state(self, trainer: Progress, path: Path) -> None:
        """Write a checkpoint to ``path`` (collective).

        Default: rank 0 writes one file with every rank's :meth:`state_dict`,
        the Trainer's progress and every rank's RNG state.
        """
        save_shared(
            path, self.state_dict(), trainer, mode=self.name, replicated=False, group=self.group
        )

    def load_state(self, trainer: Progress, path: Path) -> bool:
        """Restore from :meth:`save_state`'s files, progress included; False if there are none."""
        return load_shared(path, trainer, self.load_state_dict, mode=self.name, group=self.group)


class LocalMode(TrainingMode):
    """No communication: each rank trains its own model on its own shard.

    The baseline for comparisons, and plain single-process training on one rank.

    Example::

        Trainer(model, opt, F.cross_entropy, data, mode="local").fit(3)
    """

    name = "local"
    lockstep = False


class AllReduceMode(TrainingMode):
    """Synchronous data parallel SGD through :class:`DataParallel`.

    Options go to ``DataParallel``: ``bucket_bytes``, ``compression``, ``buffers``.
    It is the Trainer's default mode. A global batch the ranks do not divide is
    split as evenly as possible (64 over 3: 22/21/21) and each rank's loss is
    scaled by ``3 * 22/64`` or ``3 * 21/64`` before the average, so every step is
    the step one process would take on the whole batch.

    Example::

        Trainer(model, opt, F.cross_entropy, data, mode="allreduce",
                mode_options={"compression": "fp16"}).fit(3)
    """

    name = "allreduce"

    def __init__(self, **dp_options: Any):
        self.dp_options = dp_options
        self.dp: DataParallel | None = None

    def setup(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, group: comm.Group | None = None
    ) -> DataParallel:
        super().setup(model, optimizer, group)
        # Passing the optimizer checks it across ranks and makes a bare
        # optimizer.step() safe too; forward_backward synchronizes first, so the
        # step hook then finds nothing left to do.
        self.dp = DataParallel(model, optimizer=optimizer, group=group, **self.dp_options)
        return self.dp

    def forward_backward(
        self, module: nn.Module, batch: Any, loss_fn: LossFn, weight: float = 1.0
    ) -> float:
        # the gradients live in DataParallel's buckets: set_to_none would make
        # backward allocate fresh ones, copied into the buckets every step
        self._optimizer().zero_grad(set_to_none=False)
        loss = self._backward(module, batch, loss_fn, weight)
        self.dp.synchronize()  # the averaged gradients, as one process's backward gives
        self.last_comm_seconds = self.dp.last_comm_seconds
        return loss

    def save_state(self, trainer: Progress, path: Path) -> None:
        # every rank holds the same model and optimizer: rank 0's stands for all
        save_shared(
            path, self.state_dict(), trainer, mode=self.name, replicated=True, group=self.group
        )

    def teardown(self) -> None:
        if self.dp is not None:
            self.dp.remove_hooks()


class PipelineMode(TrainingMode):
    """Pipeline model parallelism through :class:`PipelineParallel`.

    The model must be an ``nn.Sequential``; options ``balance`` and ``chunks`` go
    to ``PipelineParallel``. Every rank walks the same batches, and keeps (and
    checkpoints) its own stage.

    Example (the loss is known on the last stage only)::

        net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                            nn.Linear(32, 10))       # stages balanced by size over the ranks
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        Trainer(net, opt, F.cross_entropy, data, mode="pipeline",
                mode_options={"chunks": 4}).fit(3)
    """

    name = "pipeline"

    def __init__(self, **pipe_options: Any):
        self.pipe_options = pipe_options

    def setup(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, group: comm.Group | None = None
    ) -> PipelineParallel:
        super().setup(model, optimizer, group)
        pipe = PipelineParallel(model, group=group, **self.pipe_options)
        self.model = pipe.stage  # this rank's part of the model: what its checkpoint holds
        return pipe

    def shard(self) -> tuple[int, int]:
        return 0, 1  # every stage sees every batch

    def forward_backward(
        self, module: PipelineParallel, batch: Any, loss_fn: LossFn, weight: float = 1.0
    ) -> float:
        self._optimizer().zero_grad()
        x, y = batch
        return module.train_step(x, y, loss_fn)


for _cls in (LocalMode, AllReduceMode, PipelineMode):
    register_mode(_cls.name, _cls)
