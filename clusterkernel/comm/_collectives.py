"""Tensor collectives, with the names and argument order of ``torch.distributed``.

Each call: resolve the group, run check mode if on, validate locally (so bad input
fails before any message is sent), put the tensors on the wire (zero copy for
contiguous CPU tensors), then one MPI call, blocking or nonblocking
(``async_op=True`` returns a :class:`~clusterkernel.comm.Work`). ``src``/``dst`` are
world ranks, as in torch.
"""

from __future__ import annotations

from functools import partial

import torch
from mpi4py import MPI

from clusterkernel.comm import _check, _ring
from clusterkernel.comm._dtypes import DTYPES as _DTYPES
from clusterkernel.comm._dtypes import HUGE_THRESHOLD as _BIG
from clusterkernel.comm._dtypes import STAGING as _STAGING
from clusterkernel.comm._dtypes import DType, bbuf, buf, dtype_of, unstage, wire
from clusterkernel.comm._groups import WORLD, Group, member, resolve
from clusterkernel.comm._handle import _REC, Work, _now, run
from clusterkernel.comm._ops import AVG, SUM, ReduceOp, check_algorithm, op_for, parse_op

_IN_PLACE = MPI.IN_PLACE
_fromaddress = MPI.buffer.fromaddress
_CHECK = _check.STATE


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
    algorithm: str = "mpi",
) -> Work | None:
    """Reduce ``tensor`` across the group, in place, on every rank.

    ``algorithm="mpi"`` uses MPI's own allreduce; ``"ring"`` the project's chunked,
    pipelined ring (reduce-scatter then all-gather).

    Example::

        t = torch.ones(4) * comm.rank()
        comm.all_reduce(t, op=comm.SUM)          # every rank: sum of all ranks
        w = comm.all_reduce(t, op=comm.AVG, async_op=True); w.wait()
    """
    # The hottest path of the package (a 4 KB allreduce is a few microseconds):
    # run() and note() are inlined here on purpose.
    t0 = _now()
    g = WORLD if group is None else resolve(group)
    c = g.comm
    if c is None:
        c = g.member_comm()  # raises: not a member
    if _CHECK.on:
        _check.verify(g, "all_reduce", tensor, op=op, alg=algorithm)
    if type(op) is not ReduceOp:
        op = parse_op(op)
    try:
        info = _DTYPES.get(tensor.dtype)
    except AttributeError:
        info = None  # not a tensor: wire() below says so
    if (
        info is not None
        and info.kind in "fib"  # halves reduce staged in float32; complex may be conj
        and tensor.is_cpu
        and tensor.is_contiguous()
        and not _STAGING.force
    ):
        w = tensor  # zero copy: MPI works on the tensor's own memory
    else:
        w, info = wire(tensor, reduce=True)
    mpi_op = op.mpi.get(info.kind)
    if mpi_op is None:
        op_for(op, info.kind, tensor.dtype)  # raises
    if algorithm != "mpi":
        check_algorithm(algorithm)
        return _ring.all_reduce(g, tensor, w, info, op, async_op)
    count = w.numel()
    nbytes = count * info.itemsize
    spec = [_fromaddress(w.data_ptr(), nbytes), count, info.mpi] if nbytes < _BIG else buf(w, info)
    finish = None if (w is tensor and op is not AVG) else _reduce_finisher(tensor, w, op, g.size)
    if async_op:
        winfo = ("all_reduce", nbytes, "mpi", g.size)
        return Work([c.Iallreduce(_IN_PLACE, spec, mpi_op)], winfo, t0, finish, keep=(spec, w))
    c.Allreduce(_IN_PLACE, spec, mpi_op)
    if finish is not None:
        finish()
    rec = _REC
    if rec.enabled:  # a blocking call waits for its whole duration
        dur = _now() - t0
        store = rec.comm
        store.append(("all_reduce", nbytes, "mpi", g.size, t0, dur, dur))
        if len(store) > rec.capacity:
            rec.trim("comm")
    return None


