"""A call's plan: what one signature on one group needs, worked out once.

Every tensor call, collective or point-to-point, takes the same step. Its key (the
call's name, the tensor's dtype, element count and device kind, and what else
changes the call: reduce op, root or peer as a group rank, the algorithm asked
for) is looked up in the group's ``_plans``. The first call of a key validates it,
resolves ``auto``, and looks up the MPI datatype and op; the :class:`Plan` keeps
that, the check signature, the flight entry's and timing record's bytes and the
function that runs it. Then :func:`~._begin.enter` (the check the signature is due,
the flight entry), then ``plan.run(...)``, sync or async by ``async_op``, which ends
in the ledger (:func:`~._ledger.close`, through :mod:`._handle`). Plans are local
(each rank makes its own); whether the group has *agreed* on a signature is
:mod:`._check`'s business, and a plan only caches the answer (:func:`agreed`), so
every member still decides to check or not from the same agreed set.

Not in a plan, because it changes per call: the tensor's memory (so the MPI buffer
spec and any staging copy: contiguity, a lazy conjugate and forced staging are
looked at per call, :func:`~._dtypes.wire`), lists of tensors (checked per call),
all-to-all's split sizes, a tag. Calls with nothing to plan take the same ledger
steps without one: object calls (a pickle per call: :func:`~._begin.begin` or the
point-to-point flight entry, then :func:`~._handle.drive`), CUDA tensors handed to
torch.distributed (:mod:`._torchpath`, through :func:`~._begin.begin`), and
``all_reduce_coalesced`` (:mod:`._fusion`, its buckets' layout is its signature).

The C fast path reads all_reduce's plans (``Plan.fast``): it runs a call only where
the plan says MPI's own allreduce on the tensor's memory, with the plan's handles,
and hands every other call to Python. The rules live here, not in C.

Example::

    comm.all_reduce(torch.ones(1024))
    plan = comm.WORLD._plans[(torch.float32, 1024, comm.SUM, "auto", True)]
    plan.alg        # 'mpi' for 4 KB on one node (key: dtype, numel, op, algorithm, is_cpu)
    comm.broadcast(torch.ones(8), src=0)
    comm.WORLD._plans[("broadcast", torch.float32, 8, True, 0, "auto")].alg   # 'mpi'
"""

from __future__ import annotations

from collections.abc import Callable

from clusterkernel.comm._dtypes import DType, dtype_of
from clusterkernel.comm._groups import Group
from clusterkernel.comm._ops import ReduceOp

# Plans kept per group before the cache starts afresh (a program that reduces
# tensors of ever new sizes must not grow it without bound).
MAX_PLANS = 4096


class Plan:
    """What one call signature needs on one group (see the module docstring).

    ``name`` is the call's (the flight entry's and timing record's op). ``sig`` is
    the signature's key in the group's agreed set (:mod:`._check`; None for
    point-to-point calls, which are not checked), ``detail`` how much of the tensor
    the check compares (``"size"``, or ``"dtype"`` where sizes may differ per rank);
    ``agreed`` the generation of the agreed set in which ``sig`` was found there
    (-1: not yet). ``alg`` is the algorithm a plain tensor runs; ``probe`` says a
    tensor of this signature might live in the group's shared memory, where ``auto``
    picks ``shm`` instead (looked at per call). ``info``/``mpi_op``/``count``/
    ``nbytes`` describe what MPI moves (all_reduce's halves as float32), ``size`` the
    bytes both the flight entry and the timing record carry, ``dtype`` the entry's
    dtype, ``direct`` that MPI may work on the tensor's own memory when it is
    contiguous, ``divisor`` what AVG divides by (1: nothing), ``root`` the group
    rank MPI addresses (a rooted call's root, a point-to-point call's peer, or any
    source), ``peer`` the flight entry's peer of a point-to-point call (a world
    rank, -1: any source; None for collectives). ``run`` runs one call of the plan. ``fast`` is
    ``(datatype handle, op handle, communicator handle)`` where the C path may run
    the call (all_reduce only).
    """

    __slots__ = (
        "name",
        "sig",
        "detail",
        "agreed",
        "alg",
        "probe",
        "info",
        "mpi_op",
        "count",
        "nbytes",
        "size",
        "dtype",
        "direct",
        "divisor",
        "op",
        "root",
        "peer",
        "run",
        "fast",
    )

    def __init__(
        self,
        name: str,
        run: Callable,
        sig: tuple | None,
        info: DType,
        *,
        size: int,
        dtype: object,
        alg: str = "mpi",
        count: int = 0,
        nbytes: int | None = None,
        mpi_op: object = None,
        op: ReduceOp | None = None,
        detail: str = "size",
        direct: bool = False,
        probe: bool = False,
        divisor: int = 1,
        root: int | None = None,
        peer: int | None = None,
        fast: tuple[int, int, int] | None = None,
    ) -> None:
        self.name = name
        self.sig = sig
        self.detail = detail
        self.agreed = -1
        self.alg = alg
        self.probe = probe
        self.info = info
        self.mpi_op = mpi_op
        self.count = count
        self.nbytes = size if nbytes is None else nbytes
        self.size = size
        self.dtype = dtype
        self.direct = direct
        self.divisor = divisor
        self.op = op
        self.root = root
        self.peer = peer
        self.run = run
        self.fast = fast

    def __repr__(self) -> str:
        return f"<Plan {self.name} {self.alg} {self.size} B {self.info.mpi.Get_name()}>"


def find(g: Group, key: tuple) -> Plan | None:
    """``g``'s plan for ``key``, or None (also for an unhashable key: a new plan's
    checks then say what is wrong)."""
    try:
        return g._plans.get(key)
    except TypeError:
        return None


def tensor_key(tensor: object, what: str = "tensor") -> tuple:
    """``(dtype, numel, is_cpu)`` of ``tensor``, the part of a key a tensor gives; a
    clear TypeError for what is not a tensor."""
    try:
        return tensor.dtype, tensor.numel(), tensor.is_cpu
    except AttributeError:
        dtype_of(tensor, what)  # raises: not a tensor
        raise


def keep(g: Group, key: tuple, plan: Plan) -> Plan:
    """Remember ``plan`` under ``key`` on ``g``; returns it."""
    plans = g._plans
    if len(plans) >= MAX_PLANS:
        plans.clear()
    plans[key] = plan
    return plan


def agreed(g: Group, plan: Plan) -> bool:
    """Whether ``plan``'s signature is in ``g``'s agreed set (cached per generation)."""
    gen = g._sig_gen
    if plan.agreed == gen:
        return True
    if plan.sig in g._sigs:
        plan.agreed = gen
        return True
    return False


def forget(g: Group) -> None:
    """Drop ``g``'s plans (its ``auto`` rules changed: :func:`~clusterkernel.comm.tune`)."""
    g._plans.clear()
