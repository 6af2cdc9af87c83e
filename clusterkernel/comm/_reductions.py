"""Reductions: all_reduce, reduce, reduce_scatter and reduce_scatter_tensor.

Names and argument order of ``torch.distributed``; ``dst`` is a world rank. Each
call: group membership, local validation (bad input fails before any message),
:func:`~clusterkernel.comm._begin.begin` (check and flight entry), then one MPI
call, blocking or nonblocking (``async_op=True`` returns a
:class:`~clusterkernel.comm.Work`). Halves reduce in float32.
"""

from __future__ import annotations

import sys
from bisect import bisect_right as _bisect
from functools import partial

import torch
from mpi4py import MPI

from clusterkernel.comm import _auto, _fastpath, _hier, _ring, _shm, _torchpath
from clusterkernel.comm._begin import begin
from clusterkernel.comm._check import STATE as _CHECK_STATE  # a module global: see all_reduce
from clusterkernel.comm._dtypes import DTYPES as _DTYPES
from clusterkernel.comm._dtypes import HUGE_THRESHOLD, DType, bbuf, buf, dtype_of, unstage, wire
from clusterkernel.comm._dtypes import STAGING as _STAGING
from clusterkernel.comm._flight import DONE as _DONE
from clusterkernel.comm._flight import FLIGHT as _FLIGHT
from clusterkernel.comm._flight import OURS as _OURS
from clusterkernel.comm._groups import WORLD, Group, member, resolve
from clusterkernel.comm._handle import _REC, Call, Work, _now, run
from clusterkernel.comm._ops import (
    AVG,
    DATA_ALGORITHMS,
    SUM,
    ReduceOp,
    check_algorithm,
    op_for,
    parse_op,
)
from clusterkernel.comm._tensorlists import check_list, pack, same_dtype
from clusterkernel.comm._torchpath import ROUTE as _ROUTE
from clusterkernel.comm._torchpath import route_for, torch_group

_IN_PLACE = MPI.IN_PLACE
_getframe = sys._getframe
_fromaddress = MPI.buffer.fromaddress


def _finish_reduce(tensor: torch.Tensor, w: torch.Tensor, divisor: int) -> None:
    if divisor != 1:
        w.detach().div_(divisor)
    unstage(tensor, w)


def _reduce_finisher(tensor, w, op: ReduceOp, gsize: int):
    if w is tensor and op is not AVG:
        return None
    return partial(_finish_reduce, tensor, w, gsize if op is AVG else 1)


def _mpi_op(op: ReduceOp, info: DType, dtype: torch.dtype) -> MPI.Op:
    mpi_op = op.mpi.get(info.kind)
    return mpi_op if mpi_op is not None else op_for(op, info.kind, dtype)


