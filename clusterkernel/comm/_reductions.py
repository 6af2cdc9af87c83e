"""Reductions: all_reduce, reduce, reduce_scatter and reduce_scatter_tensor.

Names and argument order of ``torch.distributed``; ``dst`` is a world rank. Each
call: group membership, local validation (bad input fails before any message),
:func:`~clusterkernel.comm._begin.begin` (check and flight entry), then one MPI
call, blocking or nonblocking (``async_op=True`` returns a
:class:`~clusterkernel.comm.Work`). Halves reduce in float32.

``all_reduce``, the call training loops make most, works from a plan
(:mod:`._plan`): the first call of a signature validates it and works out the
algorithm, the MPI datatype and op; later calls look the plan up and run it, in
Python or, for the plan's common case, in C (:mod:`._fastpath`).
"""

from __future__ import annotations

from functools import partial

import torch
from mpi4py import MPI

from clusterkernel.comm import _auto, _check, _fastpath, _hier, _plan, _ring, _shm, _torchpath
from clusterkernel.comm._auto.adapt import launched, settle, size_class
from clusterkernel.comm._begin import begin, enter, open_entry
from clusterkernel.comm._dtypes import DTYPES as _DTYPES
from clusterkernel.comm._dtypes import (
    HUGE_THRESHOLD,
    bbuf,
    buf,
    direct,
    dtype_of,
    reduced,
    unstage,
    wire,
)
from clusterkernel.comm._gate import GATE as _GATE
from clusterkernel.comm._groups import WORLD, Group, member, resolve
from clusterkernel.comm._handle import Call, Work, _now, run
from clusterkernel.comm._ledger import close_plan
from clusterkernel.comm._ops import (
    AVG,
    DATA_ALGORITHMS,
    SUM,
    ReduceOp,
    check_algorithm,
    op_for,
    parse_op,
)
from clusterkernel.comm._plan import own_memory
from clusterkernel.comm._tensorlists import check_list, pack, same_dtype
from clusterkernel.comm._torchpath import ROUTE as _ROUTE
from clusterkernel.comm._torchpath import route_for, torch_group

_IN_PLACE = MPI.IN_PLACE
_CHECK = _check.STATE
_fromaddress = MPI.buffer.fromaddress


def _finish_reduce(tensor: torch.Tensor, w: torch.Tensor, divisor: int) -> None:
    if divisor != 1:
        # detached only where autograd would refuse the in-place op: a detach is a new
        # tensor object, a quarter of AVG's whole cost on a small call
        (w.detach() if w.requires_grad else w).div_(divisor)
    unstage(tensor, w)


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
    # The common case runs in C when built (_fastpath.wrap below), from the same plan.
    t0 = _now()
    g = WORLD if group is None else resolve(group)
    if g.comm is None:
        g.member_comm()  # raises: not a member
    if type(op) is not ReduceOp:
        op = parse_op(op)
    try:
        cpu = tensor.is_cpu
        key = (tensor.dtype, tensor.numel(), op, algorithm, cpu)
    except AttributeError:
        dtype_of(tensor)  # raises: not a tensor
        raise
    if not cpu or _ROUTE.cpu:  # a device tensor: NCCL, where the ranks have it
        route = torch_group(g, tensor)
        if route is not None:
            op_for(op, dtype_of(tensor).kind, tensor.dtype)  # raises if undefined
            call = begin(g, "all_reduce", tensor, op=op, alg=route[1])
            return _torchpath.all_reduce(g, tensor, op, route, async_op, call)
    try:
        plan = g._plans.get(key)
    except TypeError:  # an unhashable algorithm: the new plan's checks say what is wrong
        plan = None
    if plan is None:
        plan = _plan_all_reduce(g, tensor, op, algorithm, key)
    if plan.probe and g._shm is not None:  # a tensor in the group's shared memory?
        if _auto.zero_copy(g, tensor, plan.size):
            plan = _sub_plan(g, tensor, op, "shm")  # its signature says "shm": checked
    # the flight entry only: the plan holds the rest of the call's records (a Call is
    # made only where a run needs one)
    entry = open_entry(g, plan, tensor)
    return plan.run(plan, g, tensor, async_op, entry, t0)


