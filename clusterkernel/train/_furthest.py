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
(:func:`restore`) with the progress it keeps beside the model. A new rank whose copy
of the variables came from that survivor at that position (the common case: one step,
no split) already holds its model and optimizer: it is sent only the RNG and progress,
so a large model's state does not cross to it a second time.

Example (on every rank, after the recovery)::

    mine = snapshot(model, opt, step=index)       # taken before rejoin()
    best, state = furthest(index, mine)           # a new rank: furthest(None, None, copied_from=r)
    if state is not None:
        index = restore(state, model, opt)["step"]
"""

from __future__ import annotations

import io
from typing import Any, NamedTuple

import torch

from clusterkernel.protocol._engine import world


class Held(NamedTuple):
    """A survivor's state at its failure, in two sizes: ``full`` (model, optimizer, RNG,
    progress) for a rank that must take all of it, ``light`` (RNG and progress) for a
    new rank whose copy of the variables came from this survivor at this point."""

    full: bytes
    light: bytes


def snapshot(model: Any, optimizer: Any, **progress: Any) -> Held:
    """This rank's torch RNG, ``model``'s and ``optimizer``'s state (either may be None)
    and ``progress`` (plain values: numbers, strings, lists and dicts of them)."""
    rng = torch.get_rng_state()
    return Held(_saved(rng, model, optimizer, progress), _saved(rng, None, None, progress))


def _saved(rng: torch.Tensor, model: Any, optimizer: Any, progress: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(
        {
            "rng": rng,
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
    position: int | None,
    mine: Held | None,
    refuse: str | None = None,
    copied_from: int | None = None,
) -> tuple[int, bytes | None]:
    """Collective over the world after a recovery: ``(the furthest survivor's position,
    its snapshot for this rank to restore, or None when this rank keeps its own)``.

    A new rank passes ``position`` and ``mine`` None and ``copied_from``, the rank its
    variables were copied from. Where survivors stand at different positions every rank
    restores (the re-attached models hold rank 0's parameters, perhaps a step behind);
    otherwise only the new ranks do, and only the RNG and progress where every one of
    them was copied from the survivor furthest on. ``refuse``: raised (RuntimeError, on
    every rank, ``{positions}`` filled in) where survivors disagree, for a loop that has
    no state to hand over.
    """
    comm = world()
    every = comm.allgather((position, copied_from))
    known = {r: p for r, (p, _) in enumerate(every) if p is not None}
    if not known:
        raise RuntimeError("no survivor took part in the recovery")
    best = max(known.values())
    src = min(r for r, p in known.items() if p == best)
    split = len(set(known.values())) > 1
    if split and refuse is not None:
        raise RuntimeError(refuse.format(positions=sorted(set(known.values()))))
    light = not split and all(c == src for p, c in every if p is None)
    sent = None
    if comm.Get_rank() == src:
        assert mine is not None  # a survivor's
        sent = mine.light if light else mine.full
    payload = comm.bcast(sent, root=src)
    behind = every[comm.Get_rank()][0] != best
    return best, payload if behind or split else None