def broadcast(
    tensor: torch.Tensor, src: int = 0, group: Group | None = None, async_op: bool = False
) -> Work | None:
    """Copy ``tensor`` from rank ``src`` to every rank of the group, in place.

    Example: ``comm.broadcast(weights, src=0)``
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "broadcast", tensor, root=src)
    root = g.group_rank(src, "src")
    is_root = g.rank == root
    w, info = wire(tensor, copy_in=is_root)
    finish = None if (w is tensor or is_root) else partial(unstage, tensor, w)
    return run(
        "broadcast",
        tensor.nbytes,
        "mpi",
        g.size,
        c.Bcast,
        c.Ibcast,
        (buf(w, info), root),
        finish,
        async_op,
        w,
    )


def reduce(
    tensor: torch.Tensor,
    dst: int = 0,
    op: ReduceOp = SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``tensor`` across the group into rank ``dst``'s tensor (others unchanged).

    Example: ``comm.reduce(loss_sum, dst=0, op=comm.SUM)``
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "reduce", tensor, op=op, root=dst)
    root = g.group_rank(dst, "dst")
    op = parse_op(op)
    w, info = wire(tensor, reduce=True)
    mpi_op = _mpi_op(op, info, tensor.dtype)
    if g.rank == root:
        args = (_IN_PLACE, buf(w, info), mpi_op, root)
        finish = _reduce_finisher(tensor, w, op, g.size)
    else:
        args = (buf(w, info), None, mpi_op, root)
        finish = None
    return run(
        "reduce", tensor.nbytes, "mpi", g.size, c.Reduce, c.Ireduce, args, finish, async_op, w
    )


def _check_list(tensors: object, n: int, like: torch.Tensor, what: str) -> list[torch.Tensor]:
    """``tensors`` must be a list of ``n`` tensors with ``like``'s shape and dtype."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what} must be a list of {n} tensors, got {type(tensors).__name__}")
    if len(tensors) != n:
        raise ValueError(
            f"{what} has {len(tensors)} tensors; it needs one per rank of the group ({n})"
        )
    for i, t in enumerate(tensors):
        dtype_of(t, f"{what}[{i}]")
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ValueError(
                f"{what}[{i}] is {t.dtype}{list(t.shape)} but the tensor is "
                f"{like.dtype}{list(like.shape)}; all must match"
            )
    return list(tensors)


def _pack(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Stack tensors into one contiguous host buffer (casting, e.g. halves to float32)."""
    first = tensors[0]
    out = torch.empty((len(tensors), *first.shape), dtype=dtype)
    for row, t in zip(out, tensors):
        row.copy_(t.detach())
    return out


def _unpack(packed: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    for row, t in zip(packed, tensors):
        t.detach().copy_(row)


def _root_only(value: object, what: str, root_name: str) -> None:
    if value:
        raise ValueError(f"{what} must be given only on the {root_name} rank; pass None here")


def scatter(
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Rank ``src`` sends ``scatter_list[i]`` to group rank ``i``, which receives it in ``tensor``.

    Example::

        parts = [torch.full((2,), float(i)) for i in range(comm.size())] if comm.rank() == 0 else None
        out = torch.empty(2); comm.scatter(out, parts, src=0)
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "scatter", tensor, root=src)
    root = g.group_rank(src, "src")
    w, info = wire(tensor, copy_in=False)
    pack = None
    if g.rank == root:
        if scatter_list is None:
            raise ValueError(f"scatter on src rank {src} needs scatter_list (one tensor per rank)")
        pack = _pack(_check_list(scatter_list, g.size, tensor, "scatter_list"), tensor.dtype)
        send = bbuf(pack, info)
    else:
        _root_only(scatter_list, "scatter_list", "src")
        send = None
    finish = None if w is tensor else partial(unstage, tensor, w)
    args = (send, buf(w, info), root)
    return run(
        "scatter",
        tensor.nbytes,
        "mpi",
        g.size,
        c.Scatter,
        c.Iscatter,
        args,
        finish,
        async_op,
        (w, pack),
    )


def gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Rank ``dst`` receives every rank's ``tensor`` into ``gather_list`` (group rank order).

    Example::

        out = [torch.empty(2) for _ in range(comm.size())] if comm.rank() == 0 else None
        comm.gather(torch.ones(2), out, dst=0)
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "gather", tensor, root=dst)
    root = g.group_rank(dst, "dst")
    w, info = wire(tensor)
    packed = finish = None
    if g.rank == root:
        if gather_list is None:
            raise ValueError(f"gather on dst rank {dst} needs gather_list (one tensor per rank)")
        outs = _check_list(gather_list, g.size, tensor, "gather_list")
        packed = torch.empty((g.size, *tensor.shape), dtype=tensor.dtype)
        recv = bbuf(packed, info)
        finish = partial(_unpack, packed, outs)
    else:
        _root_only(gather_list, "gather_list", "dst")
        recv = None
    args = (buf(w, info), recv, root)
    return run(
        "gather",
        tensor.nbytes,
        "mpi",
        g.size,
        c.Gather,
        c.Igather,
        args,
        finish,
        async_op,
        (w, packed),
    )


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Every rank receives every rank's ``tensor`` into ``tensor_list`` (group rank order).

    Example::

        out = [torch.empty(3) for _ in range(comm.size())]
        comm.all_gather(out, torch.full((3,), float(comm.rank())))
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "all_gather", tensor)
    w, info = wire(tensor)
    outs = _check_list(tensor_list, g.size, tensor, "tensor_list")
    packed = torch.empty((g.size, *tensor.shape), dtype=tensor.dtype)
    args = (buf(w, info), bbuf(packed, info))
    finish = partial(_unpack, packed, outs)
    return run(
        "all_gather",
        tensor.nbytes * g.size,
        "mpi",
        g.size,
        c.Allgather,
        c.Iallgather,
        args,
        finish,
        async_op,
        (w, packed),
    )


def _same_dtype(output: torch.Tensor, input: torch.Tensor, what: str) -> DType:
    info = dtype_of(output, "output")
    dtype_of(input, "input")
    if output.dtype != input.dtype:
        raise ValueError(
            f"{what}: output is {output.dtype} but input is {input.dtype}; they must match"
        )
    return info


def all_gather_into_tensor(
    output: torch.Tensor, input: torch.Tensor, group: Group | None = None, async_op: bool = False
) -> Work | None:
    """Gather every rank's ``input`` into ``output`` (``size * input.numel()`` elements,
    group rank order), without per-rank copies.

    Example::

        out = torch.empty(comm.size(), 3)
        comm.all_gather_into_tensor(out, torch.ones(3))
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "all_gather_into_tensor", input)
    _same_dtype(output, input, "all_gather_into_tensor")
    if output.numel() != g.size * input.numel():
        raise ValueError(
            f"all_gather_into_tensor: output has {output.numel()} elements, needs "
            f"{g.size} x {input.numel()} = {g.size * input.numel()}"
        )
    wi, info = wire(input)
    wo, _ = wire(output, copy_in=False)
    finish = None if wo is output else partial(unstage, output, wo)
    args = (buf(wi, info), bbuf(wo, info))
    return run(
        "all_gather_into_tensor",
        output.nbytes,
        "mpi",
        g.size,
        c.Allgather,
        c.Iallgather,
        args,
        finish,
        async_op,
        (wi, wo),
    )