def _plan_all_reduce(
    g: Group, tensor: torch.Tensor, op: ReduceOp, algorithm: str, key: tuple, why: str = ""
) -> _plan.Plan:
    """Validate a new all_reduce signature and work out its plan (see :mod:`._plan`).

    ``why`` (an adaptive ``auto`` call's: ``"probe"`` or ``"switch"``) is added to the
    algorithm its timing records name, e.g. ``"ring (probe)"``."""
    info = dtype_of(tensor)  # raises for a non-tensor, a sparse one, an unknown dtype
    size = tensor.nbytes
    wired = reduced(info)
    mpi_op = op_for(op, wired.kind, tensor.dtype)  # raises if undefined for the dtype
    cpu = key[4]
    run = None
    if algorithm == "auto":
        algorithm = _auto.choose(g, "all_reduce", size) if cpu else "mpi"
        probe = cpu and size >= _auto.ZERO_COPY_MIN  # shm_empty tensors: "shm" (per call)
        if cpu and _auto.adaptive(g, "all_reduce", size) is not None:
            run = _run_adaptive  # per call: the arm's algorithm, timed
    else:
        probe = False
        if algorithm != "mpi":
            check_algorithm(algorithm)
    count = tensor.numel()
    own = direct(info, cpu)
    divisor = g.size if op is AVG else 1
    handles = None  # the C path: MPI on a host tensor's own memory, nothing after
    if algorithm == "mpi" and own and divisor == 1 and not probe and run is None and not why:
        if size < HUGE_THRESHOLD:  # huge buffers are registered first (buf())
            handles = _fastpath.handles(g, info, mpi_op)
    plan = _plan.Plan(
        g,
        "all_reduce",
        run or _RUNS[algorithm],
        wired,
        size=size,
        dtype=tensor.dtype,
        alg=f"{algorithm} ({why})" if why else algorithm,
        asked=algorithm,  # all_reduce's signature names the algorithm, "mpi" too
        numel=count,
        count=count,
        nbytes=count * wired.itemsize,
        mpi_op=mpi_op,
        op=op,
        direct=own,
        probe=probe,
        divisor=divisor,
        handles=handles,
    )
    return _plan.keep(g, key, plan)


def _run_mpi(plan, g: Group, tensor, async_op: bool, entry, t0: float) -> Work | None:
    if own_memory(plan, tensor):
        w = tensor  # zero copy: MPI works on the tensor's own memory
    else:
        w, _ = wire(tensor, reduce=True)
    nbytes = plan.nbytes
    if nbytes < HUGE_THRESHOLD:
        spec = [_fromaddress(w.data_ptr(), nbytes), plan.count, plan.info.mpi]
    else:
        spec = buf(w, plan.info)
    finish = None
    if w is not tensor or plan.divisor != 1:
        finish = partial(_finish_reduce, tensor, w, plan.divisor)
    c = g.comm
    if async_op:
        req = c.Iallreduce(_IN_PLACE, spec, plan.mpi_op)
        return Work([req], plan.call(entry), t0, finish, keep=(spec, w))
    c.Allreduce(_IN_PLACE, spec, plan.mpi_op)
    if finish is not None:
        finish()
    close_plan(plan, entry, t0)
    # the C path's answer for the next calls, decided once per plan and generation: what
    # else it reads moves the gate on (an agreed signature stays agreed meanwhile)
    if plan.handles is not None and plan.stamp != _GATE.stamp:
        _plan.admit(g, plan)
    return None


def _run_ring(plan, g: Group, tensor, async_op: bool, entry, t0: float) -> Work | None:
    w = tensor if own_memory(plan, tensor) else wire(tensor, reduce=True)[0]
    return _ring.all_reduce(g, tensor, w, plan.info, plan.op, async_op, plan.call(entry))


def _run_shm(plan, g: Group, tensor, async_op: bool, entry, t0: float) -> Work | None:
    call = plan.call(entry)
    return _shm.all_reduce(g, tensor, _DTYPES[tensor.dtype], plan.op, async_op, call)


