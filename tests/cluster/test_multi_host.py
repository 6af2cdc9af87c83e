"""Several machines for real: a network namespace on this machine plays the second host.

``Cluster(hosts=...)`` with a host that is not this machine takes the multi-node
path: the controller listens on all interfaces, mpiexec starts a daemon on the
other host through its ssh launcher, and ranks on different hosts talk over TCP.
Here the other host is a Linux network namespace joined to this one by a veth
pair, with its own addresses, its own host name and its own ``/etc/hosts``; the
"ssh" is a small script that runs the command inside the namespace (there is no
sshd on the CI machine). Everything else is the real thing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from clusterkernel import Cluster, ClusterError
from tests._mpirun import run_mpi
from tests._netns import NetnsHost, ip, ssh_agent, two_host_env
from tests._open_mpi import once_more_on_open_mpi_abort
from tests._procs import wait_no_cluster_processes

_WHERE = """
import os, socket
from clusterkernel import comm
where = (socket.gethostname(), os.stat("/proc/self/ns/net").st_ino)
"""

_ALLREDUCE = """
import torch
t = torch.full((1 << 20,), float(comm.rank() + 1))
comm.all_reduce(t, op=comm.SUM)
total = (t.min().item(), t.max().item())
"""

# algorithm="shm" needs one node: the world group spans two and says so on every
# rank; each host's node group reduces through its own shared memory.
_SHM = """
try:
    comm.all_reduce(torch.ones(4), algorithm="shm")
    shm_error = ""
except comm.CommError as exc:
    shm_error = str(exc)
