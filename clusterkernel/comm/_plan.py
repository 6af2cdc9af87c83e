"""A call's plan: what one signature on one group needs, worked out once.

The first call of a signature (for ``all_reduce``: dtype, element count, reduce op
and the algorithm asked for) on a group validates it, resolves ``auto``, and looks
up the MPI datatype and op; the :class:`Plan` keeps the result in the group's
``_plans``. A later call with the same signature is one dict lookup, then
``plan.run(...)``. Plans are local (each rank makes its own); whether the group has
*agreed* on a signature is :mod:`._check`'s business, and a plan only caches the
answer (:func:`agreed`), so every member still decides to check or not from the
same agreed set.

The C fast path reads the same plans (``Plan.fast``): it runs a call only where the
plan says MPI's own allreduce on the tensor's memory, with the plan's handles, and
hands every other call to Python. The rules live here, not in C.

Example::

    comm.all_reduce(torch.ones(1024))
    plan = comm.WORLD._plans[(torch.float32, 1024, comm.SUM, "auto", True)]
    plan.alg        # 'mpi' for 4 KB on one node (key: dtype, numel, op, algorithm, is_cpu)
"""

from __future__ import annotations

from collections.abc import Callable

from clusterkernel.comm._dtypes import DType
from clusterkernel.comm._groups import Group
from clusterkernel.comm._ops import ReduceOp

# Plans kept per group before the cache starts afresh (a program that reduces
# tensors of ever new sizes must not grow it without bound).
MAX_PLANS = 4096


class Plan:
    """What one call signature needs on one group (see the module docstring).

    ``sig`` is the signature's key in the group's agreed set (:mod:`._check`);
    ``agreed`` the generation of that set in which it was found there (-1: not
    yet). ``alg`` is the algorithm a plain tensor runs; ``probe`` says a tensor of
    this signature might live in the group's shared memory, where ``auto`` picks
    ``shm`` instead (looked at per call). ``info``/``mpi_op``/``count``/``nbytes``
    describe what MPI moves (halves travel as float32), ``size`` is the tensor's own
    byte size (the flight entry's), ``direct`` that MPI may work on the tensor's own
    memory when it is contiguous, ``divisor`` what AVG divides by (1: nothing).
    ``fast`` is ``(datatype handle, op handle)`` where the C path may run the call.
    """

    __slots__ = (
        "sig",
        "agreed",
        "alg",
        "probe",
        "info",
        "mpi_op",
        "count",
        "nbytes",
        "size",
        "direct",
        "divisor",
        "op",
        "run",
        "fast",
    )

    def __init__(
        self,
        sig: tuple,
        alg: str,
        info: DType,
        mpi_op: object,
        count: int,
        size: int,
        *,
        op: ReduceOp,
        run: Callable,
        direct: bool = False,
        probe: bool = False,
        divisor: int = 1,
        fast: tuple[int, int] | None = None,
    ) -> None:
        self.sig = sig
        self.agreed = -1
        self.alg = alg
        self.probe = probe
        self.info = info
        self.mpi_op = mpi_op
        self.count = count
        self.nbytes = count * info.itemsize
        self.size = size
        self.direct = direct
        self.divisor = divisor
        self.op = op
        self.run = run
        self.fast = fast

    def __repr__(self) -> str:
        return f"<Plan {self.sig[0]} {self.alg} {self.count} x {self.info.mpi.Get_name()}>"


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
