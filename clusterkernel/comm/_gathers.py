"""Data movement without reduction: broadcast, scatter, gather, all_gather, barrier.

Names and argument order of ``torch.distributed``; ``src``/``dst`` are world ranks.
Each call: group membership, local validation, :func:`~clusterkernel.comm._begin.begin`
(check and flight entry), then one MPI call, blocking or behind a
:class:`~clusterkernel.comm.Work` with ``async_op=True``.
"""

from __future__ import annotations

from functools import partial

import torch

from clusterkernel.comm import _auto, _shm, _torchpath
from clusterkernel.comm._begin import begin
from clusterkernel.comm._dtypes import bbuf, buf, dtype_of, unstage, wire
from clusterkernel.comm._groups import Group, member
from clusterkernel.comm._handle import Call, Work, run
from clusterkernel.comm._ops import DATA_ALGORITHMS, check_algorithm
from clusterkernel.comm._tensorlists import check_list, pack, root_only, same_dtype, unpack
from clusterkernel.comm._torchpath import route_for


def broadcast(
    tensor: torch.Tensor,
    src: int = 0,
    group: Group | None = None,
    async_op: bool = False,
    algorithm: str = "auto",
) -> Work | None:
    """Copy ``tensor`` from rank ``src`` to every rank of the group, in place.

    ``algorithm="shm"`` goes through the group's shared memory (one node); ``"auto"``
    (the default) picks it or ``"mpi"`` by size.

    Example::

        weights = torch.randn(8)         # different on every rank ...
        comm.broadcast(weights, src=0)   # ... now rank 0's everywhere
    """
    g, c = member(group)
    root = g.group_rank(src, "src")
    route = route_for(g, tensor)
    if route is not None:
        entry = begin(g, "broadcast", tensor, root=src, alg=route[1])
        return _torchpath.broadcast(g, tensor, src, route, async_op, entry)
    if algorithm == "auto":
        dtype_of(tensor)  # a clear error for a non-tensor, before any message
        algorithm = _auto.pick(g, "broadcast", tensor, tensor.nbytes)
    if algorithm != "mpi":
        check_algorithm(algorithm, DATA_ALGORITHMS, "broadcast")
        dtype_of(tensor)
        entry = begin(g, "broadcast", tensor, root=src, alg=algorithm)
        return _shm.broadcast(g, tensor, root, async_op, entry)
    is_root = g.rank == root
    w, info = wire(tensor, copy_in=is_root)
    finish = None if (w is tensor or is_root) else partial(unstage, tensor, w)
    call = Call("broadcast", tensor.nbytes, "mpi", g.size, begin(g, "broadcast", tensor, root=src))
    return run(
        call, c.Bcast, c.Ibcast, (buf(w, info), root), finish=finish, async_op=async_op, keep=w
    )


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
    root = g.group_rank(src, "src")
    w, info = wire(tensor, copy_in=False)
    packed = None
    if g.rank == root:
        if scatter_list is None:
            raise ValueError(f"scatter on src rank {src} needs scatter_list (one tensor per rank)")
        packed = pack(check_list(scatter_list, g.size, tensor, "scatter_list"), tensor.dtype)
        send = bbuf(packed, info)
    else:
        root_only(scatter_list, "scatter_list", "src")
        send = None
    finish = None if w is tensor else partial(unstage, tensor, w)
    call = Call("scatter", tensor.nbytes, "mpi", g.size, begin(g, "scatter", tensor, root=src))
    return run(
        call,
        c.Scatter,
        c.Iscatter,
        (send, buf(w, info), root),
        finish=finish,
        async_op=async_op,
        keep=(w, packed),
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
    root = g.group_rank(dst, "dst")
    w, info = wire(tensor)
    packed = finish = None
    if g.rank == root:
        if gather_list is None:
            raise ValueError(f"gather on dst rank {dst} needs gather_list (one tensor per rank)")
        outs = check_list(gather_list, g.size, tensor, "gather_list")
        packed = torch.empty((g.size, *tensor.shape), dtype=tensor.dtype)
        recv = bbuf(packed, info)
        finish = partial(unpack, packed, outs)
    else:
        root_only(gather_list, "gather_list", "dst")
        recv = None
    call = Call("gather", tensor.nbytes, "mpi", g.size, begin(g, "gather", tensor, root=dst))
    return run(
        call,
        c.Gather,
        c.Igather,
        (buf(w, info), recv, root),
        finish=finish,
        async_op=async_op,
        keep=(w, packed),
    )


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: Group | None = None,
    async_op: bool = False,
    algorithm: str = "auto",
) -> Work | None:
    """Every rank receives every rank's ``tensor`` into ``tensor_list`` (group rank order).

    ``algorithm="shm"`` goes through the group's shared memory (one node); ``"auto"``
    (the default) picks it or ``"mpi"`` by size.

    Example::

        out = [torch.empty(3) for _ in range(comm.size())]
        comm.all_gather(out, torch.full((3,), float(comm.rank())))
    """
    g, c = member(group)
    if algorithm == "auto":
        dtype_of(tensor)  # a clear error for a non-tensor, before any message
        algorithm = _auto.pick(g, "all_gather", tensor, tensor.nbytes * g.size)
    if algorithm != "mpi":
        check_algorithm(algorithm, DATA_ALGORITHMS, "all_gather")
        dtype_of(tensor)
        outs = check_list(tensor_list, g.size, tensor, "tensor_list")
        nbytes = tensor.nbytes * g.size
        entry = begin(g, "all_gather", tensor, nbytes=nbytes, alg=algorithm)
        call = Call("all_gather", nbytes, "shm", g.size, entry)
        return _shm.all_gather(g, call, tensor, outs, None, async_op)
    w, info = wire(tensor)
    outs = check_list(tensor_list, g.size, tensor, "tensor_list")
    packed = torch.empty((g.size, *tensor.shape), dtype=tensor.dtype)
    nbytes = tensor.nbytes * g.size
    call = Call("all_gather", nbytes, "mpi", g.size, begin(g, "all_gather", tensor, nbytes=nbytes))
    return run(
        call,
        c.Allgather,
        c.Iallgather,
        (buf(w, info), bbuf(packed, info)),
        finish=partial(unpack, packed, outs),
        async_op=async_op,
        keep=(w, packed),
    )


