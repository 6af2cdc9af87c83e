"""Reductions on every rank: all_reduce (mpi, ring and shm), reduce, reduce_scatter
(mpi and shm), for every dtype and op, sync and async, against a numpy reference."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from _helpers import (
    ALL_DTYPES,
    OPS,
    RANK,
    SIZE,
    agree,
    as_ref,
    close,
    data,
    expect_error,
    reduce_ref,
    valid,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterkernel import comm
from clusterkernel.comm import _ring

CASES = [(d, op) for d in ALL_DTYPES for op in OPS if valid(op, d)]


def _ids(case):
    d, op = case
    return f"{str(d).replace('torch.', '')}-{op.name}"


def _expected(seed, shape, dtype, op):
    inputs = [as_ref(data(seed, r, shape, dtype, op)) for r in range(SIZE)]
    return reduce_ref(op, inputs, dtype)


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("algorithm", ["mpi", "ring", "shm"])
@pytest.mark.parametrize("async_op", [False, True])
def test_all_reduce_every_dtype_and_op(case, algorithm, async_op):
    dtype, op = case
    shape = (3, 5)
    t = data(7, RANK, shape, dtype, op)
    ptr = t.data_ptr()
    work = comm.all_reduce(t, op=op, async_op=async_op, algorithm=algorithm)
    if async_op:
        assert isinstance(work, comm.Work)
        work.wait()
        assert work.is_completed()
    else:
        assert work is None
    want = _expected(7, shape, dtype, op)
    agree(close(t, want, dtype) and t.data_ptr() == ptr, f"{dtype} {op} {algorithm}")


@pytest.mark.parametrize("algorithm", ["mpi", "ring", "shm"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 8, 9, 1000, 4099])
def test_all_reduce_awkward_sizes(n, algorithm):
    t = torch.arange(n, dtype=torch.float64) * (RANK + 1)
    comm.all_reduce(t, algorithm=algorithm)
    want = np.arange(n, dtype=np.float64) * SIZE * (SIZE + 1) / 2
    agree(np.array_equal(t.numpy(), want), f"n={n}")


def test_ring_many_segments_and_avg():
    # Tiny segments: each chunk moves as many pieces through the pipeline.
    old = _ring.SEGMENT_BYTES
    _ring.SEGMENT_BYTES = 40
    try:
        for n in (0, 1, 7, 13, 997):
            t = torch.arange(n, dtype=torch.float32) + RANK
            comm.all_reduce(t, op=comm.AVG, algorithm="ring")
            want = np.arange(n, dtype=np.float32) + (SIZE - 1) / 2
            agree(np.allclose(t.numpy(), want), f"n={n}")
    finally:
        _ring.SEGMENT_BYTES = old


def test_ring_large_multi_segment():
    n = 3 * (_ring.SEGMENT_BYTES // 4) + 11  # several segments per chunk at any size
    t = torch.full((n,), float(RANK + 1))
    comm.all_reduce(t, algorithm="ring")
    agree(bool(torch.all(t == SIZE * (SIZE + 1) / 2)), "large ring")


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    shape=st.lists(st.integers(0, 6), min_size=0, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.int32, torch.bfloat16, torch.float64]),
    op=st.sampled_from([comm.SUM, comm.MAX, comm.MIN, comm.PRODUCT]),
    algorithm=st.sampled_from(["mpi", "ring", "shm"]),
    transpose=st.booleans(),
)
def test_all_reduce_random_shapes(shape, dtype, op, algorithm, transpose):
    # derandomize: every rank draws the same examples in the same order.
    seed = zlib.crc32(repr((shape, dtype, op.name)).encode()) % 1000  # same on every rank
    base = data(seed, RANK, tuple(shape), dtype, op)
    t = base.t() if transpose and base.dim() == 2 else base
    comm.all_reduce(t, op=op, algorithm=algorithm)
    want = _expected(seed, tuple(shape), dtype, op)
    if transpose and base.dim() == 2:
        want = want.T
    agree(close(t, want, dtype), f"{shape} {dtype} {op} {algorithm}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_to_each_root(dtype, async_op):
    for root in range(SIZE):
        for op in (comm.SUM, comm.MAX):
            t = data(root, RANK, (4,), dtype, op)
            before = t.clone()
            w = comm.reduce(t, dst=root, op=op, async_op=async_op)
            if async_op:
                w.wait()
            if RANK == root:
                ok = close(t, _expected(root, (4,), dtype, op), dtype)
            else:
                ok = torch.equal(t, before)
            agree(ok, f"reduce root={root} {op}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.bool])
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("algorithm", ["mpi", "shm"])
def test_reduce_scatter(dtype, async_op, algorithm):
    inputs = [data(10 + i, RANK, (2, 3), dtype) for i in range(SIZE)]
    out = torch.empty((2, 3), dtype=dtype)
    w = comm.reduce_scatter(out, inputs, op=comm.SUM, async_op=async_op, algorithm=algorithm)
    if async_op:
        w.wait()
    ok = close(out, _expected(10 + RANK, (2, 3), dtype, comm.SUM), dtype)
    flat_in = torch.cat([x.reshape(-1) for x in inputs])
    out2 = torch.empty(6, dtype=dtype)
    w = comm.reduce_scatter_tensor(out2, flat_in, async_op=async_op, algorithm=algorithm)
    if async_op:
        w.wait()
    ok = ok and torch.equal(out2.view(2, 3), out)
    agree(ok, f"reduce_scatter {dtype}")


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("async_op", [False, True])
def test_shm_reduce_scatter_every_dtype_and_op(case, async_op):
    dtype, op = case
    inputs = [data(20 + i, RANK, (3,), dtype, op) for i in range(SIZE)]
    out = torch.empty(3, dtype=dtype)
    w = comm.reduce_scatter(out, inputs, op=op, async_op=async_op, algorithm="shm")
    if async_op:
        w.wait()
    ok = close(out, _expected(20 + RANK, (3,), dtype, op), dtype)
    flat = torch.stack(inputs).t()  # non-contiguous: block j is column j
    out2 = torch.empty(3, dtype=dtype)
    w = comm.reduce_scatter_tensor(out2, flat.t(), op=op, async_op=async_op, algorithm="shm")
    if async_op:
        w.wait()
    agree(ok and torch.equal(out2, out), f"shm reduce_scatter {dtype} {op}")


@pytest.mark.parametrize("algorithm", ["mpi", "shm"])
def test_reduce_scatter_avg_float(algorithm):
    inputs = [torch.full((3,), float(RANK + i)) for i in range(SIZE)]
    out = torch.empty(3)
    comm.reduce_scatter(out, inputs, op=comm.AVG, algorithm=algorithm)
    want = np.mean([r + RANK for r in range(SIZE)])
    agree(np.allclose(out.numpy(), want), "reduce_scatter AVG")


def test_bool_semantics_match_torch():
    # SUM/MAX are OR, PRODUCT/MIN are AND: rank 0 holds a True in slot 0 only.
    for op, want in (
        (comm.SUM, True),
        (comm.MAX, True),
        (comm.PRODUCT, SIZE == 1),
        (comm.MIN, SIZE == 1),
    ):
        t = torch.tensor([RANK == 0, True, False])
        comm.all_reduce(t, op=op)
        agree(t.tolist() == [want, True, False], f"bool {op}")


def test_invalid_ops_fail_locally_with_clear_errors():
    # Raised before any message: no other rank takes part.
    expect_error(ValueError, comm.all_reduce, torch.ones(2), op="median", match="unknown reduce op")
    expect_error(
        ValueError,
        comm.all_reduce,
        torch.ones(2, dtype=torch.int32),
        op=comm.AVG,
        match="AVG needs a floating-point",
    )
    expect_error(
        ValueError,
        comm.all_reduce,
        torch.ones(2, dtype=torch.complex64),
        op=comm.MAX,
        match="not defined for complex",
    )
    expect_error(
        ValueError, comm.all_reduce, torch.ones(2), algorithm="tree", match="unknown algorithm"
    )
    expect_error(ValueError, comm.broadcast, torch.ones(2), algorithm="ring", match="broadcast")
    expect_error(
        ValueError,
        comm.all_reduce,
        torch.ones(2, dtype=torch.int32),
        op=comm.AVG,
        algorithm="shm",
        match="AVG needs a floating-point",
    )
    expect_error(
        ValueError,
        comm.reduce_scatter,
        torch.ones(2, dtype=torch.complex64),
        [torch.ones(2, dtype=torch.complex64)] * SIZE,
        op=comm.MIN,
        algorithm="shm",
        match="not defined for complex",
    )
    expect_error(TypeError, comm.all_reduce, np.ones(2), match="must be a torch.Tensor")
    expect_error(
        TypeError, comm.all_reduce, torch.ones(2).to(torch.float8_e5m2), match="unsupported dtype"
    )
    expect_error(ValueError, comm.reduce, torch.ones(2), dst=SIZE, match="out of range")
    agree(True)


def test_string_op_names_accepted():
    t = torch.ones(2) * (RANK + 1)
    comm.all_reduce(t, op="max")
    agree(bool(torch.all(t == SIZE)), "op='max'")
