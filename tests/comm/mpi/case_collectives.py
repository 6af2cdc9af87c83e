"""Data-movement collectives on every rank: broadcast, scatter, gather, all_gather,
all_to_all (and their tensor/single forms), barrier; every dtype, sync and async,
algorithm "mpi" and "shm" where there is a choice, non-contiguous tensors, and the
host staging path used for device tensors."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from _helpers import ALL_DTYPES, RANK, SIZE, WORLD, agree, data, expect_error
from mpi4py import MPI

from clusterkernel import comm
from clusterkernel.comm import _dtypes


def _name(d):
    return str(d).replace("torch.", "")


def _wait(w, async_op):
    if async_op:
        assert isinstance(w, comm.Work)
        w.wait()
    else:
        assert w is None


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_name)
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("algorithm", ["mpi", "shm"])
def test_broadcast_from_every_root(dtype, async_op, algorithm):
    for root in range(SIZE):
        t = data(root, RANK, (2, 3), dtype)
        _wait(comm.broadcast(t, src=root, async_op=async_op, algorithm=algorithm), async_op)
        agree(torch.equal(t, data(root, root, (2, 3), dtype)), f"root {root}")


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.int8, torch.bool], ids=_name
)
@pytest.mark.parametrize("async_op", [False, True])
def test_scatter_and_gather_every_root(dtype, async_op):
    for root in range(SIZE):
        parts = [data(100 + i, root, (3,), dtype) for i in range(SIZE)]
        out = torch.empty(3, dtype=dtype)
        _wait(
            comm.scatter(out, parts if RANK == root else None, src=root, async_op=async_op),
            async_op,
        )
        ok = torch.equal(out, data(100 + RANK, root, (3,), dtype))
        gathered = [torch.empty(3, dtype=dtype) for _ in range(SIZE)] if RANK == root else None
        mine = data(200, RANK, (3,), dtype)
        _wait(comm.gather(mine, gathered, dst=root, async_op=async_op), async_op)
        if RANK == root:
            ok = ok and all(
                torch.equal(g, data(200, r, (3,), dtype)) for r, g in enumerate(gathered)
            )
        agree(ok, f"root {root}")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_name)
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("algorithm", ["mpi", "shm"])
def test_all_gather_both_forms(dtype, async_op, algorithm):
    mine = data(3, RANK, (2, 2), dtype)
    outs = [torch.empty(2, 2, dtype=dtype) for _ in range(SIZE)]
    _wait(comm.all_gather(outs, mine, async_op=async_op, algorithm=algorithm), async_op)
    ok = all(torch.equal(o, data(3, r, (2, 2), dtype)) for r, o in enumerate(outs))
    flat = torch.empty(SIZE * 2, 2, dtype=dtype)
    _wait(
        comm.all_gather_into_tensor(flat, mine, async_op=async_op, algorithm=algorithm),
        async_op,
    )
    ok = ok and torch.equal(flat, torch.cat(outs))
    agree(ok, _name(dtype))


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_uneven_sizes(async_op):
    # Rank i sends i + j + 1 elements to rank j.
    ins = [torch.full((RANK + j + 1,), float(10 * RANK + j)) for j in range(SIZE)]
    outs = [torch.empty(i + RANK + 1) for i in range(SIZE)]
    _wait(comm.all_to_all(outs, ins, async_op=async_op), async_op)
    agree(all(torch.all(o == 10 * i + RANK) for i, o in enumerate(outs)), "all_to_all")


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_single_equal_and_uneven(async_op):
    inp = torch.arange(SIZE * 2, dtype=torch.int64).view(SIZE * 2, 1) + 100 * RANK
    out = torch.empty_like(inp)
    _wait(comm.all_to_all_single(out, inp, async_op=async_op), async_op)
    want = torch.cat([torch.arange(2 * RANK, 2 * RANK + 2) + 100 * r for r in range(SIZE)]).view(
        -1, 1
    )
    ok = torch.equal(out, want)
    # Uneven: rank i sends j + 1 rows to rank j.
    sizes_in = [j + 1 for j in range(SIZE)]
    sizes_out = [RANK + 1] * SIZE
    inp = torch.full((sum(sizes_in), 3), float(RANK))
    out = torch.empty(sum(sizes_out), 3)
    _wait(comm.all_to_all_single(out, inp, sizes_out, sizes_in, async_op=async_op), async_op)
    want = torch.cat([torch.full((RANK + 1, 3), float(r)) for r in range(SIZE)])
    agree(ok and torch.equal(out, want), "all_to_all_single")


def _monotonic() -> int:
    # CLOCK_MONOTONIC: one clock for every process of a Linux machine (not only this one)
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@pytest.mark.parametrize("async_op", [False, True])
def test_barrier_lets_no_rank_leave_before_every_rank_arrived(async_op):
    # Each rank notes the time it arrives (just before the call) and the time it leaves
    # (after the call, or its wait(), returns); the last arrival must come before the
    # first departure. That holds for any barrier, however slow or loaded the machine:
    # no threshold. The last rank arrives 0.2 s late, so a barrier that did not wait
    # would let the others leave before it arrived and fail the check.
    if len(set(WORLD.allgather(MPI.Get_processor_name()))) > 1:
        pytest.skip("the ranks' clocks are compared: they must share one machine")
    if RANK == SIZE - 1:
        time.sleep(0.2)
    arrived = _monotonic()
    _wait(comm.barrier(async_op=async_op), async_op)
    left = _monotonic()
    times = WORLD.allgather((arrived, left))
    last_arrival = max(a for a, _ in times)
    first_departure = min(d for _, d in times)
    agree(last_arrival <= first_departure, f"(arrived, left) per rank, ns: {times}")


@pytest.mark.parametrize("algorithm", ["mpi", "shm"])
def test_non_contiguous_tensors_in_place(algorithm):
    base = torch.zeros(4, 6)
    col = base[:, 1]  # stride 6
    col += RANK + 1
    comm.all_reduce(col, algorithm=algorithm)
    ok = torch.all(base[:, 1] == SIZE * (SIZE + 1) / 2) and torch.all(base[:, 0] == 0)
    tt = (torch.arange(6.0).view(2, 3) * (RANK == 0)).t()
    comm.broadcast(tt, src=0, algorithm=algorithm)
    ok = ok and torch.equal(tt, torch.arange(6.0).view(2, 3).t())
    outs = [torch.empty(3, 2).t() for _ in range(SIZE)]
    comm.all_gather(outs, torch.full((2, 3), float(RANK)), algorithm=algorithm)
    ok = ok and all(torch.all(o == r) for r, o in enumerate(outs))
    flat = torch.empty(2, 3 * SIZE).t()  # non-contiguous output
    comm.all_gather_into_tensor(flat, torch.full((3, 2), float(RANK)), algorithm=algorithm)
    want = torch.arange(float(SIZE)).repeat_interleave(3).unsqueeze(1).expand(-1, 2)
    ok = ok and torch.equal(flat, want)
    agree(bool(ok), "non-contiguous")


def test_contiguous_cpu_tensors_are_not_copied():
    t = torch.ones(8)
    w, _ = _dtypes.wire(t, reduce=True)
    assert w is t  # the buffer MPI gets is the tensor's own memory
    g = torch.ones(3, requires_grad=True)
    assert _dtypes.wire(g)[0] is g
    h = torch.ones(3, dtype=torch.bfloat16)
    assert _dtypes.wire(h)[0] is h  # moved as raw 16-bit words, no staging
    assert _dtypes.wire(h, reduce=True)[0].dtype == torch.float32
    assert _dtypes.wire(torch.ones(4, 2).t())[0].is_contiguous()
    agree(True)


@pytest.mark.parametrize("algorithm", ["mpi", "shm"])
def test_requires_grad_parameter_is_updated(algorithm):
    p = torch.nn.Parameter(torch.full((3,), float(RANK)))
    comm.broadcast(p, src=SIZE - 1, algorithm=algorithm)
    comm.all_reduce(p, op=comm.MAX, algorithm=algorithm)
    agree(bool(torch.all(p.detach() == SIZE - 1)) and p.requires_grad, "parameter")


@pytest.fixture
def staged():
    """Force the device path: every tensor goes through a host staging copy."""
    comm.force_staging(True)
    yield
    comm.force_staging(False)


@pytest.mark.parametrize("async_op", [False, True])
def test_staging_path_all_calls(staged, async_op):
    t = torch.full((5,), float(RANK + 1))
    ptr = t.data_ptr()
    _wait(comm.all_reduce(t, async_op=async_op), async_op)
    ok = torch.all(t == SIZE * (SIZE + 1) / 2) and t.data_ptr() == ptr
    r = torch.full((5,), float(RANK + 1))
    _wait(comm.all_reduce(r, async_op=async_op, algorithm="ring"), async_op)
    ok = ok and torch.equal(r, t)
    b = torch.full((2, 2), float(RANK)).t()
    _wait(comm.broadcast(b, src=SIZE - 1, async_op=async_op), async_op)
    ok = ok and torch.all(b == SIZE - 1)
    out = torch.empty(SIZE, 2)
    _wait(
        comm.all_gather_into_tensor(out, torch.full((2,), float(RANK)), async_op=async_op), async_op
    )
    ok = ok and torch.equal(out[:, 0], torch.arange(float(SIZE)))
    h = torch.full((3,), RANK + 0.5, dtype=torch.float16)
    _wait(comm.all_reduce(h, op=comm.AVG, async_op=async_op), async_op)
    ok = ok and torch.allclose(h.float(), torch.full((3,), (SIZE - 1) / 2 + 0.5))
    agree(bool(ok), "staged")


def test_staging_is_really_used(staged):
    t = torch.ones(4)
    w, _ = _dtypes.wire(t)
    assert w is not t and torch.equal(w, t)
    agree(True)


def test_collective_bad_input_fails_locally():
    # Detected on the calling rank before any message: only that rank calls.
    n = SIZE
    expect_error(
        ValueError,
        comm.scatter,
        torch.empty(2),
        [torch.zeros(2)] * (n + 1),
        src=RANK,
        match="one per rank",
    )
    expect_error(
        ValueError,
        comm.gather,
        torch.empty(2),
        [torch.zeros(3)] * n,
        dst=RANK,
        match="all must match",
    )
    expect_error(ValueError, comm.broadcast, torch.empty(2), src=n, match="out of range")
    expect_error(TypeError, comm.broadcast, torch.empty(2), src="0", match="must be an int")
    expect_error(
        ValueError,
        comm.all_gather,
        [torch.empty(2)] * (n + 1),
        torch.empty(2),
        match="one per rank",
    )
    expect_error(
        ValueError,
        comm.all_gather_into_tensor,
        torch.empty(n * 2 + 1),
        torch.empty(2),
        match="needs",
    )
    if n > 1:
        expect_error(
            ValueError,
            comm.all_to_all_single,
            torch.empty(2 * n + 1),
            torch.empty(2 * n + 1),
            match="not divisible",
        )
    expect_error(
        ValueError,
        comm.reduce_scatter_tensor,
        torch.empty(2),
        torch.empty(2 * n + 1),
        match="needs",
    )
    if n > 1:
        other = (RANK + 1) % n
        expect_error(
            ValueError,
            comm.scatter,
            torch.empty(2),
            [torch.zeros(2)] * n,
            src=other,
            match="only on the src rank",
        )
        expect_error(
            ValueError,
            comm.gather,
            torch.empty(2),
            [torch.zeros(2)] * n,
            dst=other,
            match="only on the dst rank",
        )
    expect_error(
        ValueError, comm.scatter, torch.empty(2), None, src=RANK, match="needs scatter_list"
    )
    expect_error(ValueError, comm.gather, torch.empty(2), None, dst=RANK, match="needs gather_list")
    agree(True)


def test_large_broadcast_4mb():
    t = (
        torch.from_numpy(np.arange(1 << 20, dtype=np.float32))
        if RANK == 0
        else torch.zeros(1 << 20)
    )
    comm.broadcast(t, src=0)
    agree(bool(t[-1] == (1 << 20) - 1) and bool(t[12345] == 12345), "4 MB broadcast")
