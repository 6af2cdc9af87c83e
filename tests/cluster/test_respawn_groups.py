"""The user's torch.distributed subgroups work again after a rank died and was respawned.

Real ranks of a fault-tolerant (Open MPI ULFM) cluster with torch's default group
(gloo, CPU). The ranks make subgroups with torch's own ``dist.new_group`` and
``dist.new_subgroups``, and hold them in names, a list, a dict and a DDP model
(``process_group=``). A respawn closes their connections with the default group's;
it makes each again, in the order made, and binds the names to the new ones: between
cells (rank 1 SIGKILLed, ``cluster.respawn(source=0)``) and inside a running cell (a
``train.steps`` loop with auto-respawn, rank 2 SIGKILLed mid-loop). Collectives on the
subgroups then give the right sums on every member.
"""

from __future__ import annotations

import os
import signal

from clusterkernel import Cluster
from tests._procs import wait_dead

_GROUPS = """
import os, signal, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
g = dist.new_group([0, 1])
h = dist.new_group([2, 3])
cur, subs = dist.new_subgroups(2)          # [0, 1] and [2, 3] again: cur is this rank's
pairs = {"low": g, "high": h}
torch.manual_seed(0)
ddp = DDP(torch.nn.Linear(3, 1), process_group=cur)

def summed(group, members):
    # ranks r + 1 summed over a group's members; None on a rank not in it
    if dist.get_rank() not in members:
        return None
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t, group=group)
    return t.item()
"""

_SUMS = """
me = dist.get_rank()
pair = [0, 1] if me < 2 else [2, 3]
sums = (summed(g, [0, 1]), summed(h, [2, 3]), summed(cur, pair), summed(subs[me // 2], pair),
        summed(pairs["low"], [0, 1]), summed(pairs["high"], [2, 3]))
same = (cur is subs[me // 2], pairs["low"] is g, pairs["high"] is h, ddp.process_group is cur)
ddp.module.zero_grad()
ddp(torch.ones(2, 3) * (me + 1)).sum().backward()     # the gradient: averaged over the pair
grad = ddp.module.weight.grad[0, 0].item()
"""

_LOW, _HIGH = 1.0 + 2.0, 3.0 + 4.0  # ranks r + 1 summed over [0, 1] and over [2, 3]
# the DDP model's gradient, averaged over its pair: (2*1 + 2*2) / 2, (2*3 + 2*4) / 2
_GRAD = {0: 3.0, 1: 3.0, 2: 7.0, 3: 7.0}


def _expected(rank: int) -> tuple:
    low = rank < 2
    pair = _LOW if low else _HIGH
    return (_LOW if low else None, None if low else _HIGH, pair, pair,
            _LOW if low else None, None if low else _HIGH)  # fmt: skip


def test_subgroups_are_made_again_by_a_respawn_between_cells(ft: Cluster):
    ft.run(_GROUPS + _SUMS)
    assert ft.pull("sums") == {r: _expected(r) for r in range(4)}  # as made, before a death
    assert ft.pull("grad") == _GRAD
    pid = ft.rank_info[1]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_dead(ft, [1])
    report = ft.respawn(source=0)
    assert report.ranks == [1] and ft.rank_info[1]["pid"] != pid, report.summary()
    ft.run(_SUMS, timeout=60)
    # every member of every group, the new rank 1 included, sums over the new groups
    assert ft.pull("sums") == {r: _expected(r) for r in range(4)}
    assert set(ft.pull("same").values()) == {(True, True, True, True)}
    assert ft.pull("grad") == _GRAD  # averaged over the new pair
    said = report.summary()
    assert "torch.distributed subgroup(s) cur, g, h, pairs, subs made again" in said, said
    assert "DDP model(s) ddp wrapped again on the new group" in said, said


