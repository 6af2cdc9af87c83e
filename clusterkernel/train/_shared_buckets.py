"""Where DataParallel's gradient buckets live: in the group's shared memory, or not.

When every rank of the group shares one node and the gradients are host tensors,
the buckets are carved out of one :func:`~clusterkernel.comm.shm_empty` allocation,
so the default comm hook's ``all_reduce`` reduces each large bucket in place
(comm's zero-copy shared-memory path: no copy in or out). Otherwise, or when
shared memory cannot be had, they are ordinary tensors.

The choice is collective: all ranks gather their reasons not to share and decide
alike, so no rank reduces through shared memory while another runs MPI (that
would hang).
"""

from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

from clusterkernel import comm
from clusterkernel.comm._auto import ZERO_COPY_MIN
from clusterkernel.comm._groups import resolve
from clusterkernel.comm._shm import alloc as shm_alloc
from clusterkernel.train._sync import all_objects

ALIGN = 64  # bytes: each bucket starts on its own cache line
# Shared memory lives until the process exits, so the windows made here are kept per
# group, each with a weak reference to the object whose buckets it holds: a new wrap
# reuses one whose owner is gone on every rank (re-running a notebook cell that
# wraps a model must not take a new window each time).
_ARENAS: dict[comm.Group, list[list]] = {}  # group -> [[arena, weakref to owner], ...]


def _drop_stale() -> None:
    # Windows of a world replaced since (a respawn): never reused (the new ranks
    # cannot map them), and let go of so that comm gives their memory back before
    # the new window is made.
    for slots in _ARENAS.values():
        slots[:] = [s for s in slots if not shm_alloc.stale(s[0])]


def _free_arenas(g: comm.Group) -> list[int]:
    slots = _ARENAS.get(g, [])
    if any(ref() is not None for _, ref in slots):
        gc.collect()  # an owner kept only by a reference cycle is gone, too
    return [i for i, (_, ref) in enumerate(slots) if ref() is None]


def _local_reason(params: list[nn.Parameter]) -> str | None:
    for p in params:
        if p.device.type != "cpu":
            return f"a parameter is on {p.device} (shared memory holds host tensors only)"
    return None


def _offsets(layout: list[tuple[int, torch.dtype]]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for numel, dtype in layout:
        offsets.append(end)
        end += -(-numel * dtype.itemsize // ALIGN) * ALIGN
    return offsets, end


def _refuse(choice: bool | None, why: str) -> None:
    if choice:
        raise RuntimeError(
            f"DataParallel(shared_buckets=True): {why}. Pass shared_buckets=None to "
            "fall back to ordinary memory in that case, or False."
        )


def _helps(layout: list[tuple[int, torch.dtype]], group: comm.Group | None) -> bool:
    """Whether ``auto`` would reduce some bucket in place: one is large enough, and
    the group's ``auto`` is not forced to another algorithm (collective: it sets
    the group's rules up; all ranks get the same)."""
    if max(n * d.itemsize for n, d in layout) < ZERO_COPY_MIN:
        return False  # every bucket goes by the table, as in ordinary memory
    comm.auto_choice("all_reduce", 0, group)
    forced = resolve(group)._auto["forced"]
    return forced in (None, "shm")


def shared_flats(
    layout: list[tuple[int, torch.dtype]],
    params: list[nn.Parameter],
    group: comm.Group | None,
    choice: bool | None,
    owner: object = None,
) -> list[torch.Tensor] | None:
    """Zeroed flat tensors of ``layout`` (numel, dtype per bucket) in the group's
    shared memory, or None for ordinary memory.

    ``choice``: None shares when possible and useful (some bucket is reduced in
    place), True shares or raises (on every rank alike), False never shares.
    Collective over ``group`` unless it has one rank (nothing to share then: None,
    whatever ``choice`` is). The memory is reused by a later call once ``owner``
    (the object that keeps the tensors) is gone on every rank.
    """
    if comm.size(group) == 1:
        return None
    offsets, total = _offsets(layout)
    # Gathered whatever ``choice`` is: a rank passing False must not skip the
    # collectives the others make here (they would wait for it forever).
    g = resolve(group)
    _drop_stale()
    mine = (_local_reason(params), [(n, str(d)) for n, d in layout], choice, _free_arenas(g))
    everyone = all_objects(mine, group)
    if any(e[1] != mine[1] for e in everyone):
        raise ValueError(
            "DataParallel: the gradient buckets differ between ranks; build the same "
            "model and pass the same bucket_bytes on every rank."
        )
    if any(e[2] != choice for e in everyone):
        said = ", ".join(f"rank {i}: {e[2]}" for i, e in enumerate(everyone))
        raise ValueError(
            f"DataParallel: shared_buckets differs between ranks ({said}); pass the "
            "same value on every rank."
        )
    if choice is False or not layout:
        return None  # asked for ordinary memory, or no parameter needs a gradient
    why = [f"rank {i}: {e[0]}" for i, e in enumerate(everyone) if e[0]]
    if why:
        _refuse(choice, "; ".join(why))
        return None
    if choice is None and not _helps(layout, group):
        return None
    slots = _ARENAS.setdefault(g, [])
    free_everywhere = set.intersection(*(set(e[3]) for e in everyone))
    reuse = [i for i in sorted(free_everywhere) if slots[i][0].numel() >= total]
    if reuse:  # the same index on every rank: the windows were made together
        slots[reuse[0]][1] = _ref(owner)
        return _cut(slots[reuse[0]][0], layout, offsets)
    try:
        arena = comm.shm_empty(max(total, 1), torch.uint8, group)
        failed = None
    except comm.CommError as exc:  # the group spans nodes (raised on every rank)
        arena, failed = None, str(exc)
    except Exception as exc:  # no shared memory here: agree below, then fall back
        arena, failed = None, f"{type(exc).__name__}: {exc}"
    failures = [f"rank {i}: {f}" for i, f in enumerate(all_objects(failed, group)) if f]
    if failures:
        _refuse(choice, "shared memory unavailable (" + "; ".join(failures) + ")")
        return None
    slots.append([arena, _ref(owner)])
    return _cut(arena, layout, offsets)


def _ref(owner: object):
    # no owner named: the memory is never handed out again
    return weakref.ref(owner) if owner is not None else (lambda: _ref)


def _cut(arena: torch.Tensor, layout, offsets: list[int]) -> list[torch.Tensor]:
    flats = []
    for (numel, dtype), off in zip(layout, offsets, strict=True):
        flat = arena[off : off + numel * dtype.itemsize].view(dtype)
        flats.append(flat.zero_())
    return flats
