"""Check mode "every" on every rank: mismatched collectives raise everywhere, naming ranks."""

from __future__ import annotations

import pytest
import torch
from _helpers import RANK, SIZE, agree

from clusterkernel import comm

pytestmark = pytest.mark.skipif(SIZE < 2, reason="a mismatch needs two ranks")


@pytest.fixture(autouse=True)
def checking():
    comm.set_check("every")
    yield
    comm.set_check("new")


def _raised(fn, *args, **kwargs) -> str:
    try:
        fn(*args, **kwargs)
    except comm.CollectiveMismatchError as exc:
        return str(exc)
    return ""


def test_matching_calls_pass():
    t = torch.ones(3)
    comm.all_reduce(t)
    comm.all_reduce(t, algorithm="ring")
    comm.broadcast(t, src=0)
    comm.barrier()
    comm.all_reduce_coalesced([t, torch.ones(2)])
    agree(comm.check_mode() == "every" and bool(torch.all(t == SIZE**3)))


def test_different_collectives_named_on_every_rank():
    t = torch.ones(4)
    if RANK == SIZE - 1:
        msg = _raised(comm.broadcast, t, src=0)
    else:
        msg = _raised(comm.all_reduce, t)
    ok = f"ranks [{SIZE - 1}] differ" in msg and "broadcast(float32[4], root=0)" in msg
    ok = ok and "all_reduce(float32[4], op=SUM" in msg
    agree(ok, msg)


def _names(msg: str, *lines: str) -> bool:
    """The message says ranks differ and shows each expected ``rank r: call`` line."""
    return "differ" in msg and all(line in msg for line in lines)


def test_shape_dtype_op_mismatches():
    shape = (3,) if RANK == 1 else (4,)
    msg = _raised(comm.all_reduce, torch.ones(shape))
    ok = _names(msg, "rank 1: all_reduce(float32[3], op=SUM, algorithm=mpi)", "0")
    dtype = torch.float64 if RANK == 0 else torch.float32
    msg = _raised(comm.all_reduce, torch.ones(2, dtype=dtype))
    ok = ok and _names(msg, "rank 0: all_reduce(float64[2]", "float32[2]")
    op = comm.MAX if RANK == 0 else comm.SUM
    msg = _raised(comm.all_reduce, torch.ones(2), op=op)
    ok = ok and _names(msg, "rank 0: all_reduce(float32[2], op=MAX", "op=SUM")
    alg = "ring" if RANK == 0 else "mpi"
    msg = _raised(comm.all_reduce, torch.ones(2), algorithm=alg)
    ok = ok and _names(msg, "rank 0: all_reduce(float32[2], op=SUM, algorithm=ring)")
    root = 1 if RANK == 0 else 0
    msg = _raised(comm.broadcast, torch.ones(2), src=root)
    ok = ok and _names(msg, "rank 0: broadcast(float32[2], root=1)", "root=0")
    msg = _raised(comm.all_reduce_coalesced, [torch.ones(2), torch.ones(3 + (RANK == 0))])
    ok = ok and _names(msg, "rank 0: all_reduce_coalesced(", "shapes/dtypes#")
    agree(ok, msg)


def test_majority_is_named_as_intended():
    if SIZE < 3:
        pytest.skip("a majority needs three ranks")
    msg = _raised(comm.all_reduce, torch.ones(2 if RANK == 1 else 5))
    agree(f"ranks [1] differ from ranks {[r for r in range(SIZE) if r != 1]}" in msg, msg)


def test_object_collective_mismatch():
    if RANK == 0:
        msg = _raised(comm.broadcast_object, "x", src=0)
    else:
        msg = _raised(comm.barrier)
    agree("broadcast_object(root=0)" in msg and "barrier()" in msg, msg)


def test_calls_work_after_a_mismatch():
    _raised(comm.all_reduce, torch.ones(1 + RANK))
    t = torch.ones(2)
    comm.all_reduce(t)
    agree(bool(torch.all(t == SIZE)))
