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

From outside the cluster the guard runs on the login node, over the notebook's SSH
master connection, and the notebook writes it an ``alive`` line every few seconds. A
connection lost (no line for ``_SILENT`` s, or the ssh session gone) is not a dead
notebook yet: the guard waits ``$CLUSTERKERNEL_SSH_GRACE`` s (:func:`grace_s`) for the
notebook to come back, which makes the connection, its forwards and a new guard again
(the old one leaves), or for its lines to resume (a network drop TCP outlived); then it
stops the cluster as above.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from clusterkernel.client._pids import marked, pid_alive
from clusterkernel.client.cluster import _kept_records
from clusterkernel.protocol import _shm_names

_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
_POLL = 1.0  # seconds between a keeper's looks at the cluster and its client
_ENDED_FOR = 5.0  # seconds a kept cluster must look ended before the keeper says it is
_OUTSIDE = "outside"  # main's mark: run on the login node by a notebook outside the cluster
# From outside: how long the guard on the login node waits, once its connection to the
# notebook is lost, for the notebook to make it again before it cancels the job
GRACE_ENV = "CLUSTERKERNEL_SSH_GRACE"
_GRACE_DEFAULT = 60.0
_BEAT = 5.0  # seconds between the notebook's "alive" lines to a guard on the login node
_SILENT = 30.0  # seconds without one after which that guard takes the connection as lost
_LOOK = 0.5  # seconds between the notebook's looks at its guard's ssh


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
        self, cluster_file: str, run_dir: str, keep: float | None = None, login: Any = None,
        on_lost: Callable[[], Callable[[], object] | None] | None = None,
    ) -> None:  # fmt: skip
        # keep: seconds (inf: until stopped) the guard keeps the cluster once we are gone
        # login: the cluster's login node (launch._ssh.Login) from outside: the guard runs
        # there, the cluster file copied to the cluster's directory there; ssh carries our
        # pipe's EOF to it, and sshd gives it one when the connection is lost
        # on_lost: from outside, called once the connection is known lost, before it is
        # made again; what it returns is called (in a thread of its own) once it is back
        self._login, self._grace, self._on_lost = login, grace_s(), on_lost
        if login is not None:
            cluster_file = remote_cluster_file(login, cluster_file, run_dir)
            run_dir = login.home_path(run_dir)
        args = [cluster_file, run_dir, repr(float(keep)) if keep is not None else ""]
        command = [sys.executable, "-m", "clusterkernel.client.launch._guard", *args]
        if login is not None:  # it waits out a lost connection; it leaves ssh to keep
            # over the master connection: its loss (the forwards' too) ends this ssh,
            # which _watch sees
            command = login.argv(login.python, *command[1:], _OUTSIDE, repr(self._grace))
        self._command = command
        self._lock = threading.Lock()  # the guard's process, replaced after a lost connection
        self._done = threading.Event()
        self._proc = self._started()
        if login is not None:
            threading.Thread(target=self._watch, daemon=True, name="clusterkernel-guard").start()

    def _started(self) -> subprocess.Popen:
        return subprocess.Popen(
            self._command,
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
        proc = self._say(b"stopped\n")
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()

    def detach(self) -> None:
        """Leave a kept cluster to the guard (it keeps it, see :func:`keep`)."""
        self._say(b"detached\n")

    def _say(self, line: bytes) -> subprocess.Popen:
        """Our last word to the guard (no more watching); its process."""
        self._done.set()
        with self._lock:
            proc = self._proc
        stdin = proc.stdin  # a pipe: Popen was given stdin=PIPE
        if stdin is not None:
            try:
                stdin.write(line)
                stdin.close()
            except OSError:
                pass
        return proc

    def _watch(self) -> None:
        """From outside: tell the guard on the login node we live, and where its ssh ended
        (the connection was lost), make the connection, the forwards and the guard again
        while that guard waits for us (:func:`_listen_outside`)."""
        beat = 0.0
        while not self._done.wait(_LOOK):
            with self._lock:
                if self._done.is_set():
                    return
                if self._proc.poll() is None:
                    beat += _LOOK
                    if beat >= _BEAT:
                        beat = 0.0
                        _write(self._proc, b"alive\n")
                    continue
            self._reconnect()

    def _reconnect(self) -> None:
        from clusterkernel.client.launch._ssh import LoginError

        deadline = time.monotonic() + self._grace
        back = self._on_lost() if self._on_lost is not None else None
        self._login.lost = True
        try:
            while not self._done.is_set() and time.monotonic() < deadline:
                try:
                    self._login.reconnect()
                except (LoginError, subprocess.TimeoutExpired):
                    self._done.wait(1.0)
                    continue
                with self._lock:
                    if not self._done.is_set():
                        self._proc = self._started()
                if back is not None:
                    threading.Thread(target=back, daemon=True).start()
                return
            self._done.set()  # too late: the guard there has cancelled the job
        finally:
            self._login.lost = False


def _write(proc: subprocess.Popen, line: bytes) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write(line)
        proc.stdin.flush()
    except OSError:  # its ssh has ended: the next look makes it again
        pass


def grace_s() -> float:
    """Seconds a guard on the login node waits for a lost connection to be made again
    (``$CLUSTERKERNEL_SSH_GRACE``, default 60).

    Example::

        grace_s()      # 60.0
    """
    text = os.environ.get(GRACE_ENV, "")
    try:
        value = float(text) if text else _GRACE_DEFAULT
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"${GRACE_ENV} takes seconds (e.g. 60), got {text!r}.")
    return value


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