def _run_hier(plan, g: Group, tensor, async_op: bool, entry, t0: float) -> Work | None:
    return _hier.all_reduce(g, tensor, plan.op, async_op, plan.call(entry), plan)


def _sub_plan(g: Group, tensor, op: ReduceOp, alg: str, why: str = "") -> _plan.Plan:
    """The plan of an ``auto`` call that runs ``alg``: an explicit ``algorithm=alg``
    call's, or, where ``why`` says so, one whose records name it (``"ring (probe)"``)."""
    key = (tensor.dtype, tensor.numel(), op, alg, True)
    if why:
        key = (*key, why)
    return g._plans.get(key) or _plan_all_reduce(g, tensor, op, alg, key, why)


def _run_adaptive(plan, g: Group, tensor, async_op: bool, entry, t0: float) -> Work | None:
    # auto on an adaptive size class: the plan of the algorithm the group's arm says
    # (the same on every member), which writes the call's records; blocking calls
    # timed. (A zero-copy call never gets here: all_reduce gave it the shm plan.)
    arm = g._adapt[("all_reduce", size_class(plan.size))]
    alg = arm.current if async_op else arm.next()
    sub = _sub_plan(g, tensor, plan.op, alg, arm.why_for(alg))
    if _CHECK.on:  # compared before any data moves: a divergence raises, never hangs
        _check.verify(g, "all_reduce", tensor, op=plan.op, alg=alg)
    done = sub.run(sub, g, tensor, async_op, entry, t0)
    if async_op:
        launched(g, done)
    else:
        settle(g)
        arm.took(g, alg, _now() - t0)
    return done


_RUNS = {"mpi": _run_mpi, "ring": _run_ring, "shm": _run_shm, "hier": _run_hier}
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
        op_for(op, info.kind, tensor.dtype)  # raises for an op undefined on the dtype
        call = begin(g, "reduce", tensor, op=op, root=root, alg=route[1])
        return _torchpath.reduce(g, tensor, dst, op, route, async_op, call)
    key = ("reduce", *_plan.tensor_key(tensor), op, root)
    plan = _plan.find(g, key) or _plan_reduction(g, key, "reduce", tensor, op, root=root)
    call = enter(g, plan, tensor)
    return plan.run(plan, g, c, tensor, async_op, call)


def _plan_reduction(
    g: Group,
    key: tuple,
    name: str,
    tensor: torch.Tensor,
    op: ReduceOp,
    *,
    root: int | None = None,
    alg: str = "mpi",
    nbytes: int | None = None,
) -> _plan.Plan:
    """Validate a new reduce / reduce_scatter(_tensor) signature and plan it: ``tensor``
    is the one checked (the output of a reduce-scatter), ``nbytes`` the bytes the call
    moves (default the tensor's)."""
    info = dtype_of(tensor, "tensor" if name == "reduce" else "output")
    wired = reduced(info)
    mpi_op = op_for(op, wired.kind, tensor.dtype)  # raises if undefined for the dtype
    size = tensor.nbytes if nbytes is None else nbytes
    plan = _plan.Plan(
        g,
        name,
        _REDUCTION_RUNS[name, "mpi" if alg == "mpi" else "shm"],
        wired,
        size=size,
        dtype=tensor.dtype,
        alg=alg,
        numel=tensor.numel(),
        count=tensor.numel(),
        mpi_op=mpi_op,
        op=op,
        divisor=g.size if op is AVG else 1,
        root=root,
    )
    return _plan.keep(g, key, plan)


