"""Data movement without reduction: broadcast, scatter, gather, all_gather, barrier.

Names and argument order of ``torch.distributed``; ``src``/``dst`` are world ranks.
Each call: group membership, its signature's plan (made, and the signature validated,
on the first call: :mod:`._plan`), :func:`~clusterkernel.comm._begin.enter` (check
and flight entry), then ``plan.run``: one MPI call, blocking or behind a
:class:`~clusterkernel.comm.Work` with ``async_op=True``.
"""

from __future__ import annotations

from functools import partial

import torch

from clusterkernel.comm import _auto, _plan, _shm, _torchpath
from clusterkernel.comm._begin import begin, enter
from clusterkernel.comm._dtypes import bbuf, buf, dtype_of, unstage, wire
from clusterkernel.comm._groups import Group, member
from clusterkernel.comm._handle import Call, Work, run
from clusterkernel.comm._ops import DATA_ALGORITHMS, check_algorithm
from clusterkernel.comm._tensorlists import check_list, pack, root_list, same_dtype, unpack
from clusterkernel.comm._torchpath import route_for


def _plan_data(
    g: Group,
    key: tuple,
    name: str,
    tensor: torch.Tensor | None,
    run,
    *,
    size: int,
    nbytes: int | None = None,
    root: int | None = None,
    alg: str = "mpi",
) -> _plan.Plan:
    """Plan a new signature of a call that moves data without reducing it: ``tensor``
    is the one checked, ``size`` the flight entry's bytes, ``nbytes`` the timing
    record's (default ``size``), ``root`` a rooted call's group rank."""
    info = None if tensor is None else dtype_of(tensor)  # None: barrier
    plan = _plan.Plan(
        g,
        name,
        run,
        info,
        size=size,
        nbytes=nbytes,
        dtype=None if tensor is None else tensor.dtype,
        numel=-1 if tensor is None else tensor.numel(),
        alg=alg,
        root=root,
    )
    return _plan.keep(g, key, plan)


def _pick(g: Group, name: str, tensor: torch.Tensor, nbytes: int, algorithm: str) -> str:
    if algorithm == "auto":
        return _auto.pick(g, name, tensor, nbytes)
    if algorithm != "mpi":
        check_algorithm(algorithm, DATA_ALGORITHMS, name)
    return algorithm


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
        call = begin(g, "broadcast", tensor, root=root, alg=route[1])
        return _torchpath.broadcast(g, tensor, src, route, async_op, call)
    key = ("broadcast", *_plan.tensor_key(tensor), root, algorithm)
    plan = _plan.find(g, key)
    if plan is None:
        dtype_of(tensor)  # a clear error for a non-tensor, before any message
        alg = _pick(g, "broadcast", tensor, tensor.nbytes, algorithm)
        run = _run_broadcast if alg == "mpi" else _run_broadcast_shm
        plan = _plan_data(g, key, "broadcast", tensor, run, size=tensor.nbytes, root=root, alg=alg)
    call = enter(g, plan, tensor)
    return plan.run(plan, g, c, tensor, async_op, call)


def _run_broadcast(plan, g: Group, c, tensor, async_op: bool, call: Call) -> Work | None:
    root = plan.root
    is_root = g.rank == root
    w, info = wire(tensor, copy_in=is_root)
    finish = None if (w is tensor or is_root) else partial(unstage, tensor, w)
    return run(
        call, c.Bcast, c.Ibcast, (buf(w, info), root), finish=finish, async_op=async_op, keep=w
    )


def _run_broadcast_shm(plan, g: Group, c, tensor, async_op: bool, call: Call) -> Work | None:
    return _shm.broadcast(g, tensor, plan.root, async_op, call)


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
    key = ("scatter", *_plan.tensor_key(tensor), root)
    plan = _plan.find(g, key) or _plan_data(
        g, key, "scatter", tensor, _run_scatter, size=tensor.nbytes, root=root
    )
    parts = root_list(scatter_list, g.rank == root, g.size, tensor, "scatter_list", "src", src)
    call = enter(g, plan, tensor)
    return plan.run(plan, g, c, tensor, parts, async_op, call)


