"""Hierarchical all_reduce (``algorithm="hier"``) for a group that spans nodes.

Let ``L`` be the number of the group's ranks on a node. When every node holds the
same ``L`` (the usual layout), a call runs three stages:

1. in each node, a shared-memory reduce-scatter (:mod:`._shm`): local rank ``i``
   ends with block ``i`` (``1/L`` of the tensor) of its node's sum;
2. across nodes, an MPI allreduce of block ``i`` among the ranks holding it, one
   per node: local rank ``i`` of each node leads block ``i``. Only these leaders
   use the network, and each block crosses it once per node, not once per rank
   (between two nodes the two leaders swap blocks and both reduce, so the link
   carries both directions at once);
3. in each node, a shared-memory all-gather of the blocks.

When nodes hold different numbers of the group's ranks the blocks do not line up
across nodes; then each node allreduces through shared memory, one leader per
node (local rank 0) allreduces over MPI, and broadcasts to its node (MPI, whose
on-node path is shared memory too). A group on one node runs ``algorithm="shm"``.

The node and leader communicators are made at the group's first hier call (every
member makes it, so the collective splits line up) and kept on the group until
:func:`comm.destroy_group`. Halves are reduced in float32 throughout; AVG sums
everywhere and divides once by the group's size. The stages of one call are issued
one after another, so hier calls on a group run in the order they were made (each
waits for its ticket): every rank then issues the sub-collectives in one order.
Calls on different groups, and other algorithms, progress alongside.
"""

from __future__ import annotations

from collections.abc import Generator

import torch
from mpi4py import MPI

from clusterkernel.comm import _plan, _shm
from clusterkernel.comm._dtypes import DTYPES, DType, buf, unstage, wire
from clusterkernel.comm._groups import Group, _world_ranks
from clusterkernel.comm._handle import Call, Work
from clusterkernel.comm._ledger import abandon
from clusterkernel.comm._ops import AVG, SUM, ReduceOp, op_for
from clusterkernel.comm._shm.segment import segment
from clusterkernel.comm._shm.steps import slot_dtype
from clusterkernel.comm._turns import inline, issue, run

_IN_PLACE = MPI.IN_PLACE
# The shared-memory steps of a hier call: timed as part of it, never on their own.
_STEP = _plan.step("all_reduce", "shm")
# Blocks from this size are swapped between two nodes' leaders (_cross). Measured on
# the two-host bench (BENCHMARKS.md, "Collectives", hierarchy across two hosts): below it
# the swap was slower on a fast link and no faster on a slow one; above it, faster.
SWAP_MIN = 64 << 10


class Layout:
    """A group's hier plan: its ranks on this node, the cross-node communicator,
    and the order of its calls."""

    __slots__ = ("local", "cross", "nodes", "even", "issued", "done", "last")

    def __init__(self, local: Group | None, cross: MPI.Intracomm | None, nodes: int, even: bool):
        self.local = local  # the group's ranks on this node (None when only this one)
        self.cross = cross  # one rank per node (None: not a leader, or a single node)
        self.nodes = nodes
        self.even = even  # every node holds as many of the group's ranks
        self.issued = 0  # hier calls started on the group (their tickets)
        self.done = 0  # finished: call k runs once done == k
        self.last: Work | None = None  # the latest async call

    def free(self) -> None:
        """Wait for this rank's calls, then free the communicators (collective)."""
        if self.done < self.issued and self.last is not None:
            self.last.wait()
        self.last = None
        if self.local is not None:
            self.local.free()
            self.local = None
        if self.cross is not None:
            self.cross.Free()
            self.cross = None


def plan(group: Group, node: int | None = None) -> Layout:
    """Make (once) and return ``group``'s hier layout; collective over its members.

    ``node`` is this rank's node number; by default the machine's shared-memory
    domain (``MPI_Comm_split_type``). A test or a benchmark on one machine may pass
    its own numbers to treat groups of its ranks as separate nodes: the stages then
    run exactly as across machines (the leaders' allreduce through MPI's on-node
    path instead of the network).

    Example: ``_hier.plan(g, node=comm.rank() // 2)`` before the first hier call.
    """
    lay = group._hier
    if lay is None:
        lay = group._hier = _make(group, node)
    return lay


def _make(g: Group, node: int | None) -> Layout:
    inner = g.inner()
    if node is None:
        ncomm = inner.Split_type(MPI.COMM_TYPE_SHARED, key=g.rank)
    else:
        ncomm = inner.Split(node, key=g.rank)
    mine, n = ncomm.Get_rank(), ncomm.Get_size()
    shape = inner.allgather((mine, n))
    nodes = sum(1 for r, _ in shape if r == 0)
    even = len({size for _, size in shape}) == 1
    if nodes == 1:
        ncomm.Free()
        return Layout(None, None, 1, True)
    # Even: local rank i of every node shares block i. Otherwise local rank 0 leads.
    color = mine if even else (0 if mine == 0 else MPI.UNDEFINED)
    cross = inner.Split(color, key=g.rank)
    cross = None if cross == MPI.COMM_NULL else cross
    local = None
    if n > 1:
        local = Group(ncomm, _world_ranks(ncomm), f"{g.name}.node")
    else:
        ncomm.Free()
    return Layout(local, cross, nodes, even)


