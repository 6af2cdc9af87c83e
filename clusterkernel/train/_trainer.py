"""A torchnet-style training engine whose distribution strategy is a pluggable mode."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from clusterkernel import comm, metrics
from clusterkernel.partition import Partition, distributed_loader, set_epoch
from clusterkernel.protocol import _engine
from clusterkernel.protocol._engine import recovery as _recovery
from clusterkernel.train._checkpoint import CHECKPOINT_NAME
from clusterkernel.train._furthest import Held, furthest, restore, snapshot
from clusterkernel.train._modes import TrainingMode, make_mode
from clusterkernel.train._prefetch import Prefetcher, spare_core
from clusterkernel.train._sync import all_objects

EVENTS = ("on_start", "on_batch_end", "on_epoch_end", "on_end")


class Trainer:
    """Train a model with ``fit``, measure it with ``evaluate``, on every rank.

    ``mode`` decides how ranks cooperate: ``"allreduce"`` (synchronous data
    parallel through :class:`DataParallel`), ``"pipeline"`` (stages of an
    ``nn.Sequential`` through :class:`PipelineParallel`), ``"local"`` (no
    communication), or any mode added with :func:`register_mode`. Options for the
    mode go in ``mode_options``.

    Example (on every rank)::

        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        trainer = Trainer(net, opt, nn.functional.cross_entropy, digits(),
                          batch_size=128, checkpoint_dir="ckpt")
        trainer.add_hook("on_epoch_end", lambda t: print(t.epoch, t.last_loss))
        trainer.fit(epochs=5)
        print(trainer.evaluate(test_set))   # {"loss": ..., "accuracy": ..., "samples": ...}

    Args:
        model, optimizer, loss_fn: as in a single-process loop; ``loss_fn`` should
            average over the batch.
        train_data: a ``Dataset`` (the Trainer builds this rank's loader:
            ``batch_size`` is the global batch, split over the ranks, reshuffled
            every epoch from ``seed``) or any iterable of ``(x, y)`` batches that
            is already this rank's share. A global batch the ranks do not divide
            is split as evenly as possible (64 over 3 ranks: 22/21/21); in
            ``allreduce`` mode each rank's loss is weighted by its share, so a
            step equals one process's step on the whole global batch.
        hooks: ``{event: fn or [fn, ...]}``; events are ``on_start``,
            ``on_batch_end``, ``on_epoch_end``, ``on_end``; each ``fn(trainer)``.
        checkpoint_dir: where rank 0 writes ``checkpoint.pt`` (at the end of every
            epoch, and every ``checkpoint_every`` steps if set); ``fit(resume=True)``
            or :meth:`load_checkpoint` continue from it.
        prefetch: load the next batch in a background thread while the current
            one computes: ``True``, ``False``, or ``"auto"`` (only when the thread
            gets a core of its own, see :func:`spare_core`).
        log_every: log per-rank ``loss``, ``samples_per_s`` and ``comm_s`` to the
            metrics recorder every this many steps.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        train_data: Dataset | Iterable,
        mode: str | TrainingMode = "allreduce",
        *,
        mode_options: dict | None = None,
        batch_size: int = 128,
        seed: int = 0,
        hooks: dict[str, Callable | list[Callable]] | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        prefetch: bool | str = "auto",
        log_every: int = 1,
        group: comm.Group | None = None,
    ):
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.group = group
        self.batch_size = batch_size
        self.seed = seed
        if prefetch not in (True, False, "auto"):
            raise ValueError(f"prefetch must be True, False or 'auto', got {prefetch!r}.")
        self.prefetch = spare_core(comm.size(group)) if prefetch == "auto" else prefetch
        self.log_every = max(1, int(log_every))
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        if checkpoint_every is not None and checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1 step, got {checkpoint_every}.")
        self.checkpoint_every = checkpoint_every
        self.rank = comm.rank(group)
        self.world = comm.size(group)

        self.mode = make_mode(mode, mode_options)
        self.module = self.mode.setup(model, optimizer, group)
        self._train_data = train_data  # a respawned rank builds its own share from it
        self.train_loader = self._loader(train_data, shuffle=True)

        self.hooks: dict[str, list[Callable]] = {e: [] for e in EVENTS}
        for event, fns in (hooks or {}).items():
            for fn in fns if isinstance(fns, list | tuple) else [fns]:
                self.add_hook(event, fn)

        self.epoch = 0  # epochs finished
        self.step_in_epoch = 0  # batches finished in the current epoch
        self.global_step = 0
        self.last_loss: float | None = None
        self.history: list[dict] = []  # one entry per epoch: mean loss, time, samples/s
        self._recorder = metrics.recorder()

    def __getstate__(self) -> dict:
        # a copy (respawn --from R) records into the metrics of the process it lands in
        return {k: v for k, v in vars(self).items() if k != "_recorder"}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self._recorder = metrics.recorder()

    # -- setup helpers ----------------------------------------------------------
    def _loader(self, data: Dataset | Iterable, shuffle: bool) -> Iterable:
        if not isinstance(data, Dataset) or isinstance(data, DataLoader):
            return data  # the caller's own iterable: already this rank's share
        index, count = self.mode.shard()
        return distributed_loader(
            data, self.batch_size, shuffle=shuffle, seed=self.seed, size=count, rank=index
        )

    def add_hook(self, event: str, fn: Callable[[Trainer], Any]) -> None:
        """Call ``fn(trainer)`` at ``event`` (one of :data:`EVENTS`)."""
        if event not in self.hooks:
            raise ValueError(f"unknown hook event {event!r}; use one of {EVENTS}.")
        if not callable(fn):
            raise TypeError(f"hook for {event} must be callable, got {fn!r}.")
        self.hooks[event].append(fn)

    def _fire(self, event: str) -> None:
        for fn in self.hooks[event]:
            fn(self)

    def _batches_per_epoch(self) -> int | None:
        try:
            return len(self.train_loader)
        except TypeError:
            return None

    # -- training ---------------------------------------------------------------
    def fit(self, epochs: int, resume: bool = False) -> list[dict]:
        """Train until ``epochs`` epochs are done in total; returns :attr:`history`.

        With ``resume=True`` first load the checkpoint from ``checkpoint_dir`` (if
        there is one) and continue from the step it was written at.

        With auto-respawn (``%mpi start --respawn``) a rank that dies during ``fit`` is
        replaced within it: the survivors wait for the new rank at the step that
        failed, it takes rank 0's copy of the trainer (model, optimizer, step, its own
        data share and RNG) and every rank redoes that step. Survivors a step apart
        (the step's all-reduce completed on some of them only) all go on from the one
        furthest on, with its model, optimizer, RNG and progress.
        """
        self._take_over_after_respawn(copied_from=_recovery.take_joining())
        if resume:
            self.load_checkpoint()
        self._ready()
        self._fire("on_start")
        while True:
            try:
                self.mode.run(self, lambda: self._train_epochs(epochs))
            except RuntimeError as e:  # comm.PeerDiedError, or MPI's own error for it
                # auto-respawn: the dead rank is replaced now, and the step that failed
                # (it left no trace: see _run_epoch) runs again on the N ranks; the new
                # rank's fit starts as a fit does, so the survivors' goes on the same way
                if not _recovery.recovers(e):
                    raise
                mine: Held | None = self._snapshot()  # before rejoin re-attaches rank 0's model
                if not _recovery.rejoin(cause=e):
                    raise
            else:
                # every rank agrees no peer died before any leaves fit: one that died in
                # the last step is recovered with all the survivors (see train.steps)
                mine = self._died_at_the_end()
                if mine is None:
                    break
            self._take_over_after_respawn(mine)
            self._ready()
        self._fire("on_end")
        return self.history

    def _ready(self) -> None:
        self.mode.check_batches(self._batches_per_epoch())
        self.module.train()

    def _died_at_the_end(self) -> Held | None:
        """With auto-respawn, on a Trainer of every rank: when the ranks' agreement at the
        end of fit finds a peer dead (then recovered here, as a failed step is), this
        rank's :meth:`_snapshot` from before the recovery; else None."""
        if not _recovery.armed() or comm.size(self.group) != comm.size():
            return None
        if _recovery.agree(True):
            return None
        mine = self._snapshot()
        if not _recovery.rejoin(agreed=True):
            raise RuntimeError("fit: a peer died at the end of fit and was not recovered")
        return mine

    def _snapshot(self) -> Held:
        """Model, optimizer, RNG and progress: what a rank behind takes after a recovery."""
        return snapshot(
            self.model,
            self.optimizer,
            epoch=self.epoch,
            step_in_epoch=self.step_in_epoch,
            global_step=self.global_step,
            history=self.history,
            last_loss=self.last_loss,
        )

    def _take_over_after_respawn(
        self, mine: Held | None = None, copied_from: int | None = None
    ) -> None:
        """A Trainer copied onto a respawned rank (``%mpi respawn --from R``) holds rank
        R's share of the data: that rank takes its own, and R's torch RNG state (every
        rank's is the same where they seeded alike, as data parallel training does).
        Collective in a job that saw a respawn (one small gather when no rank moved);
        nothing otherwise.

        After a recovery inside the cell (``mine``: a survivor's :meth:`_snapshot` from
        before it; ``copied_from``: on a new rank, where its variables came from) every
        rank first takes the state of the survivor that is furthest on: a step whose
        collective completed on some survivors only leaves them a step apart (as
        ``train.steps`` does)."""
        if not _engine.replaced():
            return
        if mine is not None or copied_from is not None:
            position = self.global_step if mine is not None else None
            _, state = furthest(position, mine, copied_from=copied_from)
            if state is not None:
                progress = restore(state, self.model, self.optimizer)
                self.epoch = progress["epoch"]
                self.step_in_epoch = progress["step_in_epoch"]
                self.global_step = progress["global_step"]
                self.history = progress["history"]
                self.last_loss = progress["last_loss"]
        now = comm.rank(self.group)
        was = all_objects((self.rank, now), self.group)
        if all(copied == rank for copied, rank in was):
            return
        states = all_objects(torch.get_rng_state(), self.group)
        if self.rank != now:
            torch.set_rng_state(states[self.rank])
            self.rank = now
            self.train_loader = self._loader(self._train_data, shuffle=True)

    def _train_epochs(self, epochs: int) -> None:
        while self.epoch < epochs:
            self._run_epoch()
            self.epoch += 1
            self.step_in_epoch = 0
            self._fire("on_epoch_end")
            if self.checkpoint_dir is not None:
                self.save_checkpoint()

    def _batches(self):
        set_epoch(self.train_loader, self.epoch)
        it: Iterable = self.train_loader
        if self.step_in_epoch:
            # resumed mid-epoch: the sampler replays this epoch's order, skip what's done
            it = itertools.islice(it, self.step_in_epoch, None)
        return Prefetcher(it) if self.prefetch else _Plain(it)

    def _run_epoch(self) -> None:
        mode, rec = self.mode, self._recorder
        weight = _batch_weight(self.train_loader)
        loss_sum, samples, t_epoch = 0.0, 0, time.perf_counter()
        with self._batches() as batches:
            for batch in batches:
                t0 = time.perf_counter()
                share = weight(self.step_in_epoch) if weight is not None else 1.0
                rng = torch.get_rng_state()
                try:
                    with rec.span("forward_backward"):
                        loss = mode.forward_backward(self.module, batch, self.loss_fn, share)
                    with rec.span("optimizer_step"):
                        mode.step(self.global_step + 1)
                except BaseException:
                    # a step that failed (a rank died in its all-reduce) leaves no trace:
                    # run again after a respawn, it draws what it drew (dropout) the first time
                    torch.set_rng_state(rng)
                    raise
                self.global_step += 1
                self.step_in_epoch += 1
                dt = time.perf_counter() - t0
                n = len(batch[0])
                loss_sum += loss * n
                samples += n
                self.last_loss = loss
                if self.global_step % self.log_every == 0:
                    rec.log(
                        step=self.global_step,
                        loss=loss,
                        samples_per_s=n / dt if dt > 0 else 0.0,
                        comm_s=mode.last_comm_seconds,
                    )
                self._fire("on_batch_end")
                if (
                    self.checkpoint_dir is not None
                    and self.checkpoint_every
                    and self.global_step % self.checkpoint_every == 0
                ):
                    self.save_checkpoint()
        elapsed = time.perf_counter() - t_epoch
        self.history.append(
            {
                "epoch": self.epoch,
                "loss": loss_sum / samples if samples else float("nan"),
                "seconds": elapsed,
                "samples_per_s": samples / elapsed if elapsed > 0 else 0.0,
            }
        )

    # -- evaluation ---------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, data: Dataset | Iterable, batch_size: int | None = None) -> dict:
        """Loss and accuracy over ``data``, combined over all ranks (collective).

        A ``Dataset`` is split without padding: rank ``r`` of ``n`` takes samples
        ``r, r + n, ...``, so every sample counts once. Any other iterable is
        taken as this rank's share. Accuracy is reported when outputs are class
        scores and targets are class indices.
        """
        if isinstance(data, Dataset) and not isinstance(data, DataLoader):
            index, count = self.mode.shard()
            share = Partition(data, range(index, len(data), count))
            # its own generator: evaluating must not move the training's RNG
            data = DataLoader(
                share, batch_size=batch_size or self.batch_size, generator=torch.Generator()
            )
        self.module.eval()
        totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, samples
        try:
            for x, y in data:
                out = self.mode.predict(self.module, x)
                if out is None:
                    continue
                totals[0] += float(self.loss_fn(out, y)) * len(y)
                if out.dim() == 2 and not y.is_floating_point():
                    totals[1] += (out.argmax(dim=1) == y).sum().item()
                totals[2] += len(y)
        finally:
            self.module.train()
        comm.all_reduce(totals, op=comm.SUM, group=self.group)
        loss_sum, correct, n = totals.tolist()
        if n == 0:
            raise ValueError("evaluate() got no samples on any rank.")
        return {"loss": loss_sum / n, "accuracy": correct / n, "samples": int(n)}

    # -- checkpoints --------------------------------------------------------------
    def _checkpoint_path(self, path: str | os.PathLike | None) -> Path:
        if path is not None:
            return Path(path)
        if self.checkpoint_dir is None:
            raise ValueError("no checkpoint path: pass one or set Trainer(checkpoint_dir=...).")
        return self.checkpoint_dir / CHECKPOINT_NAME

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Write model, optimizer, mode, progress and RNG state (collective).

        The mode decides the layout (:meth:`TrainingMode.save_state`): a
        replicated mode's rank 0 writes its state for all, other modes gather
        every rank's state into the file, parameter servers write one file per
        server. Every rank's torch RNG state is saved, and restored on resume
        with the same number of ranks, so random layers (dropout) draw the same
        numbers as in an uninterrupted run.
        """
        path = self._checkpoint_path(path)
        self.mode.save_state(self, path)
        return path

    def load_checkpoint(self, path: str | os.PathLike | None = None) -> bool:
        """Restore from a checkpoint on every rank; False (everywhere) if none exists."""
        return self.mode.load_state(self, self._checkpoint_path(path))

    def close(self) -> None:
        """Remove the mode's hooks from the model (it stays usable alone)."""
        self.mode.teardown()


class _Plain:
    """The no-prefetch counterpart of :class:`Prefetcher` (same context protocol)."""

    def __init__(self, it: Iterable):
        self._it = it

    def __iter__(self):
        return iter(self._it)

    def __enter__(self) -> _Plain:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _batch_weight(loader: Iterable) -> Callable[[int], float] | None:
    """``weight(k)`` of a loader whose ranks' batches differ in size, else None."""
    for s in (getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
        if callable(getattr(s, "weight", None)):
            return s.weight
    return None