def _run_scatter(plan, g: Group, c, tensor, parts, async_op: bool, call: Call) -> Work | None:
    w, info = wire(tensor, copy_in=False)
    packed = send = None
    if parts is not None:
        packed = pack(parts, tensor.dtype)
        send = bbuf(packed, info)
    finish = None if w is tensor else partial(unstage, tensor, w)
    return run(
        call,
        c.Scatter,
        c.Iscatter,
        (send, buf(w, info), plan.root),
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
    key = ("gather", *_plan.tensor_key(tensor), root)
    plan = _plan.find(g, key) or _plan_data(
        g, key, "gather", tensor, _run_gather, size=tensor.nbytes, root=root
    )
    outs = root_list(gather_list, g.rank == root, g.size, tensor, "gather_list", "dst", dst)
    call = enter(g, plan, tensor)
    return plan.run(plan, g, c, tensor, outs, async_op, call)


def _run_gather(plan, g: Group, c, tensor, outs, async_op: bool, call: Call) -> Work | None:
    w, info = wire(tensor)
    packed = recv = finish = None
    if outs is not None:
        packed = torch.empty((g.size, *tensor.shape), dtype=tensor.dtype)
        recv = bbuf(packed, info)
        finish = partial(unpack, packed, outs)
    return run(
        call,
        c.Gather,
        c.Igather,
        (buf(w, info), recv, plan.root),
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
    key = ("all_gather", *_plan.tensor_key(tensor), algorithm)
    plan = _plan.find(g, key)
    if plan is None:
        dtype_of(tensor)  # a clear error for a non-tensor, before any message
        nbytes = tensor.nbytes * g.size
        alg = _pick(g, "all_gather", tensor, nbytes, algorithm)
        run = _run_all_gather if alg == "mpi" else _run_all_gather_shm
        plan = _plan_data(g, key, "all_gather", tensor, run, size=nbytes, alg=alg)
    outs = check_list(tensor_list, g.size, tensor, "tensor_list")
    call = enter(g, plan, tensor)
    return plan.run(plan, g, c, tensor, outs, async_op, call)


def _run_all_gather(plan, g: Group, c, tensor, outs, async_op: bool, call: Call) -> Work | None:
    w, info = wire(tensor)
    packed = torch.empty((g.size, *tensor.shape), dtype=tensor.dtype)
    return run(
        call,
        c.Allgather,
        c.Iallgather,
        (buf(w, info), bbuf(packed, info)),
        finish=partial(unpack, packed, outs),
        async_op=async_op,
        keep=(w, packed),
    )


def _run_all_gather_shm(plan, g: Group, c, tensor, outs, async_op: bool, call: Call):
    return _shm.all_gather(g, call, tensor, outs, None, async_op)


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
    name = "all_gather_into_tensor"
    same_dtype(output, input, name)
    if output.numel() != g.size * input.numel():
        raise ValueError(
            f"all_gather_into_tensor: output has {output.numel()} elements, needs "
            f"{g.size} x {input.numel()} = {g.size * input.numel()}"
        )
    route = route_for(g, output)
    if route is not None:
        call = begin(g, name, input, nbytes=output.nbytes, alg=route[1])
        return _torchpath.all_gather_into_tensor(g, output, input, route, async_op, call)
    key = (name, *_plan.tensor_key(input), output.is_cpu, algorithm)
    plan = _plan.find(g, key)
    if plan is None:
        alg = _pick(g, name, output, output.nbytes, algorithm)
        run = _run_all_gather_into_tensor if alg == "mpi" else _run_all_gather_into_tensor_shm
        plan = _plan_data(g, key, name, input, run, size=output.nbytes, alg=alg)
    call = enter(g, plan, input)
    return plan.run(plan, g, c, output, input, async_op, call)


def _run_all_gather_into_tensor(plan, g: Group, c, output, input, async_op: bool, call: Call):
    wi, info = wire(input)
    wo, _ = wire(output, copy_in=False)
    finish = None if wo is output else partial(unstage, output, wo)
    return run(
        call,
        c.Allgather,
        c.Iallgather,
        (buf(wi, info), bbuf(wo, info)),
        finish=finish,
        async_op=async_op,
        keep=(wi, wo),
    )


def _run_all_gather_into_tensor_shm(plan, g: Group, c, output, input, async_op: bool, call: Call):
    return _shm.all_gather(g, call, input, None, output, async_op)


def barrier(group: Group | None = None, async_op: bool = False) -> Work | None:
    """Wait until every rank of the group has reached this call.

    Example: ``comm.barrier()``
    """
    g, c = member(group)
    plan = g._plans.get(_BARRIER) or _plan_data(g, _BARRIER, "barrier", None, _run_barrier, size=0)
    call = enter(g, plan)
    return plan.run(plan, g, c, async_op, call)


_BARRIER = ("barrier",)


def _run_barrier(plan, g: Group, c, async_op: bool, call: Call) -> Work | None:
    return run(call, c.Barrier, c.Ibarrier, (), async_op=async_op)