def reduce_scatter(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: ReduceOp = SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``input_list[i]`` across ranks into group rank ``i``'s ``output``.

    Example::

        ins = [torch.ones(2) for _ in range(comm.size())]
        out = torch.empty(2); comm.reduce_scatter(out, ins)   # out == size
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "reduce_scatter", output, op=op)
    op = parse_op(op)
    dtype_of(output, "output")
    ins = _check_list(input_list, g.size, output, "input_list")
    wo, info = wire(output, reduce=True, copy_in=False)
    mpi_op = _mpi_op(op, info, output.dtype)
    pack = _pack(ins, wo.dtype)
    args = (bbuf(pack, info), buf(wo, info), mpi_op)
    return run(
        "reduce_scatter",
        output.nbytes * g.size,
        "mpi",
        g.size,
        c.Reduce_scatter_block,
        c.Ireduce_scatter_block,
        args,
        partial(_finish_reduce, output, wo, g.size if op is AVG else 1),
        async_op,
        (wo, pack),
    )


def reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: ReduceOp = SUM,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``input`` (``size * output.numel()`` elements) across ranks; group rank
    ``i`` gets block ``i`` of the result in ``output``.

    Example::

        out = torch.empty(3)
        comm.reduce_scatter_tensor(out, torch.ones(comm.size() * 3))
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "reduce_scatter_tensor", output, op=op)
    op = parse_op(op)
    _same_dtype(output, input, "reduce_scatter_tensor")
    if input.numel() != g.size * output.numel():
        raise ValueError(
            f"reduce_scatter_tensor: input has {input.numel()} elements, needs "
            f"{g.size} x {output.numel()} = {g.size * output.numel()}"
        )
    wi, info = wire(input, reduce=True)
    wo, _ = wire(output, reduce=True, copy_in=False)
    mpi_op = _mpi_op(op, info, output.dtype)
    args = (bbuf(wi, info), buf(wo, info), mpi_op)
    return run(
        "reduce_scatter_tensor",
        input.nbytes,
        "mpi",
        g.size,
        c.Reduce_scatter_block,
        c.Ireduce_scatter_block,
        args,
        _reduce_finisher(output, wo, op, g.size),
        async_op,
        (wi, wo),
    )


