"""Stops a cluster when the process that started it dies (``python -m clusterkernel.cluster._guard``).

ipyparallel's ``shutdown_atexit`` does not run when the notebook kernel is killed
outright, and the controller and mpiexec run in sessions of their own, so nothing
else would stop them. The starting process holds the write end of our stdin: EOF
without a final ``stopped`` line means it died. Then there is nobody left to be
graceful for: batch jobs named in the cluster file are cancelled (``scancel``),
every local process of the cluster (with all their descendants: ranks, nannies)
gets SIGTERM, then SIGKILL a few seconds later, the job's files in this host's
/dev/shm that mpiexec did not get to remove are removed (by the names the ranks
noted, :mod:`clusterkernel._shm_names`), and the cluster's private directory is
removed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil

from clusterkernel import _shm_names

_GRACE = 3.0  # seconds between SIGTERM and SIGKILL


def _cluster_pids(cluster_file: str) -> list[int]:
    with open(cluster_file) as f:
        info = json.load(f)
    pids = [info.get("controller", {}).get("state", {}).get("pid")]
    sets = info.get("engines", {}).get("sets", {}).values()
    pids += [s.get("pid") for s in sets]  # a batch job's set has none: it is cancelled
    return [p for p in pids if p]


def _cancel_jobs(cluster_file: str) -> None:
    from clusterkernel.cluster._launch import batch_jobs

    jobs = batch_jobs(cluster_file)
    scancel = shutil.which("scancel")
    if jobs and scancel:
        subprocess.run([scancel, *jobs], capture_output=True, timeout=30)


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


def main(cluster_file: str, run_dir: str | None = None) -> int:
    last = b""
    for line in sys.stdin.buffer:
        last = line.strip()
    if last == b"stopped":
        return 0
    try:
        # No cluster file: the starter died while stopping the cluster (ipyparallel
        # had removed the file), and only the run directory is left to remove.
        if os.path.exists(cluster_file):
            try:
                _cancel_jobs(cluster_file)
            finally:
                stop_tree(_cluster_pids(cluster_file))
    finally:
        if os.path.exists(cluster_file):
            os.remove(cluster_file)
        if run_dir:
            _shm_names.remove(run_dir)
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
