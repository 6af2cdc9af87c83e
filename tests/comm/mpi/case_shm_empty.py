"""comm.shm_empty: tensors in a group's shared memory, all-reduced without copies in
or out; correct for every op and dtype, views at different offsets, async calls,
mixed with ordinary tensors, and valid after the group's segment grows."""

from __future__ import annotations

import pytest
import torch
from _helpers import RANK, SIZE, agree, as_ref, close, data, expect_error, reduce_ref, valid

from clusterkernel import comm

TRI = SIZE * (SIZE + 1) / 2
BIG = 100_003  # past the one-exchange size: the zero-copy path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint32])
@pytest.mark.parametrize("op", [comm.SUM, comm.MAX, comm.MIN, comm.PRODUCT, comm.AVG])
def test_every_op_and_dtype_matches_numpy(dtype, op):
    if not valid(op, dtype):
        pytest.skip("op not defined for dtype")
    ok = True
    for n in (17, BIG, 3 << 18):
        t = comm.shm_empty(n, dtype=dtype)
        t.copy_(data(n % 89, RANK, (n,), dtype, op))
        comm.all_reduce(t, op=op, algorithm="shm")
        want = reduce_ref(
            op, [as_ref(data(n % 89, r, (n,), dtype, op)) for r in range(SIZE)], dtype
        )
        ok = ok and close(t, want, dtype)
    agree(ok, f"{dtype} {op}")


def test_views_at_different_offsets_and_async():
    buf = comm.shm_empty((4, BIG))
    buf.fill_(-1.0)
    row = buf[RANK % 4]  # each rank its own row: offsets differ across ranks
    row.fill_(RANK + 1.0)
    w = comm.all_reduce(row, async_op=True, algorithm="shm")
    w.wait()
    ok = bool(torch.all(row == TRI))
    others = [buf[i] for i in range(4) if i != RANK % 4]
    ok = ok and all(bool(torch.all(o == -1.0)) for o in others)  # untouched
    agree(ok and w.is_completed(), "views")


def test_mixed_with_ordinary_tensors_falls_back():
    # Rank 0 passes a shm_empty tensor, the others plain ones: the copying pipeline.
    z = comm.shm_empty(BIG)  # collective: every rank allocates
    t = z if RANK == 0 else torch.empty(BIG)
    t.fill_(RANK + 1.0)
    comm.all_reduce(t, algorithm="shm")
    agree(bool(torch.all(t == TRI)), "mixed")


def test_valid_after_the_segment_grows_and_after_destroy_group():
    g = comm.new_group(list(range(SIZE)))
    t = comm.shm_empty(BIG, group=g)
    t.fill_(RANK + 1.0)
    cap = g._shm.cap
    comm.broadcast(torch.zeros(max(cap, 1 << 16) // 2 + (4 << 20)), src=0, group=g, algorithm="shm")
    grown = g._shm.cap > cap
    comm.all_reduce(t, group=g, algorithm="shm")
    ok = grown and bool(torch.all(t == TRI))
    comm.destroy_group(g)
    t.add_(1.0)  # still this rank's memory
    agree(ok and bool(torch.all(t == TRI + 1)), "growth")


def test_bad_arguments_say_what_to_do():
    expect_error(TypeError, comm.shm_empty, 4, dtype="float32", match="torch.dtype")
    expect_error(ValueError, comm.shm_empty, (4, -1), match="non-negative")
    if SIZE > 1:
        sub = comm.new_group([0])
        if RANK != 0:
            expect_error(comm.CommError, comm.shm_empty, 4, group=sub, match="not a member")
    agree(True, "errors")