def all_reduce(
    tensor: torch.Tensor,
    op: ReduceOp = SUM,
    group: Group | None = None,
    async_op: bool = False,
    algorithm: str = "auto",
) -> Work | None:
    """Reduce ``tensor`` across the group, in place, on every rank.

    ``algorithm="auto"`` (the default) picks one of the others by size, group size
    and node layout (:func:`~clusterkernel.comm.auto_choice`); ``"mpi"`` uses MPI's
    own allreduce; ``"ring"`` the project's chunked, pipelined ring (reduce-scatter
    then all-gather); ``"shm"`` the group's shared memory (every rank of the group
    on one node); ``"hier"`` shared memory in each node and MPI between one leader
    per node (for a group spanning nodes).

    Example::

        t = torch.ones(4) * comm.rank()
        comm.all_reduce(t, op=comm.SUM)          # every rank: sum of all ranks
        w = comm.all_reduce(t, op=comm.AVG, async_op=True); w.wait()
    """
    # The hottest path of the package (a 4 KB allreduce is a few microseconds): its
    # common case runs in C when built (wrap() below; _fast.c does the steps below
    # one for one), and member(), begin() and run() are inlined here on purpose.
    t0 = _now()
    g = WORLD if group is None else resolve(group)
    c = g.comm
    if c is None:
        c = g.member_comm()  # raises: not a member
    if type(op) is not ReduceOp:
        op = parse_op(op)
    try:
        dtype = tensor.dtype  # read once: a torch attribute costs ~0.05 us
    except AttributeError:
        dtype = None  # not a tensor: wire() below says so
    info = _DTYPES.get(dtype)
    if info is not None:
        size = tensor.nbytes
        cpu = tensor.is_cpu
        if not cpu or _ROUTE.cpu:  # a device tensor: NCCL, where the ranks have it
            route = torch_group(g, tensor)
            if route is not None:
                if op.mpi.get(info.kind) is None:
                    op_for(op, info.kind, dtype)  # raises
                entry = begin(g, "all_reduce", tensor, op=op, alg=route[1])
                return _torchpath.all_reduce(g, tensor, op, route, async_op, entry)
    if algorithm == "auto":
        if info is None or not cpu:
            algorithm = "mpi"  # not a tensor (wire() below says so), or device memory
        else:  # _auto.choose() inlined
            rules = g._auto
            if rules is None:
                rules = _auto.setup(g, "all_reduce", size)
            limits, algs = rules["all_reduce"]
            algorithm = algs[_bisect(limits, size)]
            if g._shm is not None:  # the group has shared memory: a shm_empty tensor?
                algorithm = _auto.zero_copy(g, tensor, size, algorithm)
    if (
        info is not None
        and info.kind in "fib"  # halves reduce staged in float32; complex may be conj
        and cpu
        and tensor.is_contiguous()
        and not _STAGING.force
    ):
        w = tensor  # zero copy: MPI works on the tensor's own memory
        nbytes = size
    else:
        if algorithm == "shm" or algorithm == "hier":
            w = tensor  # shm and hier copy (and cast halves) themselves
            info = dtype_of(tensor)
        else:
            w, info = wire(tensor, reduce=True)
        nbytes = w.nbytes
        size = tensor.nbytes
    mpi_op = op.mpi.get(info.kind)
    if mpi_op is None:
        op_for(op, info.kind, dtype)  # raises
    if algorithm != "mpi":
        check_algorithm(algorithm)
    count = nbytes // info.itemsize
    # begin() inlined for the common case, a signature the group has agreed on. The
    # short key stands for begin's full one ("all_reduce", dtype, count, op, None,
    # algorithm, -1, -1): a tuple of 4 hashes in half the time of 8.
    # _check.STATE as a module global and then a local: one lookup, not two, per call.
    check = _CHECK_STATE  # .on: mode "every"; .new: mode "new" (or "every")
    if check.on or (check.new and (dtype, count, op, algorithm) not in g._sigs):
        entry = begin(g, "all_reduce", tensor, op=op, alg=algorithm)
        if not check.on:  # agreed by begin (mode "every" reads no keys: keep none)
            g._sigs.add((dtype, count, op, algorithm))
    elif _FLIGHT.on:
        f = _getframe(1)
        if f.f_code.co_filename in _OURS:  # a training mode's call: record() walks out
            entry = _FLIGHT.record(g, "all_reduce", size, dtype, None, 2)
        else:  # record() inlined: the user's own call, the common case
            seq = g._calls
            g._calls = seq + 1
            entry = [seq, "all_reduce", g, size, dtype, None, f.f_code, f.f_lasti, False]
            _FLIGHT.ring.append(entry)
    else:
        entry = None
    if algorithm != "mpi":
        if algorithm == "shm":
            return _shm.all_reduce(g, tensor, info, op, async_op, entry)
        if algorithm == "hier":
            return _hier.all_reduce(g, tensor, op, async_op, entry)
        return _ring.all_reduce(g, tensor, w, info, op, async_op, entry)
    spec = (
        [_fromaddress(w.data_ptr(), nbytes), count, info.mpi]
        if nbytes < HUGE_THRESHOLD
        else buf(w, info)
    )
    finish = None if (w is tensor and op is not AVG) else _reduce_finisher(tensor, w, op, g.size)
    if async_op:
        call = Call("all_reduce", nbytes, "mpi", g.size, entry)
        return Work([c.Iallreduce(_IN_PLACE, spec, mpi_op)], call, t0, finish, keep=(spec, w))
    c.Allreduce(_IN_PLACE, spec, mpi_op)
    if finish is not None:
        finish()
    if entry is not None:  # note() inlined
        entry[_DONE] = True
    rec = _REC
    if rec.enabled:
        dur = _now() - t0
        store = rec.comm
        store.append(("all_reduce", nbytes, "mpi", g.size, t0, dur, dur))
        if len(store) > rec.capacity:
            rec.trim("comm")
    return None


all_reduce = _fastpath.wrap(all_reduce)


