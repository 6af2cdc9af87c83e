"""Collectives through a group's shared memory (``algorithm="shm"``), for ranks on one node.

Every call works in its bank of the group's segment (:mod:`._shm_segment`): ``n``
slots, one per group rank, in the tensor's dtype (float32 for float16/bfloat16,
which are reduced in float32 as everywhere in comm).

- all_reduce: each rank copies its input into its slot; barrier; each rank reduces
  its ``1/n`` share across all slots into slot 0 (in place: nobody else touches
  that share); barrier; each rank copies slot 0 out.
- reduce_scatter: each rank copies its ``n`` blocks into its slot; barrier; rank
  ``i`` reduces block ``i`` across the slots and copies it out.
- all_gather: each rank copies its input into its slot; barrier; each copies all
  slots out. broadcast: the root copies into its slot; barrier; the others copy out.

Reductions are torch operations on views of the shared buffer (one per peer slot,
no loop over elements); torch has no arithmetic for uint16/32/64, so those go
through numpy's ufuncs on the same memory. The barriers are ``Ibarrier`` on the
segment's private communicator, yielded to :func:`~clusterkernel.comm._handle.drive`,
so several async calls, on one group or several, progress together. Calls on one
group run in the order they were made (each waits for its ticket), on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import torch
from mpi4py import MPI

from clusterkernel.comm._dtypes import DType
from clusterkernel.comm._flight import DONE
from clusterkernel.comm._groups import Group
from clusterkernel.comm._handle import _ACTIVE, Call, Work, _now, drive, note
from clusterkernel.comm._ops import AVG, MAX, MIN, PRODUCT, ReduceOp
from clusterkernel.comm._shm_segment import Segment, segment

_waitall = MPI.Request.Waitall
_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)
_LINE = 64  # bytes: shares start on cache lines, so no two ranks write one line


def all_reduce(
    g: Group, tensor: torch.Tensor, info: DType, op: ReduceOp, async_op: bool, entry: list | None
) -> Work | None:
    """Allreduce ``tensor`` in place over ``g`` through shared memory."""
    seg = _segment(g, entry)
    sdt = torch.float32 if info.kind == "h" else tensor.dtype
    count = tensor.numel()
    seg.reserve(count * sdt.itemsize)
    rows = seg.rows(seg.issued, sdt)[:, :count]
    steps = _all_reduce(seg, rows, tensor.detach(), _folder(op, sdt), g.size if op is AVG else 1)
    return _launch(seg, Call("all_reduce", tensor.nbytes, "shm", g.size, entry), steps, async_op)


def broadcast(
    g: Group, tensor: torch.Tensor, root: int, async_op: bool, entry: list | None
) -> Work | None:
    """Broadcast ``tensor`` from group rank ``root`` through shared memory."""
    seg = _segment(g, entry)
    seg.reserve(tensor.nbytes)
    row = seg.rows(seg.issued, tensor.dtype)[root, : tensor.numel()]
    steps = _broadcast(seg, row, tensor.detach(), root)
    return _launch(seg, Call("broadcast", tensor.nbytes, "shm", g.size, entry), steps, async_op)


def all_gather(
    g: Group,
    call: Call,
    tensor: torch.Tensor,
    outs: list[torch.Tensor] | None,
    output: torch.Tensor | None,
    async_op: bool,
) -> Work | None:
    """Gather every rank's ``tensor`` into ``outs`` (a list) or ``output`` (one tensor)."""
    seg = _segment(g, call.entry)
    seg.reserve(tensor.nbytes)
    rows = seg.rows(seg.issued, tensor.dtype)[:, : tensor.numel()]
    outs = None if outs is None else [o.detach() for o in outs]
    out = None if output is None else output.detach()
    return _launch(seg, call, _all_gather(seg, rows, tensor.detach(), outs, out), async_op)


def reduce_scatter(
    g: Group,
    call: Call,
    output: torch.Tensor,
    ins: list[torch.Tensor] | None,
    input: torch.Tensor | None,
    op: ReduceOp,
    async_op: bool,
) -> Work | None:
    """Reduce ``ins`` (a list of ``n`` blocks) or ``input`` (``n`` blocks in one tensor)
    across ranks; group rank ``i`` gets block ``i`` in ``output``."""
    seg = _segment(g, call.entry)
    sdt = _slot_dtype(output.dtype)
    seg.reserve(g.size * output.numel() * sdt.itemsize)
    rows = seg.rows(seg.issued, sdt)[:, : g.size * output.numel()]
    ins = None if ins is None else [x.detach() for x in ins]
    inp = None if input is None else input.detach()
    divisor = g.size if op is AVG else 1
    steps = _reduce_scatter(seg, rows, ins, inp, output.detach(), _folder(op, sdt), divisor)
    return _launch(seg, call, steps, async_op)


# ----------------------------------------------------------------------- running


