"""No /dev/shm leftovers of a real cluster's job after a crash in algorithm="shm" calls.

Only files whose names carry the job's identity (host, uid, job id; the prefixes
the ranks note in the run directory, see clusterkernel/protocol/_shm_names.py) are looked
at: other jobs and other users may have files in /dev/shm at the same time.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from clusterkernel import Cluster, RankError
from clusterkernel.protocol._shm_names import SHM_DIR
from tests._procs import wait_no_cluster_processes

REPO = Path(__file__).resolve().parents[2]
SETUP = (
    "import torch\nfrom clusterkernel import comm\n"
    "t = torch.ones(1 << 20)\ncomm.all_reduce(t, algorithm='shm')\n"
)


def _noted_prefixes(run_dir: str, n: int) -> list[str]:
    notes = sorted(Path(run_dir).glob("shm-names-rank*.txt"))
    assert len(notes) == n, f"expected one note per rank in {run_dir}, found {notes}"
    prefixes = sorted({p for f in notes for p in f.read_text().split()})
    assert any(p.startswith("sm_segment.") for p in prefixes), prefixes
    return prefixes


def _job_files(prefixes: list[str]) -> list[str]:
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(tuple(prefixes)))


def _wait_gone(prefixes: list[str], seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    left = _job_files(prefixes)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _job_files(prefixes)
    return left


def test_rank_killed_in_a_shm_collective_leaves_nothing(cluster: Cluster):
    cluster.run(SETUP)
    prefixes = _noted_prefixes(cluster.run_dir, 4)
    assert _job_files(prefixes), "the job has no files in /dev/shm: the check would prove nothing"
    kill = (
        "import os, signal\n"
        "t = torch.ones(1 << 22)\n"
        "for i in range(400):\n"
        "    if comm.rank() == 2 and i == 20:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    comm.all_reduce(t, algorithm='shm')\n"
    )
    try:
        with pytest.raises(RankError) as info:
            cluster.run(kill)
        died = [f for f in info.value.failures if f.kind == "died"]
        assert died and died[0].ranks == [2]
        left = _wait_gone(prefixes, 20)
        assert not left, f"left in {SHM_DIR} after rank 2 was killed: {left}"
    finally:
        cluster.restart()
    cluster.run(SETUP)  # usable again, with a new job's segment


STARTER = """
import json, sys, time
from clusterkernel import Cluster
c = Cluster(n=2).start()
c.run({setup!r})
print(json.dumps({{"run_dir": c.run_dir, "cluster_file": c.cluster_file}}), flush=True)
time.sleep(600)
"""


def test_guard_removes_the_files_a_stuck_mpiexec_left(no_shared_cluster):
    # mpiexec removes its job's files when the job ends; here it is frozen (SIGSTOP),
    # so the guard's SIGTERM goes unanswered and it is SIGKILLed: only the guard can
    # remove the files then (without it, 16 MB per rank stay in /dev/shm).
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER.format(setup=SETUP)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    mpiexec = None
    try:
        line = starter.stdout.readline()
        assert line, "the starter printed nothing: the cluster did not start"
        info = json.loads(line)
        prefixes = _noted_prefixes(info["run_dir"], 2)
        assert _job_files(prefixes), "no job files in /dev/shm: the check would prove nothing"
        sets = json.loads(Path(info["cluster_file"]).read_text())["engines"]["sets"]
        mpiexec = psutil.Process(next(iter(sets.values()))["pid"])
        mpiexec.send_signal(signal.SIGSTOP)
        starter.kill()  # the notebook kernel dies: the guard takes over
        starter.wait(10)
        left = wait_no_cluster_processes(30)
        assert not left, f"cluster processes outlived the guard: {[p.cmdline() for p in left]}"
        files = _job_files(prefixes)
        assert not files, f"left in {SHM_DIR} by a stuck mpiexec and its guard: {files}"
        assert not os.path.exists(info["run_dir"])
    finally:
        if starter.poll() is None:
            starter.kill()
        if mpiexec is not None:
            try:
                mpiexec.kill()
            except psutil.Error:
                pass


def test_a_segment_no_process_maps_is_removed_one_in_use_or_older_stays():
    """``remove_unmapped``: a dead rank's segment (made since, mapped by nobody) goes; a
    live process's, one made before the cluster was opened, and one made this instant
    and mapped a moment later (as Open MPI makes a segment), stay."""
    from clusterkernel.protocol import _shm_names

    host, uid = socket.gethostname(), os.getuid()
    tag = f"{os.getpid():x}"
    older, dead, live, newborn = (
        Path(SHM_DIR, f"sm_segment.{host}.{uid}.{tag}{k}.0") for k in ("a", "b", "c", "d")
    )
    try:
        now = time.time()
        since = now - 10  # the cluster opened 10 s ago; one file is older, two newer
        for path, age in ((older, 20), (dead, 5), (live, 5)):
            path.write_bytes(b"\0" * 4096)
            os.utime(path, (now - age, now - age))
        # maps each file named on its stdin, as a rank maps its own segment, then waits
        holder = subprocess.Popen(
            [sys.executable, "-c", "import mmap, sys\nkept = []\nfor line in sys.stdin:\n"
             "    f = open(line.strip(), 'r+b')\n    kept.append(mmap.mmap(f.fileno(), 4096))\n"
             "    print('mapped', flush=True)"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            holder.stdin.write(f"{live}\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "mapped"
            # made just now and mapped a moment later, as Open MPI makes a segment
            newborn.write_bytes(b"\0" * 4096)
            holder.stdin.write(f"{newborn}\n")
            holder.stdin.flush()
            removed = _shm_names.remove_unmapped(since)
            assert holder.stdout.readline().strip() == "mapped"
        finally:
            holder.communicate("", timeout=30)
        assert removed == [dead.name] and not dead.exists()
        assert live.exists() and older.exists() and newborn.exists()
    finally:
        for p in (older, dead, live, newborn):
            p.unlink(missing_ok=True)
