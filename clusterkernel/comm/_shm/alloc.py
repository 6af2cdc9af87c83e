"""Tensors that live in a group's shared memory (:func:`shm_empty`), and the
zero-copy all-reduce on them.

Each :func:`shm_empty` call makes its own MPI shared window over the group's node
communicator (every member owns its part), so growing the group's segment, which
remaps the segment's own windows, never moves such a tensor. All-reduce on
tensors of one such allocation on every rank (``algorithm="shm"``) skips the copy
in and the copy out: each rank reduces its ``1/n`` share across the other ranks'
tensors in place, in cache-sized chunks, and writes the result straight into every
other rank's tensor. Two exchanges of progress counters per call, no per-chunk
synchronization.

The windows are freed at exit, not with the group: a tensor may outlive
``destroy_group`` and must stay valid memory while it does. Allocate once (a
gradient buffer, a model's flat parameters) and reuse it. When the world is
replaced (a respawn), the old world's windows are given back on each survivor as
soon as no tensor views them any more (at once for those no tensor views, else at
a later :func:`shm_empty`); one that is still viewed stays valid memory, but the new
rank has no part in it, so reduce it with the new world only after allocating anew.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from mpi4py import MPI

from clusterkernel.comm._dtypes import dtype_of
from clusterkernel.comm._groups import Group, resolve
from clusterkernel.comm._shm.segment import (
    AFTER_SEGMENTS,
    PIPE_CHUNK,
    WORLD_DROPPED,
    Segment,
    segment,
)
from clusterkernel.comm._shm.steps import share
from clusterkernel.comm._shm.unmap import only_ours, release, views

_ARENAS: list[Arena] = []  # every live allocation, in creation order (same on all members)
_STALE: list[Arena] = []  # the old worlds' allocations some tensor still views


class Arena:
    """One :func:`shm_empty` allocation: its window and every member's part."""

    __slots__ = ("win", "parts", "lo", "hi", "made")

    def __init__(self, win: MPI.Win, parts: list[torch.Tensor], lo: int, hi: int):
        self.win = win
        self.parts = parts  # uint8 tensor of each member's part, by group rank
        self.made = [views(p) for p in parts]  # before any view of them (unmap.views)
        self.lo, self.hi = lo, hi  # this rank's part: [lo, hi) addresses

    def free(self) -> None:
        self.parts = []
        self.win.Unlock_all()
        self.win.Free()


