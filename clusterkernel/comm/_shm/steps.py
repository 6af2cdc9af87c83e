"""The steps of the shared-memory collectives (:mod:`._shm`): views into a bank,
the reductions, and the barriers between phases.

A step generator yields ``[Ibarrier request]`` where every rank must have finished
the phase before anyone reads what it wrote (``Win.Sync`` on both sides of it, as
the MPI shared-memory model asks), and is driven in the segment's turn by
:func:`clusterkernel.comm._turns.run` (after :func:`~clusterkernel.comm._turns.issue`).
All-reduce has its own pipeline (:mod:`.pipe`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import torch

from clusterkernel.comm._ops import MAX, MIN, PRODUCT, ReduceOp
from clusterkernel.comm._shm.segment import Segment

_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)
_LINE = 64  # bytes: shares start on cache lines, so no two ranks write one line


def barrier(seg: Segment) -> list:
    """End a phase: publish this rank's stores, then the barrier request to wait for."""
    seg.sync()
    return [seg.comm.Ibarrier()]


def broadcast_steps(seg: Segment, row: torch.Tensor, t: torch.Tensor, root: int) -> Generator:
    row = row.view(t.shape)
    if seg.rank == root:
        row.copy_(t)
    yield barrier(seg)
    seg.sync()
    if seg.rank != root:
        t.copy_(row)


def all_gather_steps(
    seg: Segment, rows: torch.Tensor, t: torch.Tensor, outs: list | None, out: torch.Tensor | None
) -> Generator:
    m = t.numel()
    rows[seg.rank].view(t.shape).copy_(t)
    yield barrier(seg)
    seg.sync()
    if outs is not None:
        for o, row in zip(outs, rows):
            o.copy_(row.view(o.shape))
    elif out.is_contiguous():
        out.view(seg.n, m).copy_(rows)
    else:
        out.copy_(rows.reshape(out.shape))


def reduce_scatter_steps(
    seg: Segment,
    rows: torch.Tensor,
    ins: list | None,
    inp: torch.Tensor | None,
    out: torch.Tensor,
    fold,
    divisor: int,
) -> Generator:
    n, r, m = seg.n, seg.rank, out.numel()
    mine = rows[r]
    if ins is not None:
        for j, x in enumerate(ins):
            mine[j * m : (j + 1) * m].view(x.shape).copy_(x)
    else:
        mine.view(inp.shape).copy_(inp)
    yield barrier(seg)
    seg.sync()
    # Block r of slot 0 is rank r's alone in this phase: reduce into it in place.
    acc = rows[0, r * m : (r + 1) * m]
    for j in range(1, n):
        fold(acc, rows[j, r * m : (r + 1) * m])
    if divisor != 1:
        acc.div_(divisor)
    out.copy_(acc.view(out.shape))


def slot_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def share(count: int, n: int, r: int, itemsize: int) -> tuple[int, int]:
    """Rank ``r``'s part of ``count`` elements, cut on cache-line boundaries."""
    unit = max(1, _LINE // itemsize)
    units = -(-count // unit)
    base, extra = divmod(units, n)
    start = r * base + min(r, extra)
    stop = start + base + (1 if r < extra else 0)
    return min(count, start * unit), min(count, stop * unit)


FOLDS: dict[tuple, Callable] = {}  # (op, dtype) -> fold


def fold_for(op: ReduceOp, dtype: torch.dtype) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """``fold(acc, x)``: ``acc = acc op x`` in place, on views of the shared buffer."""
    fold = FOLDS[(op, dtype)] = _make_fold(op, dtype)
    return fold


def _make_fold(op: ReduceOp, dtype: torch.dtype) -> Callable[[torch.Tensor, torch.Tensor], None]:
    if dtype is torch.bool:
        return torch.Tensor.logical_and_ if op in (PRODUCT, MIN) else torch.Tensor.logical_or_
    if dtype in _UNSIGNED:
        ufunc = op.ufunc["i"]

        def fold_numpy(acc: torch.Tensor, x: torch.Tensor) -> None:
            a = acc.numpy()
            ufunc(a, x.numpy(), out=a)

        return fold_numpy
    if op is MIN:
        return lambda acc, x: torch.minimum(acc, x, out=acc)
    if op is MAX:
        return lambda acc, x: torch.maximum(acc, x, out=acc)
    if op is PRODUCT:
        return torch.Tensor.mul_
    return torch.Tensor.add_  # SUM, AVG
