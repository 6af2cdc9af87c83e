"""Object collectives on every rank, sync and async."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import RANK, SIZE, agree, expect_error

from clusterkernel import comm


def _wait(result, async_op):
    return result.result() if async_op else result


@pytest.mark.parametrize("async_op", [False, True])
def test_broadcast_object_every_root(async_op):
    for root in range(SIZE):
        obj = {"root": root, "arr": np.arange(3) + root} if RANK == root else None
        got = _wait(comm.broadcast_object(obj, src=root, async_op=async_op), async_op)
        agree(got["root"] == root and np.array_equal(got["arr"], np.arange(3) + root), f"{root}")


@pytest.mark.parametrize("async_op", [False, True])
def test_broadcast_object_list_in_place(async_op):
    objs = ["cfg", 3, {"lr": 0.1}] if RANK == 0 else [None, None, None]
    _wait(comm.broadcast_object_list(objs, src=0, async_op=async_op), async_op)
    agree(objs == ["cfg", 3, {"lr": 0.1}], str(objs))


@pytest.mark.parametrize("async_op", [False, True])
def test_gather_and_all_gather_object(async_op):
    root = SIZE - 1
    out = [None] * SIZE if RANK == root else None
    _wait(comm.gather_object(("r", RANK), out, dst=root, async_op=async_op), async_op)
    ok = out == [("r", r) for r in range(SIZE)] if RANK == root else True
    every = [None] * SIZE
    _wait(comm.all_gather_object(every, {"rank": RANK}, async_op=async_op), async_op)
    agree(ok and every == [{"rank": r} for r in range(SIZE)], str(every))


@pytest.mark.parametrize("async_op", [False, True])
def test_scatter_object_list(async_op):
    out = [None]
    ins = [f"shard-{i}" for i in range(SIZE)] if RANK == 0 else None
    _wait(comm.scatter_object_list(out, ins, src=0, async_op=async_op), async_op)
    agree(out == [f"shard-{RANK}"], str(out))


def test_several_object_collectives_outstanding():
    w1 = comm.broadcast_object("first" if RANK == 0 else None, src=0, async_op=True)
    w2 = comm.broadcast_object("second" if RANK == 0 else None, src=0, async_op=True)
    agree((w2.result(), w1.result()) == ("second", "first"))


def test_large_object_broadcast():
    arr = np.arange(3 << 20, dtype=np.float64) if RANK == 0 else None  # 24 MB
    got = comm.broadcast_object(arr, src=0)
    agree(got.shape == (3 << 20,) and got[-1] == (3 << 20) - 1)


def test_object_bad_input():
    expect_error(ValueError, comm.all_gather_object, [None] * (SIZE + 1), 1, match="one per rank")
    expect_error(TypeError, comm.broadcast_object_list, "abc", match="must be a list")
    expect_error(ValueError, comm.gather_object, 1, [None], dst=SIZE, match="out of range")
    agree(True)
