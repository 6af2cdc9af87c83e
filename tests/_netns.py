"""A second "machine" on this one: a network namespace joined to it by a veth pair.

The namespace has its own addresses, its own host name (seen through the ssh
stand-in) and its own ``/etc/hosts``; the "ssh" mpiexec uses is a small script
that runs the command inside the namespace (there is no sshd on the CI machine).
Ranks started there talk to ranks here over TCP on the link, as between two hosts.
Used by the multi-host tests (through a fixture) and by ``benchmarks/bench_hier.py``.
Needs root and ``ip``.

Example::

    with second_host() as host:
        env = two_host_env(host, ssh_agent(tmp / "ssh", host))
        hosts = f"{socket.gethostname()}:2,{host.ns_ip}:2"   # mpiexec --host

    with second_host(link_rate="1gbit") as host:   # a 1 Gbit/s link each way
        ...
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

# tc's rate units, in bits per second.
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
# tbf's bucket: deep enough to take a GSO packet off the veth (64 KB) and ~100 us of
# traffic (tbf then wakes rarely enough to hold its rate), shallow enough that a
# message of a few hundred KB after an idle gap still goes at the rate, not the burst.
_BURST_SECONDS = 100e-6
_MIN_BURST = 64 * 1024
# The queue tbf holds before dropping (tc's "latency"): TCP then never sees drops.
_TBF_LATENCY = "20ms"

# Another fixture (a Slurm test bed) takes 10.231.x.0/24: ours start above it.
_FIRST_SUBNET = ipaddress.ip_network("10.232.0.0/24")
_LAST_SUBNET = ipaddress.ip_network("10.239.255.0/24")


class NoSecondHost(RuntimeError):
    """This machine cannot stand in for two (no root, no ``ip``, no free subnet)."""


@dataclass
class NetnsHost:
    ns: str  # namespace name
    hostname: str  # the host name processes inside it see
    veth: str  # this machine's end of the link
    subnet: str  # the link's network, e.g. "10.232.0.0/24"
    host_ip: str  # this machine's address on it (.1)
    ns_ip: str  # the other "machine"'s (.2)

    def pids(self) -> list[int]:
        out = ip("netns", "pids", self.ns).stdout
        return [int(p) for p in out.split()]

    def inode(self) -> int:
        """The namespace's inode, what ``/proc/self/ns/net`` shows inside it."""
        return os.stat(f"/run/netns/{self.ns}").st_ino

    def link_bytes(self) -> int:
        """Bytes sent plus received on this machine's end of the link."""
        stats = Path("/sys/class/net", self.veth, "statistics")
        return sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))


def rate_bits(rate: str) -> int:
    """A tc rate such as ``"10gbit"`` or ``"500mbit"`` in bits per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?bit)", rate.strip().lower())
    if m is None:
        raise ValueError(f"link rate {rate!r}: give a number and a unit, e.g. 10gbit or 500mbit")
    return int(float(m.group(1)) * _RATE_UNITS[m.group(2)])


def _shape(host: NetnsHost, peer: str, rate: str) -> None:
    """Limit both ends of the veth pair to ``rate`` (so both directions): a token
    bucket (tc tbf; netem is not available here) models a slower inter-node link."""
    tc = which("tc")
    burst = max(_MIN_BURST, int(rate_bits(rate) / 8 * _BURST_SECONDS))
    qdisc = ["qdisc", "add", "dev"]
    tbf = ["root", "tbf", "rate", rate, "burst", str(burst), "latency", _TBF_LATENCY]
    for cmd in ([tc, *qdisc, host.veth, *tbf], [tc, "-n", host.ns, *qdisc, peer, *tbf]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:  # not a skip: the bed is here, the cap is broken
            raise RuntimeError(f"cannot shape the link to {rate}: {done.stderr.strip()}")


def which(program: str) -> str:
    path = shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise NoSecondHost(f"needs `{program}` to stand in for a second machine")
    return path


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([which("ip"), *args], capture_output=True, text=True, check=check)


def _free_subnet() -> ipaddress.IPv4Network:
    """The first 10.23x.y.0/24 from 10.232.0.0 that no route or address here touches.

    A fixed subnet collides with a link another test (or anything else) set up.
    """
    shown = ip("-4", "route", "show", "table", "all").stdout + ip("-4", "-br", "addr").stdout
    used = [
        ipaddress.ip_network(m, strict=False)
        for m in re.findall(r"\b\d+\.\d+\.\d+\.\d+(?:/\d+)?", shown)
    ]
    net = _FIRST_SUBNET
    while net.network_address <= _LAST_SUBNET.network_address:
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
        net = ipaddress.ip_network((int(net.network_address) + 256, 24))
    raise NoSecondHost(f"no free /24 between {_FIRST_SUBNET} and {_LAST_SUBNET}")


@contextlib.contextmanager
def second_host(link_rate: str | None = None) -> Iterator[NetnsHost]:
    """A namespace at .2 of a free subnet, routed to this machine; removed on exit
    with everything still running in it.

    ``link_rate`` (a tc rate, e.g. ``"1gbit"``) caps the link in each direction, as
    a network slower than memory would; by default it runs as fast as the machine
    copies. The caps go with the veth pair when the namespace is removed.
    """
    if link_rate is not None:
        rate_bits(link_rate)  # a bad rate fails before anything is made
    if os.geteuid() != 0:
        raise NoSecondHost("needs root to create a network namespace")
    tag = str(os.getpid())
    subnet = _free_subnet()
    host = NetnsHost(
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
        made = ip("netns", "add", host.ns, check=False)
        if made.returncode != 0:
            raise NoSecondHost(f"cannot create a network namespace here: {made.stderr.strip()}")
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
            ip(*cmd)
        if link_rate is not None:
            _shape(host, peer, link_rate)
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
        with contextlib.suppress(subprocess.CalledProcessError):
            for pid in host.pids():  # whatever a failed run left running in there
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
        ip("netns", "del", host.ns, check=False)  # deletes the veth pair with it
        ip("link", "del", host.veth, check=False)
        shutil.rmtree(etc, ignore_errors=True)


def ssh_agent(path: Path, host: NetnsHost) -> Path:
    """What mpiexec runs instead of ssh: ``agent <host> <command...>``.

    Like ssh it hands the command to a shell on the other host: in the namespace,
    under that host's name (a UTS namespace of its own), since Open MPI tells
    nodes apart by host name. Each call is logged to ``<path>.log`` for a failure
    to show.
    """
    ip_, unshare, hostname = which("ip"), which("unshare"), which("hostname")
    path.write_text(
        "#!/bin/sh\n"
        f'echo "called with: $*" >> {path}.log\n'
        'while [ "${1#-}" != "$1" ]; do shift; done  # ssh options, if any\n'
        "shift  # the host name: there is only one other host\n"
        # Full paths: mpiexec's PATH need not have the system's sbin/.
        f"exec {ip_} netns exec {host.ns} {unshare} --uts "
        f'sh -c "{hostname} {host.hostname} && $*"\n'
    )
    path.chmod(0o755)
    return path


def two_host_env(host: NetnsHost, agent: Path) -> dict[str, str]:
    """Environment for an mpiexec spanning this machine and ``host``."""
    return {
        "PRTE_MCA_plm_ssh_agent": str(agent),
        # Ranks on different hosts use TCP (shared memory within a host); only
        # the veth link may carry it, so what crosses hosts crosses the link.
        "OMPI_MCA_btl_tcp_if_include": host.subnet,
    }
