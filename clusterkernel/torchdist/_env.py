"""torchrun's environment on an MPI rank: RANK, LOCAL_RANK, MASTER_ADDR, ... (rank side).

``torch.distributed.init_process_group()`` (``env://``) reads who it is and where
to meet from environment variables that ``torchrun`` sets. An MPI job knows all of
it already: the world rank and size, and which ranks share a host (one allgather
of host names). Rank 0 picks a free port on its own address and shares it over
MPI, so every start gets a fresh rendezvous and two jobs on one host never meet
by accident.

Example (what ``%mpi start`` runs on every rank; in a script run by mpiexec call it
before ``init_process_group``)::

    from clusterkernel.torchdist import torchrun_env
    env = torchrun_env()          # sets os.environ too
    env["LOCAL_RANK"]             # '1'
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

from clusterkernel.protocol._net import route_source

# torchrun's names (torch/distributed/run.py); GROUP_RANK is torchrun's node index,
# NODE_RANK the name the Lightning and accelerate launchers read for the same.
NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def node_layout(hosts: list[str]) -> list[dict[str, int]]:
    """Each rank's place from the host name of every rank (index = rank).

    Nodes are numbered in the order their first rank appears, ranks on a node in
    rank order, as torchrun numbers them.

    Example::

        node_layout(["a", "a", "b", "b"])[2]
        # {'LOCAL_RANK': 0, 'LOCAL_WORLD_SIZE': 2, 'GROUP_RANK': 1, 'GROUP_WORLD_SIZE': 2}
    """
    nodes: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        nodes.setdefault(host, []).append(rank)
    index = {host: i for i, host in enumerate(nodes)}
    return [
        {
            "LOCAL_RANK": nodes[host].index(rank),
            "LOCAL_WORLD_SIZE": len(nodes[host]),
            "GROUP_RANK": index[host],
            "GROUP_WORLD_SIZE": len(nodes),
        }
        for rank, host in enumerate(hosts)
    ]


def master_address(hosts: list[str], networks: list[list[str]] | None = None) -> str:
    """Rank 0's address as the other ranks reach it; call on rank 0.

    One host: loopback (nothing listens on the network). Several: the address of
    rank 0's interface on the route to another node, as the OS picks it; where the
    other nodes' names do not resolve here, rank 0's address on a network every
    node has an address on (``networks``: each rank's :func:`local_networks`).
    Never a name another node might resolve differently.
    """
    others = [h for h in dict.fromkeys(hosts) if h != hosts[0]]
    if not others:
        return "127.0.0.1"
    for host in others:
        try:
            return route_source(host)
        except OSError:
            continue
    shared = _shared_address(hosts, networks or [])
    return shared or socket.gethostbyname(socket.gethostname())


def local_networks() -> list[str]:
    """This host's IPv4 interface addresses with their networks (``10.1.2.3/24``), loopback left out."""
    import psutil

    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and a.netmask and not a.address.startswith("127."):
                out.append(str(ipaddress.ip_interface(f"{a.address}/{a.netmask}")))
    return out


def _shared_address(hosts: list[str], networks: list[list[str]]) -> str | None:
    """Rank 0's first address on a network that every other node has an address on."""
    if len(networks) != len(hosts):
        return None
    by_host: dict[str, set] = {}
    for host, nets in zip(hosts, networks):
        by_host.setdefault(host, set()).update(ipaddress.ip_interface(n).network for n in nets)
    for net in networks[0]:
        iface = ipaddress.ip_interface(net)
        if all(iface.network in nets for h, nets in by_host.items() if h != hosts[0]):
            return str(iface.ip)
    return None


def free_port(address: str) -> int:
    """A port free on ``address`` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def torchrun_env(comm: Any = None, apply: bool = True) -> dict[str, str]:
    """torchrun's variables for this rank, from MPI; set in ``os.environ`` unless ``apply=False``.

    Collective over ``comm`` (default: MPI's world, respawned ranks included): every rank must call it.
    ``MASTER_PORT`` is a fresh free port each call. To pin the rendezvous, give the
    ranks ``CLUSTERKERNEL_MASTER_ADDR`` / ``CLUSTERKERNEL_MASTER_PORT``
    (``Cluster(env=...)``): plain ``MASTER_*`` are what this call writes.
    """
    if comm is None:
        from clusterkernel.protocol._engine import world

        comm = world()
    rank, size = comm.Get_rank(), comm.Get_size()
    hosts = comm.allgather(socket.gethostname())
    several = len(set(hosts)) > 1
    networks = comm.gather(local_networks() if several else [], root=0)
    meet = None
    if rank == 0:
        addr = os.environ.get("CLUSTERKERNEL_MASTER_ADDR") or master_address(hosts, networks)
        port = os.environ.get("CLUSTERKERNEL_MASTER_PORT") or str(free_port(addr))
        meet = (addr, port)
    addr, port = comm.bcast(meet, root=0)
    layout = node_layout(hosts)[rank]
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(layout["LOCAL_RANK"]),
        "LOCAL_WORLD_SIZE": str(layout["LOCAL_WORLD_SIZE"]),
        "GROUP_RANK": str(layout["GROUP_RANK"]),
        "NODE_RANK": str(layout["GROUP_RANK"]),
        "GROUP_WORLD_SIZE": str(layout["GROUP_WORLD_SIZE"]),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }
    if apply:
        os.environ.update(env)
    return env
