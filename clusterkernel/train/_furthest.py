"""After a dead rank was replaced inside the cell: every rank takes the state of the
survivor that is furthest on (the training loops' catch-up, ``train.steps`` and
``Trainer.fit``).

A step's collective can complete on some survivors and fail on others (one whose
peer died after sending its share), so the survivors of a death may stand a step
apart, and a new rank stands nowhere. Each rank says its position (a new rank: None)
and, a survivor, the state it had when it failed (:func:`snapshot`, taken before the
recovery: re-attaching DataParallel models copies rank 0's parameters to every rank,
and rank 0 may be behind). :func:`furthest` gives every rank that must catch up the
state of the lowest survivor at the furthest position; each loop puts it back
(:func:`restore`) with the progress it keeps beside the model.

Example (on every rank, after the recovery)::

    mine = snapshot(model, opt, step=index)       # taken before rejoin()
    best, state = furthest(index, mine)
    if state is not None:
        index = restore(state, model, opt)["step"]
"""

from __future__ import annotations

import io
from typing import Any

import torch

from clusterkernel.protocol._engine import world


def snapshot(model: Any, optimizer: Any, **progress: Any) -> bytes:
    """This rank's torch RNG, ``model``'s and ``optimizer``'s state (either may be None)
    and ``progress`` (plain values: numbers, strings, lists and dicts of them)."""
    buf = io.BytesIO()
    torch.save(
        {
            "rng": torch.get_rng_state(),
            "model": model.state_dict() if model is not None else None,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "progress": progress,
        },
        buf,
    )
    return buf.getvalue()


def restore(blob: bytes, model: Any, optimizer: Any) -> dict:
    """Put a :func:`snapshot` back into this rank's RNG, ``model`` and ``optimizer``;
    returns its ``progress``."""
    state = torch.load(io.BytesIO(blob), weights_only=True)
    torch.set_rng_state(state["rng"])
    if model is not None and state["model"] is not None:
        model.load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state.get("progress") or {}


def furthest(
    position: int | None, mine: bytes | None, refuse: str | None = None
) -> tuple[int, bytes | None]:
    """Collective over the world after a recovery: ``(the furthest survivor's position,
    its snapshot for this rank to restore, or None when this rank keeps its own)``.

    A new rank passes ``position`` None. Where survivors stand at different positions
    every rank restores (the re-attached models hold rank 0's parameters, perhaps a step
    behind); otherwise only the new ranks do. ``refuse``: raised (RuntimeError, on every
    rank, ``{positions}`` filled in) where survivors disagree, for a loop that has no
    state to hand over.
    """
    comm = world()
    every = comm.allgather(position)
    known = {r: p for r, p in enumerate(every) if p is not None}
    if not known:
        raise RuntimeError("no survivor took part in the recovery")
    best = max(known.values())
    src = min(r for r, p in known.items() if p == best)
    split = len(set(known.values())) > 1
    if split and refuse is not None:
        raise RuntimeError(refuse.format(positions=sorted(set(known.values()))))
    payload = comm.bcast(mine if comm.Get_rank() == src else None, root=src)
    behind = every[comm.Get_rank()] != best
    return best, payload if behind or split else None
