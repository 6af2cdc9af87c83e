"""Collectives through a group's shared memory (``algorithm="shm"``), for ranks on one node.

Every call works in its bank of the group's segment (:mod:`.segment`): ``n``
slots, one per group rank, in the tensor's dtype (float32 for float16/bfloat16,
which are reduced in float32 as everywhere in comm).

- all_reduce: a pipeline of cache-sized chunks through the segment's fixed stage
  buffers, synchronized by progress counters in shared memory (:mod:`.pipe`):
  each rank copies a chunk in, reduces its ``1/n`` share of it across the ranks'
  buffers into rank 0's, and copies the result out (the common case's loop in C,
  ``_cpipe.c``).
- reduce_scatter: each rank copies its ``n`` blocks into its slot; barrier; rank
  ``i`` reduces block ``i`` across the slots and copies it out.
- all_gather: each rank copies its input into its slot; barrier; each copies all
  slots out. broadcast: the root copies into its slot; barrier; the others copy out.

Reductions are torch operations on views of the shared buffer (one per peer slot,
no loop over elements); torch has no arithmetic for uint16/32/64, so those go
through numpy's ufuncs on the same memory (:mod:`.steps`). The barriers are
``Ibarrier`` on the segment's private communicator, yielded to
:func:`~clusterkernel.comm._handle.drive`, so several async calls, on one group or
several, progress together. Calls on one group run in the order they were made
(each waits for its ticket), on every rank. A blocking call with nothing
outstanding runs its phases inline.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import torch

from clusterkernel.comm._dtypes import DType, reduced_torch
from clusterkernel.comm._groups import Group
from clusterkernel.comm._handle import Call, Work, _now, note
from clusterkernel.comm._ledger import abandon
from clusterkernel.comm._ops import AVG, ReduceOp
from clusterkernel.comm._shm.pipe import (
    SMALL,
    large_steps,
    small_now,
    small_steps,
    steps_for,
)
from clusterkernel.comm._shm.segment import Segment, segment
from clusterkernel.comm._shm.steps import (
    FOLDS,
    all_gather_steps,
    broadcast_steps,
    fold_for,
    reduce_scatter_steps,
    slot_dtype,
)
from clusterkernel.comm._turns import inline, issue, run


def all_reduce(
    g: Group, tensor: torch.Tensor, info: DType, op: ReduceOp, async_op: bool, call: Call
) -> Work | None:
    """Allreduce ``tensor`` in place over ``g`` through shared memory; ``call`` its
    records (:meth:`~clusterkernel.comm._plan.Plan.call`)."""
    seg = g._shm
    if seg is None or seg.error:
        seg = _segment(g, call.entry)
    sdt = reduced_torch(tensor.dtype)
    fold = FOLDS.get((op, sdt)) or fold_for(op, sdt)
    divisor = g.size if op is AVG else 1
    t = tensor.detach()
    ticket = seg.issued
    small = t.numel() * sdt.itemsize <= SMALL
    if t.is_contiguous():
        flat = t if t.dim() == 1 else t.view(-1)
        if inline(seg, ticket, async_op):
            # Nothing outstanding anywhere: the steps inline, without a Work.
            t0 = _now()
            seg.issued = ticket + 1
            try:
                if small:
                    small_now(seg, flat, sdt, fold, divisor)
                else:
                    for _ in large_steps(seg, flat, sdt, fold, divisor):
                        pass  # a wait: the steps gave up the core already; look again
            finally:
                seg.done = ticket + 1
            note(call, t0, None)
            return None
        steps = (small_steps if small else large_steps)(seg, flat, sdt, fold, divisor)
    else:
        steps = _through_copy(seg, t, sdt, fold, divisor)
    return _launch(seg, call, steps, async_op)


def _through_copy(seg: Segment, t: torch.Tensor, sdt: torch.dtype, fold, divisor: int) -> Generator:
    flat = t.contiguous().view(-1)
    yield from steps_for(seg, flat, sdt, fold, divisor)
    t.copy_(flat.view(t.shape))


def broadcast(g: Group, tensor: torch.Tensor, root: int, async_op: bool, call: Call) -> Work | None:
    """Broadcast ``tensor`` from group rank ``root`` through shared memory."""
    seg = _segment(g, call.entry)
    seg.reserve(tensor.nbytes)
    row = seg.rows(seg.issued, tensor.dtype)[root, : tensor.numel()]
    steps = broadcast_steps(seg, row, tensor.detach(), root)
    return _launch(seg, call, steps, async_op)


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
    return _launch(seg, call, all_gather_steps(seg, rows, tensor.detach(), outs, out), async_op)


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
    sdt = slot_dtype(output.dtype)
    seg.reserve(g.size * output.numel() * sdt.itemsize)
    rows = seg.rows(seg.issued, sdt)[:, : g.size * output.numel()]
    ins = None if ins is None else [x.detach() for x in ins]
    inp = None if input is None else input.detach()
    divisor = g.size if op is AVG else 1
    steps = reduce_scatter_steps(seg, rows, ins, inp, output.detach(), fold_for(op, sdt), divisor)
    return _launch(seg, call, steps, async_op)


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
    first = seg.issued
    divisor = g.size if op is AVG else 1
    parts = []
    for f in flats:
        sdt = slot_dtype(f.dtype)
        parts.append(steps_for(seg, f.view(-1), sdt, fold_for(op, sdt), divisor))
    # One ticket for all the buckets: a ticket each would leave the later ones
    # unspent (and every later call on the segment waiting) if a bucket raised.
    return run(seg, call, issue(seg, _chain(parts, then)), async_op, first)


def _chain(parts: list[Generator], then: Callable[[], None]) -> Generator:
    for steps in parts:
        yield from steps
    then()


# ----------------------------------------------------------------------- running


def _segment(g: Group, entry: int | None) -> Segment:
    try:
        return segment(g)
    except BaseException:
        abandon(entry)  # raised on every member: nobody waits in it
        raise


def _launch(seg: Segment, call: Call, steps: Generator, async_op: bool) -> Work | None:
    first = seg.issued
    return run(seg, call, issue(seg, steps), async_op, first)
