"""torchrun's environment on every rank of the session's shared cluster, at start and
after a restart (a fresh port): ``dist.init_process_group()`` with no arguments works.

Apart from tests/torchdist/test_on_ranks.py (a 2-rank cluster of its own), so that this
test runs on the shared 4-rank cluster while it runs (``shared_cluster_first`` in
tests/conftest.py), not after a module that stopped it.
"""

from __future__ import annotations

from clusterkernel import Cluster

_ENV = """
import os
env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
       "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
"""


def test_every_rank_has_torchruns_environment_and_a_fresh_port_after_restart(cluster: Cluster):
    cluster.run(_ENV)
    envs = cluster.pull("env")
    for rank, env in envs.items():
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(rank) and env["LOCAL_WORLD_SIZE"] == "4"
        assert env["GROUP_RANK"] == env["NODE_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1"
    ports = {env["MASTER_PORT"] for env in envs.values()}
    assert len(ports) == 1
    # dist.init_process_group() with no arguments just works in a cell
    cluster.run(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group()\n"
        "t = torch.ones(2) * (dist.get_rank() + 1)\n"
        "dist.all_reduce(t)\n"
        "total = t.tolist()"
    )
    assert set(map(tuple, cluster.pull("total").values())) == {(10.0, 10.0)}
    cluster.restart()  # destroys the group first; the new ranks meet elsewhere
    cluster.run(_ENV)
    again = cluster.pull("env")
    assert {env["MASTER_PORT"] for env in again.values()} != ports
    cluster.run(
        "import torch.distributed as dist\ndist.init_process_group()\nok = dist.is_initialized()"
    )
    assert all(cluster.pull("ok").values())
    cluster.run("dist.destroy_process_group()")
