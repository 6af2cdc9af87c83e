"""Reduction operators and how each maps onto MPI for a given element kind."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI


class ReduceOp:
    """Reduction operators, as in ``torch.distributed.ReduceOp``.

    Example: ``comm.all_reduce(t, op=comm.ReduceOp.MAX)`` (or ``op=comm.MAX``, or
    ``op="max"``).

    On ``bool`` tensors SUM and MAX are logical OR, PRODUCT and MIN logical AND (as
    torch's NCCL backend does). AVG needs a floating-point or complex tensor; MIN and
    MAX are not defined for complex numbers.

    Each operator carries its MPI op and numpy ufunc per element kind (``mpi`` and
    ``ufunc``, keyed by "f" float, "h" half, "i" integer, "b" bool, "c" complex), so
    a call finds them with one small dict lookup.
    """

    __slots__ = ("name", "mpi", "ufunc")
    SUM: ReduceOp
    PRODUCT: ReduceOp
    MIN: ReduceOp
    MAX: ReduceOp
    AVG: ReduceOp

    def __init__(self, name: str, mpi: dict[str, MPI.Op], ufunc: dict[str, np.ufunc]):
        self.name = name
        self.mpi = mpi
        self.ufunc = ufunc

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"

    def __reduce__(self) -> tuple:
        return (parse_op, (self.name,))


def _table(mpi_op, ufunc, bool_pair=None, kinds: str = "fhic") -> tuple[dict, dict]:
    mpi = dict.fromkeys(kinds, mpi_op)
    ufuncs = dict.fromkeys(kinds, ufunc)
    if bool_pair is not None:
        mpi["b"], ufuncs["b"] = bool_pair
    return mpi, ufuncs


_OR = (MPI.LOR, np.logical_or)
_AND = (MPI.LAND, np.logical_and)
SUM = ReduceOp("SUM", *_table(MPI.SUM, np.add, _OR))
PRODUCT = ReduceOp("PRODUCT", *_table(MPI.PROD, np.multiply, _AND))
MIN = ReduceOp("MIN", *_table(MPI.MIN, np.minimum, _AND, kinds="fhi"))
MAX = ReduceOp("MAX", *_table(MPI.MAX, np.maximum, _OR, kinds="fhi"))
AVG = ReduceOp("AVG", *_table(MPI.SUM, np.add, kinds="fhc"))  # then divide by the group size
ALL_OPS = (SUM, PRODUCT, MIN, MAX, AVG)
for _op in ALL_OPS:
    setattr(ReduceOp, _op.name, _op)
_BY_NAME = {o.name: o for o in ALL_OPS}


def parse_op(op: object) -> ReduceOp:
    """Accept a :class:`ReduceOp` or its name (``"sum"``, ``"MAX"``, ...)."""
    if type(op) is ReduceOp:
        return op
    if isinstance(op, str) and op.upper() in _BY_NAME:
        return _BY_NAME[op.upper()]
    names = ", ".join("comm." + o.name for o in ALL_OPS)
    raise ValueError(f"unknown reduce op {op!r}; use one of {names}")


def op_for(op: ReduceOp, kind: str, dtype: object) -> MPI.Op:
    """The MPI op for ``op`` on elements of ``kind``, or a clear error if undefined."""
    mpi_op = op.mpi.get(kind)
    if mpi_op is None:
        raise ValueError(_undefined(op, kind, dtype))
    return mpi_op


def _undefined(op: ReduceOp, kind: str, dtype: object) -> str:
    if op is AVG and kind in "ib":
        return (
            f"op AVG needs a floating-point or complex tensor, got {dtype}; "
            "use op=SUM and divide, or convert the tensor to float"
        )
    if kind == "c":
        return f"op {op.name} is not defined for complex tensors ({dtype}); use SUM, PRODUCT or AVG"
    return f"op {op.name} is not supported for {dtype}"


ALGORITHMS = ("mpi", "ring", "shm", "hier")  # for all_reduce
FUSED_ALGORITHMS = ("mpi", "ring", "shm")  # all_reduce_coalesced
DATA_ALGORITHMS = ("mpi", "shm")  # broadcast, all_gather, reduce_scatter (no ring)


def check_algorithm(
    algorithm: object, allowed: tuple[str, ...] = ALGORITHMS, what: str = "all_reduce"
) -> None:
    """Raise a clear error for an algorithm not in ``allowed`` (default: all_reduce's)."""
    if algorithm not in allowed:
        raise ValueError(
            f"unknown algorithm {algorithm!r} for {what}; use 'auto' (the default) or one "
            f"of {allowed}"
        )
