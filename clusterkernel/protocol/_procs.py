"""Processes on this host: whether one runs, and which are a respawn's new processes
(both sides).

A respawn starts one new process per dead rank (``python -m clusterkernel.rank._respawn
RANK ...``) that joins the survivors' MPI world and then becomes the rank's engine. The
notebook looks for them among its cluster's processes (to end those a failed respawn
left, to tell one that died before it joined); a survivor looks for them during an
in-cell recovery, where no notebook signal frees it from a spawn that waits for a
process that died: each new process announces itself in the run directory
(:func:`announce`), and :class:`Joiners` tells one that ended before it joined.

Example::

    new_ranks(cluster.processes())   # [(2, psutil.Process(pid=...))] while rank 2 joins
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from pathlib import Path

import psutil

from clusterkernel.protocol._names import RUN_DIR_ENV

JOINER = "clusterkernel.rank._respawn"  # the module a new process runs (``python -m``)


def new_ranks(pids: Iterable[int]) -> list[tuple[int, psutil.Process]]:
    """``(rank, process)`` of those of ``pids`` that are a new rank's process."""
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            cmd = proc.cmdline()
        except psutil.Error:  # gone meanwhile
            continue
        if JOINER in cmd and cmd.index(JOINER) + 1 < len(cmd):
            found.append((int(cmd[cmd.index(JOINER) + 1]), proc))
    return found


def alive(proc: psutil.Process) -> bool:
    """Whether ``proc`` still runs (a zombie does not)."""
    try:
        return proc.is_running() and pid_alive(proc.pid)
    except psutil.Error:
        return False


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` runs here: another user's process counts, a zombie (its parent
    has not reaped it) does not."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def announce(rank: int) -> Path | None:
    """In a new process, first of all: a file in the cluster's run directory that says
    this process (host, pid) is joining as ``rank``, so the survivors on this host can
    tell that it died before it joined (:class:`Joiners`). Returns it: remove it once
    joined. None where this host has no run directory."""
    marks = _marks()
    if marks is None:
        return None
    path = marks / f"joining-{socket.gethostname()}-{rank}-{os.getpid()}"
    path.touch()
    return path


class Joiners:
    """On a survivor: the new processes for the ``dead`` ranks that announce themselves on
    this host (:func:`announce`) after this is made. A new process that dies before it
    has joined leaves the survivors' ``MPI_Comm_spawn`` waiting (Open MPI's
    connect/accept waits 600 s for its port) and MPI never says so; only a survivor on
    the new process's host can see it end.

    Example::

        joiners = Joiners([2])     # before the spawn starts
        joiners.died()             # [] while rank 2's new process lives or is unseen
    """

    def __init__(self, dead: list[int]) -> None:
        self.dead = set(dead)
        self.before = set(self._announced())  # earlier spawns' announcements

    def died(self) -> list[int]:
        """The ranks whose new process announced itself here and has ended since."""
        died = []
        for path, (rank, pid) in self._announced().items():
            if rank in self.dead and path not in self.before and not pid_alive(pid):
                died.append(rank)
                path.unlink(missing_ok=True)  # told once
        return sorted(died)

    @staticmethod
    def _announced() -> dict[Path, tuple[int, int]]:
        marks = _marks()
        if marks is None:
            return {}
        found = {}
        for path in marks.glob(f"joining-{socket.gethostname()}-*"):
            rank, pid = path.name.rsplit("-", 2)[1:]
            found[path] = (int(rank), int(pid))
        return found


def _marks() -> Path | None:
    run_dir = os.environ.get(RUN_DIR_ENV)
    return Path(run_dir) if run_dir and os.path.isdir(run_dir) else None
