"""algorithm="shm" on every rank: sizes that grow the segment, many calls outstanding
on one group and on several groups, subset groups, freeing, and the records."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import RANK, SIZE, agree, as_ref, close, data, expect_error, reduce_ref

from clusterkernel import comm, metrics
from clusterkernel.comm import _ring

TRI = SIZE * (SIZE + 1) / 2


def _expected(seed, shape, dtype, op, ranks=range(SIZE)):
    return reduce_ref(op, [as_ref(data(seed, r, shape, dtype, op)) for r in ranks], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint32])
@pytest.mark.parametrize("op", [comm.SUM, comm.MAX, comm.MIN, comm.PRODUCT])
def test_sizes_that_grow_the_segment(dtype, op):
    # 1 element up to 3 MB: the slots grow (collectively) several times.
    ok = True
    for n in (1, 17, 4096, 100_003, 3 << 18):
        t = data(n % 97, RANK, (n,), dtype, op)
        comm.all_reduce(t, op=op, algorithm="shm")
        ok = ok and close(t, _expected(n % 97, (n,), dtype, op), dtype)
    agree(ok, f"{dtype} {op}")


def test_window_is_reused_across_calls():
    # all_reduce streams through fixed stage buffers; the others use the banks.
    g = comm.new_group(list(range(SIZE)))
    comm.broadcast(torch.ones(1000), src=0, group=g, algorithm="shm")
    win, cap, pipe = g._shm.win, g._shm.cap, g._shm.pipe_win
    for n in (10, 1000, 3, 1 << 20):
        comm.broadcast(torch.ones(n % 5000), src=0, group=g, algorithm="shm")
        comm.all_reduce(torch.ones(n), group=g, algorithm="shm")
    same = g._shm.win is win and g._shm.cap == cap and g._shm.pipe_win is pipe
    comm.broadcast(torch.ones(cap), src=0, group=g, algorithm="shm")  # 4 bytes each: grows
    grown = g._shm.cap > cap
    comm.destroy_group(g)
    agree(same and grown and g._shm is None, "reuse")


def test_many_async_calls_on_one_group_waited_in_any_order():
    a = torch.full((1000,), float(RANK + 1))
    b = torch.full((5,), float(RANK), dtype=torch.float16)
    c = torch.full((7,), float(RANK))
    outs = [torch.empty(3, dtype=torch.int32) for _ in range(SIZE)]
    rs = torch.empty(2)
    works = [
        comm.all_reduce(a, async_op=True, algorithm="shm"),
        comm.all_reduce(b, op=comm.AVG, async_op=True, algorithm="shm"),
        comm.broadcast(c, src=SIZE - 1, async_op=True, algorithm="shm"),
        comm.all_gather(
            outs, torch.full((3,), RANK, dtype=torch.int32), async_op=True, algorithm="shm"
        ),
        comm.reduce_scatter(
            rs, [torch.full((2,), float(j)) for j in range(SIZE)], async_op=True, algorithm="shm"
        ),
    ]
    # Odd ranks wait newest first, even ranks oldest first.
    for w in reversed(works) if RANK % 2 else works:
        w.wait()
    ok = torch.all(a == TRI) and torch.all(b == (SIZE - 1) / 2) and torch.all(c == SIZE - 1)
    ok = ok and all(torch.all(o == r) for r, o in enumerate(outs)) and torch.all(rs == RANK * SIZE)
    agree(bool(ok) and all(w.is_completed() for w in works), "one group")


def test_two_overlapping_groups_at_once():
    # Every rank is in "all" and in one of two halves; calls on both are outstanding.
    half = comm.split(RANK % 2)
    whole = comm.new_group(list(range(SIZE)))
    x = torch.full((50_000,), float(RANK + 1))
    y = torch.full((30_001,), float(RANK))
    z = torch.full((9,), float(RANK))
    wx = comm.all_reduce(x, group=whole, async_op=True, algorithm="shm")
    wy = comm.all_reduce(y, group=half, async_op=True, algorithm="shm")
    wz = comm.all_reduce(z, group=whole, op=comm.MAX, async_op=True, algorithm="shm")
    order = [wy, wz, wx] if RANK % 2 else [wx, wy, wz]
    for w in order:
        w.wait()
    mates = [r for r in range(SIZE) if r % 2 == RANK % 2]
    ok = torch.all(x == TRI) and torch.all(y == sum(mates)) and torch.all(z == SIZE - 1)
    comm.destroy_group(half)
    comm.destroy_group(whole)
    agree(bool(ok), "two groups")


def test_subset_group_and_non_members():
    sub = comm.new_group(list(range(1, SIZE)) or [0])
    ok = True
    if RANK in sub.ranks:
        t = data(5, RANK, (40,), torch.float64)
        comm.all_reduce(t, group=sub, algorithm="shm")
        ok = close(t, _expected(5, (40,), torch.float64, comm.SUM, sub.ranks), torch.float64)
        b = torch.full((4,), float(RANK))
        comm.broadcast(b, src=sub.ranks[-1], group=sub, algorithm="shm")  # a world rank
        ok = ok and bool(torch.all(b == sub.ranks[-1]))
        out = torch.empty(len(sub.ranks), 2)
        comm.all_gather_into_tensor(out, torch.full((2,), float(RANK)), group=sub, algorithm="shm")
        ok = ok and torch.equal(out[:, 0], torch.tensor([float(r) for r in sub.ranks]))
        comm.destroy_group(sub)
    else:
        expect_error(
            comm.CommError,
            comm.all_reduce,
            torch.ones(1),
            group=sub,
            algorithm="shm",
            match="not a member",
        )
    agree(ok, "subset")


def test_growth_while_calls_are_outstanding():
    g = comm.new_group(list(range(SIZE)))
    small = [torch.full((100,), float(RANK + i)) for i in range(3)]
    works = [comm.all_reduce(s, group=g, async_op=True, algorithm="shm") for s in small]
    big = torch.full((1 << 20,), float(RANK + 1))  # 4 MB: grows the slots after those finish
    wb = comm.all_reduce(big, group=g, async_op=True, algorithm="shm")
    wb.wait()
    for w in works:
        w.wait()
    ok = all(torch.all(s == sum(r + i for r in range(SIZE))) for i, s in enumerate(small))
    ok = ok and bool(torch.all(big == TRI))
    comm.destroy_group(g)
    agree(ok, "growth")


def test_shm_alongside_outstanding_ring_and_mpi_calls():
    old = _ring.SEGMENT_BYTES
    _ring.SEGMENT_BYTES = 256  # a ring of many steps, progressed while others wait
    try:
        r = torch.full((5000,), float(RANK + 1))
        m = torch.full((300,), float(RANK + 1))
        s = torch.full((4000,), float(RANK + 1))
        wr = comm.all_reduce(r, async_op=True, algorithm="ring")
        wm = comm.all_reduce(m, async_op=True)
        ws = comm.all_reduce(s, async_op=True, algorithm="shm")
        s2 = torch.full((10,), float(RANK))
        comm.all_reduce(s2, algorithm="shm")  # a blocking call behind an async one
        for w in (ws, wm, wr) if RANK % 2 else (wr, wm, ws):
            w.wait()
    finally:
        _ring.SEGMENT_BYTES = old
    ok = all(bool(torch.all(t == TRI)) for t in (r, m, s)) and torch.all(s2 == TRI - SIZE)
    agree(bool(ok), "mixed")


def test_polling_is_completed_finishes_a_call():
    t = torch.full((10_000,), float(RANK + 1))
    w = comm.all_reduce(t, op=comm.AVG, async_op=True, algorithm="shm")
    while not w.is_completed():
        pass
    agree(bool(torch.allclose(t, torch.full((10_000,), (SIZE + 1) / 2))), "polling")


def test_a_ring_call_then_shared_memory_calls_at_once():
    """A rank can leave a ring call with its own part done while the other ranks' last
    sends of it still wait for this rank's MPI progress; a shared-memory call right
    after waits on their counters, so it must let MPI progress meanwhile (it did not:
    both waited for ever, each for the other, as the adapting default's probes ran
    algorithms back to back)."""
    t = torch.empty(16 << 20)  # 64 MB: the ring's sends go by MPI's large-message protocol
    ok = True
    for _ in range(3):
        t.fill_(1.0)
        comm.all_reduce(t, algorithm="ring")
        comm.all_reduce(t, algorithm="shm")
        ok = ok and bool((t == SIZE * SIZE).all())
    agree(ok, "sums")


def test_large_avg_matches_numpy():
    n = (4 << 20) // 4 + 13  # just over 4 MB of float32
    t = torch.from_numpy(np.arange(n, dtype=np.float32) * (RANK + 1))
    comm.all_reduce(t, op=comm.AVG, algorithm="shm")
    want = np.arange(n, dtype=np.float64) * (SIZE + 1) / 2
    agree(bool(np.allclose(t.numpy(), want, rtol=1e-6)), "4 MB AVG")


def test_records_name_the_algorithm():
    rec = metrics.recorder()
    rec.drain("comm")
    comm.all_reduce(torch.ones(8, dtype=torch.bfloat16), algorithm="shm")
    comm.broadcast(torch.ones(8), src=0, algorithm="shm")
    comm.all_reduce(torch.ones(8), algorithm="shm", async_op=True).wait()
    got = [(r["op"], r["nbytes"], r["algorithm"], r["group_size"]) for r in rec.drain("comm")]
    want = [("all_reduce", 16, "shm", SIZE), ("broadcast", 32, "shm", SIZE)]
    agree(got == [*want, ("all_reduce", 32, "shm", SIZE)], f"records {got}")


def test_check_catches_an_algorithm_mismatch():
    if SIZE < 2:
        pytest.skip("needs two ranks")
    alg = "shm" if RANK == 0 else "mpi"
    t = torch.ones(123)
    msg = expect_error(
        comm.CollectiveMismatchError, comm.all_reduce, t, algorithm=alg, match="mismatch"
    )
    agree("algorithm=shm" in msg, msg)
