"""The guard: stops a cluster when the process that started it dies (client side).

:class:`Guard` is the starting process's handle; the guard itself is this module run
as ``python -m clusterkernel.client.launch._guard`` (:func:`main`).

ipyparallel's ``shutdown_atexit`` does not run when the notebook kernel is killed
outright, and the controller and mpiexec run in sessions of their own, so nothing
else would stop them. The starting process holds the write end of our stdin: EOF
without a final ``stopped`` line means it died. Then there is nobody left to be
graceful for: batch jobs named in the cluster file are cancelled (by their
scheduler's class, :mod:`clusterkernel.client.scheduler`),
every local process of the cluster (with all their descendants: ranks, nannies)
gets SIGTERM, then SIGKILL a few seconds later, the job's files in this host's
/dev/shm that mpiexec did not get to remove are removed (by the names the ranks
noted, :mod:`clusterkernel.protocol._shm_names`), and the cluster's private directory is
removed.

A kept cluster (``keep``: seconds, or ``inf``; :mod:`clusterkernel.client.cluster._kept_records`) is
not stopped then: the guard becomes its keeper. It stops the cluster once no client
has been attached for the keep time, leaves at once when a client stopped it (the
cluster file is gone), and when the ranks or the controller die with no one there
it stops what is left and keeps only the record, saying why, for ``%mpi list``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import psutil

from clusterkernel.client._pids import marked, pid_alive
from clusterkernel.client.cluster import _kept_records
from clusterkernel.protocol import _shm_names

_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
_POLL = 1.0  # seconds between a keeper's looks at the cluster and its client
_ENDED_FOR = 5.0  # seconds a kept cluster must look ended before the keeper says it is
_OUTSIDE = "outside"  # main's mark: run on the login node by a notebook outside the cluster


class Guard:
    """A watcher process that stops the cluster if this process dies (even SIGKILL).

    It holds the read end of a pipe; EOF without a final ``stopped`` line means we
    died. It then stops every process in the cluster file, cancels its batch jobs
    and removes the run directory (:func:`main`, in a process of its own).

    Example::

        # not run: needs a running cluster's file and run directory
        guard = Guard(cluster_file, run_dir)
        guard.release()          # we stopped the cluster ourselves
    """

    def __init__(
        self, cluster_file: str, run_dir: str, keep: float | None = None, login: Any = None
    ) -> None:
        # keep: seconds (inf: until stopped) the guard keeps the cluster once we are gone
        # login: the cluster's login node (launch._ssh.Login) from outside: the guard runs
        # there, the cluster file copied to the cluster's directory there; ssh carries our
        # pipe's EOF to it, and sshd gives it one when the connection is lost
        if login is not None:
            cluster_file = remote_cluster_file(login, cluster_file, run_dir)
            run_dir = login.home_path(run_dir)
        args = [cluster_file, run_dir, repr(float(keep)) if keep is not None else ""]
        command = [sys.executable, "-m", "clusterkernel.client.launch._guard", *args]
        if login is not None:  # it leaves its ssh session when it becomes a keeper
            command = login.argv(login.python, *command[1:], _OUTSIDE, shared=False)
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal must not reach it
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def release(self) -> None:
        """Tell the guard we stopped the cluster ourselves, and wait for it to go."""
        self._say(b"stopped\n")
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()

    def detach(self) -> None:
        """Leave a kept cluster to the guard (it keeps it, see :func:`keep`)."""
        self._say(b"detached\n")

    def _say(self, line: bytes) -> None:
        stdin = self._proc.stdin  # a pipe: Popen was given stdin=PIPE
        if stdin is None:
            return
        try:
            stdin.write(line)
            stdin.close()
        except OSError:
            pass


def remote_cluster_file(login: Any, cluster_file: str, run_dir: str) -> str:
    """Copy the cluster file to the cluster's directory on ``login`` (a ``Login``), where
    the guard reads it; its path there. Again after a restart: it names the new job."""
    remote = f"{login.home_path(run_dir)}/cluster.json"
    with open(cluster_file) as f:
        login.write(remote, f.read())
    return remote


def batch_jobs(cluster_file: str) -> list[tuple[str, str]]:
    """``(scheduler, job id)`` of the batch jobs an ipyparallel cluster file names."""
    with open(cluster_file) as f:
        info = json.load(f)
    sets = info.get("engines", {}).get("sets", {}).values()
    # a set without a scheduler's name is an older cluster's Slurm job
    return [(s.get("scheduler") or "slurm", str(s["job_id"])) for s in sets if s.get("job_id")]


def _cluster_pids(cluster_file: str) -> list[int]:
    with open(cluster_file) as f:
        info = json.load(f)
    pids = [info.get("controller", {}).get("state", {}).get("pid")]
    sets = info.get("engines", {}).get("sets", {}).values()
    pids += [s.get("pid") for s in sets]  # a batch job's set has none: it is cancelled
    return [p for p in pids if p]


def _cancel_jobs(cluster_file: str) -> None:
    from clusterkernel.client import scheduler

    for name, job in batch_jobs(cluster_file):
        scheduler.get(name).cancel([job])


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


def why_ended(cluster_file: str) -> str | None:
    """Why a kept cluster can no longer run cells (None: it still can)."""
    from clusterkernel.client.cluster._jobreport import death_cause

    with open(cluster_file) as f:
        info = json.load(f)
    controller = info.get("controller", {}).get("state", {}).get("pid")
    if controller and not pid_alive(controller):
        return "the controller exited"
    for engine_set in info.get("engines", {}).get("sets", {}).values():
        job = engine_set.get("job_id")
        if job:
            from clusterkernel.client import scheduler

            ended = scheduler.get(engine_set.get("scheduler") or "slurm").why_ended(job)
            if ended:
                return ended
        elif engine_set.get("pid") and not pid_alive(engine_set["pid"]):
            cause = death_cause(_tail_of(engine_set.get("output_file")))
            return "the MPI job ended" + (f" ({cause})" if cause else "")
    return None


def _tail_of(path: str | None) -> str:
    try:
        with open(path or "", errors="replace") as f:
            return f.read()[-20000:]
    except OSError:
        return ""


def keep(cluster_file: str, run_dir: str, keep_s: float) -> bool:
    """Keep the cluster while a client is attached or was within ``keep_s``; True when it
    is time to stop it, False when there is nothing left to stop."""
    idle_since = time.time()
    ended_since: float | None = None
    while True:
        if not os.path.exists(cluster_file):  # a client stopped it
            return False
        try:
            ended = why_ended(cluster_file)
        except (OSError, ValueError):  # gone or half-written: look again after a pause
            time.sleep(_POLL)
            continue
        if ended is None:
            ended_since = None
        elif ended_since is None:
            # seen once: a client's restart also stops the old ranks before the file names
            # the new ones, so only an end that lasts counts
            ended_since = time.time()
        elif time.time() - ended_since >= _ENDED_FOR:
            _kept_records.update(run_dir, {"ended": ended, "client": None})
            _stop(cluster_file, run_dir, keep_record=True)
            return False
        record = _kept_records.read(run_dir) or {}
        if _kept_records.client_alive(record.get("client")):
            idle_since = time.time()
        elif record.get("client") is not None:  # it died without detaching
            _kept_records.update(run_dir, {"client": None, "idle_since": idle_since})
        if not math.isinf(keep_s) and time.time() - idle_since >= keep_s:
            return True
        time.sleep(_POLL)


def _stop(cluster_file: str, run_dir: str | None, keep_record: bool = False) -> None:
    """Cancel the batch jobs, stop every process, remove the cluster's files (all of the
    run directory, or all but the kept record)."""
    try:
        # No cluster file: the starter died while stopping the cluster (ipyparallel
        # had removed the file), and only the run directory is left to remove.
        if os.path.exists(cluster_file):
            try:
                _cancel_jobs(cluster_file)
            finally:
                stop_tree(_cluster_pids(cluster_file))
        if run_dir:  # processes the trees no longer reach, e.g. a nanny whose engine is gone
            stop_tree([p.pid for p in marked(run_dir)])
    finally:
        if os.path.exists(cluster_file):
            os.remove(cluster_file)
        if run_dir:
            _shm_names.remove(run_dir)
            if not keep_record:
                shutil.rmtree(run_dir, ignore_errors=True)
            else:
                for name in os.listdir(run_dir):
                    if name != _kept_records.RECORD:
                        path = os.path.join(run_dir, name)
                        if os.path.isdir(path):
                            shutil.rmtree(path, ignore_errors=True)
                        else:
                            os.remove(path)


def _leave_session() -> None:
    """A keeper on the login node leaves the ssh session that started it (its stdio on
    /dev/null, its work in a child of its own, the command ended), so that the session
    closes and a connection the notebook's machine loses later cannot end it."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    if os.fork() > 0:
        os._exit(0)
    os.setsid()


def main(cluster_file: str, run_dir: str | None = None, keep_s: str = "", where: str = "") -> int:
    last = b""
    for line in sys.stdin.buffer:
        last = line.strip()
    if last == b"stopped":
        return 0
    if keep_s and run_dir and where == _OUTSIDE:
        _leave_session()
    if keep_s and run_dir and not keep(cluster_file, run_dir, float(keep_s)):
        if not os.path.exists(cluster_file) and not (_kept_records.read(run_dir) or {}).get(
            "ended"
        ):
            shutil.rmtree(run_dir, ignore_errors=True)  # a client stopped it: anything left
        return 0
    _stop(cluster_file, run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
