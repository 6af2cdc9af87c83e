"""Which local address reaches a host (shared by both sides: the standard library only).

The notebook asks it for the controller's address on the nodes' network (Slurm);
rank 0 asks it for the ``MASTER_ADDR`` torch.distributed's other ranks reach.

Example::

    route_source("node2")    # e.g. "10.231.0.1"
"""

from __future__ import annotations

import socket


def route_source(address: str) -> str:
    """This machine's address on the route to ``address`` (no packet is sent)."""
    infos = socket.getaddrinfo(address, 9, socket.AF_INET, socket.SOCK_DGRAM)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(infos[0][4])
        return s.getsockname()[0]
