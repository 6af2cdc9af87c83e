"""GPU ranks for real: run where CUDA GPUs are at hand (``pytest -m gpu``); skipped elsewhere.

Correct at any GPU count: with one GPU the NCCL tests run one rank, and the shared-GPU
test runs one rank more than there are GPUs. The respawn test runs two fault-tolerant
ranks on GPU 0 (the helpers and checks of ``tests/cluster/test_respawn.py``'s DDP case). What they showed on a GPU machine is in
BENCHMARKS.md ("GPU").
"""

from __future__ import annotations

import pytest
import torch

from clusterkernel import Cluster, RankError
from tests._procs import wait_no_cluster_processes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs"),
]


@pytest.fixture
def gpu_cluster(no_shared_cluster):
    n = min(torch.cuda.device_count(), 2)
    c = Cluster(n=n, torch=True).start()
    yield c
    c.stop()


def test_each_rank_is_bound_to_its_gpu_and_nccl_reduces_cuda_tensors(gpu_cluster: Cluster):
    n = gpu_cluster.n
    assert gpu_cluster.gpus == {r: [r] for r in range(n)}
    gpu_cluster.run(
        "import torch, torch.distributed as dist\n"
        "dev = torch.cuda.current_device()\n"
        "t = torch.ones(1 << 20, device='cuda') * (dist.get_rank() + 1)\n"
        "dist.all_reduce(t)\n"
        "total = t[0].item()\n"
        "backend = dist.get_backend_config()"
    )
    assert gpu_cluster.pull("dev") == {r: r for r in range(n)}
    assert set(gpu_cluster.pull("total").values()) == {n * (n + 1) / 2}
    assert all("nccl" in b for b in gpu_cluster.pull("backend").values())
    rows = gpu_cluster.status()
    assert all(row["gpu"] and row["gpu"]["mem_total_mib"] > 0 for row in rows)


def test_comms_collectives_on_cuda_tensors_go_through_nccl(gpu_cluster: Cluster):
    n = gpu_cluster.n
    gpu_cluster.run(
        "import torch\n"
        "from clusterkernel import comm, metrics\n"
        "t = torch.full((1 << 20,), float(comm.rank() + 1), device='cuda')\n"
        "comm.all_reduce(t)\n"
        "total, where = t[0].item(), t.device.type\n"
        "alg = metrics.recorder().records('comm')[-1]['algorithm']"
    )
    assert set(gpu_cluster.pull("total").values()) == {n * (n + 1) / 2}
    assert set(gpu_cluster.pull("where").values()) == {"cuda"}
    assert set(gpu_cluster.pull("alg").values()) == {"nccl"}


def test_ddp_on_gpus_trains_as_one_process_on_the_whole_batch(gpu_cluster: Cluster):
    gpu_cluster.run(
        "import torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "rank, n = dist.get_rank(), dist.get_world_size()\n"
        "torch.manual_seed(0)\n"
        "ref = torch.nn.Linear(16, 4).cuda()\n"
        "net = torch.nn.Linear(16, 4).cuda()\n"
        "net.load_state_dict(ref.state_dict())\n"
        "from clusterkernel import metrics\n"
        "metrics.recorder()  # a rank that records metrics: its DDP's all-reduces are timed\n"
        "ddp, w0 = DDP(net), ref.weight.detach().clone()\n"
        "hooked = getattr(ddp, '_ck_timed', None) is not None\n"
        "g = torch.Generator().manual_seed(1)\n"
        "x, y = torch.randn(8 * n, 16, generator=g).cuda(), torch.randn(8 * n, 4, generator=g).cuda()\n"
        "mine = slice(8 * rank, 8 * (rank + 1))\n"
        "opt, ref_opt = torch.optim.SGD(ddp.parameters(), 0.1), torch.optim.SGD(ref.parameters(), 0.1)\n"
        "for _ in range(5):\n"
        "    opt.zero_grad(); torch.nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward(); opt.step()\n"
        "    ref_opt.zero_grad(); torch.nn.functional.mse_loss(ref(x), y).backward(); ref_opt.step()\n"
        "moved = (net.weight - w0).abs().max().item()\n"
        "diff = max((a - b).abs().max().item() for a, b in zip(net.parameters(), ref.parameters()))\n"
        "where = next(net.parameters()).device.type\n"
        "import time\n"
        "from clusterkernel.torchdist import _timings\n"
        "torch.cuda.synchronize(); time.sleep(1.0)  # NCCL's watchdog times the calls\n"
        "_timings.collect(metrics.recorder())\n"
        "ops = {r['op'] for r in metrics.recorder().records('comm')}"
    )
    assert set(gpu_cluster.pull("where").values()) == {"cuda"}
    # the timed hook on the group torch picks by device (cpu:gloo,cuda:nccl): torch's NCCL
    # flight-recorder entries did not reach the recorder on an H200 (BENCHMARKS.md, "GPU")
    assert set(gpu_cluster.pull("hooked").values()) == {True}
    assert all(
        "torch allreduce" in o or "torch all_reduce" in o for o in gpu_cluster.pull("ops").values()
    ), gpu_cluster.pull("ops")
    assert all(m > 1e-3 for m in gpu_cluster.pull("moved").values())  # it trained
    assert all(d < 1e-5 for d in gpu_cluster.pull("diff").values()), gpu_cluster.pull("diff")


