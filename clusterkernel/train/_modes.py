"""Training modes: how ranks cooperate inside :class:`~clusterkernel.train.Trainer`.

A mode is a small strategy object. The Trainer's loop calls, for every batch::

    loss = mode.forward_backward(module, batch, loss_fn)
    mode.after_backward()
    mode.before_step()
    mode.step(optimizer)
    mode.after_step(step)

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
from clusterkernel.train._ddp import DataParallel
from clusterkernel.train._pipeline import PipelineParallel

#: ``loss_fn(outputs, targets) -> loss``, e.g. ``torch.nn.functional.cross_entropy``
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_MODES: dict[str, type[TrainingMode]] = {}


def register_mode(name: str, cls: type[TrainingMode]) -> type[TrainingMode]:
    """Make ``Trainer(..., mode=name)`` use ``cls`` (a :class:`TrainingMode` subclass).

    Example::

        class EASGD(TrainingMode):
            replicated = False
            def after_step(self, step): ...   # elastic averaging every tau steps

        register_mode("easgd", EASGD)
        Trainer(model, opt, loss_fn, data, mode="easgd", mode_options={"tau": 4})
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
    """Base class of training modes; every hook has a do-nothing default.

    Class attributes tell the Trainer how to treat the mode:

    - ``shards_data``: each rank trains on its own shard of the data (True), or
      every rank walks the same batches (False, e.g. pipeline stages);
    - ``replicated``: every rank holds the same model and optimizer state after
      each step, so a checkpoint needs only rank 0's (True), or each rank's
      state is its own and is gathered (False);
    - ``lockstep``: every step is collective, so all ranks must run the same
      number of steps per epoch (checked before training starts).

    Example (a mode that averages parameters every ``k`` steps)::

        class PeriodicAverage(TrainingMode):
            name = "periodic"
            replicated = False      # replicas drift between averagings

            def __init__(self, k: int = 8):
                self.k = k

            def after_step(self, step: int) -> None:
                if step % self.k == 0:
                    average_parameters(self.model)   # your collective here

        register_mode("periodic", PeriodicAverage)
    """

    name: ClassVar[str] = "base"
    shards_data: ClassVar[bool] = True
    replicated: ClassVar[bool] = True
    lockstep: ClassVar[bool] = True
    #: ``optimizer.zero_grad(set_to_none=...)`` between steps; False keeps
    #: gradient tensors alive (DataParallel's live in its buckets)
    zero_grad_to_none: ClassVar[bool] = True
    #: the mode writes and reads checkpoints itself (:meth:`save_checkpoint`),
    #: e.g. parameter servers, whose ranks never meet in a collective mid-run
    own_checkpoints: bool = False
    #: this rank serves the others (a parameter server): it trains on no data
    serves: bool = False
    #: the ranks' gradients are averaged every step (synchronous data parallel):
    #: when their batches differ in size, the Trainer sets :attr:`loss_scale` to
    #: each rank's share, so the average is the global batch's gradient
    averages_gradients: ClassVar[bool] = False
    #: factor on the loss before ``backward`` (1 unless the Trainer weights shares)
    loss_scale: float = 1.0

    #: the ranks taking part (a ``comm.new_group`` group); None: all ranks
    group: comm.Group | None = None

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        """Prepare for training; return the module that forward passes go through."""
        return model

    def train_shard(self) -> tuple[int, int]:
        """``(index, count)``: which share of the training data this rank trains on."""
        return comm.rank(self.group), comm.size(self.group)

    def run(self, trainer: Any, train: Callable[[], None]) -> None:
        """Run ``train()``, the Trainer's epoch loop, on this rank.

        Modes whose ranks have other jobs override it: a parameter server serves
        the workers here instead of training; a worker fetches parameters first
        and says it is done after.
        """
        train()

    def forward_backward(self, module: nn.Module, batch: Any, loss_fn: LossFn) -> float:
        """Compute the loss of one batch and its gradients; return the loss."""
        x, y = batch
        loss = loss_fn(module(x), y)
        (loss * self.loss_scale if self.loss_scale != 1.0 else loss).backward()
        return loss.item()

    def after_backward(self) -> None:
        """After gradients are computed, before the optimizer is involved."""

    def before_step(self) -> None:
        """Right before ``step`` (e.g. wait for averaged gradients)."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply the update."""
        optimizer.step()

    def after_step(self, step: int) -> None:
        """After the update of global step ``step`` (e.g. periodic averaging)."""

    def predict(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """Outputs for evaluation, or ``None`` on ranks that produce none."""
        return module(x)

    def eval_shard(self) -> tuple[int, int]:
        """``(index, count)``: which strided share of evaluation data this rank takes."""
        return comm.rank(self.group), comm.size(self.group)

    def comm_seconds(self) -> float:
        """Seconds this rank spent communicating in the last step (0 if unknown)."""
        return 0.0

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The user's module inside whatever ``setup`` returned (for checkpoints)."""
        return module

    def state_dict(self) -> dict:
        """Mode state to checkpoint (e.g. a center variable); default none."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""

    def save_checkpoint(self, trainer: Any, path: Path) -> None:
        """Write a checkpoint this mode's own way (called when ``own_checkpoints``)."""
        raise NotImplementedError(f"mode {self.name!r} does not write its own checkpoints")

    def load_checkpoint(self, trainer: Any, path: Path) -> bool:
        """Restore from :meth:`save_checkpoint`'s files; False if there are none."""
        raise NotImplementedError(f"mode {self.name!r} does not read its own checkpoints")

    def teardown(self) -> None:
        """Undo ``setup`` side effects (hooks); called when the Trainer is closed."""


class LocalMode(TrainingMode):
    """No communication: each rank trains its own model on its own shard.

    The baseline for comparisons, and plain single-process training on one rank.

    Example::

        Trainer(model, opt, F.cross_entropy, data, mode="local").fit(3)
    """

    name = "local"
    replicated = False
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
    zero_grad_to_none = False
    averages_gradients = True

    def __init__(self, **dp_options: Any):
        self.dp_options = dp_options
        self.dp: DataParallel | None = None

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> DataParallel:
        # Passing the optimizer checks it across ranks and makes a bare
        # optimizer.step() safe too; the synchronize in before_step comes first,
        # so the step hook then finds nothing left to do.
        self.dp = DataParallel(model, optimizer=optimizer, group=self.group, **self.dp_options)
        return self.dp

    def before_step(self) -> None:
        self.dp.synchronize()

    def comm_seconds(self) -> float:
        return self.dp.last_comm_seconds

    def unwrap(self, module: DataParallel) -> nn.Module:
        return module.module

    def teardown(self) -> None:
        if self.dp is not None:
            self.dp.remove_hooks()


class PipelineMode(TrainingMode):
    """Pipeline model parallelism through :class:`PipelineParallel`.

    The model must be an ``nn.Sequential``; options ``balance`` and ``chunks`` go
    to ``PipelineParallel``. Every rank walks the same batches.

    Example (the loss is known on the last stage only)::

        Trainer(nn.Sequential(...), opt, F.cross_entropy, data, mode="pipeline",
                mode_options={"chunks": 4}).fit(3)
    """

    name = "pipeline"
    shards_data = False
    replicated = False

    def __init__(self, **pipe_options: Any):
        self.pipe_options = pipe_options

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> PipelineParallel:
        return PipelineParallel(model, group=self.group, **self.pipe_options)

    def forward_backward(self, module: PipelineParallel, batch: Any, loss_fn: LossFn) -> float:
        x, y = batch
        return module.train_step(x, y, loss_fn)

    def eval_shard(self) -> tuple[int, int]:
        return 0, 1

    def unwrap(self, module: PipelineParallel) -> nn.Module:
        return module.stage


for _cls in (LocalMode, AllReduceMode, PipelineMode):
    register_mode(_cls.name, _cls)
