"""A plain training loop that survives a rank's death inside its cell: :func:`steps`.

The per-step model of torchft, for one interactive job: each step of the loop is a
unit that is either applied on every rank or redone. With auto-respawn on
(``%mpi start --respawn``) a step whose collective finds a peer dead
(``comm.PeerDiedError``) is caught by its ``with step:`` block; the survivors bring the
dead rank back into the job (``rank._recovery.rejoin``), agree on where the loop is, and
the loop yields the same step again. The new rank runs the cell from the top: its
``steps`` loop starts at the agreed step, with the model's and the optimizer's state,
and the torch RNG, of the survivor that is furthest on.

Where the step is redone: a step fails before its optimizer step (the gradient
all-reduce is the usual place: ``DataParallel`` averages in the optimizer's pre-step
hook) and leaves no trace (the RNG is put back as it was at the step's start); a step
that failed after its optimizer step counts as done. Survivors that disagree (a
collective that completed on some ranks and failed on others) all take the state of
the furthest one, so no step is applied twice or lost.

A sharded (FSDP2) model cannot be handed over that way: each rank holds a shard, and
the dead rank's shards are gone. Its loop passes ``keep=``, a
:class:`~clusterkernel.torchdist.Keeper` saved every few steps inside ``with step:``:
after a recovery every rank, the new ones included, rebuilds the model and optimizer
on the new group from the newest surviving copy (``keep.restore()``) and the loop goes
on from the step of that save.

Without auto-respawn nothing is caught: the error ends the cell as it would without
the guard, and the notebook tells the death.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from clusterkernel.protocol._engine import recovery as _recovery
from clusterkernel.protocol._engine import world
from clusterkernel.train._furthest import Held, furthest, restore, snapshot


class Step:
    """One step of a :func:`steps` loop: ``step.index`` is its number; ``with step:``
    around the step's work marks it done, or redoes it after a peer's death."""

    def __init__(self, loop: _Loop, index: int) -> None:
        self._loop = loop
        self.index = index

    def __enter__(self) -> Step:
        self._loop.begin()
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> bool:
        return self._loop.end(exc)

    def __repr__(self) -> str:
        return f"Step({self.index})"


class _Loop:
    """The state of one :func:`steps` loop on this rank (see the module)."""

    def __init__(self, n: int, start: int, model: Any, optimizer: Any, keep: Any) -> None:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"steps(n): n must be a whole number of steps >= 0, got {n!r}")
        _check_keep(keep, model, optimizer)
        self.n = n
        self.index = start
        self.model = _inner(model)
        self.optimizer = optimizer
        self.keep = keep  # a Keeper: a recovery rebuilds its model from the last save
        self.done = False  # the current step's body ended without an error
        self.stepped = False  # the optimizer stepped during the current step
        self.rng: torch.Tensor | None = None  # the RNG at the current step's start
        self._hook = None

    def __iter__(self) -> Iterator[Step]:
        if self.optimizer is not None:
            self._hook = self.optimizer.register_step_post_hook(self._optimizer_stepped)
        try:
            copied_from = _recovery.take_joining()
            if copied_from is not None:  # a new rank: the survivors say where they are
                self.index = self._agree(None, None, copied_from)
            while True:
                while self.index < self.n:
                    self.done = False
                    yield Step(self, self.index)
                    if not self.done:
                        raise RuntimeError(
                            "steps(): put each step's work in a `with step:` block "
                            "(for step in steps(n):\n    with step:\n        ...)"
                        )
                if self._through_the_gate():
                    return
        finally:
            if self._hook is not None:
                self._hook.remove()

    def _through_the_gate(self) -> bool:
        """After the last step, with auto-respawn: the survivors agree (uniformly) that
        no peer died before any leaves the loop, so a peer that died in the last step is
        recovered with all of them (one whose last collective completed would have left,
        and the others would wait for it); False when a recovery moved the loop back to
        a step before the end."""
        if not _recovery.armed() or _recovery.agree(True):
            return True
        self.begin()
        self._recover(agreed=True)
        return self.index >= self.n and self._through_the_gate()

    def _optimizer_stepped(self, *_: Any) -> None:
        self.stepped = True

    def begin(self) -> None:
        self.stepped = False
        # only where a death can be recovered: then a failed step draws again what it drew
        self.rng = torch.get_rng_state() if _recovery.armed() else None

    def end(self, exc: BaseException | None) -> bool:
        """True (the error handled, the step to be redone or counted) after a recovery."""
        if exc is None:
            self.done = True
            self.index += 1
            return False
        if not _recovery.recovers(exc):
            return False
        if not self.stepped and self.rng is not None:
            torch.set_rng_state(self.rng)
        return self._recover(agreed=False, cause=exc)

    def _recover(self, agreed: bool, cause: BaseException | None = None) -> bool:
        position = self.index + 1 if self.stepped else self.index
        # taken before the recovery: re-attaching DataParallel models copies rank 0's
        # parameters to every rank, and rank 0 may be behind the furthest survivor
        mine = self._state()
        if not _recovery.rejoin(agreed=agreed, cause=cause):
            return False
        # the loop goes on from the agreed step: this one again, or the next
        self.index = self._agree(position, mine)
        self.done = True
        return True

    def _agree(
        self, position: int | None, mine: Held | None, copied_from: int | None = None
    ) -> int:
        """Collective over the world after a recovery: the position of the survivor that
        is furthest on (a new rank has ``position`` None); the ranks behind it (the new
        ones among them) take its model, optimizer and RNG (``mine``: a survivor's state
        at its failure; ``copied_from``: on a new rank, where its variables came from).
        With a keeper: the step of its newest surviving save, every rank rebuilt from it."""
        if self.keep is not None:
            return self._restored()
        _refuse_sharded()
        refuse = None
        if self.model is None:
            refuse = (
                "steps(): after a rank's death the survivors disagree on the step "
                "({positions}), and the loop has no model to copy: pass model= and "
                "optimizer= to steps() so the ranks behind take the state of the one "
                "furthest on"
            )
        best, state = furthest(position, mine, refuse, copied_from)
        if state is not None:
            restore(state, self.model, self.optimizer)
            self.stepped = False
        return best

    def _restored(self) -> int:
        """``keep.restore()`` on every rank of the new default group (collective): the
        model and optimizer built again and loaded from the newest kept copy, the user's
        names bound to them. A death during it is recovered as one in a step (the new
        rank runs the cell from the top and joins the restore at its loop's start)."""
        while True:
            try:
                step = self.keep.restore()
            except Exception as e:
                if not _recovery.recovers(e) or not _recovery.rejoin(cause=e):
                    raise
                continue
            self.stepped = False
            if world().Get_rank() == 0:  # the notice says a rank came back; this, from where
                print(
                    f"train.steps: rebuilt from keep's save at step {step}; "
                    f"the steps from {step} on are done again",
                    flush=True,
                )
            return step

    def _state(self) -> Held | None:
        # with a keeper the loop goes back to its save: no rank's own state is handed over
        return snapshot(self.model, self.optimizer) if self.keep is None else None


def _check_keep(keep: Any, model: Any, optimizer: Any) -> None:
    """``steps()``'s ``keep=`` refused where the loop could not recover with it, and an
    FSDP2 model refused as ``model=`` (a survivor's shard is not the whole model)."""
    if keep is None:
        if hasattr(model, "_get_fsdp_state"):
            raise TypeError(
                "steps(): model is an FSDP2 (fully_shard) model: each rank holds only a "
                "shard of it, so no survivor can hand it to a new rank. Make it with "
                "keep = torchdist.Keeper(build), save it inside `with step:` "
                "(keep.save(step.index + 1) every few steps) and pass "
                "steps(n, keep=keep) instead of model= and optimizer=."
            )
        return
    from clusterkernel.torchdist._keep import Keeper

    if not isinstance(keep, Keeper):
        raise TypeError(
            f"steps(): keep must be a torchdist.Keeper (keep = torchdist.Keeper(build)), "
            f"got {type(keep).__name__}"
        )
    if model is not None or optimizer is not None:
        raise ValueError(
            "steps(): pass keep= alone: the loop trains the keeper's model and optimizer "
            "(keep.model, keep.optimizer), rebuilt from its last save after a death; "
            "drop model= and optimizer="
        )


def _refuse_sharded() -> None:
    """After a recovery, on every rank (collective over the world): a RuntimeError where
    any rank's namespace holds an FSDP2 model and the loop has no keeper. Its shards
    are on the group the death closed, and the dead rank's are gone: a step on it would
    hang or train a wrong model."""
    from clusterkernel.torchdist._rewrap import held_models

    sharded = sorted(set().union(*world().allgather(held_models()["fsdp"])))
    if sharded:
        what = "is an FSDP2 (fully_shard) model" if len(sharded) == 1 else "are FSDP2 models"
        raise RuntimeError(
            f"steps(): {', '.join(sharded)} {what} and cannot go on after a rank's death: "
            "each rank held a shard on the group the death closed. "
            "Make it with keep = torchdist.Keeper(build), save it inside `with step:` "
            "(keep.save(step.index + 1) every few steps) and loop with "
            "train.steps(n, keep=keep); keep.restore() rebuilds it now from its last save."
        )


def _inner(model: Any) -> Any:
    """The module whose state the loop hands over: a ``DistributedDataParallel``'s own
    (the recovery wraps the module again on the new group; the loop must not keep the old
    wrapper, whose gradient hooks would still fire on the closed group)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def steps(
    n: int, model: Any = None, optimizer: Any = None, start: int = 0, keep: Any = None
) -> Iterator[Step]:
    """The steps ``start .. n-1`` of a training loop, each redone on every rank if a peer
    dies in it and auto-respawn (``%mpi start --respawn``) brings the peer back.

    Write the step's work inside ``with step:``, and take its data by ``step.index`` (so
    that a step done again, or on a new rank, reads the same batch). Pass the ``model``
    and ``optimizer`` the loop trains: a rank that joins, or a survivor that is behind,
    takes them from the survivor furthest on. Keep the set-up (model, optimizer,
    ``DataParallel``, data) in an earlier cell: a new rank gets it by the copy of a
    survivor's variables and runs only the loop's cell.

    Example (on every rank; with ``DataParallel`` the loop is the same, ``opt.step()``
    then averages the gradients)::

        import torch
        from clusterkernel import comm, train
        net = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in train.steps(3, model=net, optimizer=opt):
            with step:
                g = torch.Generator().manual_seed(10 * step.index + comm.rank())
                opt.zero_grad()
                net(torch.randn(8, 4, generator=g)).square().mean().backward()
                for p in net.parameters():
                    comm.all_reduce(p.grad, op=comm.AVG)
                opt.step()
        print(step.index)        # 2

    A sharded model (FSDP2, ``fully_shard``) goes in a
    :class:`~clusterkernel.torchdist.Keeper` instead: pass ``keep=`` (not ``model=`` or
    ``optimizer=``) and call ``keep.save(step.index + 1)`` every few steps inside
    ``with step:``, after the optimizer step. After a death every rank (the new ones
    too) calls ``keep.restore()`` on the new default group: ``build()`` runs again, the
    newest surviving copy is loaded, your names (``model``, ``opt``) are bound to the new
    model and optimizer, and the loop goes on from that save's step (``keep.step``),
    redoing the steps since. A death during a save is one in its step: the loop goes
    back to the newest copy a survivor holds, that save's or the one before. Randomness
    the loop draws is not kept: seed it by ``step.index``. An FSDP2 model passed as
    ``model=`` is refused; a loop without ``keep=`` while the namespace holds one fails
    after a death, on every rank, saying what to do.

    Example (on every rank, with a torch default group: ``%mpi start --torch``)::

        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from clusterkernel import torchdist, train
        if not dist.is_initialized():
            dist.init_process_group()
        def build():
            torch.manual_seed(0)
            net = fully_shard(torch.nn.Linear(4, 1))
            return net, torch.optim.Adam(net.parameters(), lr=0.1)
        keep = torchdist.Keeper(build)
        model, opt = keep.model, keep.optimizer
        for step in train.steps(6, keep=keep):
            with step:
                g = torch.Generator().manual_seed(10 * step.index + dist.get_rank())
                opt.zero_grad()
                model(torch.randn(8, 4, generator=g)).square().mean().backward()
                opt.step()
                if (step.index + 1) % 3 == 0:
                    keep.save(step.index + 1)
        print(keep.step)         # 6
    """
    return iter(_Loop(n, start, model, optimizer, keep))
