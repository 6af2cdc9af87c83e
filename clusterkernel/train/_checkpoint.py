"""Checkpoints in one shared file: rank 0 writes it, every rank reads it back.

Two layouts, chosen by the mode (see :meth:`TrainingMode.save_state
<clusterkernel.train.TrainingMode.save_state>`):

- replicated: every rank holds the same state, so rank 0's stands for all;
- gathered: every rank's state is collected into the file, and each rank gets
  its own back on resume (same number of ranks).

Both carry the Trainer's progress and every rank's torch RNG state. Modes whose
ranks never meet in a collective mid-run (parameter servers) write files of
their own instead (:mod:`clusterkernel.train.ps`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from clusterkernel import comm
from clusterkernel.train._sync import all_objects, world_rank

FORMAT = 1
#: the file name under ``Trainer(checkpoint_dir=...)``
CHECKPOINT_NAME = "checkpoint.pt"


class Progress(Protocol):
    """What a checkpoint saves and restores of the Trainer: how far training got."""

    epoch: int
    step_in_epoch: int
    global_step: int
    checkpoint_dir: Path | None


def _agree(ok: bool, message: str, group: comm.Group | None) -> None:
    """Raise on every rank if ``ok`` is false on any; ``message`` names the first."""
    flags = all_objects(None if ok else message, group)
    bad = [(r, m) for r, m in enumerate(flags) if m is not None]
    if bad:
        raise RuntimeError("; ".join(f"rank {r}: {m}" for r, m in bad))


def save(
    path: str | os.PathLike, states: list[dict], meta: dict, group: comm.Group | None = None
) -> None:
    """Write ``{"meta": meta, "ranks": states}`` on rank 0, atomically; collective.

    Every rank returns only after the file is complete, or raises if rank 0
    could not write it.
    """
    path = Path(path)
    error = ""
    if comm.rank(group) == 0:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            torch.save({"format": FORMAT, "meta": meta, "ranks": states}, tmp)
            os.replace(tmp, path)  # a crash mid-write leaves the old checkpoint intact
        except OSError as exc:
            error = f"could not write checkpoint {path}: {exc}"
    _agree(not error, error, group)


def load(path: str | os.PathLike, group: comm.Group | None = None) -> dict | None:
    """Read a checkpoint on every rank; ``None`` on all ranks if rank 0 has none.

    Every rank reads the file itself, so it must be on a filesystem all ranks
    see; if some rank cannot see it, every rank raises, saying which.
    """
    path = Path(path)
    seen = all_objects(path.is_file(), group)
    if not seen[0]:
        return None
    missing = [r for r, s in enumerate(seen) if not s]
    if missing:
        raise RuntimeError(
            f"checkpoint {path} exists on rank 0 but ranks {missing} cannot see it; put the "
            "checkpoint directory on a filesystem shared by all ranks."
        )
    error, ckpt = "", None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if ckpt.get("format") != FORMAT:
            error = f"{path} is not a clusterkernel checkpoint of format {FORMAT}"
    except Exception as exc:  # a corrupt file must fail on every rank, not hang
        error = f"could not read {path}: {type(exc).__name__}: {exc}"
    _agree(not error, error, group)
    return ckpt


def _gather(obj: Any, group: comm.Group | None) -> list | None:
    """Every rank's ``obj`` on rank 0 of the group (``None`` elsewhere); collective."""
    out = [None] * comm.size(group) if comm.rank(group) == 0 else None
    comm.gather_object(obj, out, dst=world_rank(group, 0), group=group)
    return out


def save_shared(
    path: Path,
    state: dict,
    progress: Progress,
    *,
    mode: str,
    replicated: bool,
    group: comm.Group | None = None,
) -> None:
    """Write this rank's ``state`` (and progress, RNG) into the one file; collective.

    ``replicated``: rank 0's state stands for all; otherwise every rank's state
    is gathered into the file.

    Example (what a gathered mode's ``save_state`` does)::

        save_shared(path, mode.state_dict(), trainer, mode="local", replicated=False)
    """
    states = [state] if replicated else _gather(state, group)
    meta = {
        "epoch": progress.epoch,
        "step_in_epoch": progress.step_in_epoch,
        "global_step": progress.global_step,
        "world": comm.size(group),
        "mode": mode,
        "replicated": replicated,
        # every rank's, even when rank 0's state stands for all: dropout and
        # other random layers draw from it, so a resumed run repeats their draws
        "torch_rng": _gather(torch.get_rng_state(), group),
    }
    save(path, states, meta, group)


def load_shared(
    path: Path,
    progress: Progress,
    load_state: Callable[[dict], None],
    *,
    mode: str,
    group: comm.Group | None = None,
) -> bool:
    """Restore from :func:`save_shared`'s file on every rank; False if there is none.

    ``load_state(state)`` gets this rank's state (rank 0's when replicated);
    then the RNG and ``progress`` are restored.

    Example::

        load_shared(path, trainer, mode.load_state_dict, mode="local")
    """
    ckpt = load(path, group)
    if ckpt is None:
        return False
    meta = ckpt["meta"]
    if meta["mode"] != mode:
        raise ValueError(
            f"{path} was written by mode {meta['mode']!r}; this Trainer runs {mode!r}."
        )
    world, rank = comm.size(group), comm.rank(group)
    if meta["replicated"]:
        state = ckpt["ranks"][0]
    else:
        if meta["world"] != world:
            raise ValueError(
                f"{path} holds per-rank state for {meta['world']} ranks; this run has "
                f"{world}. Resume with the same number of ranks."
            )
        state = ckpt["ranks"][rank]
    load_state(state)
    rng = meta.get("torch_rng")  # absent from checkpoints of earlier versions
    if rng is not None and len(rng) == world:
        torch.set_rng_state(rng[rank])
    progress.epoch = meta["epoch"]
    progress.step_in_epoch = meta["step_in_epoch"]
    progress.global_step = meta["global_step"]
    return True
