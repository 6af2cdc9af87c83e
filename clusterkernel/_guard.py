"""Stops a cluster when the process that started it dies (``python -m clusterkernel._guard``).

ipyparallel's ``shutdown_atexit`` does not run when the notebook kernel is killed
outright, and the controller and mpiexec run in sessions of their own, so nothing
else would stop them. The starting process holds the write end of our stdin: EOF
without a final ``stopped`` line means it died. Then there is nobody left to be
graceful for: every process of the cluster (read from its cluster file, with all
their descendants: ranks, nannies) gets SIGTERM, then SIGKILL a few seconds later.
"""

from __future__ import annotations

import json
import os
import sys

import psutil

_GRACE = 3.0  # seconds between SIGTERM and SIGKILL


def _cluster_pids(cluster_file: str) -> list[int]:
    with open(cluster_file) as f:
        info = json.load(f)
    pids = [info.get("controller", {}).get("state", {}).get("pid")]
    pids += [s.get("pid") for s in info.get("engines", {}).get("sets", {}).values()]
    return [p for p in pids if p]


def stop_tree(pids: list[int]) -> None:
    procs = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=_GRACE)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=_GRACE)


def main(cluster_file: str) -> int:
    last = b""
    for line in sys.stdin.buffer:
        last = line.strip()
    if last == b"stopped" or not os.path.exists(cluster_file):
        return 0
    try:
        stop_tree(_cluster_pids(cluster_file))
    finally:
        if os.path.exists(cluster_file):
            os.remove(cluster_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
