"""torchrun's environment from MPI, and torch.distributed on it, at any world size.

Every rank runs this file (pytest inside ``mpiexec -n N``); checks hold for N = 1..4.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI

from clusterkernel import torchdist
from clusterkernel.torchdist import _flight

WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def env():
    return torchdist.torchrun_env()


def test_the_environment_is_torchruns(env):
    rank, size = WORLD.Get_rank(), WORLD.Get_size()
    assert env["RANK"] == os.environ["RANK"] == str(rank)
    assert env["WORLD_SIZE"] == str(size)
    # one host: local ranks are the world's, one node
    assert env["LOCAL_RANK"] == str(rank) and env["LOCAL_WORLD_SIZE"] == str(size)
    assert env["GROUP_RANK"] == env["NODE_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
    assert env["MASTER_ADDR"] == "127.0.0.1"
    # every rank meets at the same port, and rank 0 can listen on it now
    assert len(set(WORLD.allgather(env["MASTER_PORT"]))) == 1
    if rank == 0:
        with socket.socket() as s:
            s.bind((env["MASTER_ADDR"], int(env["MASTER_PORT"])))


def test_each_call_gives_a_fresh_port(env):
    again = torchdist.torchrun_env(apply=False)
    assert again["MASTER_PORT"] != env["MASTER_PORT"] or WORLD.Get_size() == 0
    assert os.environ["MASTER_PORT"] == env["MASTER_PORT"]  # apply=False left it


def test_init_process_group_with_no_arguments_works(env):
    dist.init_process_group()  # env://, backend by device
    try:
        t = torch.full((5,), float(WORLD.Get_rank() + 1))
        dist.all_reduce(t)
        n = WORLD.Get_size()
        assert t.tolist() == [n * (n + 1) / 2] * 5
        # torch's flight recorder, read as the hang report reads it
        mine = [e for e in _flight.flight() if e["op"] == "all_reduce"]
        assert mine and mine[-1]["nbytes"] == 20 and mine[-1]["dtype"] == "float32"
        assert mine[-1]["done"] and mine[-1]["group_ranks"] == list(range(n))
        assert mine[-1]["seq"] >= 1
    finally:
        dist.destroy_process_group()


def test_init_then_reinit_keeps_the_process_and_changes_the_rendezvous(env):
    first = torchdist.init("gloo")
    assert first["backend"] == "gloo" and first["world_size"] == WORLD.Get_size()
    assert torchdist.init("gloo") == first  # a second init is harmless
    second = torchdist.reinit()
    assert second["backend"] == "gloo" and second["master"] != first["master"]
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [float(WORLD.Get_size())] * 3
    assert torchdist.destroy() and not torchdist.destroy()


def test_a_backend_this_torch_lacks_is_a_clear_error_before_any_rendezvous(env):
    if torch.cuda.is_available():
        pytest.skip("this host has GPUs: nccl is a real choice here")
    with pytest.raises(torchdist.BackendError, match="no nccl backend|needs a GPU"):
        torchdist.init("nccl")
    with pytest.raises(torchdist.BackendError, match="use one of gloo, nccl"):
        torchdist.init("tcp")
    assert not dist.is_initialized()


def test_shutdown_frees_what_holds_the_group_then_destroys_it(env):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torchdist.init("gloo")
    names = {"net": DDP(torch.nn.Linear(2, 1)), "keep": 7}
    names["net"](torch.ones(1, 2)).sum().backward()
    assert torchdist.shutdown(names)
    assert names == {"keep": 7} and not dist.is_initialized()
    assert not torchdist.shutdown(names)  # nothing left to do