x = torch.full((1000,), float(comm.rank()))
comm.all_reduce(x, group=comm.node_group(), algorithm="shm")
node_sum = (x.min().item(), x.max().item())
"""

# torch.distributed as torchrun would start it on these two hosts: a gloo all_reduce
# over the rendezvous every rank found in its environment
_TORCH = """
import torch.distributed as dist
torch_env = {k: os.environ[k] for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "MASTER_ADDR", "MASTER_PORT")}
dist.init_process_group("gloo")
y = torch.full((1000,), float(dist.get_rank() + 1))
dist.all_reduce(y)
torch_sum = (y.min().item(), y.max().item())
dist.destroy_process_group()
"""


def test_ranks_on_two_hosts(no_shared_cluster, netns_host, tmp_path):
    # Only the veth link may carry the ranks' TCP: a right sum means data crossed it.
    env = two_host_env(netns_host, ssh_agent(tmp_path / "ssh", netns_host))
    here = socket.gethostname()
    cluster = Cluster(n=4, hosts=f"{here}:2,{netns_host.ns_ip}:2", env=env, start_timeout=60)
    assert cluster.multi_node
    try:
        cluster.start()
    except ClusterError as exc:
        # the launcher's words (in the error), and what we can see of the other host
        pytest.fail(f"{exc}\n\n{_diagnose(netns_host, tmp_path / 'ssh.log')}")
    try:
        cluster.run(_WHERE)
        where = cluster.pull("where")
        my_netns = os.stat("/proc/self/ns/net").st_ino
        assert where[0] == where[1] == (here, my_netns)
        assert where[2] == where[3] == (netns_host.hostname, netns_host.inode())

        before = netns_host.link_bytes()
        cluster.run(_ALLREDUCE)
        crossed = netns_host.link_bytes() - before
        assert cluster.pull("total") == {r: (10.0, 10.0) for r in range(4)}
        # Host 2 cannot know the sum without host 1's partial sum (4 MiB) or more.
        assert crossed >= 4 * (1 << 20), crossed

        cluster.run(_SHM)
        errors = cluster.pull("shm_error")
        assert all("several nodes" in errors[r] for r in range(4)), errors
        assert cluster.pull("node_sum") == {
            0: (1.0, 1.0),
            1: (1.0, 1.0),
            2: (5.0, 5.0),
            3: (5.0, 5.0),
        }

        cluster.run(_TORCH)
        envs = cluster.pull("torch_env")
        assert [envs[r]["LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
        assert [envs[r]["GROUP_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
        assert {envs[r]["LOCAL_WORLD_SIZE"] for r in range(4)} == {"2"}
        # rank 0's address on the link, which the other host reaches
        assert {envs[r]["MASTER_ADDR"] for r in range(4)} == {netns_host.host_ip}
        assert len({envs[r]["MASTER_PORT"] for r in range(4)}) == 1
        assert cluster.pull("torch_sum") == {r: (10.0, 10.0) for r in range(4)}

        rows = cluster.status()
        assert [r["rank"] for r in rows] == [0, 1, 2, 3]
        assert [r["host"] for r in rows] == [here, here, netns_host.hostname, netns_host.hostname]
        assert {r["state"] for r in rows} == {"idle"}
        assert all(r["memory_mib"] > 0 for r in rows)
    finally:
        cluster.stop()
    assert not wait_no_cluster_processes(20)
    _assert_other_host_empty(netns_host)


def test_a_dead_rank_on_the_other_host_is_respawned_there(no_shared_cluster, netns_host, tmp_path):
    env = two_host_env(netns_host, ssh_agent(tmp_path / "ssh", netns_host))
    here = socket.gethostname()

    @contextmanager
    def job() -> Iterator[Cluster]:
        cluster = Cluster(
            n=4, hosts=f"{here}:2,{netns_host.ns_ip}:2", env=env, start_timeout=60,
            fault_tolerant=True,
        )  # fmt: skip
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
        assert not wait_no_cluster_processes(20)
        _assert_other_host_empty(netns_host)

    def respawned(cluster: Cluster) -> None:
        cluster.run(_WHERE + "x = 5")
        os.kill(cluster.rank_info[3]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while 3 in cluster.live_ranks and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.respawn(source=0).ranks == [3]
        cluster.run(_WHERE + _ALLREDUCE)
        assert cluster.pull("where")[3] == (netns_host.hostname, netns_host.inode())
        assert cluster.rank_info[3]["host"] == netns_host.hostname
        assert cluster.pull("total") == {r: (10.0, 10.0) for r in range(4)}
        assert cluster.pull("x", ranks=[3]) == {3: 5}

    once_more_on_open_mpi_abort(job, respawned)  # only where Open MPI aborted itself


def test_hier_all_reduce_across_two_hosts(netns_host, tmp_path):
    """algorithm="hier" on 2 + 2 ranks (tests/cluster/_hier_two_hosts.py): every case
    matches numpy, and of a large call only the leaders' blocks crossed the link."""
    here = socket.gethostname()
    env = two_host_env(netns_host, ssh_agent(tmp_path / "ssh", netns_host))
    env["HIER_LINK_STATS"] = f"/sys/class/net/{netns_host.veth}/statistics"
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # auto: the shipped table, no user's cache
    script = Path(__file__).with_name("_hier_two_hosts.py")
    hosts = [(here, 2), (netns_host.ns_ip, 2)]
    out = run_mpi(4, str(script), hosts=hosts, env=env, timeout=300).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    res = json.loads(line.removeprefix("RESULT "))
    there = netns_host.hostname
    assert res["where"] == [[here, [0, 1]]] * 2 + [[there, [2, 3]]] * 2
    assert res["layout"] == [2, True]
    assert res["bad"] == [{"world": [], "0,1,2": [], "0,2": []}] + [
        {"world": [], "0,1,2": []},
        {"world": [], "0,1,2": [], "0,2": []},
        {"world": []},
    ], res["bad"]
    n = res["bytes"]
    # Each host needs the other's partial sum of every element: n bytes each way
    # at least. The leaders' allreduces (block i between the two local ranks i)
    # move just that, plus headers; if every rank's data crossed it would be 2x.
    assert 2 * n <= res["hier"] <= 2.5 * n, res
    # auto on a group across hosts: MPI for small calls, hier in the middle, the
    # ring for the largest (the shipped several-node rule), and a right sum.
    picks = {int(k): v for k, v in res["auto"]["picks"].items()}
    assert picks == {4096: "mpi", 1 << 20: "hier", 64 << 20: "ring"}, res["auto"]
    assert res["auto"]["sum_ok"], res["auto"]
    _assert_other_host_empty(netns_host)


def _assert_other_host_empty(host: NetnsHost) -> None:
    left = host.pids()
    deadline = time.monotonic() + 20  # the launcher's shell exits after its daemon
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = host.pids()
    assert not left, f"left in the other host: {[_cmdline(p) for p in left]}"


def _diagnose(host: NetnsHost, agent_log: Path) -> str:
    """What happened on the way to the other host, for a failed start."""
    calls = agent_log.read_text() if agent_log.exists() else "(mpiexec never called it)\n"
    procs = "\n".join(_cmdline(p) for p in host.pids()) or "(none)"
    here = ip("-br", "addr", check=False).stdout
    there = ip("-n", host.ns, "-br", "addr", check=False).stdout
    return (
        f"ssh stand-in {agent_log.with_suffix('')}:\n{calls}"
        f"processes in {host.ns}:\n{procs}\n"
        f"link {host.subnet} ({host.host_ip} here, {host.ns_ip} there)\n"
        f"addresses here:\n{here}addresses there:\n{there}"
    )


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return f"{pid} (gone)"
