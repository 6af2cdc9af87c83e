"""Several async calls outstanding at once, waited in any order, on every rank."""

from __future__ import annotations

import gc

import pytest
import torch
from _helpers import RANK, SIZE, agree
from torch.multiprocessing.reductions import StorageWeakRef

from clusterkernel import comm
from clusterkernel.comm import _ring

TRI = SIZE * (SIZE + 1) / 2


def test_mixed_outstanding_calls_waited_in_reverse():
    a = torch.full((1000,), float(RANK + 1))
    b = torch.full((3000,), float(RANK + 1))
    c = torch.full((7,), float(RANK))
    outs = [torch.empty(2) for _ in range(SIZE)]
    works = [
        comm.all_reduce(a, async_op=True),
        comm.all_reduce(b, algorithm="ring", async_op=True),
        comm.broadcast(c, src=0, async_op=True),
        comm.all_gather(outs, torch.full((2,), float(RANK)), async_op=True),
        comm.all_reduce_coalesced(
            [torch.ones(3), torch.ones(4, dtype=torch.float64)], async_op=True
        ),
        comm.barrier(async_op=True),
    ]
    for w in reversed(works):
        w.wait()
    ok = torch.all(a == TRI) and torch.all(b == TRI) and torch.all(c == 0)
    ok = ok and all(torch.all(o == r) for r, o in enumerate(outs))
    agree(bool(ok) and all(w.is_completed() for w in works), "mixed")


def test_two_rings_waited_in_opposite_orders_do_not_deadlock():
    old = _ring.SEGMENT_BYTES
    _ring.SEGMENT_BYTES = 256  # many steps each, so both rings need many rounds
    try:
        x = torch.full((5000,), float(RANK + 1))
        y = torch.full((3001,), float(2 * RANK))
        wx = comm.all_reduce(x, algorithm="ring", async_op=True)
        wy = comm.all_reduce(y, algorithm="ring", async_op=True)
        # Odd ranks wait y first, even ranks x first: a blocked ring keeps the other moving.
        first, second = (wy, wx) if RANK % 2 else (wx, wy)
        first.wait()
        second.wait()
    finally:
        _ring.SEGMENT_BYTES = old
    agree(bool(torch.all(x == TRI)) and bool(torch.all(y == SIZE * (SIZE - 1))), "two rings")


def test_is_completed_polling_finishes_ring():
    t = torch.full((10000,), float(RANK + 1))
    w = comm.all_reduce(t, algorithm="ring", async_op=True, op=comm.AVG)
    spins = 0
    while not w.is_completed():
        spins += 1
    agree(bool(torch.allclose(t, torch.full((10000,), (SIZE + 1) / 2))), "polling")


def test_async_result_is_not_visible_before_wait_for_avg():
    # AVG divides on completion: after wait() the value is the mean.
    t = torch.full((4,), float(RANK))
    w = comm.all_reduce(t, op=comm.AVG, async_op=True)
    w.wait()
    w.wait()  # waiting twice is harmless
    agree(bool(torch.allclose(t, torch.full((4,), (SIZE - 1) / 2))), "avg")


def _revive(ref: StorageWeakRef, n: int) -> torch.Tensor | None:
    """A float32 tensor over the storage ``ref`` names, or None if it was freed."""
    storage = None if ref.expired() else torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
    return None if storage is None else torch.empty(0).set_(storage, 0, (n,), (1,))


@pytest.mark.parametrize("algorithm", ["auto", "mpi", "ring", "shm"])
def test_temporary_tensors_survive_until_wait(algorithm):
    # The Work keeps its tensor's memory alive when the caller drops every reference:
    # each tensor below is reachable only through its Work (a weak reference to its
    # storage, torch's own, does not count) until wait() is called, and then holds the
    # sum. A Work already complete when the call returns (a ring of one rank has nothing
    # to send) need keep nothing; an MPI request is in flight until wait().
    n = 4096
    works, refs, in_flight = [], [], []
    for i in range(8):
        t = torch.arange(n, dtype=torch.float32) + (RANK + 1) * (i + 1)
        works.append(comm.all_reduce(t, algorithm=algorithm, async_op=True))
        refs.append(StorageWeakRef(t.untyped_storage()))
        in_flight.append(not works[-1]._done)  # read before t is dropped
    del t
    gc.collect()
    # strong references again, all at once: a Work completed by another's wait() drops
    # its own
    tensors = [_revive(r, n) for r in refs]
    kept = [t is not None for t in tensors]
    for w in works:
        w.wait()
    sums = {}
    for i, t in enumerate(tensors):
        if t is not None:
            want = torch.arange(n, dtype=torch.float32) * SIZE + TRI * (i + 1)
            sums[i] = torch.equal(t, want)
    # every tensor in flight was kept, and holds the sum after wait()
    ok = all(sums.get(i, False) for i, f in enumerate(in_flight) if f) and all(sums.values())
    ok = ok and (algorithm != "mpi" or all(in_flight))
    agree(ok, f"{algorithm}: in flight {in_flight}, kept {kept}, sums right {sums}")
