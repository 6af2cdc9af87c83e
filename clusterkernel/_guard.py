"""Stops a cluster when the process that started it dies (``python -m clusterkernel._guard``).

ipyparallel's ``shutdown_atexit`` does not run when the notebook kernel is killed
outright, and the controller and mpiexec run in sessions of their own, so nothing
else would stop them. The starting process holds the write end of our stdin: EOF
without a final ``stopped`` line means it died, and we stop the cluster from its
cluster file.
"""

from __future__ import annotations

import os
import sys


def main(cluster_file: str) -> int:
    last = b""
    for line in sys.stdin.buffer:
        last = line.strip()
    if last == b"stopped" or not os.path.exists(cluster_file):
        return 0
    import ipyparallel as ipp

    try:
        cluster = ipp.Cluster.from_file(cluster_file=cluster_file)
        cluster.stop_cluster_sync()
    finally:
        if os.path.exists(cluster_file):
            os.remove(cluster_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
