"""Reduction operators and how each maps onto MPI for a given element kind."""

from __future__ import annotations

import enum

import numpy as np
from mpi4py import MPI


class ReduceOp(enum.Enum):
    """Reduction operators, as in ``torch.distributed.ReduceOp``.

    Example: ``comm.all_reduce(t, op=comm.ReduceOp.MAX)`` (or ``op=comm.MAX``).

    On ``bool`` tensors SUM and MAX are logical OR, PRODUCT and MIN logical AND (as
    torch's NCCL backend does). AVG needs a floating-point or complex tensor; MIN and
    MAX are not defined for complex numbers.
    """

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    AVG = "avg"


SUM, PRODUCT, MIN, MAX, AVG = (
    ReduceOp.SUM,
    ReduceOp.PRODUCT,
    ReduceOp.MIN,
    ReduceOp.MAX,
    ReduceOp.AVG,
)

# Element kinds (see _dtypes): f float, h half (reduced in float32), i int, b bool, c complex.
_MPI_OP = {
    SUM: MPI.SUM,
    PRODUCT: MPI.PROD,
    MIN: MPI.MIN,
    MAX: MPI.MAX,
    AVG: MPI.SUM,  # then divide by the group size
}
_BOOL_OP = {SUM: MPI.LOR, MAX: MPI.LOR, PRODUCT: MPI.LAND, MIN: MPI.LAND}
_UFUNC = {SUM: np.add, PRODUCT: np.multiply, MIN: np.minimum, MAX: np.maximum, AVG: np.add}
_BOOL_UFUNC = {SUM: np.logical_or, MAX: np.logical_or, PRODUCT: np.logical_and, MIN: np.logical_and}

# (op, kind) -> MPI op, for every valid pair; filled below so lookups are one dict get.
MPI_OPS: dict[tuple[ReduceOp, str], MPI.Op] = {}
UFUNCS: dict[tuple[ReduceOp, str], np.ufunc] = {}
for _op in ReduceOp:
    for _kind in "fhic":
        if _kind == "c" and _op in (MIN, MAX):
            continue
        if _kind == "i" and _op is AVG:
            continue
        MPI_OPS[(_op, _kind)] = _MPI_OP[_op]
        UFUNCS[(_op, _kind)] = _UFUNC[_op]
    if _op in _BOOL_OP:
        MPI_OPS[(_op, "b")] = _BOOL_OP[_op]
        UFUNCS[(_op, "b")] = _BOOL_UFUNC[_op]


def parse_op(op: object) -> ReduceOp:
    """Accept a :class:`ReduceOp` or its name (``"sum"``, ``"MAX"``, ...)."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp(op.lower())
        except ValueError:
            pass
    names = ", ".join(o.name for o in ReduceOp)
    raise ValueError(f"unknown reduce op {op!r}; use one of comm.{names.replace(', ', ', comm.')}")


def op_for(op: ReduceOp, kind: str, dtype: object) -> MPI.Op:
    """The MPI op for ``op`` on elements of ``kind``, or a clear error if undefined."""
    mpi_op = MPI_OPS.get((op, kind))
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


ALGORITHMS = ("mpi", "ring")


def check_algorithm(algorithm: object) -> None:
    """Raise a clear error for an allreduce algorithm other than "mpi" or "ring"."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; use one of {ALGORITHMS}")
