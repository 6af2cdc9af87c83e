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

import contextlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from clusterkernel import Cluster
from tests._procs import wait_no_cluster_processes

_SUBNET = "10.231.0.0/24"
_HOST_IP = "10.231.0.1"  # this machine's end of the veth pair
_NS_IP = "10.231.0.2"  # the other "machine"


@dataclass
class _NetnsHost:
    ns: str  # namespace name
    hostname: str  # the host name processes inside it see
    veth: str  # this machine's end of the link

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.ns).stdout
        return [int(p) for p in out.split()]

    def inode(self) -> int:
        """The namespace's inode, what ``/proc/self/ns/net`` shows inside it."""
        return os.stat(f"/run/netns/{self.ns}").st_ino

    def link_bytes(self) -> int:
        """Bytes sent plus received on this machine's end of the link."""
        stats = Path("/sys/class/net", self.veth, "statistics")
        return sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))


def _which(program: str) -> str:
    path = shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        pytest.skip(f"needs `{program}` to stand in for a second machine")
    return path


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([_which("ip"), *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def netns_host():
    """A second "machine": a network namespace at 10.231.0.2, routed to this one."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    tag = str(os.getpid())
    host = _NetnsHost(ns=f"ck-host2-{tag}", hostname=f"ck-host2-{tag}", veth=f"ckh{tag}")
    peer = f"ckn{tag}"
    etc = Path("/etc/netns", host.ns)
    try:
        made = _ip("netns", "add", host.ns, check=False)
        if made.returncode != 0:
            pytest.skip(f"cannot create a network namespace here: {made.stderr.strip()}")
        for cmd in (
            ["link", "add", host.veth, "type", "veth", "peer", "name", peer],
            ["link", "set", peer, "netns", host.ns],
            ["addr", "add", f"{_HOST_IP}/24", "dev", host.veth],
            ["link", "set", host.veth, "up"],
            ["-n", host.ns, "addr", "add", f"{_NS_IP}/24", "dev", peer],
            ["-n", host.ns, "link", "set", peer, "up"],
            ["-n", host.ns, "link", "set", "lo", "up"],
            # Through this machine's end, the namespace reaches every address of it.
            ["-n", host.ns, "route", "add", "default", "via", _HOST_IP],
        ):
            _ip(*cmd)
        # Its own /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/*), as on a
        # real second machine: our host name means our address on the link, not
        # the loopback address our own /etc/hosts may give it.
        etc.mkdir(parents=True)
        (etc / "hosts").write_text(
            f"127.0.0.1 localhost\n{_HOST_IP} {socket.gethostname()}\n{_NS_IP} {host.hostname}\n"
        )
        yield host
    finally:
        for pid in host.pids():  # whatever a failed test left running in there
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        _ip("netns", "del", host.ns, check=False)  # deletes the veth pair with it
        _ip("link", "del", host.veth, check=False)
        shutil.rmtree(etc, ignore_errors=True)


def _ssh_agent(path: Path, host: _NetnsHost) -> Path:
    """What mpiexec runs instead of ssh: ``agent <host> <command...>``.

    Like ssh it hands the command to a shell on the other host: in the namespace,
    under that host's name (a UTS namespace of its own), since Open MPI tells
    nodes apart by host name.
    """
    ip, unshare, hostname = _which("ip"), _which("unshare"), _which("hostname")
    path.write_text(
        "#!/bin/sh\n"
        'while [ "${1#-}" != "$1" ]; do shift; done  # ssh options, if any\n'
        "shift  # the host name: there is only one other host\n"
        # Full paths: mpiexec's PATH need not have the system's sbin/.
        f"exec {ip} netns exec {host.ns} {unshare} --uts "
        f'sh -c "{hostname} {host.hostname} && $*"\n'
    )
    path.chmod(0o755)
    return path


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


def test_ranks_on_two_hosts(no_shared_cluster, netns_host, tmp_path):
    env = {
        "PRTE_MCA_plm_ssh_agent": str(_ssh_agent(tmp_path / "ssh", netns_host)),
        # Ranks on different hosts use TCP (shared memory within a host); only
        # the veth link may carry it, so a right sum means data crossed it.
        "OMPI_MCA_btl_tcp_if_include": _SUBNET,
    }
    here = socket.gethostname()
    cluster = Cluster(n=4, hosts=f"{here}:2,{_NS_IP}:2", env=env, start_timeout=60)
    assert cluster.multi_node
    with cluster:
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

        rows = cluster.status()
        assert [r["rank"] for r in rows] == [0, 1, 2, 3]
        assert [r["host"] for r in rows] == [here, here, netns_host.hostname, netns_host.hostname]
        assert {r["state"] for r in rows} == {"idle"}
        assert all(r["memory_mib"] > 0 for r in rows)
    assert not wait_no_cluster_processes(20)
    left = netns_host.pids()
    deadline = time.monotonic() + 20  # the launcher's shell exits after its daemon
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = netns_host.pids()
    assert not left, f"left in the other host: {[_cmdline(p) for p in left]}"


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return f"{pid} (gone)"
