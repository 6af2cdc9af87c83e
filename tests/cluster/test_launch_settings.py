"""Launch options said once (issue 28 item 2): ``Cluster(...)``'s keywords and ``%mpi
start``'s options make one :class:`LaunchSettings`, the launcher is built from it and
keeps it, and a kept cluster's record makes the same settings again.

Nothing starts but in the last test; the others build launchers only.
"""

from __future__ import annotations

import pytest
from IPython.core.magic_arguments import parse_argstring

from clusterkernel import Cluster
from clusterkernel.client.cluster import LaunchSettings
from clusterkernel.client.launch import BatchLauncher as SlurmLauncher
from clusterkernel.client.launch import MpiexecLauncher
from clusterkernel.client.magics._args import start_args


@pytest.fixture(autouse=True)
def _outside_an_allocation(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def test_the_magic_and_the_api_make_the_same_settings():
    line = "-n 8 --slurm --nodes 2 --partition gpu --time 2:00:00 --gres gpu:4 --timeout 5"
    from_magic = LaunchSettings.from_args(parse_argstring(start_args, line))
    from_api = Cluster(n=8, launcher="slurm", nodes=2, partition="gpu", time="2:00:00",
                       slurm_args=["--gres=gpu:4"]).launcher  # fmt: skip
    assert isinstance(from_api, SlurmLauncher)
    assert from_magic == from_api.settings
    assert from_api.system.sbatch.nodes == 2 and from_api.system.sbatch.partition == "gpu"
    here = LaunchSettings.from_args(parse_argstring(start_args, "-n 2 --hosts localhost:2"))
    assert here == Cluster(n=2, hosts="localhost:2").launcher.settings
    assert here.kind() == "mpiexec" and isinstance(here.build(), MpiexecLauncher)


def test_a_prebuilt_launch_is_the_whole_launch():
    settings = LaunchSettings(n=2, hosts=["localhost:2"])
    assert settings.hosts == ("localhost:2",)  # a value: lists become tuples
    cluster = Cluster(launcher=settings, timeout=30)
    assert cluster.launcher.settings is settings and cluster.n == 2 and cluster.timeout == 30
    built = settings.build()
    assert Cluster(launcher=built).launcher is built
    with pytest.raises(ValueError, match=r"LaunchSettings.*give n=, fault_tolerant= in it"):
        Cluster(n=4, launcher=settings, fault_tolerant=True)
    with pytest.raises(ValueError, match="launcher must be one of mpiexec, sge, slurm"):
        Cluster(n=2, launcher=5)


def test_each_rule_is_checked_once_where_it_belongs():
    with pytest.raises(ValueError, match="positive integer number of ranks"):
        LaunchSettings(n=0)
    with pytest.raises(ValueError, match="go with --slurm"):
        LaunchSettings.from_args(parse_argstring(start_args, "-n 2 --gpus-per-node 4"))
    with pytest.raises(ValueError, match="--gpus-per-node must be a positive integer"):
        LaunchSettings.from_args(parse_argstring(start_args, "-n 2 --slurm --gpus-per-node 0"))
    with pytest.raises(ValueError, match="are for launcher='slurm'"):
        LaunchSettings(n=2, nodes=2).build()  # settings alone are fine; mpiexec refuses
    with pytest.raises(ValueError, match="Slurm chooses the hosts"):
        LaunchSettings(n=2, hosts="localhost:2", launcher="slurm").build()
    with pytest.raises(ValueError, match="--time 'soon'"):
        LaunchSettings(n=2, launcher="slurm", time="soon").build()


def test_the_kept_record_makes_the_same_settings_again():
    import json

    cluster = Cluster(n=3, launcher="slurm", nodes=3, slurm_args=("--exclusive",), timeout=9)
    record = json.loads(json.dumps(cluster._settings))  # as kept.json holds it
    again = Cluster(**record)
    assert again.launcher.settings == cluster.launcher.settings
    assert again.timeout == 9 and again.launcher.system.sbatch == cluster.launcher.system.sbatch


def test_a_cluster_from_settings_starts(no_shared_cluster):
    with Cluster(launcher=LaunchSettings(n=2)) as cluster:
        cluster.run("from mpi4py import MPI; r = MPI.COMM_WORLD.Get_rank()")
        assert cluster.pull("r") == {0: 0, 1: 1}
        assert cluster._settings["n"] == 2 and cluster._settings["launcher"] is None
