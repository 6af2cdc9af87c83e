"""all_reduce_coalesced on every rank: buckets, mixed dtypes and shapes, ring, shm, async."""

from __future__ import annotations

import pytest
import torch
from _helpers import RANK, SIZE, agree, as_ref, data, expect_error, reduce_ref

from clusterkernel import comm

SHAPES = [(3,), (2, 5), (), (7, 1, 2), (0,), (64,), (4, 4)]
DTYPES = [
    torch.float32,
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float32,
    torch.int64,
    torch.float16,
]


def _tensors(seed):
    return [data(seed + i, RANK, s, d) for i, (s, d) in enumerate(zip(SHAPES, DTYPES))]


def _check(ts, seed, op):
    ok = True
    for i, (t, s, d) in enumerate(zip(ts, SHAPES, DTYPES)):
        want = reduce_ref(op, [as_ref(data(seed + i, r, s, d)) for r in range(SIZE)], d)
        got = as_ref(t)
        tol = 1e-2 if d in (torch.bfloat16, torch.float16) else 1e-6
        ok = ok and got.shape == want.shape and (got.size == 0 or abs(got - want).max() <= tol)
    return ok


@pytest.mark.parametrize("bucket_bytes", [1, 40, 1 << 20])
@pytest.mark.parametrize("algorithm", ["mpi", "ring", "shm"])
@pytest.mark.parametrize("async_op", [False, True])
def test_coalesced_matches_reference(bucket_bytes, algorithm, async_op):
    ts = _tensors(5)
    w = comm.all_reduce_coalesced(
        ts, bucket_bytes=bucket_bytes, algorithm=algorithm, async_op=async_op
    )
    if async_op:
        w.wait()
    agree(_check(ts, 5, comm.SUM), f"{bucket_bytes} {algorithm}")


@pytest.mark.parametrize("algorithm", ["mpi", "shm"])
def test_coalesced_avg_on_float_grads_repeated(algorithm):
    # The same layout every step reuses cached buckets; results must stay right.
    for step in range(3):
        grads = [torch.full(s, float(RANK + step)) for s in [(10,), (3, 3), (1,)]]
        comm.all_reduce_coalesced(grads, op=comm.AVG, algorithm=algorithm)
        want = (SIZE - 1) / 2 + step
        agree(all(torch.allclose(g, torch.full_like(g, want)) for g in grads), f"step {step}")


@pytest.mark.parametrize("algorithm", ["mpi", "shm"])
def test_two_outstanding_coalesced_with_same_layout(algorithm):
    a = [torch.ones(5) * RANK, torch.ones(2) * RANK]
    b = [torch.ones(5) * (RANK + 1), torch.ones(2) * (RANK + 1)]
    wa = comm.all_reduce_coalesced(a, async_op=True, algorithm=algorithm, bucket_bytes=20)
    # must not share a's buffers
    wb = comm.all_reduce_coalesced(b, async_op=True, algorithm=algorithm, bucket_bytes=20)
    wb.wait()
    wa.wait()
    ok = all(torch.all(x == SIZE * (SIZE - 1) / 2) for x in a)
    ok = ok and all(torch.all(x == SIZE * (SIZE + 1) / 2) for x in b)
    agree(ok, "two outstanding")


def test_model_gradients_of_parameters():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.full((3, 4), float(RANK))
    model(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    comm.all_reduce_coalesced([p.grad for p in model.parameters()], op=comm.AVG, bucket_bytes=64)
    for g in grads:
        comm.all_reduce(g, op=comm.AVG)
    agree(all(torch.allclose(p.grad, g) for p, g in zip(model.parameters(), grads)), "grads")


def test_coalesced_bad_input():
    expect_error(TypeError, comm.all_reduce_coalesced, torch.ones(3), match="list of tensors")
    expect_error(TypeError, comm.all_reduce_coalesced, [torch.ones(1), 3.0], match="tensors[1]")
    expect_error(
        ValueError, comm.all_reduce_coalesced, [torch.ones(1)], bucket_bytes=0, match="bucket_bytes"
    )
    expect_error(
        ValueError,
        comm.all_reduce_coalesced,
        [torch.ones(1, dtype=torch.int8)],
        op=comm.AVG,
        match="AVG needs",
    )
    agree(True)