def all_gather_into_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    group: Group | None = None,
    async_op: bool = False,
    algorithm: str = "auto",
) -> Work | None:
    """Gather every rank's ``input`` into ``output`` (``size * input.numel()`` elements,
    group rank order), without per-rank copies. ``algorithm="shm"`` goes through the
    group's shared memory (one node); ``"auto"`` (the default) picks it or ``"mpi"``.

    Example::

        out = torch.empty(comm.size(), 3)
        comm.all_gather_into_tensor(out, torch.ones(3))
    """
    g, c = member(group)
    same_dtype(output, input, "all_gather_into_tensor")
    if output.numel() != g.size * input.numel():
        raise ValueError(
            f"all_gather_into_tensor: output has {output.numel()} elements, needs "
            f"{g.size} x {input.numel()} = {g.size * input.numel()}"
        )
    route = route_for(g, output)
    if route is not None:
        entry = begin(g, "all_gather_into_tensor", input, nbytes=output.nbytes, alg=route[1])
        return _torchpath.all_gather_into_tensor(g, output, input, route, async_op, entry)
    if algorithm == "auto":
        algorithm = _auto.pick(g, "all_gather_into_tensor", output, output.nbytes)
    if algorithm != "mpi":
        check_algorithm(algorithm, DATA_ALGORITHMS, "all_gather_into_tensor")
        name = "all_gather_into_tensor"
        entry = begin(g, name, input, nbytes=output.nbytes, alg=algorithm)
        call = Call(name, output.nbytes, "shm", g.size, entry)
        return _shm.all_gather(g, call, input, None, output, async_op)
    wi, info = wire(input)
    wo, _ = wire(output, copy_in=False)
    finish = None if wo is output else partial(unstage, output, wo)
    entry = begin(g, "all_gather_into_tensor", input, nbytes=output.nbytes)
    return run(
        Call("all_gather_into_tensor", output.nbytes, "mpi", g.size, entry),
        c.Allgather,
        c.Iallgather,
        (buf(wi, info), bbuf(wo, info)),
        finish=finish,
        async_op=async_op,
        keep=(wi, wo),
    )


def barrier(group: Group | None = None, async_op: bool = False) -> Work | None:
    """Wait until every rank of the group has reached this call.

    Example: ``comm.barrier()``
    """
    g, c = member(group)
    call = Call("barrier", 0, "mpi", g.size, begin(g, "barrier"))
    return run(call, c.Barrier, c.Ibarrier, (), async_op=async_op)
