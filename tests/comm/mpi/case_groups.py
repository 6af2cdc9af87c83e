"""Groups on every rank: new_group, split, node_group, group= on calls, non-members."""

from __future__ import annotations

import pickle

import pytest
import torch
from _helpers import RANK, SIZE, agree, expect_error

from clusterkernel import comm


def test_world_rank_and_size():
    agree(comm.rank() == RANK and comm.size() == SIZE and comm.get_world_size() == SIZE)


def test_torch_distributed_spellings_port_unchanged():
    # The PyTorch tutorial's calls, with `dist` renamed to `comm`.
    comm.init_process_group("gloo", rank=RANK, world_size=SIZE)
    t = torch.ones(1)
    comm.all_reduce(t, op=comm.reduce_op.SUM)
    ok = comm.is_initialized() and comm.get_rank() == RANK and t.item() == SIZE
    ok = ok and comm.ReduceOp.MAX is comm.MAX and pickle.loads(pickle.dumps(comm.AVG)) is comm.AVG
    agree(ok)


def test_new_group_of_even_ranks():
    evens = comm.new_group(list(range(0, SIZE, 2))[::-1])  # any order: sorted, as torch
    member = RANK % 2 == 0
    ok = evens.ranks == tuple(range(0, SIZE, 2)) and (comm.rank(evens) == RANK // 2) == member
    if member:
        t = torch.full((3,), float(RANK))
        comm.all_reduce(t, group=evens)
        ok = ok and torch.all(t == sum(range(0, SIZE, 2)))
        r = torch.full((5,), float(RANK))
        comm.all_reduce(r, group=evens, algorithm="ring")
        ok = ok and torch.all(r == sum(range(0, SIZE, 2)))
        b = torch.full((2,), float(RANK))
        last = evens.ranks[-1]
        comm.broadcast(b, src=last, group=evens)  # src is a world rank
        ok = ok and torch.all(b == last)
        outs = [torch.empty(1) for _ in evens.ranks]
        comm.all_gather(outs, torch.full((1,), float(RANK)), group=evens)
        ok = ok and [o.item() for o in outs] == [float(r) for r in evens.ranks]
    else:
        assert comm.rank(evens) == -1
        expect_error(
            comm.CommError, comm.all_reduce, torch.ones(1), group=evens, match="not a member"
        )
        expect_error(comm.CommError, comm.barrier, group=evens, match="not a member")
    agree(bool(ok), "evens")
    comm.destroy_group(evens)


def test_src_outside_group_is_a_clear_error():
    if SIZE < 2:
        pytest.skip("needs two ranks")
    pair = comm.new_group([0, 1])
    if RANK in (0, 1) and SIZE > 2:
        expect_error(
            ValueError, comm.broadcast, torch.ones(1), src=2, group=pair, match="is not in group"
        )
    agree(True)


def test_split_by_color_and_key():
    color = RANK % 2
    g = comm.split(color, key=-RANK)  # reversed order inside each part
    mates = [r for r in range(SIZE) if r % 2 == color]
    ok = g.ranks == tuple(reversed(mates)) and comm.size(g) == len(mates)
    t = torch.ones(1) * RANK
    comm.all_reduce(t, group=g)
    ok = ok and t.item() == sum(mates)
    none = comm.split(None if RANK == 0 else 0)
    if RANK == 0:
        ok = ok and none.rank == -1
        expect_error(
            comm.CommError, comm.all_reduce, torch.ones(1), group=none, match="not a member"
        )
    else:
        ok = ok and none.ranks == tuple(range(1, SIZE))
    agree(bool(ok), "split")


def test_split_of_a_subgroup():
    evens = comm.new_group(list(range(0, SIZE, 2)))
    if RANK % 2 == 0:
        sub = comm.split(0, group=evens)
        t = torch.ones(1)
        comm.all_reduce(t, group=sub)
        ok = t.item() == len(evens.ranks) and sub.ranks == evens.ranks
    else:
        ok = True
    agree(ok, "split of subgroup")


def test_node_group():
    node = comm.node_group()
    # All ranks of this test job run on one machine.
    t = torch.ones(1)
    comm.all_reduce(t, group=node)
    agree(node.ranks == tuple(range(SIZE)) and t.item() == SIZE and comm.node_group() is node)


def test_new_group_bad_input_is_local_and_clear():
    expect_error(ValueError, comm.new_group, [0, SIZE], match="out of range")
    expect_error(ValueError, comm.new_group, [0, 0], match="duplicates")
    expect_error(TypeError, comm.new_group, ["a"], match="ints")
    expect_error(TypeError, comm.all_reduce, torch.ones(1), group="world", match="comm.Group")
    expect_error(ValueError, comm.split, -3, match="color")
    expect_error(ValueError, comm.destroy_group, comm.WORLD, match="cannot be destroyed")
    agree(True)
