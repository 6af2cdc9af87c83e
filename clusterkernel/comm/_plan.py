"""A call's plan: what one signature on one group needs, worked out once.

Every tensor call, collective or point-to-point, takes the same step. Its key (the
call's name, the tensor's dtype, element count and device kind, and what else
changes the call: reduce op, root or peer as a group rank, the algorithm asked
for) is looked up in the group's ``_plans``. The first call of a key validates it,
resolves ``auto``, and looks up the MPI datatype and op; the :class:`Plan` keeps
that, the check signature, the flight entry's and timing record's bytes and the
function that runs it. Then :func:`~._begin.enter` (the check the signature is due,
the flight entry; it returns the call's :class:`~._handle.Call`, made by
:meth:`Plan.call`), then ``plan.run(...)``, sync or async by ``async_op``, which ends
in the ledger (:func:`~._ledger.close`, through :mod:`._handle`).

**The one constructor of a call's records.** A plan makes its call's check signature
(:class:`Sig`, from the plan's own fields), its flight entry (:func:`~._begin.enter`
from ``name``/``size``/``dtype``/``peer``) and its timing record's fields
(:meth:`Plan.call`); call sites pass only what varies per call (the tensor, the bytes of
an all-to-all). Calls with nothing to cache make a plan for the one call
(:func:`~._begin.begin`). No other module builds a ``Call``, a signature or a flight
entry (tests/test_seam.py reads the source for it).

**Admission rules, each written once, here or in** :mod:`._dtypes`: whether a check is
due (:func:`check_due`), whether MPI works on the tensor's own memory
(:func:`own_memory`; the plan's part, :func:`~._dtypes.direct`), and that halves reduce
in float32 (:func:`~._dtypes.reduced`). :func:`admit` applies them after a blocking
Python call of a plan whose answer is not current and leaves the C path its answer in
``plan.fast`` (the handles, or None), stamped with :data:`GATE`'s generation, which
every change of the check mode, of forced staging or of a group's agreed set moves on
(so once per plan and generation). Plans are local
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

The C fast path reads all_reduce's plans (``Plan.fast``, ``Plan.stamp``): it runs a
call only where the plan's answer is current and says MPI's own allreduce on the
tensor's memory (a contiguous tensor), with the plan's handles, and hands every other
call to Python. The rules live here, not in C. The C path remembers a few plans by
their key's parts (skipping the key's tuple and the dict look-up): a plan that leaves
its group's cache is dropped (:func:`keep`, :func:`forget`: ``fast`` and ``handles``
None), so a remembered one is never run after it.

Example::

    comm.all_reduce(torch.ones(1024))
    plan = comm.WORLD._plans[(torch.float32, 1024, comm.SUM, "auto", True)]
    plan.alg        # 'mpi' for 4 KB on one node (key: dtype, numel, op, algorithm, is_cpu)
    comm.broadcast(torch.ones(8), src=0)
    comm.WORLD._plans[("broadcast", torch.float32, 8, True, 0, "auto")].alg   # 'mpi'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from clusterkernel.comm import _check
from clusterkernel.comm._dtypes import STAGING, DType, dtype_of
from clusterkernel.comm._gate import GATE
from clusterkernel.comm._groups import Group
from clusterkernel.comm._handle import Call
from clusterkernel.comm._ledger import code as record_code
from clusterkernel.comm._ops import ReduceOp

# Plans kept per group before the cache starts afresh (a program that reduces
# tensors of ever new sizes must not grow it without bound).
MAX_PLANS = 4096
_CHECK = _check.STATE
# ``asked`` left out: the signature's algorithm is the plan's, None for "mpi"
_FROM_ALG = "<from alg>"
# a Call made as the tuple it is: half the time of its NamedTuple constructor (a
# Python function), on every call's path; its fields are Call's, in Call's order
_new_call = tuple.__new__


class Sig(NamedTuple):
    """A call's check signature, the key of the group's agreed set (:mod:`._check`):
    equal on every rank for equal calls (a parsed op, a world-rank root, a dtype and an
    element count; -1 / None for what the call does not have). Made by :class:`Plan`."""

    name: str
    dtype: object = None
    numel: int = -1
    op: ReduceOp | None = None
    root: int | None = None
    alg: str | None = None
    count: int = -1
    extra: int = -1


class Plan:
    """What one call signature needs on one group (see the module docstring).

    ``name`` is the call's (the flight entry's and timing record's op). ``sig`` is
    the signature's key in the group's agreed set (a :class:`Sig`; None for
    point-to-point calls, which are not checked), ``detail`` how much of the tensor
    the check compares (``"size"``, or ``"dtype"`` where sizes may differ per rank);
    ``agreed`` the generation of the agreed set in which ``sig`` was found there
    (-1: not yet). ``alg`` is the algorithm a plain tensor runs (the timing record's);
    ``probe`` says a tensor of this signature might live in the group's shared
    memory, where ``auto`` picks ``shm`` instead (looked at per call).
    ``info``/``mpi_op``/``count``/``nbytes`` describe what MPI moves (reductions'
    halves as float32), ``size`` the bytes both the flight entry and the timing record
    carry, ``dtype`` the entry's dtype, ``gsize`` the group's size (the record's),
    ``op_code``/``alg_code`` the record's ``name``/``alg`` as the recorder's ring
    stores them,
    ``direct`` that MPI may work on the tensor's own memory when it is contiguous,
    ``divisor`` what AVG divides by (1: nothing), ``root`` the group rank MPI
    addresses (a rooted call's root, a point-to-point call's peer, or any source),
    ``peer`` the flight entry's peer of a point-to-point call (a world rank, -1: any
    source; None for collectives). ``run`` runs one call of the plan. ``handles`` is
    ``(datatype handle, op handle, communicator handle)`` where the C path may run the
    call (all_reduce only); ``fast`` is ``handles`` once :func:`admit` let the C path
    take the plan's calls, with ``stamp`` the :data:`GATE` generation it decided in.

    ``asked`` is the signature's algorithm (what the caller asked for; by default
    None for ``alg="mpi"`` and ``alg`` otherwise), ``numel`` its element count,
    ``sig_count``/``extra`` its call-specific fields (a list's length, a layout code).
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
        "gsize",
        "op_code",
        "alg_code",
        "direct",
        "divisor",
        "op",
        "root",
        "peer",
        "run",
        "handles",
        "fast",
        "stamp",
    )

    def __init__(
        self,
        g: Group,
        name: str,
        run: Callable | None,
        info: DType | None,
        *,
        size: int,
        dtype: object,
        alg: str = "mpi",
        asked: str | None = _FROM_ALG,
        numel: int = -1,
        count: int = 0,
        sig_count: int = -1,
        extra: int = -1,
        nbytes: int | None = None,
        mpi_op: object = None,
        op: ReduceOp | None = None,
        detail: str = "size",
        direct: bool = False,
        probe: bool = False,
        divisor: int = 1,
        root: int | None = None,
        peer: int | None = None,
        handles: tuple[int, int, int] | None = None,
    ) -> None:
        self.name = name
        if peer is not None:  # point-to-point: not checked
            self.sig = None
        else:
            if asked is _FROM_ALG:
                asked = None if alg == "mpi" else alg
            self.sig = Sig(
                name,
                dtype,
                -1 if detail == "dtype" else numel,
                op,
                None if root is None else g.ranks[root],
                asked,
                sig_count,
                extra,
            )
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
        self.gsize = g.size
        # the timing record's names as the recorder's ring stores them (the C writes them)
        self.op_code = record_code(name)
        self.alg_code = record_code(alg)
        self.direct = direct
        self.divisor = divisor
        self.op = op
        self.root = root
        self.peer = peer
        self.run = run
        self.handles = handles
        self.fast = None  # not yet admitted: the first call runs in Python
        self.stamp = -1

    def call(self, entry: int | None, nbytes: int = -1, alg: str | None = None) -> Call:
        """The :class:`~._handle.Call` of one call of this plan: its timing record's
        fields and its flight entry. ``nbytes`` where the bytes vary per call under one
        plan (all-to-all; -1: ``size``), ``alg`` where a step runs the call another way
        than planned (a hier call on one node is shared memory's)."""
        return _new_call(
            Call,
            (
                self.name,
                self.size if nbytes < 0 else nbytes,
                self.alg if alg is None else alg,
                self.gsize,
                entry,
                True,
            ),
        )

    def __repr__(self) -> str:
        wired = self.info.mpi.Get_name() if self.info is not None else "-"
        return f"<Plan {self.name} {self.alg} {self.size} B {wired}>"