def keep(cluster_file: str, run_dir: str, keep_s: float) -> bool:
    """Keep the cluster while a client is attached or was within ``keep_s``; True when it
    is time to stop it, False when there is nothing left to stop."""
    idle_since = time.time()
    ended_since: float | None = None
    while True:
        if not os.path.exists(cluster_file):  # a client stopped it
            return False
        if _successor(run_dir):  # its notebook made its connection again: a new guard
            return False
        try:
            ended = _kept_records.why_ended(cluster_file)
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


# the guard starts with its cluster: this host's /dev/shm gained since may be the cluster's
_STARTED_AT = time.time()


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
            _shm_names.remove_unmapped(_STARTED_AT)  # a rank's that died unnoted
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


def _successor(run_dir: str) -> bool:
    """Whether another guard, alive, watches the cluster now (the notebook made its lost
    connection again and started it)."""
    try:
        with open(os.path.join(run_dir, _kept_records.SUCCESSOR)) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and pid_alive(pid)


def _register(run_dir: str) -> None:
    """This guard watches the cluster now (a guard before it leaves: :func:`_successor`)."""
    path = os.path.join(run_dir, _kept_records.SUCCESSOR)
    with open(path + ".new", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".new", path)


def _listen_outside(cluster_file: str, run_dir: str, grace_s: float) -> tuple[bytes, bool]:
    """From outside: read the notebook's lines until they end; ``(its last word, whether
    it came back)``. Its connection is lost when no line came for ``_SILENT`` s or stdin
    ended with the ssh session (a notebook that ends or closes its pipe leaves the
    session open); then for ``grace_s`` it comes back by a new guard (it made its
    connection again), by a stop (the cluster file gone) or by lines on this one again
    (the network came back before ssh gave the connection up)."""
    last, buf, reading = b"", b"", True
    lost_at: float | None = None
    while True:
        if lost_at is not None:
            if _successor(run_dir) or not os.path.exists(cluster_file):
                return last, True
            if time.monotonic() - lost_at >= grace_s:
                return last, False
        wait = _SILENT if lost_at is None else _LOOK
        ready, _, _ = select.select([0] if reading else [], [], [], wait)
        if not ready:
            if lost_at is None:
                lost_at = time.monotonic()
            continue
        chunk = os.read(0, 4096)
        if not chunk:
            reading = False
            if lost_at is None and (last or _session_open()):
                return last, False  # its last word, or the notebook ended
            lost_at = time.monotonic() if lost_at is None else lost_at
            continue
        lost_at = None
        *lines, buf = (buf + chunk).split(b"\n")
        for line in (x.strip() for x in lines):
            if line and line != b"alive":
                last = line


def _session_open() -> bool:
    """Whether our ssh session still carries our output: sshd closes both ends of a
    session whose connection ended, within moments."""
    for _ in range(5):
        time.sleep(0.2)
        try:
            os.write(1, b"\n")
        except OSError:
            return False
    return True


def main(
    cluster_file: str, run_dir: str | None = None, keep_s: str = "", where: str = "",
    grace: str = "",
) -> int:  # fmt: skip
    outside = where == _OUTSIDE and run_dir is not None
    if outside:
        assert run_dir is not None
        _register(run_dir)
        # a kept cluster needs no grace: its keeper waits for a client anyway
        last, back = _listen_outside(cluster_file, run_dir, 0.0 if keep_s else float(grace or 0))
        if back:
            return 0
    else:
        last = b""
        for line in sys.stdin.buffer:
            last = line.strip()
    if last == b"stopped":
        return 0
    if keep_s and run_dir and outside:
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
    sys.exit(main(*sys.argv[1:6]))
