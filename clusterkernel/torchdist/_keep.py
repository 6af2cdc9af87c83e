"""A sharded model that outlives a rank's death: its full state kept, rebuilt on a new group.

An FSDP2 (``fully_shard``) model holds one shard of every parameter on each rank:
when a rank dies, its shards are gone, and no survivor can rebuild the model from
what it holds. A :class:`Keeper` keeps what is needed: at each :meth:`Keeper.save`
(a step the user picks) torch's distributed-checkpoint functions gather the model's
and optimizer's full state (``get_model_state_dict`` / ``get_optimizer_state_dict``,
``full_state_dict=True, cpu_offload=True``) to rank 0, which sends it on to the
next ``copies - 1`` ranks: one death leaves a copy. After a respawn (run for you by
``cluster.respawn(source=R)``) or a new group, :meth:`Keeper.restore` makes the
model and optimizer again with the user's ``build`` on the current default group and
loads the newest surviving copy into them (``set_model_state_dict`` /
``set_optimizer_state_dict``, ``broadcast_from_rank0=True``): the user's loop goes on
from :attr:`Keeper.step`, redoing the steps since that save. Inside a running cell with
auto-respawn, a ``clusterkernel.train.steps(n, keep=keep)`` loop calls
:meth:`Keeper.restore` itself on every rank after the dead rank is replaced.

The cost is memory and one gather per save: each of the ``copies`` ranks holds the
whole model and optimizer state in CPU memory (Adam: 3x the parameters' bytes), and
a save moves as much as one forward pass's all-gathers plus the optimizer state.
Saving every k steps trades that against redoing up to k steps after a death.

Example (a ``%%mpi`` cell)::

    def build():
        model = Tiny()
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    keep = torchdist.Keeper(build)            # model, opt = keep.model, keep.optimizer
    model, opt = keep.model, keep.optimizer
    for step in range(keep.step, 1000):       # after a respawn: from the last save
        train_step(model, opt, step)
        if (step + 1) % 10 == 0:
            keep.save(step + 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clusterkernel.protocol._engine import user_namespace as _user_namespace
from clusterkernel.protocol._engine import world


class Keeper:
    """The model and optimizer ``build()`` returns, with their full state kept in memory
    on ranks ``0..copies-1`` at each :meth:`save`, so that :meth:`restore` rebuilds them
    on a new group after a rank died. Made on every rank at once (collective: it saves
    step 0).

    ``build`` takes no arguments and returns ``(model, optimizer)`` made on the current
    default group (FSDP2, DDP or a plain module); define it in a cell, so that a
    respawned rank gets it in its copy of a peer's variables. Randomness the loop draws
    (dropout) is not kept: seed it by step for a redo to match.

    Example::

        # not run: build makes an FSDP2 model (tests/cluster/test_respawn_fsdp.py runs it)
        keep = torchdist.Keeper(build)
        model, opt = keep.model, keep.optimizer
        keep.save(step)                       # after an optimizer step, on every rank
    """

    def __init__(self, build: Callable[[], tuple[Any, Any]], copies: int = 2) -> None:
        if not callable(build):
            raise TypeError(
                f"Keeper: build must be a function returning (model, optimizer), got {build!r}"
            )
        if copies < 1:
            raise ValueError(f"Keeper: copies must be at least 1, got {copies}")
        self.build = build
        self.copies = copies
        self.model, self.optimizer = _built(build)
        self.step = 0
        self._names: list[tuple[str, str]] = []  # a copy's: (name, "model"/"optimizer")
        self._kept: tuple | None = None  # (step, model state, optimizer state) on holders
        self.save(0)

    def save(self, step: int) -> None:
        """Keep the model's and optimizer's full state as of ``step`` (what the loop
        resumes from). Collective over the default group; call it between steps."""
        import torch.distributed as dist

        msd, osd = _full_state(self.model, self.optimizer)
        rank, holders = dist.get_rank(), self._holders()
        if rank == 0:
            kept = (step, msd, osd)
            for dst in holders[1:]:
                _send(kept, dst)
        elif rank in holders:
            kept = _recv(0)
        else:
            kept = None
        self._kept = kept
        self.step = step

    def restore(self, namespace: dict | None = None) -> int:
        """Make the model and optimizer again with ``build`` on the current default group
        and load the newest kept state into them; names in ``namespace`` (default: the
        user's) that held the old ones get the new ones. Collective over the default
        group; returns the step the state is of (also :attr:`step`)."""
        import torch.distributed as dist

        ns = _user_namespace() if namespace is None else namespace
        rank, size = dist.get_rank(), dist.get_world_size()
        # each rank's kept step (-1: none) and whether the optimizer had stepped then
        told: list = [None] * size
        mine = (self._kept[0], self._kept[2] is not None) if self._kept is not None else (-1, False)
        dist.all_gather_object(told, mine)
        steps = [step for step, _ in told]
        best = max(steps)
        if best < 0:
            held = self._holders()
            who = f"rank {held[0]}" if len(held) == 1 else f"ranks {held[0]}-{held[-1]}"
            raise RuntimeError(
                f"Keeper: no rank holds a kept state ({who} kept it and died); rebuild "
                "the model and start again, or keep more copies "
                f"(torchdist.Keeper(build, copies={self.copies + 1}))."
            )
        source = steps.index(best)
        kept = self._kept if steps[rank] == best else None
        if source != 0:  # torch's loading broadcasts from rank 0
            if rank == source:
                _send(kept, 0)
            elif rank == 0:
                kept = _recv(source)
        old = (self.model, self.optimizer)
        self.model, self.optimizer = _built(self.build)
        _load(self.model, self.optimizer, kept if rank == 0 else None, told[source][1])
        # the holders without the newest copy (a respawned one) get it from rank 0
        for dst in self._holders():
            if dst != 0 and steps[dst] != best:
                if rank == 0:
                    _send(kept, dst)
                elif rank == dst:
                    kept = _recv(0)
        self._kept = kept if rank in self._holders() else None
        self.step = best
        self._rebind(ns, old)
        return best

    def _holders(self) -> list[int]:
        import torch.distributed as dist

        return list(range(min(self.copies, dist.get_world_size())))

    def _rebind(self, ns: dict, old: tuple) -> None:
        for name, value in list(ns.items()):
            if value is None:
                continue
            if value is old[0]:
                ns[name] = self.model
            elif value is old[1]:
                ns[name] = self.optimizer
        # a respawned rank's copy has no old objects: the source's names for them
        for name, which in self._names:
            ns[name] = self.model if which == "model" else self.optimizer

    def __getstate__(self) -> dict:
        # a respawn's copy: the recipe, the step and the names, not the models (they
        # hold the old group) or the kept state (restore sends it where it is needed)
        ns = _user_namespace()
        names = [
            (n, "model" if v is self.model else "optimizer")
            for n, v in ns.items()
            if not n.startswith("_") and (v is self.model or v is self.optimizer)
        ]
        return {"build": self.build, "copies": self.copies, "step": self.step, "_names": names}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, model=None, optimizer=None, _kept=None)

    def __repr__(self) -> str:
        held = "holds a copy" if self._kept is not None else "holds no copy"
        return f"Keeper(step={self.step}, copies={self.copies}, {held})"


class _Slot:
    """Where a tensor goes in a kept state sent by :func:`_send`: its shape and dtype."""

    def __init__(self, shape, dtype) -> None:
        self.shape, self.dtype = shape, dtype


def _send(kept: tuple, dst: int) -> None:
    """``kept`` to rank ``dst``: its structure pickled (small), then each tensor as it is
    (pickling hundreds of MB through ``send_object_list`` is far slower: BENCHMARKS.md,
    "Faults")."""
    import torch
    import torch.distributed as dist
    from torch.utils._pytree import tree_flatten, tree_map_only

    dist.send_object_list(
        [tree_map_only(torch.Tensor, lambda t: _Slot(t.shape, t.dtype), kept)], dst=dst
    )
    for leaf in tree_flatten(kept)[0]:
        if isinstance(leaf, torch.Tensor):
            dist.send(leaf.contiguous(), dst=dst)


def _recv(src: int) -> tuple:
    """What :func:`_send` sent from rank ``src``."""
    import torch
    import torch.distributed as dist
    from torch.utils._pytree import tree_map_only

    box: list = [None]
    dist.recv_object_list(box, src=src)

    def fill(slot: _Slot):
        t = torch.empty(slot.shape, dtype=slot.dtype)
        dist.recv(t, src=src)
        return t

    return tree_map_only(_Slot, fill, box[0])


def _built(build: Callable) -> tuple[Any, Any]:
    made = build()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise TypeError(
            f"Keeper: build() must return (model, optimizer), got {type(made).__name__}"
        )
    return made


def _full_state(model, optimizer) -> tuple[dict, dict | None]:
    """The full (unsharded) state dicts, on CPU, on rank 0 (empty elsewhere). Collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = _owned(get_model_state_dict(model, options=opts))
    # torch fills an optimizer that has not stepped yet by stepping it with zero
    # gradients, which counts a step (Adam's bias correction): a fresh one is kept as
    # None, what ``build`` makes anyway
    if not optimizer.state:
        return msd, None
    return msd, _owned(get_optimizer_state_dict(model, optimizer, options=opts))


def _owned(state: Any) -> Any:
    """``state`` (dicts, tuples) with tensors of its own: cpu_offload hands back a tensor that is
    already on the CPU and not sharded (a buffer, DDP's parameters, Adam's step count)
    as the live one, which the next steps would change in the copy."""
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.detach().clone(), state)


