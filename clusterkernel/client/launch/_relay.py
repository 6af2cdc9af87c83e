"""The dashboard's stream relayed from the cluster's nodes to a notebook outside it.

From outside the cluster (``ssh=HOST``) the nodes cannot reach the notebook, where the
dashboard's receiver listens. So the stream takes two hops, both of OpenSSH and zmq:
a zmq proxy on the login node (``python -m clusterkernel.client.launch._relay``, run
over the master connection) receives the ranks' records on the login node's address
the nodes reach, and pushes them to a port of the login node's loopback that a remote
forward of the same master connection (``ssh -O forward -R``) carries to the
receiver's port on this machine's loopback. The records are signed by the ranks and
checked by the receiver: the relay forwards their frames unread. It exits when its
ssh's stdin closes: at :meth:`Relay.close`, or when the kernel dies.

Example::

    # not run: needs an SSH host
    relay = Relay(login("login", python), "tcp://127.0.0.1:5555", "10.0.0.1")
    relay.address            # what the ranks stream to, e.g. tcp://10.0.0.1:40123
    relay.close()
"""

from __future__ import annotations

import subprocess
import sys

from clusterkernel.client.launch._piped import end, next_line
from clusterkernel.client.launch._ssh import Login, LoginError

_START_TIMEOUT = 30  # seconds for the relay on the login node to say where it listens


class Relay:
    """A relay on ``login`` to the receiver at ``local`` (``tcp://127.0.0.1:PORT`` here),
    listening on the login node's ``bind_ip`` (see the module)."""

    def __init__(self, login: Login, local: str, bind_ip: str) -> None:
        self._login = login
        self._local_port = int(local.rsplit(":", 1)[1])
        done = subprocess.run(
            login.ssh("-O", "forward", "-R", f"127.0.0.1:0:127.0.0.1:{self._local_port}"),
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        said = done.stdout.split()
        if done.returncode != 0 or not said or not said[0].isdigit():
            raise LoginError(
                f"ssh {login.host}: the dashboard's stream could not be forwarded back here "
                f"({done.stderr.strip() or 'no answer'}); the server must allow TCP "
                "forwarding (AllowTcpForwarding)."
            )
        self._remote_port = int(said[0])
        self._proc = subprocess.Popen(
            login.argv(login.python, "-m", __name__, bind_ip, str(self._remote_port)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = next_line(self._proc, _START_TIMEOUT)
        if not line.startswith("tcp://"):
            err = self.close()
            raise LoginError(
                f"The dashboard's relay on {login.host} did not start: {err or line or 'no answer'}"
            )
        self.address = line

    def close(self) -> str:
        """Stop the relay and cancel its forward; what the relay wrote to stderr."""
        err = end(self._proc, 10)
        subprocess.run(
            self._login.ssh(
                "-O", "cancel", "-R", f"127.0.0.1:{self._remote_port}:127.0.0.1:{self._local_port}"
            ),
            capture_output=True, timeout=10,
        )  # fmt: skip
        return err


def main(bind_ip: str, port: int) -> None:
    """The login node's side: receive on ``bind_ip``, push to loopback ``port``, until
    stdin closes."""
    import os
    import threading

    import zmq

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for sock in (pull, push):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 256)
        sock.setsockopt(zmq.RCVHWM, 256)
    got = pull.bind_to_random_port(f"tcp://{bind_ip}")
    push.connect(f"tcp://127.0.0.1:{port}")
    threading.Thread(target=zmq.proxy, args=(pull, push), daemon=True).start()
    print(f"tcp://{bind_ip}:{got}", flush=True)
    sys.stdin.read()  # until our ssh's stdin closes: the notebook closed it, or died
    os._exit(0)  # the proxy thread holds the sockets: nothing of them to flush


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