def _segment(g: Group, entry: list | None) -> Segment:
    try:
        return segment(g)
    except BaseException:
        if entry is not None:
            entry[DONE] = True  # raised on every member: nobody waits in it
        raise


def all_reduce_flats(
    g: Group,
    call: Call,
    flats: list[torch.Tensor],
    op: ReduceOp,
    async_op: bool,
    then: Callable[[], None],
) -> Work | None:
    """Allreduce several contiguous host tensors (fusion buckets) one after the
    other, then call ``then()``; AVG is divided here."""
    seg = _segment(g, call.entry)
    seg.reserve(max((f.numel() * f.dtype.itemsize for f in flats), default=0))
    first = seg.issued
    divisor = g.size if op is AVG else 1
    parts = []
    for f in flats:
        rows = seg.rows(seg.issued, f.dtype)[:, : f.numel()]
        parts.append(_issue(seg, _all_reduce(seg, rows, f, _folder(op, f.dtype), divisor)))
    return _run(seg, call, _chain(parts, then), async_op, first)


def _chain(parts: list[Generator], then: Callable[[], None]) -> Generator:
    for steps in parts:
        yield from steps
    then()


def _launch(seg: Segment, call: Call, steps: Generator, async_op: bool) -> Work | None:
    first = seg.issued
    return _run(seg, call, _issue(seg, steps), async_op, first)


def _issue(seg: Segment, steps: Generator) -> Generator:
    """Give ``steps`` the group's next ticket: they run after every earlier call."""
    ticket = seg.issued
    seg.issued = ticket + 1
    return _in_turn(seg, ticket, steps)


def _run(seg: Segment, call: Call, gen: Generator, async_op: bool, first: int) -> Work | None:
    if not async_op and seg.done == first and not _ACTIVE:
        # Nothing else is outstanding: run the steps here, without a Work.
        t0 = _now()
        for reqs in gen:
            _waitall(reqs)
        note(call, t0, None)
        return None
    work = drive(call, gen, async_op)
    if async_op:
        seg.last = work
    return work


def _in_turn(seg: Segment, ticket: int, steps: Generator) -> Generator:
    try:
        while seg.done != ticket:
            yield None  # an earlier call on this group is still running: poll again
        yield from steps
    finally:
        if seg.done == ticket:
            seg.done = ticket + 1


def _barrier(seg: Segment) -> list:
    seg.sync()
    return [seg.comm.Ibarrier()]


# ----------------------------------------------------------------------- the steps


def _all_reduce(seg: Segment, rows: torch.Tensor, t: torch.Tensor, fold, divisor: int) -> Generator:
    r, n = seg.rank, seg.n
    rows[r].view(t.shape).copy_(t)
    yield _barrier(seg)
    seg.sync()
    a, b = _share(rows.shape[1], n, r, rows.dtype.itemsize)
    if a < b:
        acc = rows[0, a:b]
        for j in range(1, n):
            fold(acc, rows[j, a:b])
        if divisor != 1:
            acc.div_(divisor)
    yield _barrier(seg)
    seg.sync()
    t.copy_(rows[0].view(t.shape))


def _broadcast(seg: Segment, row: torch.Tensor, t: torch.Tensor, root: int) -> Generator:
    row = row.view(t.shape)
    if seg.rank == root:
        row.copy_(t)
    yield _barrier(seg)
    seg.sync()
    if seg.rank != root:
        t.copy_(row)


def _all_gather(
    seg: Segment, rows: torch.Tensor, t: torch.Tensor, outs: list | None, out: torch.Tensor | None
) -> Generator:
    m = t.numel()
    rows[seg.rank].view(t.shape).copy_(t)
    yield _barrier(seg)
    seg.sync()
    if outs is not None:
        for o, row in zip(outs, rows):
            o.copy_(row.view(o.shape))
    elif out.is_contiguous():
        out.view(seg.n, m).copy_(rows)
    else:
        out.copy_(rows.reshape(out.shape))


def _reduce_scatter(
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
    yield _barrier(seg)
    seg.sync()
    # Block r of slot 0 is rank r's alone in this phase: reduce into it in place.
    acc = rows[0, r * m : (r + 1) * m]
    for j in range(1, n):
        fold(acc, rows[j, r * m : (r + 1) * m])
    if divisor != 1:
        acc.div_(divisor)
    out.copy_(acc.view(out.shape))


# ----------------------------------------------------------------------- helpers


def _slot_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _share(count: int, n: int, r: int, itemsize: int) -> tuple[int, int]:
    """Rank ``r``'s part of ``count`` elements, cut on cache-line boundaries."""
    unit = max(1, _LINE // itemsize)
    units = -(-count // unit)
    base, extra = divmod(units, n)
    start = r * base + min(r, extra)
    stop = start + base + (1 if r < extra else 0)
    return min(count, start * unit), min(count, stop * unit)


def _folder(op: ReduceOp, dtype: torch.dtype) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """``fold(acc, x)``: ``acc = acc op x`` in place, on views of the shared buffer."""
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