def test_ranks_sharing_a_gpu_move_cuda_tensors_through_gloo(no_shared_cluster):
    """NCCL refuses two ranks of one group on one GPU: with ``gpu_share`` the group is
    gloo, and torch's and comm's collectives on CUDA tensors still add up."""
    count = torch.cuda.device_count()
    if count > 3:
        pytest.skip("one rank more than GPUs would be many ranks here")
    n = count + 1
    c = Cluster(n=n, torch=True, gpu_share=True).start()
    try:
        assert c.gpus[n - 1] == [0]  # the last rank shares GPU 0
        c.run(
            "import torch, torch.distributed as dist\n"
            "from clusterkernel import comm, metrics\n"
            "t = torch.ones(1 << 16, device='cuda') * (dist.get_rank() + 1)\n"
            "dist.all_reduce(t)\n"
            "u = torch.full((1 << 16,), float(comm.rank() + 1), device='cuda')\n"
            "comm.all_reduce(u)\n"
            "totals = (t[0].item(), u[0].item(), u.device.type)\n"
            "backend = dist.get_backend()\n"
            "alg = metrics.recorder().records('comm')[-1]['algorithm']"
        )
        want = n * (n + 1) / 2
        assert set(c.pull("totals").values()) == {(want, want, "cuda")}
        assert set(c.pull("backend").values()) == {"gloo"}
        assert set(c.pull("alg").values()) == {"gloo"}
    finally:
        c.stop()


def test_fsdp2_and_dtensor_on_gpus(gpu_cluster: Cluster):
    n = gpu_cluster.n
    gpu_cluster.run(
        "import torch, torch.distributed as dist\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "from torch.distributed.tensor import DTensor, Shard, distribute_tensor\n"
        "mesh = init_device_mesh('cuda', (dist.get_world_size(),))\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(\n"
        "    torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()\n"
        "fully_shard(model, mesh=mesh)\n"
        "opt = torch.optim.Adam(model.parameters(), 1e-2)\n"
        "x = torch.randn(256, 32, device='cuda'); y = x.sum(1, keepdim=True)\n"
        "losses = []\n"
        "for _ in range(30):\n"
        "    opt.zero_grad(); loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "    loss.backward(); opt.step(); losses.append(loss.item())\n"
        "sharded = all(isinstance(p, DTensor) for p in model.parameters())\n"
        "d = distribute_tensor(torch.arange(4.0 * mesh.size(), device='cuda'), mesh, [Shard(0)])\n"
        "full, local = d.full_tensor().sum().item(), d.to_local().numel()"
    )
    assert all(ls[-1] < ls[0] / 2 for ls in gpu_cluster.pull("losses").values())
    assert all(gpu_cluster.pull("sharded").values())
    assert set(gpu_cluster.pull("full").values()) == {sum(range(4 * n))}
    assert set(gpu_cluster.pull("local").values()) == {4}


# a DDP model on the rank's GPU, data by step and rank; rank 1 is killed at step 20
_RESPAWN_TRAIN = """
import os, signal, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).cuda()
ddp = DDP(net)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
step = 0
def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 6, generator=g).cuda(), torch.randn(8, 1, generator=g).cuda()
"""

_RESPAWN_LOOP = """
while step < 40:
    if DIE and step == 20 and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    x, y = batch(step, dist.get_rank())
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    step += 1
weights = torch.cat([p.detach().flatten() for p in net.parameters()]).cpu()
"""

_WHERE = """
import os, torch, torch.distributed as dist
where = (torch.cuda.current_device(), os.environ.get("CLUSTERKERNEL_GPUS"), dist.get_backend(),
         dist.get_world_size(), next(net.parameters()).device.type if "net" in dir() else None,
         os.getpid())
"""


def test_a_gpu_rank_killed_mid_ddp_is_respawned_on_its_gpu_and_trains_on(no_shared_cluster):
    """Two fault-tolerant ranks on GPU 0 (``gpu_share``: a gloo group moving CUDA
    tensors): rank 1 killed in a DDP loop, respawned from rank 0; the new process is
    bound to its predecessor's GPU, the group is made again over both, and the DDP
    model trains on to the weights of an undisturbed run."""
    c = Cluster(
        n=2, torch=True, gpu_share=True, fault_tolerant=True, env={"OMP_NUM_THREADS": "1"}
    ).start()
    try:
        assert c.gpus == {0: [0], 1: [0]}
        c.run(_RESPAWN_TRAIN + "DIE = False\n" + _RESPAWN_LOOP)
        undisturbed = c.pull("weights")[0]
        c.run(_RESPAWN_TRAIN + "DIE = True\n" + _WHERE)
        before = c.pull("where")
        assert before[1][:4] == (0, "0", "gloo", 2), before
        with pytest.raises(RankError) as info:
            c.run(_RESPAWN_LOOP, timeout=120)
        assert [f.ranks for f in info.value.failures if f.kind == "died"] == [[1]]
        assert c.pull("step", ranks=[0]) == {0: 20}  # the step that failed
        report = c.respawn(source=0)
        assert report.ranks == [1] and "ddp" in report.ddp, report.summary()
        c.run(_WHERE)
        after = c.pull("where")
        assert after[1][:5] == before[1][:5], (before, after)  # its GPU, gloo, 2 ranks, CUDA model
        assert (
            after[1][5] != before[1][5] and after[0][5] == before[0][5]
        )  # new process, same survivor
        c.run("DIE = False\n" + _RESPAWN_LOOP)
        for rank, weights in c.pull("weights").items():
            assert (weights - undisturbed).abs().max().item() < 1e-5, rank
    finally:
        c.stop()
    assert not wait_no_cluster_processes(20)
