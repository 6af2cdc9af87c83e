"""Point-to-point on every rank: tensors and objects, sync and async, any source."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import ALL_DTYPES, RANK, SIZE, agree, data, expect_error

from clusterkernel import comm

pytestmark = pytest.mark.skipif(SIZE < 2, reason="point-to-point needs two ranks")
RIGHT = (RANK + 1) % SIZE
LEFT = (RANK - 1) % SIZE


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_ring_exchange_sync_every_dtype(dtype):
    # Even ranks send first, odd ranks receive first. With an odd rank count two
    # neighbours both send first; these small messages go eagerly, so that is fine.
    mine = data(1, RANK, (4, 2), dtype)
    got = torch.empty(4, 2, dtype=dtype)
    if RANK % 2 == 0:
        comm.send(mine, dst=RIGHT)
        src = comm.recv(got, src=LEFT)
    else:
        src = comm.recv(got, src=LEFT)
        comm.send(mine, dst=RIGHT)
    agree(src == LEFT and torch.equal(got, data(1, LEFT, (4, 2), dtype)), str(dtype))


def test_isend_irecv_many_outstanding():
    sends = [comm.isend(torch.full((3,), float(RANK * 10 + k)), dst=RIGHT, tag=k) for k in range(5)]
    bufs = [torch.empty(3) for _ in range(5)]
    recvs = [comm.irecv(bufs[k], src=LEFT, tag=k) for k in range(5)]
    for w in reversed(recvs):
        assert w.wait() is True
    for w in sends:
        w.wait()
    ok = all(torch.all(b == LEFT * 10 + k) for k, b in enumerate(bufs))
    ok = ok and all(w.result() == LEFT for w in recvs) and all(w.is_completed() for w in sends)
    agree(ok, "isend/irecv")


def test_async_op_flag_and_large_message():
    n = 1 << 20  # 4 MB: beyond any eager limit
    w = comm.send(torch.full((n,), float(RANK)), dst=RIGHT, async_op=True)
    got = torch.empty(n)
    r = comm.recv(got, src=LEFT, async_op=True)
    r.wait()
    w.wait()
    agree(bool(torch.all(got == LEFT)), "large")


def test_recv_from_any_source():
    if RANK == 0:
        senders = set()
        t = torch.empty(2)
        for _ in range(SIZE - 1):
            s = comm.recv(t)  # src=None: whoever comes first
            assert torch.all(t == s), (t, s)
            senders.add(s)
        ok = senders == set(range(1, SIZE))
    else:
        comm.send(torch.full((2,), float(RANK)), dst=0)
        ok = True
    agree(ok, "any source")


def test_non_contiguous_send_and_recv():
    src = torch.arange(12.0).view(3, 4).t() + RANK  # non-contiguous
    dst = torch.zeros(4, 6)[:, ::2]  # non-contiguous view
    w = comm.isend(src, dst=RIGHT)
    comm.recv(dst, src=LEFT)
    w.wait()
    agree(torch.equal(dst, torch.arange(12.0).view(3, 4).t() + LEFT), "non-contiguous")


def test_wrong_size_recv_raises_on_receiver_and_frees_sender():
    if RANK == 0:
        comm.send(torch.ones(4), dst=1)
        comm.send(torch.ones(4), dst=1, tag=3)
        ok = True
    elif RANK == 1:
        msg = expect_error(ValueError, comm.recv, torch.empty(3), src=0, match="has 16 bytes")
        ok = "sender's shape" in msg
        w = comm.irecv(torch.empty(2), src=0, tag=3)
        expect_error(ValueError, w.wait, match="larger than the receive tensor")
    else:
        ok = True
    agree(ok, "wrong size")


def test_p2p_bad_arguments_fail_locally():
    expect_error(ValueError, comm.send, torch.ones(1), dst=RANK, match="this rank itself")
    expect_error(ValueError, comm.send, torch.ones(1), dst=SIZE, match="out of range")
    expect_error(ValueError, comm.recv, torch.ones(1), src=-1, match="out of range")
    expect_error(ValueError, comm.send, torch.ones(1), dst=RIGHT, tag=-1, match="tag must be")
    expect_error(TypeError, comm.send, [1.0], dst=RIGHT, match="must be a torch.Tensor")
    agree(True)


def test_wait_timeout_then_complete():
    t = torch.empty(1)
    if RANK == 0:
        w = comm.irecv(t, src=1, tag=9)
        expect_error(TimeoutError, w.wait, timeout=0.05, match="not completed")
        comm.barrier()
        w.wait()
        ok = t.item() == 1.0
    else:
        comm.barrier()
        if RANK == 1:
            comm.send(torch.ones(1), dst=0, tag=9)
        ok = True
    agree(ok, "timeout")


@pytest.mark.parametrize("async_op", [False, True])
def test_objects_point_to_point(async_op):
    obj = {"rank": RANK, "text": "x" * RANK, "arr": np.arange(5) * RANK, "t": torch.ones(2) * RANK}
    w = comm.send_object(obj, dst=RIGHT, async_op=async_op)
    got = comm.recv_object(src=LEFT, async_op=async_op)
    if async_op:
        got = got.result()
        w.wait()
    ok = (
        got["rank"] == LEFT
        and got["text"] == "x" * LEFT
        and np.array_equal(got["arr"], np.arange(5) * LEFT)
    )
    agree(ok and torch.equal(got["t"], torch.ones(2) * LEFT), "objects")


def test_object_tags_do_not_mix_with_tensor_tags():
    # The object goes out first on the same tag, yet the tensor receive skips it.
    wo = comm.send_object("hello", dst=RIGHT, tag=0, async_op=True)
    wt = comm.isend(torch.full((1,), 5.0), dst=RIGHT, tag=0)
    t = torch.empty(1)
    comm.recv(t, src=LEFT, tag=0)
    obj = comm.recv_object(src=LEFT, tag=0)
    wo.wait()
    wt.wait()
    agree(obj == "hello" and t.item() == 5.0, "tags")


def test_large_object_pickle5():
    big = np.arange(4 << 20, dtype=np.float64) + RANK  # 32 MB, out-of-band buffer
    w = comm.send_object(big, dst=RIGHT, async_op=True)
    got = comm.recv_object(src=LEFT)
    w.wait()
    agree(got.shape == big.shape and got[-1] == (4 << 20) - 1 + LEFT, "large object")