def _load(model, optimizer, kept: tuple | None, stepped: bool) -> None:
    """Rank 0's full state (``kept``) into every rank's shards; the optimizer's where it
    had ``stepped`` (every rank is told). Collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    # torch's loading puts the shards it makes into the dicts it is given, and on rank 0
    # they may be views of the tensors given (training would change the kept copy):
    # it gets a copy, and the kept state stays whole for the next restore
    _, msd, osd = _owned(kept) if kept is not None else (None, {}, {})
    set_model_state_dict(model, msd, options=opts)
    if stepped:
        set_optimizer_state_dict(model, optimizer, osd or {}, options=opts)


def restore_namespace(namespace: dict | None = None) -> dict[str, int]:
    """After a respawn, on every rank: :meth:`Keeper.restore` for each keeper of the
    namespace that every rank has (by name, in name order). Collective over the world;
    ``{name: the step it went back to}``."""
    import sys

    ns = _user_namespace() if namespace is None else namespace
    dist = sys.modules.get("torch.distributed")
    ready = dist is not None and dist.is_available() and dist.is_initialized()
    mine = sorted(n for n, v in ns.items() if not n.startswith("_") and isinstance(v, Keeper))
    common = sorted(set.intersection(*map(set, world().allgather(mine if ready else []))))
    return {name: ns[name].restore(ns) for name in common}
