"""GPU ranks for real: run where CUDA GPUs are at hand (``pytest -m gpu``); skipped elsewhere.

Correct at any GPU count: with one GPU the NCCL tests run one rank, and the shared-GPU
test runs one rank more than there are GPUs. What they showed on a GPU machine is in
BENCHMARKS.md ("GPU ranks").
"""

from __future__ import annotations

import pytest
import torch

from clusterkernel import Cluster

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
        "ddp, w0 = DDP(net), ref.weight.detach().clone()\n"
        "g = torch.Generator().manual_seed(1)\n"
        "x, y = torch.randn(8 * n, 16, generator=g).cuda(), torch.randn(8 * n, 4, generator=g).cuda()\n"
        "mine = slice(8 * rank, 8 * (rank + 1))\n"
        "opt, ref_opt = torch.optim.SGD(ddp.parameters(), 0.1), torch.optim.SGD(ref.parameters(), 0.1)\n"
        "for _ in range(5):\n"
        "    opt.zero_grad(); torch.nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward(); opt.step()\n"
        "    ref_opt.zero_grad(); torch.nn.functional.mse_loss(ref(x), y).backward(); ref_opt.step()\n"
        "moved = (net.weight - w0).abs().max().item()\n"
        "diff = max((a - b).abs().max().item() for a, b in zip(net.parameters(), ref.parameters()))\n"
        "where = next(net.parameters()).device.type"
    )
    assert set(gpu_cluster.pull("where").values()) == {"cuda"}
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