def _flat_host(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    total = sum(t.numel() for t in tensors)
    out = torch.empty(total, dtype=dtype)
    pos = 0
    for t in tensors:
        n = t.numel()
        out[pos : pos + n].copy_(t.detach().reshape(-1))
        pos += n
    return out


def _vspec(w: torch.Tensor, info: DType, counts: list[int]) -> list:
    displs = [0] * len(counts)
    for i in range(1, len(counts)):
        displs[i] = displs[i - 1] + counts[i - 1]
    spec = buf(w, info)
    return [spec[0], (counts, displs), info.mpi]


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    pos = 0
    for t in tensors:
        n = t.numel()
        t.detach().copy_(flat[pos : pos + n].view(t.shape))
        pos += n


def all_to_all(
    output_tensor_list: list[torch.Tensor],
    input_tensor_list: list[torch.Tensor],
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """Group rank ``j`` receives ``input_tensor_list[j]`` of every rank ``i`` into its
    ``output_tensor_list[i]``. Sizes may differ per pair (they must agree pairwise).

    Example::

        ins = [torch.full((2,), float(comm.rank())) for _ in range(comm.size())]
        outs = [torch.empty(2) for _ in range(comm.size())]
        comm.all_to_all(outs, ins)     # outs[i] == i
    """
    g, c = member(group)
    if _CHECK.on:
        first = input_tensor_list[0] if input_tensor_list else None
        _check.verify(g, "all_to_all", first, count=len(input_tensor_list))
    n = g.size
    for what, lst in (
        ("output_tensor_list", output_tensor_list),
        ("input_tensor_list", input_tensor_list),
    ):
        if not isinstance(lst, (list, tuple)) or len(lst) != n:
            raise ValueError(f"all_to_all: {what} must be a list of {n} tensors (one per rank)")
    info = dtype_of(output_tensor_list[0], "output_tensor_list[0]")
    for t in [*output_tensor_list, *input_tensor_list]:
        dtype_of(t, "all_to_all tensor")
        if t.dtype != output_tensor_list[0].dtype:
            raise ValueError(
                f"all_to_all: found {t.dtype} and {output_tensor_list[0].dtype}; "
                "all tensors must share one dtype"
            )
    sendbuf = _flat_host(list(input_tensor_list), output_tensor_list[0].dtype)
    recvbuf = torch.empty(sum(t.numel() for t in output_tensor_list), dtype=sendbuf.dtype)
    args = (
        _vspec(sendbuf, info, [t.numel() for t in input_tensor_list]),
        _vspec(recvbuf, info, [t.numel() for t in output_tensor_list]),
    )
    finish = partial(_unflatten, recvbuf, list(output_tensor_list))
    return run(
        "all_to_all",
        sendbuf.nbytes,
        "mpi",
        n,
        c.Alltoallv,
        c.Ialltoallv,
        args,
        finish,
        async_op,
        (sendbuf, recvbuf),
    )


def _splits(sizes: list[int] | None, t: torch.Tensor, n: int, what: str) -> list[int]:
    rows = t.shape[0] if t.dim() else 1
    if sizes is None:
        if rows % n:
            raise ValueError(
                f"all_to_all_single: {what} has {rows} rows, not divisible by {n} ranks; "
                f"pass {what.split()[0]}_split_sizes"
            )
        sizes = [rows // n] * n
    sizes = list(sizes)
    if len(sizes) != n or sum(sizes) != rows or min(sizes) < 0:
        raise ValueError(
            f"all_to_all_single: {what} split sizes {sizes} must be {n} non-negative ints "
            f"summing to its {rows} rows"
        )
    per_row = t.numel() // rows if rows else 0
    return [s * per_row for s in sizes]


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None,
    group: Group | None = None,
    async_op: bool = False,
) -> Work | None:
    """All-to-all on single tensors split along dim 0 (equal splits by default).

    Example::

        inp = torch.arange(comm.size() * 2.0)
        out = torch.empty_like(inp)
        comm.all_to_all_single(out, inp)
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "all_to_all_single", input)
    info = _same_dtype(output, input, "all_to_all_single")
    scounts = _splits(input_split_sizes, input, g.size, "input")
    rcounts = _splits(output_split_sizes, output, g.size, "output")
    wi, _ = wire(input)
    wo, _ = wire(output, copy_in=False)
    finish = None if wo is output else partial(unstage, output, wo)
    args = (_vspec(wi, info, scounts), _vspec(wo, info, rcounts))
    return run(
        "all_to_all_single",
        input.nbytes,
        "mpi",
        g.size,
        c.Alltoallv,
        c.Ialltoallv,
        args,
        finish,
        async_op,
        (wi, wo),
    )


def barrier(group: Group | None = None, async_op: bool = False) -> Work | None:
    """Wait until every rank of the group has reached this call.

    Example: ``comm.barrier()``
    """
    g, c = member(group)
    if _CHECK.on:
        _check.verify(g, "barrier")
    return run("barrier", 0, "mpi", g.size, c.Barrier, c.Ibarrier, (), None, async_op)
