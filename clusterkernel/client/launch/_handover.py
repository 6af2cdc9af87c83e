"""ipyparallel's controller whose client sockets hand a client's routing id over (runs
on the login node, for a notebook outside the cluster).

A notebook outside reaches the controller through forwards of its SSH connection; when
that connection is lost and made again, its client's sockets connect anew with the
routing ids they had (``StableContext``), so that the replies to what it sent before
reach it. The old connections may stay open on the login node meanwhile (sshd does not
know the laptop's network went), and a ZeroMQ ROUTER ignores a peer whose routing id is
in use, for good: the reconnected client would hear nothing. ``ZMQ_ROUTER_HANDOVER`` on
the controller's ROUTER sockets that clients connect to (the hub's queries, the direct
and control queues) gives the id to the newest connection. Everything else is
ipyparallel's ``IPController``.

Example::

    # not run: the login node's controller command (launch._batch_job sets it)
    python -m clusterkernel.client.launch._handover --profile-dir=...
"""

from __future__ import annotations

import zmq
from ipyparallel.controller.app import IPController
from traitlets import Unicode
from zmq.devices import ProcessMonitoredQueue


class HandoverProcessMonitoredQueue(ProcessMonitoredQueue):
    """ipyparallel's queue process, its client side (``in``, a ROUTER) with handover.

    Example::

        q = HandoverProcessMonitoredQueue(zmq.ROUTER, zmq.ROUTER, zmq.PUB, b"in", b"out")
    """

    def __init__(self, in_type: int, *args, **kwargs) -> None:
        super().__init__(in_type, *args, **kwargs)
        if in_type == zmq.ROUTER:
            self.setsockopt_in(zmq.ROUTER_HANDOVER, 1)


class HandoverController(IPController):
    """``IPController`` with :class:`HandoverProcessMonitoredQueue` and a hub whose
    query socket hands over.

    Example::

        # not run: starts a controller
        HandoverController.launch_instance()
    """

    # its queues in processes, as IPController's ('Process' in the name says so to it)
    mq_class = Unicode(f"{__name__}.HandoverProcessMonitoredQueue")

    def init_hub(self) -> None:
        super().init_hub()
        self.hub.query.setsockopt(zmq.ROUTER_HANDOVER, 1)


if __name__ == "__main__":
    HandoverController.launch_instance()