def shm_empty(
    shape: int | tuple[int, ...] | torch.Size,
    dtype: torch.dtype = torch.float32,
    group: Group | None = None,
) -> torch.Tensor:
    """An uninitialized tensor inside ``group``'s shared memory on this node.

    Collective: every member of ``group`` (default: all ranks) calls it, in the same
    order, with the same shape and dtype. ``comm.all_reduce(t, algorithm="shm")`` on
    such tensors (or on the same contiguous slice of them, on every rank) reduces
    without copying the tensor in or out: the fastest all-reduce on one node for
    large tensors. Everything else treats it as an ordinary CPU tensor. The memory
    stays valid until the process exits (also after ``destroy_group``), so allocate
    once and reuse.

    Example::

        grads = comm.shm_empty(1 << 20)        # 4 MB of float32 on every rank: keep it
        grads.fill_(float(comm.rank()))        # this rank's gradients, say
        comm.all_reduce(grads, op=comm.AVG, algorithm="shm")   # in place, no copies
    """
    g = resolve(group)
    g.member_comm()  # raises when this rank is not a member
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got {dtype!r}")
    dtype_of(torch.empty(0, dtype=dtype))  # raises for dtypes comm cannot move
    size = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(s, int) or s < 0 for s in size):
        raise ValueError(f"shape must be non-negative ints, got {shape!r}")
    nbytes = math.prod(size) * dtype.itemsize
    release_stale()  # before the new window: it may reuse the memory given back
    seg = segment(g)  # raises when the group spans nodes
    win = MPI.Win.Allocate_shared(-(-nbytes // 4096) * 4096, 1, comm=seg.comm)
    win.Lock_all(MPI.MODE_NOCHECK)
    parts = []
    for j in range(seg.n):
        mem, _ = win.Shared_query(j)
        parts.append(torch.from_numpy(np.frombuffer(mem, dtype=np.uint8)))
    mine = parts[seg.rank]
    lo = mine.data_ptr()
    arena = Arena(win, parts, lo, lo + mine.numel())
    _ARENAS.append(arena)
    seg.arenas.append(arena)
    return mine[:nbytes].view(dtype).view(size)


def find(seg: Segment, t: torch.Tensor) -> tuple[int, int]:
    """``(1 + index of the allocation in seg.arenas, byte offset)`` when contiguous
    ``t`` lies in one of ``seg``'s allocations on this rank, else ``(0, 0)``."""
    if not seg.arenas:
        return 0, 0
    p = t.data_ptr()
    end = p + t.numel() * t.element_size()
    for i, arena in enumerate(seg.arenas):
        if arena.lo <= p and end <= arena.hi:
            return i + 1, p - arena.lo
    return 0, 0


def peers(arena: Arena, offsets: list[int], t: torch.Tensor) -> list[torch.Tensor]:
    """Every member's tensor of the call, by group rank (each at its own offset)."""
    nbytes = t.numel() * t.element_size()
    return [
        part[off : off + nbytes].view(t.dtype)
        for part, off in zip(arena.parts, offsets, strict=True)
    ]


def zero_copy_reduce(
    seg: Segment, ts: list[torch.Tensor], sdt: torch.dtype, fold, divisor: int
) -> None:
    """Reduce this rank's share across ``ts`` (every rank's tensor, all arrived) and
    write it into all of them, chunk by chunk so each chunk stays in cache."""
    n, r = seg.n, seg.rank
    count = ts[0].numel()
    a, b = share(count, n, r, ts[0].element_size())
    if a >= b:
        return
    mine = ts[r]
    others = [x for j, x in enumerate(ts) if j != r]
    step = PIPE_CHUNK // sdt.itemsize
    halves = sdt is not mine.dtype  # float16/bfloat16: accumulate in float32
    for lo in range(a, b, step):
        hi = min(b, lo + step)
        acc = seg.scratch(sdt, hi - lo) if halves else mine[lo:hi]
        if halves:
            acc.copy_(mine[lo:hi])
        for x in others:
            fold(acc, x[lo:hi])
        if divisor != 1:
            acc.div_(divisor)
        if halves:
            mine[lo:hi].copy_(acc)
        for x in others:
            x[lo:hi].copy_(acc)


def stale(t: torch.Tensor) -> bool:
    """Whether ``t`` lies in a window of a world replaced since (see the module doc).

    Example: ``stale(bucket_arena)`` after a respawn is True on a survivor.
    """
    p = t.data_ptr()
    return any(arena.lo <= p < arena.hi for arena in _STALE)


def release_stale() -> None:
    """Give back the old worlds' windows that no tensor views any more (local)."""
    kept = []
    for arena in _STALE:
        if all(only_ours(p, m) for p, m in zip(arena.parts, arena.made, strict=True)):
            some = [part for part in arena.parts if part.numel()]
            if some:
                release(some[0].data_ptr())
            arena.parts = []
        else:
            kept.append(arena)
    _STALE[:] = kept


def _drop_world() -> None:
    # Every allocation so far was on the old world's groups; Win_free would be
    # collective over a dead rank, so none is ever freed through MPI now.
    _STALE.extend(_ARENAS)
    _ARENAS.clear()
    release_stale()


WORLD_DROPPED.append(_drop_world)


def free_all() -> None:
    """Free every allocation (collective; at exit, after the segments)."""
    while _ARENAS:
        _ARENAS.pop(0).free()


AFTER_SEGMENTS.append(free_all)
