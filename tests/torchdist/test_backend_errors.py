"""What the ranks cannot do is refused at start on every rank, naming it, leaving nothing.

(A backend this torch lacks, ``nccl`` on CPU, is refused the same way before any
rendezvous: ``mpi/case_torchrun.py`` checks it on the ranks.)"""

from __future__ import annotations

import pytest

from clusterkernel import Cluster, ClusterError
from tests._procs import wait_no_cluster_processes


def test_gpus_asked_of_a_host_without_them_is_refused_on_every_rank(no_shared_cluster):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    with pytest.raises(ClusterError) as info:
        Cluster(n=2, gpus_per_rank=1).start()
    said = str(info.value)
    assert "Setting torchrun's environment and each rank's GPU failed" in said
    assert "[rank 0]" in said and "[rank 1]" in said and "this host has no GPU" in said
    assert not wait_no_cluster_processes(20)
