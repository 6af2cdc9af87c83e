"""Shared by the case files that run on every MPI rank (under mpiexec).

Data is made from a seed and a rank, so every rank can rebuild every other rank's
input and compute the expected result with numpy, without communication. Results
are judged together: ``agree`` combines each rank's verdict with a raw mpi4py
allreduce, so all ranks pass or fail a case together and none is left waiting in
a collective the others skipped.
"""

from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI

from clusterkernel import comm

WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()
SIZE = WORLD.Get_size()

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
]
COMPLEX = [torch.complex64, torch.complex128]
ALL_DTYPES = [*FLOATS, *INTS, torch.bool, *COMPLEX]
OPS = [comm.SUM, comm.PRODUCT, comm.MIN, comm.MAX, comm.AVG]


def kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "b"
    if dtype.is_complex:
        return "c"
    return "f" if dtype.is_floating_point else "i"


def valid(op, dtype: torch.dtype) -> bool:
    """Whether ``op`` is defined on ``dtype`` (see comm.ReduceOp)."""
    k = kind(dtype)
    if op is comm.AVG:
        return k in "fc"
    if op in (comm.MIN, comm.MAX):
        return k != "c"
    return True


def data(seed: int, rank: int, shape, dtype: torch.dtype, op=comm.SUM) -> torch.Tensor:
    """Rank ``rank``'s input: small exact values (sums and products stay exact)."""
    rng = np.random.default_rng([seed, rank])
    k = kind(dtype)
    small = op is comm.PRODUCT
    if k == "b":
        arr = np.asarray(rng.integers(0, 2, shape), dtype=np.int64)
        return torch.from_numpy(arr).to(torch.bool)
    lo, hi = (-2, 3) if small else (-8, 9)
    if k == "i" and not dtype.is_signed:
        lo = 0
    arr = np.asarray(rng.integers(lo, hi, shape), dtype=np.int64)
    if k == "i":
        return torch.from_numpy(arr).to(dtype)
    vals = np.asarray(arr / 2.0 if small else arr / 4.0)
    if k == "c":
        im = np.asarray(rng.integers(lo, hi, shape)) / (2.0 if small else 4.0)
        return torch.from_numpy(vals + 1j * im).to(dtype)
    return torch.from_numpy(vals).to(dtype)


def as_ref(t: torch.Tensor) -> np.ndarray:
    """A tensor's values in a numpy dtype wide enough to compare exactly."""
    k = kind(t.dtype)
    if k == "b":
        return t.numpy().copy()
    if k == "c":
        return t.to(torch.complex128).numpy()
    if k == "i":
        return t.to(torch.int64).numpy()
    return t.to(torch.float64).numpy()


def reduce_ref(op, arrays: list[np.ndarray], dtype: torch.dtype) -> np.ndarray:
    """numpy reference of reducing ``arrays`` with torch's semantics for ``dtype``."""
    stack = np.stack(arrays)
    if kind(dtype) == "b":
        if op in (comm.SUM, comm.MAX):
            return stack.any(axis=0)
        return stack.all(axis=0)
    if op is comm.SUM:
        out = stack.sum(axis=0)
    elif op is comm.PRODUCT:
        out = stack.prod(axis=0)
    elif op is comm.MIN:
        out = stack.min(axis=0)
    elif op is comm.MAX:
        out = stack.max(axis=0)
    else:
        out = stack.mean(axis=0)
    # The result lives in ``dtype``: round the reference the same way.
    return as_ref(torch.from_numpy(np.asarray(out)).to(dtype))


def close(got: torch.Tensor, want: np.ndarray, dtype: torch.dtype) -> bool:
    g = as_ref(got)
    if g.shape != want.shape:
        return False
    if kind(dtype) in "bi":
        return bool(np.array_equal(g, want))
    tol = {torch.float16: 1e-3, torch.bfloat16: 1e-2}.get(dtype, 1e-6)
    return bool(np.allclose(g, want, rtol=tol, atol=tol))


def agree(ok: bool, what: str = "") -> None:
    """Fail on every rank if the check failed on any rank (naming those ranks)."""
    verdicts = WORLD.allgather(bool(ok))
    bad = [r for r, v in enumerate(verdicts) if not v]
    assert not bad, f"failed on ranks {bad}: {what}"


def expect_error(exc_type, fn, *args, match: str = "", **kwargs) -> str:
    """Call ``fn``; it must raise ``exc_type`` with ``match`` in the message."""
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        msg = str(exc)
        assert match in msg, f"{exc_type.__name__} message {msg!r} lacks {match!r}"
        return msg
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc_type.__name__}")