def step(name: str, alg: str) -> Call:
    """A step of another call (hier's shared-memory stages): its flight entry is the
    call's and the call writes the timing record, so the step writes none."""
    return _new_call(Call, (name, 0, alg, 0, None, False))


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
        _drop_all(plans)
    old = plans.get(key)
    if old is not None:
        _drop(old)
    plans[key] = plan
    return plan


def _drop(plan: Plan) -> None:
    """``plan`` leaves its group's cache: the C path never runs it again (it may still
    remember it by its key's parts, until it finds ``fast`` None), and :func:`admit`,
    which reads ``handles`` after its stamp, never gives it back (a Python call of it
    still in flight in another thread)."""
    plan.handles = None
    plan.fast = None


def _drop_all(plans: dict) -> None:
    for plan in plans.values():
        _drop(plan)
    plans.clear()


def agreed(g: Group, plan: Plan) -> bool:
    """Whether ``plan``'s signature is in ``g``'s agreed set (cached per generation)."""
    gen = g._sig_gen
    if plan.agreed == gen:
        return True
    if plan.sig in g._sigs:
        plan.agreed = gen
        return True
    return False


def check_due(g: Group, plan: Plan) -> bool:
    """Whether a call of ``plan`` must be checked across ``g`` first (the rule, once):
    never for point-to-point calls, every call in mode ``"every"``, and in mode
    ``"new"`` until the group agreed on the signature."""
    if plan.sig is None:
        return False
    check = _CHECK
    return check.on or (check.new and not agreed(g, plan))


def own_memory(plan: Plan, tensor: object) -> bool:
    """Whether MPI works on ``tensor``'s own memory for a call of ``plan`` (the rule,
    once): the plan allows it (:func:`~._dtypes.direct`), the tensor is contiguous and
    staging is not forced."""
    return plan.direct and tensor.is_contiguous() and not STAGING.force


def admit(g: Group, plan: Plan) -> None:
    """Leave the C path its answer for ``plan``'s next calls: ``fast`` the handles where
    the plan runs MPI on the tensor's own memory with nothing due before (no check) and
    nothing after, else None; stamped with :data:`GATE`'s generation. Called after a
    blocking Python call of a plan that has ``handles`` where ``plan.stamp`` is not the
    gate's (the C path takes the plan's calls from the next one)."""
    stamp = GATE.stamp  # read first: a change while the rules are read leaves it stale
    ok = plan.direct and not STAGING.force and not check_due(g, plan)
    # the answer, then its stamp, with no call between (another thread's C path may run
    # during check_due: it must not see this stamp with the answer of an older one)
    plan.fast = plan.handles if ok else None
    plan.stamp = stamp


def forget(g: Group) -> None:
    """Drop ``g``'s plans (its ``auto`` rules changed: :func:`~clusterkernel.comm.tune`)."""
    _drop_all(g._plans)