def all_reduce(
    g: Group, tensor: torch.Tensor, op: ReduceOp, async_op: bool, call: Call, planned: _plan.Plan
) -> Work | None:
    """Allreduce ``tensor`` in place over ``g``: node, leaders, node (module doc).
    ``call`` is its records, made by its plan ``planned``."""
    lay = g._hier
    if lay is None:
        try:
            lay = plan(g)
        except BaseException:
            abandon(call.entry)  # raised on every member: nobody waits in it
            raise
    if lay.nodes == 1:  # one node: shared memory's call, and its record
        call = planned.call(call.entry, alg="shm")
        return _shm.all_reduce(g, tensor, DTYPES[tensor.dtype], op, async_op, call)
    w, info = wire(tensor, reduce=True)  # halves: float32; odd strides: a contiguous copy
    mpi_op = op_for(SUM if op is AVG else op, info.kind, w.dtype)
    divisor = g.size if op is AVG else 1
    if lay.local is not None and w.numel():
        # Grow the node's shared memory now, where every rank's program is at the same
        # call: growing is collective, and inside the steps of a queued call it would
        # run whenever some rank happens to poll it (and deadlock with a blocking call).
        per_rank = -(-w.numel() // lay.local.size)
        seg = segment(lay.local)
        seg.reserve(lay.local.size * per_rank * slot_dtype(w.dtype).itemsize)
    first = lay.issued
    nested = not inline(lay, first, async_op)
    steps = issue(lay, _steps(lay, tensor, w, info, op, mpi_op, divisor, nested))
    return run(lay, call, steps, async_op, first)


def _steps(lay, tensor, w, info: DType, op, mpi_op, divisor: int, nested: bool) -> Generator:
    flat = w.view(-1)
    if flat.numel():
        node_op = SUM if op is AVG else op
        if lay.even:
            yield from _by_blocks(lay, flat, info, node_op, mpi_op, divisor, nested)
        else:
            yield from _by_leader(lay, flat, info, node_op, mpi_op, divisor, nested)
    unstage(tensor, w)


def _by_blocks(lay, flat, info, node_op, mpi_op, divisor, nested) -> Generator:
    local = lay.local
    if local is None:  # one rank per node: the leaders are the whole group
        yield from _cross(lay.cross, flat, info, mpi_op)
        if divisor != 1:
            flat.div_(divisor)
        return
    whole, blocks, padded = _blocks(flat, local.size)
    shard = padded[local.rank]
    ins, inp = (None, flat) if whole else (padded, None)
    yield from _wait(_shm.reduce_scatter(local, _STEP, shard, ins, inp, node_op, nested))
    yield from _cross(lay.cross, shard, info, mpi_op)
    if divisor != 1:
        shard.div_(divisor)
    outs, out = (None, flat) if whole else (padded, None)
    yield from _wait(_shm.all_gather(local, _STEP, shard, outs, out, nested))
    _unpad(blocks, padded)


def _by_leader(lay, flat, info, node_op, mpi_op, divisor, nested) -> Generator:
    local = lay.local
    if local is not None:
        # The node's sum on every local rank: reduce-scatter, then all-gather.
        whole, blocks, padded = _blocks(flat, local.size)
        shard = padded[local.rank]
        ins, inp = (None, flat) if whole else (padded, None)
        yield from _wait(_shm.reduce_scatter(local, _STEP, shard, ins, inp, node_op, nested))
        outs, out = (None, flat) if whole else (padded, None)
        yield from _wait(_shm.all_gather(local, _STEP, shard, outs, out, nested))
        _unpad(blocks, padded)
    spec = buf(flat, info)
    if lay.cross is not None:  # this rank is its node's leader
        yield from _cross(lay.cross, flat, info, mpi_op)
        if divisor != 1:
            flat.div_(divisor)
    if local is not None:
        yield [local.comm.Ibcast(spec, root=0)]


def _cross(cross: MPI.Intracomm, x: torch.Tensor, info: DType, mpi_op: MPI.Op) -> Generator:
    """Allreduce ``x`` in place among the leaders (one per node).

    Between two nodes both leaders send at once, then each reduces ``x0 op x1`` (in
    that order on both, so both hold the same bits). MPI's nonblocking allreduce on
    two ranks reduces to one and sends back, one direction at a time: half the link.
    Small blocks keep the Iallreduce: one request costs less than a swap's buffer
    and local reduction, and the link's direction does not matter at their size.
    """
    if cross.Get_size() != 2 or x.nbytes < SWAP_MIN:
        yield [cross.Iallreduce(_IN_PLACE, buf(x, info), mpi_op)]
        return
    peer = 1 - cross.Get_rank()
    other = torch.empty_like(x)
    yield [cross.Isend(buf(x, info), peer), cross.Irecv(buf(other, info), peer)]
    if peer == 1:  # x is x0
        mpi_op.Reduce_local(buf(x, info), buf(other, info))
        x.copy_(other)
    else:
        mpi_op.Reduce_local(buf(other, info), buf(x, info))


def _blocks(flat: torch.Tensor, n: int) -> tuple[bool, list, list]:
    """``flat`` cut into ``n`` equal blocks: ``(whole, blocks, padded)``.

    ``blocks`` are views of ``flat`` (the last ones shorter, or empty, when ``n``
    does not divide it); ``padded`` is the same list with each short block
    replaced by a full-length copy, as the shared-memory steps need equal blocks.
    """
    count = flat.numel()
    m = -(-count // n)
    blocks = [flat[j * m : (j + 1) * m] for j in range(n)]
    if m * n == count:
        return True, blocks, blocks
    padded = []
    for b in blocks:
        if b.numel() == m:
            padded.append(b)
        else:
            p = torch.zeros(m, dtype=flat.dtype)
            p[: b.numel()] = b
            padded.append(p)
    return False, blocks, padded


def _unpad(blocks: list, padded: list) -> None:
    for b, p in zip(blocks, padded):
        if p is not b and b.numel():
            b.copy_(p[: b.numel()])


def _wait(work: Work | None) -> Generator:
    """Poll a nested shared-memory call until it is done (it is None if it ran inline)."""
    if work is not None:
        while not work.is_completed():
            yield None
