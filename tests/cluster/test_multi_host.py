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
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from clusterkernel import Cluster, ClusterError
from tests._procs import wait_no_cluster_processes

# Another fixture (a Slurm test bed) takes 10.231.x.0/24: ours start above it.
_FIRST_SUBNET = ipaddress.ip_network("10.232.0.0/24")
_LAST_SUBNET = ipaddress.ip_network("10.239.255.0/24")


@dataclass
class _NetnsHost:
    ns: str  # namespace name
    hostname: str  # the host name processes inside it see
    veth: str  # this machine's end of the link
    subnet: str  # the link's network, e.g. "10.232.0.0/24"
    host_ip: str  # this machine's address on it (.1)
    ns_ip: str  # the other "machine"'s (.2)

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


def _free_subnet() -> ipaddress.IPv4Network:
    """The first 10.23x.y.0/24 from 10.232.0.0 that no route or address here touches.

    A fixed subnet collides with a link another test (or anything else) set up.
    """
    shown = _ip("-4", "route", "show", "table", "all").stdout + _ip("-4", "-br", "addr").stdout
    used = [
        ipaddress.ip_network(m, strict=False)
        for m in re.findall(r"\b\d+\.\d+\.\d+\.\d+(?:/\d+)?", shown)
    ]
    net = _FIRST_SUBNET
    while net.network_address <= _LAST_SUBNET.network_address:
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
        net = ipaddress.ip_network((int(net.network_address) + 256, 24))
    pytest.skip(f"no free /24 between {_FIRST_SUBNET} and {_LAST_SUBNET}")


@pytest.fixture(scope="module")
def netns_host():
    """A second "machine": a network namespace at .2 of a free subnet, routed to this one."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    tag = str(os.getpid())
    subnet = _free_subnet()
    host = _NetnsHost(
        ns=f"ck-host2-{tag}",
        hostname=f"ck-host2-{tag}",
        veth=f"ckh{tag}",
        subnet=str(subnet),
        host_ip=str(subnet.network_address + 1),
        ns_ip=str(subnet.network_address + 2),
    )
    peer = f"ckn{tag}"
    etc = Path("/etc/netns", host.ns)
    try:
        made = _ip("netns", "add", host.ns, check=False)
        if made.returncode != 0:
            pytest.skip(f"cannot create a network namespace here: {made.stderr.strip()}")
        for cmd in (
            ["link", "add", host.veth, "type", "veth", "peer", "name", peer],
            ["link", "set", peer, "netns", host.ns],
            ["addr", "add", f"{host.host_ip}/24", "dev", host.veth],
            ["link", "set", host.veth, "up"],
            ["-n", host.ns, "addr", "add", f"{host.ns_ip}/24", "dev", peer],
            ["-n", host.ns, "link", "set", peer, "up"],
            ["-n", host.ns, "link", "set", "lo", "up"],
            # Through this machine's end, the namespace reaches every address of it.
            ["-n", host.ns, "route", "add", "default", "via", host.host_ip],
        ):
            _ip(*cmd)
        # Its own /etc/hosts (`ip netns exec` mounts /etc/netns/<ns>/*), as on a
        # real second machine: our host name means our address on the link, not
        # the loopback address our own /etc/hosts may give it.
        etc.mkdir(parents=True)
        (etc / "hosts").write_text(
            f"127.0.0.1 localhost\n{host.host_ip} {socket.gethostname()}\n"
            f"{host.ns_ip} {host.hostname}\n"
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
    nodes apart by host name. Each call is logged to ``<path>.log`` for a failure
    to show.
    """
    ip, unshare, hostname = _which("ip"), _which("unshare"), _which("hostname")
    path.write_text(
        "#!/bin/sh\n"
        f'echo "called with: $*" >> {path}.log\n'
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


def test_ranks_on_two_hosts(no_shared_cluster, netns_host, tmp_path):
    env = {
        "PRTE_MCA_plm_ssh_agent": str(_ssh_agent(tmp_path / "ssh", netns_host)),
        # Ranks on different hosts use TCP (shared memory within a host); only
        # the veth link may carry it, so a right sum means data crossed it.
        "OMPI_MCA_btl_tcp_if_include": netns_host.subnet,
    }
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

        rows = cluster.status()
        assert [r["rank"] for r in rows] == [0, 1, 2, 3]
        assert [r["host"] for r in rows] == [here, here, netns_host.hostname, netns_host.hostname]
        assert {r["state"] for r in rows} == {"idle"}
        assert all(r["memory_mib"] > 0 for r in rows)
    finally:
        cluster.stop()
    assert not wait_no_cluster_processes(20)
    left = netns_host.pids()
    deadline = time.monotonic() + 20  # the launcher's shell exits after its daemon
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = netns_host.pids()
    assert not left, f"left in the other host: {[_cmdline(p) for p in left]}"


def _diagnose(host: _NetnsHost, agent_log: Path) -> str:
    """What happened on the way to the other host, for a failed start."""
    calls = agent_log.read_text() if agent_log.exists() else "(mpiexec never called it)\n"
    procs = "\n".join(_cmdline(p) for p in host.pids()) or "(none)"
    here = _ip("-br", "addr", check=False).stdout
    there = _ip("-n", host.ns, "-br", "addr", check=False).stdout
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
