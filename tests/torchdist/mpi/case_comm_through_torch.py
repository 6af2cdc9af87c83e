"""comm's calls handed to torch.distributed (issue 23's NCCL path), tested through gloo.

On GPU nodes CUDA tensors go through NCCL; here CPU tensors are routed through the
default gloo group (``comm.route_to_torch("cpu")``), so the same code runs: results,
the check across ranks, flight entries and timing records. Correct at N = 1..4.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from clusterkernel import comm, metrics, torchdist
from tests.comm.mpi._helpers import RANK, SIZE, agree


@pytest.fixture(scope="module", autouse=True)
def gloo_routes_cpu_tensors():
    torchdist.torchrun_env()
    dist.init_process_group("gloo")
    old = comm.route_to_torch("cuda", "cpu")
    yield
    comm.route_to_torch(*old)
    dist.destroy_process_group()


def _last_record() -> dict:
    return metrics.recorder().records("comm")[-1]


def test_all_reduce_goes_through_gloo_with_its_entry_and_record():
    for op, want in ((comm.SUM, SIZE * (SIZE + 1) / 2), (comm.AVG, (SIZE + 1) / 2)):
        t = torch.full((7, 3), float(RANK + 1)).t()  # not contiguous: copied back
        comm.all_reduce(t, op=op)
        rec, entry = _last_record(), comm.flight()[-1]
        ok = bool((t == want).all()) and rec["algorithm"] == "gloo" and rec["op"] == "all_reduce"
        agree(ok and entry["op"] == "all_reduce" and entry["done"], f"{op.name} {t} {rec}")
    w = comm.all_reduce(torch.ones(5), op=comm.AVG, async_op=True)
    a = torch.full((5,), float(RANK))
    w2 = comm.all_reduce(a, async_op=True)
    agree(w2.wait() and w.wait() and bool((a == SIZE * (SIZE - 1) / 2).all()), f"{a}")


def test_the_other_collectives_and_a_subgroup():
    b = torch.full((4,), float(RANK))
    comm.broadcast(b, src=SIZE - 1)
    r = torch.full((3,), float(RANK + 1))
    comm.reduce(r, dst=0, op=comm.SUM)
    want_r = SIZE * (SIZE + 1) / 2 if RANK == 0 else RANK + 1  # the others keep theirs
    out = torch.empty(SIZE, 2)
    comm.all_gather_into_tensor(out, torch.full((2,), float(RANK)))
    ok = bool((b == SIZE - 1).all()) and bool((r == want_r).all())
    ok = ok and bool((out == torch.arange(SIZE).view(SIZE, 1)).all())
    ends = comm.new_group(sorted({0, SIZE - 1}))  # a true subgroup from 3 ranks up
    s = torch.ones(2)
    if RANK in ends.ranks:
        comm.all_reduce(s, group=ends)
    ok = ok and bool((s == (len(ends.ranks) if RANK in ends.ranks else 1)).all())
    agree(ok and _last_record()["algorithm"] == "gloo", f"{b} {r} {out} {s}")
    comm.destroy_group(ends)


def test_send_and_recv_go_through_gloo():
    if SIZE < 2:
        return  # nothing to send to: checked at 2 ranks and up
    t = torch.empty(3)
    if RANK == 0:
        for src in range(1, SIZE):
            assert comm.recv(t, src=src) == src and bool((t == src).all())
    else:
        comm.isend(torch.full((3,), float(RANK)), dst=0).wait()
    agree(_last_record()["algorithm"] == "gloo", str(_last_record()))


def test_ranks_that_would_use_different_transports_get_a_mismatch_error():
    if SIZE < 2:
        return  # a mismatch needs two ranks
    if RANK == 1:
        comm.route_to_torch("cuda")  # this rank alone would use MPI
    try:
        comm.all_reduce(torch.ones(11))
        raised = ""
    except comm.CollectiveMismatchError as exc:
        raised = str(exc)
    finally:
        comm.route_to_torch("cuda", "cpu")
    # each rank's line names what it would have used: gloo, or MPI's own pick (auto)
    agree("algorithm=gloo" in raised and "algorithm=auto" in raised, raised)


def test_data_parallel_averages_its_buckets_through_gloo():
    from clusterkernel.train import DataParallel

    torch.manual_seed(0)  # the same model on every rank
    model = DataParallel(torch.nn.Linear(4, 1))
    x = torch.arange(8.0).view(2, 4) + RANK  # a different batch on every rank
    model(x).sum().backward()
    model.synchronize()
    want = (torch.arange(8.0).view(2, 4).sum(0) + 2 * (SIZE - 1) / 2).view(1, 4)
    grad = model.module.weight.grad
    ok = torch.allclose(grad, want) and _last_record()["algorithm"] == "gloo"
    agree(ok, f"{grad} want {want}, {_last_record()}")


def test_torchs_pick_by_device_is_read_from_the_groups_config():
    """``init_process_group()`` without a backend: ``get_backend()`` reads "undefined";
    the backend per device is in its config ("cpu:gloo" here, "cpu:gloo,cuda:nccl" on
    GPU nodes, where a GPU run once sent CUDA tensors through MPI for want of this)."""
    dist.destroy_process_group()
    torchdist.torchrun_env()
    dist.init_process_group()
    try:
        t = torch.ones(3)
        comm.all_reduce(t)
        rec = _last_record()
        agree(bool((t == SIZE).all()) and rec["algorithm"] == "gloo", f"{t} {rec}")
    finally:
        dist.destroy_process_group()
        torchdist.torchrun_env()
        dist.init_process_group("gloo")
