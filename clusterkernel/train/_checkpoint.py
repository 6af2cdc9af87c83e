"""Checkpoints: rank 0 writes one file, every rank reads it back."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from clusterkernel import comm
from clusterkernel.train._sync import all_objects

FORMAT = 1


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
