"""algorithm="hier" on every rank: every op and dtype against numpy, on the machine's
own layout (one node: it runs as shm) and on this machine's ranks split into
pretend nodes (``_hier.plan(g, node=...)``), even and uneven; async calls, several
groups at once, the records, freeing."""

from __future__ import annotations

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

from clusterkernel import comm, metrics
from clusterkernel.comm import _hier

TRI = SIZE * (SIZE + 1) / 2

# Node number of each world rank: pairs (even layout at 2 and 4 ranks), one rank per
# node, rank 0 alone against the rest (uneven from 3 ranks), and the real machine.
LAYOUTS = {
    "pairs": lambda r: r // 2,
    "single": lambda r: r,
    "uneven": lambda r: 0 if r == 0 else 1,
    "machine": None,
}
SIZES = (1, 3, 4099, 40_000)  # 1 and 3 elements: fewer than the ranks of a node


def _group(layout: str) -> comm.Group:
    g = comm.new_group(list(range(SIZE)))
    node = LAYOUTS[layout]
    _hier.plan(g, node=None if node is None else node(RANK))
    return g


def _expected(seed, shape, dtype, op, ranks=range(SIZE)):
    return reduce_ref(op, [as_ref(data(seed, r, shape, dtype, op)) for r in ranks], dtype)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def group(request):
    g = _group(request.param)
    yield g
    comm.destroy_group(g)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_every_op_and_dtype_matches_numpy(group, op):
    bad = []
    for dtype in ALL_DTYPES:
        if not valid(op, dtype):
            continue
        for n in SIZES:
            seed = n % 89 + 7
            t = data(seed, RANK, (n,), dtype, op)
            comm.all_reduce(t, op=op, group=group, algorithm="hier")
            if not close(t, _expected(seed, (n,), dtype, op), dtype):
                bad.append((str(dtype), n))
    agree(not bad, f"{op}: {bad}")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_is_what_was_asked(layout):
    g = _group(layout)
    lay = g._hier
    nodes, even = {
        "pairs": ((SIZE + 1) // 2, SIZE % 2 == 0 or SIZE == 1),
        "single": (SIZE, True),
        "uneven": (min(SIZE, 2), SIZE <= 2),
        "machine": (1, True),
    }[layout]
    got = (lay.nodes, lay.even or lay.nodes == 1)
    comm.destroy_group(g)
    agree(got == (nodes, even), f"{layout}: {got} != {(nodes, even)}")


def test_halves_accumulate_in_float32(group):
    # float16 spacing at 2048 is 2: adding the other ranks' 1s one at a time in
    # float16 would stay at 2048; in float32 the sum is 2048 + SIZE - 1.
    for dtype in (torch.float16, torch.bfloat16):
        big = 2048.0 if dtype is torch.float16 else 256.0
        t = torch.full((5,), big if RANK == 0 else 1.0, dtype=dtype)
        comm.all_reduce(t, group=group, algorithm="hier")
        want = torch.tensor(big + SIZE - 1, dtype=torch.float32).to(dtype)
        agree(bool(torch.all(t == want)), f"{dtype}: {t.tolist()} != {want.item()}")


def test_avg_divides_once_by_the_group_size(group):
    t = torch.full((1001,), float(RANK + 1), dtype=torch.float64)
    comm.all_reduce(t, op=comm.AVG, group=group, algorithm="hier")
    agree(bool(torch.all(t == (SIZE + 1) / 2)), f"{t[:3].tolist()}")


def test_non_contiguous_and_conjugated_tensors(group):
    base = torch.full((6, 8), float(RANK + 1))
    col = base[:, 1]  # stride 8
    comm.all_reduce(col, group=group, algorithm="hier")
    ok = bool(torch.all(col == TRI)) and bool(torch.all(base[:, 0] == RANK + 1))
    z = torch.full((5,), complex(RANK, 1)).conj()  # a lazily conjugated view
    comm.all_reduce(z, group=group, algorithm="hier")
    ok = ok and bool(torch.all(z == complex(SIZE * (SIZE - 1) / 2, -SIZE)))
    agree(ok, "strided / conj")


def test_async_calls_waited_in_any_order(group):
    a = torch.full((30_000,), float(RANK + 1))
    b = torch.full((7,), float(RANK), dtype=torch.bfloat16)
    c = torch.full((1000,), RANK, dtype=torch.int32)
    works = [
        comm.all_reduce(a, group=group, async_op=True, algorithm="hier"),
        comm.all_reduce(b, op=comm.AVG, group=group, async_op=True, algorithm="hier"),
        comm.all_reduce(c, op=comm.MAX, group=group, async_op=True, algorithm="hier"),
    ]
    blocking = torch.full((10,), float(RANK))
    comm.all_reduce(blocking, group=group, algorithm="hier")  # behind the async ones
    for w in reversed(works) if RANK % 2 else works:
        w.wait()
    ok = bool(torch.all(a == TRI)) and bool(torch.all(b == (SIZE - 1) / 2))
    ok = ok and bool(torch.all(c == SIZE - 1)) and bool(torch.all(blocking == TRI - SIZE))
    agree(ok and all(w.is_completed() for w in works), "async")


def test_polling_is_completed_finishes_a_call(group):
    t = torch.full((10_000,), float(RANK + 1))
    w = comm.all_reduce(t, op=comm.AVG, group=group, async_op=True, algorithm="hier")
    while not w.is_completed():
        pass
    agree(bool(torch.allclose(t, torch.full((10_000,), (SIZE + 1) / 2))), "polling")


def test_several_groups_and_algorithms_at_once():
    # Two hier groups with different layouts, plus shm, ring and MPI calls, all
    # outstanding together and waited in different orders on different ranks.
    g1, g2 = _group("pairs"), _group("uneven")
    half = comm.split(RANK % 2)
    _hier.plan(half, node=RANK // 2)
    xs = [torch.full((n,), float(RANK + 1)) for n in (20_001, 5, 3000, 64, 777, 100)]
    works = [
        comm.all_reduce(xs[0], group=g1, async_op=True, algorithm="hier"),
        comm.all_reduce(xs[1], group=g2, async_op=True, algorithm="hier"),
        comm.all_reduce(xs[2], group=half, async_op=True, algorithm="hier"),
        comm.all_reduce(xs[3], async_op=True, algorithm="shm"),
        comm.all_reduce(xs[4], async_op=True, algorithm="ring"),
        comm.all_reduce(xs[5], async_op=True),
    ]
    for w in reversed(works) if RANK % 2 else works:
        w.wait()
    mates = sum(r + 1 for r in range(SIZE) if r % 2 == RANK % 2)
    want = [TRI, TRI, mates, TRI, TRI, TRI]
    ok = all(bool(torch.all(x == v)) for x, v in zip(xs, want))
    for g in (g1, g2, half):
        comm.destroy_group(g)
    agree(ok, f"{[x[0].item() for x in xs]} != {want}")


@pytest.mark.parametrize("layout", ["pairs", "single", "uneven"])
def test_blocks_swapped_between_two_nodes_every_dtype(layout):
    # From _hier.SWAP_MIN bytes a block crosses between two nodes by a swap, each
    # leader reducing x0 op x1 itself: the same bits on both, for every dtype.
    g = _group(layout)
    bad = []
    for dtype in ALL_DTYPES:
        n = 2 * _hier.SWAP_MIN // dtype.itemsize + 5  # a node's blocks reach SWAP_MIN
        for op in (comm.SUM, comm.MAX, comm.AVG):
            if not valid(op, dtype):
                continue
            t = data(11, RANK, (n,), dtype, op)
            comm.all_reduce(t, op=op, group=g, algorithm="hier")
            if not close(t, _expected(11, (n,), dtype, op), dtype):
                bad.append((str(dtype), op.name))
    comm.destroy_group(g)
    agree(not bad, f"{layout}: {bad}")


def test_large_tensor_matches_numpy():
    g = _group("pairs")
    n = (4 << 20) // 4 + 13  # just over 4 MB of float32, not a multiple of the ranks
    t = torch.from_numpy(np.arange(n, dtype=np.float32) * (RANK + 1))
    comm.all_reduce(t, op=comm.AVG, group=g, algorithm="hier")
    want = np.arange(n, dtype=np.float64) * (SIZE + 1) / 2
    comm.destroy_group(g)
    agree(bool(np.allclose(t.numpy(), want, rtol=1e-6)), "4 MB AVG")


def test_one_record_per_call_naming_hier():
    g = _group("single")
    rec = metrics.recorder()
    rec.drain("comm")
    comm.all_reduce(torch.ones(8, dtype=torch.bfloat16), group=g, algorithm="hier")
    comm.all_reduce(torch.ones(8), group=g, algorithm="hier", async_op=True).wait()
    got = [(r["op"], r["nbytes"], r["algorithm"], r["group_size"]) for r in rec.drain("comm")]
    comm.destroy_group(g)
    alg = "shm" if SIZE == 1 else "hier"  # a single node runs as shm
    agree(got == [("all_reduce", 16, alg, SIZE), ("all_reduce", 32, alg, SIZE)], f"{got}")


def test_destroy_group_frees_the_sub_communicators():
    g = _group("uneven")
    comm.all_reduce(torch.ones(100), group=g, algorithm="hier", async_op=True)  # not waited
    lay = g._hier
    comm.destroy_group(g)
    agree(g._hier is None and lay.local is None and lay.cross is None, "freed")


def test_first_call_on_the_real_layout_makes_it():
    g = comm.new_group(list(range(SIZE)))
    t = torch.full((10,), float(RANK + 1))
    comm.all_reduce(t, group=g, algorithm="hier")
    ok = g._hier is not None and g._hier.nodes == 1 and bool(torch.all(t == TRI))
    comm.destroy_group(g)
    agree(ok, "real layout")


def test_check_catches_an_algorithm_mismatch():
    if SIZE < 2:
        pytest.skip("needs two ranks")
    alg = "hier" if RANK == 0 else "mpi"
    msg = expect_error(
        comm.CollectiveMismatchError,
        comm.all_reduce,
        torch.ones(321),
        algorithm=alg,
        match="mismatch",
    )
    agree("algorithm=hier" in msg, msg)


def test_coalesced_says_hier_is_not_for_it():
    expect_error(
        ValueError,
        comm.all_reduce_coalesced,
        [torch.ones(2)],
        algorithm="hier",
        match="all_reduce_coalesced",
    )