_LOOP = """
from clusterkernel import train
wrong = []
for s in train.steps(12):
    with s:
        if s.index == 6 and os.getpid() == VICTIM:
            os.kill(os.getpid(), signal.SIGKILL)
        me = dist.get_rank()
        pair = summed(g if me < 2 else h, [0, 1] if me < 2 else [2, 3])
        every = torch.ones(1)
        dist.all_reduce(every)                 # the default group: all four notice a death
        if (pair, every.item()) != (3.0 if me < 2 else 7.0, 4.0):
            wrong.append((s.index, pair, every.item()))
last = s.index
"""


def test_subgroups_are_made_again_by_a_respawn_inside_a_running_cell(ft: Cluster):
    """Rank 2 (in ``h``) SIGKILLed at step 6 of a ``train.steps`` loop with auto-respawn:
    the survivors bring it back in the cell, its groups and theirs are made again, and
    the loop redoes step 6 on the new ``g`` and ``h`` (the new rank 2 takes ``h`` from
    rank 3's view: rank 0, whose variables it copies, is not in ``h``)."""
    ft.run(_GROUPS + "VICTIM = os.getpid() if dist.get_rank() == 2 else None")
    pid = ft.rank_info[2]["pid"]
    ft.auto_respawn = True
    try:
        ft.run(_LOOP, timeout=60)
    finally:
        ft.auto_respawn = False
    assert ft.live_ranks == [0, 1, 2, 3] and not ft.dead
    assert ft.rank_info[2]["pid"] != pid
    assert ft.pull("last") == dict.fromkeys(range(4), 11)
    assert ft.pull("wrong") == dict.fromkeys(range(4), [])


_NEW_H = """
import torch, torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
me = dist.get_rank()
mine = g if me < 2 else h if me == 2 else c10d._resolve_process_group(h_name)
t = torch.ones(1) * (me + 1)
dist.all_reduce(t, group=mine)
pair = t.item()
"""


def test_subgroups_are_made_again_by_a_respawn_without_from(ft: Cluster):
    """Rank 3 (in ``h``) SIGKILLed, ``cluster.respawn()`` with no source: the new rank
    starts empty, takes part in making the survivors' groups again and gets no name;
    the survivors' names work again, and the new rank reaches its ``h`` by the name
    torch gave it (the same on every rank: it made them in the same order)."""
    ft.run(_GROUPS)
    pid = ft.rank_info[3]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_dead(ft, [3])
    report = ft.respawn()
    assert report.ranks == [3] and ft.rank_info[3]["pid"] != pid, report.summary()
    ft.run("named = 'g' in globals()")
    assert ft.pull("named") == {0: True, 1: True, 2: True, 3: False}  # nothing bound on it
    ft.run("h_name = h.group_name", ranks=[2])
    ft.push({"h_name": ft.pull("h_name", ranks=[2])[2]}, ranks=[3])
    ft.run(_NEW_H, timeout=60)
    assert ft.pull("pair") == {0: _LOW, 1: _LOW, 2: _HIGH, 3: _HIGH}
    said = report.summary()
    assert "torch.distributed subgroup(s) cur, g, h, pairs, subs made again" in said, said


def test_torch_reinit_makes_the_subgroups_again_and_rewrap_keeps_a_ddp_models_own(ft: Cluster):
    """``%mpi torch-reinit`` (``cluster.torch_reinit()``): every subgroup made again, the
    names rebound; ``torchdist.rewrap(ddp)`` wraps a DDP model on the subgroup made again
    in place of its own (its gradient averaged over its pair, not the world)."""
    ft.run(_GROUPS)
    groups = ft.torch_reinit()
    made = {"cur", "g", "h", "pairs", "subs"}  # and a name an earlier test left holding one
    assert all(made <= set(g["subgroups"]) for g in groups.values()), groups
    ft.run("from clusterkernel import torchdist\nddp = torchdist.rewrap(ddp)\n" + _SUMS, timeout=60)
    assert ft.pull("sums") == {r: _expected(r) for r in range(4)}
    assert ft.pull("grad") == _GRAD  # averaged over its pair
    assert set(ft.pull("same").values()) == {(True, True, True, True)}
