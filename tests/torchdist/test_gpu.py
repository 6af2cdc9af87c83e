"""GPU ranks for real: run where CUDA GPUs are at hand (``pytest -m gpu``); skipped elsewhere.

Not yet run on a GPU: no GPU machine was lent to the sessions that wrote them.
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