def reduce(
    tensor: torch.Tensor,
    dst: int = 0,
    op: ReduceOp = SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``tensor`` across the group into rank ``dst``'s tensor (others unchanged).

    Example::

        loss_sum = torch.tensor([2.0 * comm.rank()])
        comm.reduce(loss_sum, dst=0, op=comm.SUM)   # rank 0: the total; the others: their own
    """
    g, c = member(group)
    root = g.group_rank(dst, "dst")
    op = parse_op(op)
    route = route_for(g, tensor)
    if route is not None:
        info = dtype_of(tensor)
        _mpi_op(op, info, tensor.dtype)  # raises for an op undefined on the dtype
        entry = begin(g, "reduce", tensor, op=op, root=dst, alg=route[1])
        return _torchpath.reduce(g, tensor, dst, op, route, async_op, entry)
    w, info = wire(tensor, reduce=True)
    mpi_op = _mpi_op(op, info, tensor.dtype)
    if g.rank == root:
        args = (_IN_PLACE, buf(w, info), mpi_op, root)
        finish = _reduce_finisher(tensor, w, op, g.size)
    else:
        args = (buf(w, info), None, mpi_op, root)
        finish = None
    entry = begin(g, "reduce", tensor, op=op, root=dst)
    call = Call("reduce", tensor.nbytes, "mpi", g.size, entry)
    return run(call, c.Reduce, c.Ireduce, args, finish=finish, async_op=async_op, keep=w)


def reduce_scatter(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: ReduceOp = SUM,
    group: Group | None = None,
    async_op: bool = False,
    algorithm: str = "auto",
) -> Work | None:
    """Reduce ``input_list[i]`` across ranks into group rank ``i``'s ``output``.

    ``algorithm="shm"`` goes through the group's shared memory (one node); ``"auto"``
    (the default) picks it or ``"mpi"`` by size.

    Example::

        ins = [torch.ones(2) for _ in range(comm.size())]
        out = torch.empty(2); comm.reduce_scatter(out, ins)   # out == size
    """
    g, c = member(group)
    op = parse_op(op)
    info = dtype_of(output, "output")
    ins = check_list(input_list, g.size, output, "input_list")
    if algorithm == "auto":
        algorithm = _auto.pick(g, "reduce_scatter", output, output.nbytes * g.size)
    if algorithm != "mpi":
        check_algorithm(algorithm, DATA_ALGORITHMS, "reduce_scatter")
        op_for(op, info.kind, output.dtype)  # raises for an op undefined on the dtype
        entry = begin(g, "reduce_scatter", output, op=op, alg=algorithm)
        call = Call("reduce_scatter", output.nbytes * g.size, "shm", g.size, entry)
        return _shm.reduce_scatter(g, call, output, ins, None, op, async_op)
    wo, info = wire(output, reduce=True, copy_in=False)
    mpi_op = _mpi_op(op, info, output.dtype)
    packed = pack(ins, wo.dtype)
    args = (bbuf(packed, info), buf(wo, info), mpi_op)
    entry = begin(g, "reduce_scatter", output, op=op)
    call = Call("reduce_scatter", output.nbytes * g.size, "mpi", g.size, entry)
    finish = partial(_finish_reduce, output, wo, g.size if op is AVG else 1)
    return run(
        call,
        c.Reduce_scatter_block,
        c.Ireduce_scatter_block,
        args,
        finish=finish,
        async_op=async_op,
        keep=(wo, packed),
    )


def reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: ReduceOp = SUM,
    group: Group | None = None,
    async_op: bool = False,
    algorithm: str = "auto",
) -> Work | None:
    """Reduce ``input`` (``size * output.numel()`` elements) across ranks; group rank
    ``i`` gets block ``i`` of the result in ``output``. ``algorithm="shm"`` goes
    through the group's shared memory (one node); ``"auto"`` (the default) picks it
    or ``"mpi"`` by size.

    Example::

        out = torch.empty(3)
        comm.reduce_scatter_tensor(out, torch.ones(comm.size() * 3))
    """
    g, c = member(group)
    op = parse_op(op)
    same_dtype(output, input, "reduce_scatter_tensor")
    if input.numel() != g.size * output.numel():
        raise ValueError(
            f"reduce_scatter_tensor: input has {input.numel()} elements, needs "
            f"{g.size} x {output.numel()} = {g.size * output.numel()}"
        )
    route = route_for(g, output)
    if route is not None:
        op_for(op, dtype_of(output).kind, output.dtype)  # raises if undefined
        name = "reduce_scatter_tensor"
        entry = begin(g, name, output, op=op, nbytes=input.nbytes, alg=route[1])
        return _torchpath.reduce_scatter_tensor(g, output, input, op, route, async_op, entry)
    if algorithm == "auto":
        algorithm = _auto.pick(g, "reduce_scatter_tensor", input, input.nbytes)
    if algorithm != "mpi":
        check_algorithm(algorithm, DATA_ALGORITHMS, "reduce_scatter_tensor")
        op_for(op, _DTYPES[output.dtype].kind, output.dtype)  # raises if undefined
        name = "reduce_scatter_tensor"
        entry = begin(g, name, output, op=op, nbytes=input.nbytes, alg=algorithm)
        call = Call(name, input.nbytes, "shm", g.size, entry)
        return _shm.reduce_scatter(g, call, output, None, input, op, async_op)
    wi, info = wire(input, reduce=True)
    wo, _ = wire(output, reduce=True, copy_in=False)
    mpi_op = _mpi_op(op, info, output.dtype)
    args = (bbuf(wi, info), buf(wo, info), mpi_op)
    entry = begin(g, "reduce_scatter_tensor", output, op=op, nbytes=input.nbytes)
    call = Call("reduce_scatter_tensor", input.nbytes, "mpi", g.size, entry)
    return run(
        call,
        c.Reduce_scatter_block,
        c.Ireduce_scatter_block,
        args,
        finish=_reduce_finisher(output, wo, op, g.size),
        async_op=async_op,
        keep=(wi, wo),
    )