def _run_reduce(plan, g: Group, c, tensor, async_op: bool, call: Call) -> Work | None:
    w, info = wire(tensor, reduce=True)
    if g.rank == plan.root:
        args = (_IN_PLACE, buf(w, info), plan.mpi_op, plan.root)
        finish = None
        if w is not tensor or plan.divisor != 1:
            finish = partial(_finish_reduce, tensor, w, plan.divisor)
    else:
        args = (buf(w, info), None, plan.mpi_op, plan.root)
        finish = None
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
    key = ("reduce_scatter", *_plan.tensor_key(output, "output"), op, algorithm)
    ins = check_list(input_list, g.size, output, "input_list")
    plan = _plan.find(g, key)
    if plan is None:
        dtype_of(output, "output")
        alg = _pick(g, "reduce_scatter", output, output.nbytes * g.size, algorithm)
        plan = _plan_reduction(
            g, key, "reduce_scatter", output, op, alg=alg, nbytes=output.nbytes * g.size
        )
    call = enter(g, plan, output)
    return plan.run(plan, g, c, output, ins, async_op, call)


def _pick(g: Group, name: str, tensor: torch.Tensor, nbytes: int, algorithm: str) -> str:
    """The algorithm a new plan of call ``name`` runs (``auto`` resolved; a clear error
    for one the call does not have)."""
    if algorithm == "auto":
        return _auto.pick(g, name, tensor, nbytes)
    if algorithm != "mpi":
        check_algorithm(algorithm, DATA_ALGORITHMS, name)
    return algorithm


def _run_reduce_scatter(plan, g: Group, c, output, ins, async_op: bool, call: Call) -> Work | None:
    wo, info = wire(output, reduce=True, copy_in=False)
    packed = pack(ins, wo.dtype)
    args = (bbuf(packed, info), buf(wo, info), plan.mpi_op)
    finish = partial(_finish_reduce, output, wo, plan.divisor)
    return run(
        call,
        c.Reduce_scatter_block,
        c.Ireduce_scatter_block,
        args,
        finish=finish,
        async_op=async_op,
        keep=(wo, packed),
    )


def _run_reduce_scatter_shm(plan, g: Group, c, output, ins, async_op: bool, call: Call):
    return _shm.reduce_scatter(g, call, output, ins, None, plan.op, async_op)


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
    name = "reduce_scatter_tensor"
    same_dtype(output, input, name)
    if input.numel() != g.size * output.numel():
        raise ValueError(
            f"reduce_scatter_tensor: input has {input.numel()} elements, needs "
            f"{g.size} x {output.numel()} = {g.size * output.numel()}"
        )
    route = route_for(g, output)
    if route is not None:
        op_for(op, dtype_of(output).kind, output.dtype)  # raises if undefined
        call = begin(g, name, output, op=op, nbytes=input.nbytes, alg=route[1])
        return _torchpath.reduce_scatter_tensor(g, output, input, op, route, async_op, call)
    key = (name, *_plan.tensor_key(output), op, algorithm)
    plan = _plan.find(g, key)
    if plan is None:
        alg = _pick(g, name, input, input.nbytes, algorithm)
        plan = _plan_reduction(g, key, name, output, op, alg=alg, nbytes=input.nbytes)
    call = enter(g, plan, output)
    return plan.run(plan, g, c, output, input, async_op, call)


def _run_reduce_scatter_tensor(plan, g: Group, c, output, input, async_op: bool, call: Call):
    wi, info = wire(input, reduce=True)
    wo, _ = wire(output, reduce=True, copy_in=False)
    args = (bbuf(wi, info), buf(wo, info), plan.mpi_op)
    finish = None
    if wo is not output or plan.divisor != 1:
        finish = partial(_finish_reduce, output, wo, plan.divisor)
    return run(
        call,
        c.Reduce_scatter_block,
        c.Ireduce_scatter_block,
        args,
        finish=finish,
        async_op=async_op,
        keep=(wi, wo),
    )


def _run_reduce_scatter_tensor_shm(plan, g: Group, c, output, input, async_op: bool, call: Call):
    return _shm.reduce_scatter(g, call, output, None, input, plan.op, async_op)


_REDUCTION_RUNS = {
    ("reduce", "mpi"): _run_reduce,
    ("reduce_scatter", "mpi"): _run_reduce_scatter,
    ("reduce_scatter", "shm"): _run_reduce_scatter_shm,
    ("reduce_scatter_tensor", "mpi"): _run_reduce_scatter_tensor,
    ("reduce_scatter_tensor", "shm"): _run_reduce_scatter_tensor_shm,
}
