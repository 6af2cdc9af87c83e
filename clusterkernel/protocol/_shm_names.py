"""Names of an Open MPI job's files in /dev/shm: noted by the ranks, removed by the guard.

Open MPI keeps two kinds of files of a job in /dev/shm (measured with Open MPI 5.0):

- ``sm_segment.<host>.<uid>.<jobid>.<local rank>``, 16 MB each: the shared-memory
  transport's segment of each rank, for the job's whole life. ``mpiexec``
  (prterun) removes them when the job ends, also when a rank was killed; they
  stay behind when prterun itself is killed before it can (SIGKILL, or a guard
  whose SIGTERM it did not answer in time).
- ``osc_sm.<host>.<jobid>.<rank>.<cid>``: the backing file of an MPI shared window
  (``comm``'s ``algorithm="shm"``). Open MPI unlinks it as soon as every rank has
  mapped it, so only a crash during the window's creation could leave it.

Each rank writes its job's name prefixes (``sm_segment.<host>.<uid>.<jobid>.`` and
``osc_sm.<host>.<jobid>.``, read from its own memory map) into the cluster's run
directory; a guard that stops a cluster whose starter died removes the files of
this host's /dev/shm that start with one of them, and nothing else: other jobs'
and other users' files carry other job ids.

A rank that never got to note its names leaves a segment nobody knows by job: the new
process of a respawn whose prterun crashed while it started (it dies in MPI_Init, its
segment made). Its owner mapped the segment from the moment it made it, so a segment of
this host and user that no live process maps is a dead job's: a restart or stop (the
guard's too) removes those made since its cluster was opened (:func:`remove_unmapped`).

A process started without mpiexec (an MPI "singleton") has no prterun to remove
its segment: ``comm`` removes it at exit (:mod:`clusterkernel.comm._shm.segment`).

Example::

    note(run_dir, rank=0)      # on a rank, after MPI_Init
    remove(run_dir)            # in the guard, once the job's processes are gone
    remove_unmapped(since)     # the client, once its ranks are gone
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterable
from pathlib import Path

SHM_DIR = "/dev/shm"
_SEGMENT = re.compile(r"sm_segment\.(?P<host>[^/\s]+)\.(?P<uid>\d+)\.(?P<job>[0-9a-f]+)\.\d+")
_PREFIX = re.compile(r"(sm_segment\.[^/\s]+\.\d+\.[0-9a-f]+\.|osc_sm\.[^/\s]+\.[0-9a-f]+\.)")
_NOTE = "shm-names-rank{}.txt"


def job_prefixes(maps: str | None = None) -> list[str]:
    """This process's MPI job's /dev/shm name prefixes, from ``/proc/self/maps``.

    Empty when the job has mapped no such file (one rank alone, or not Open MPI).
    """
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    found = set()
    for name in _shm_files(maps):
        m = _SEGMENT.fullmatch(name)
        if m:
            found.add(f"sm_segment.{m['host']}.{m['uid']}.{m['job']}.")
            found.add(f"osc_sm.{m['host']}.{m['job']}.")
    return sorted(found)


def mapped_by(pids: list[int]) -> set[str]:
    """The job prefixes of the /dev/shm files that the processes ``pids`` have mapped
    now (those it may not read, or that are gone, give none).

    A rank notes its prefixes once, at set-up, when Open MPI may not have made every
    segment yet; the client reads its own ranks' maps again just before it stops them.
    """
    found: set[str] = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        found.update(job_prefixes(maps))
    return found


def note(run_dir: str, rank: int) -> None:
    """Write this rank's job prefixes into ``run_dir`` (quietly nothing if it is missing,
    as on a node that does not share the client's file system)."""
    prefixes = job_prefixes()
    if not prefixes:
        return
    path = Path(run_dir) / _NOTE.format(rank)
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(p + "\n" for p in prefixes))
        tmp.replace(path)
    except OSError:
        pass


def remove(run_dir: str) -> list[str]:
    """Remove the files of this host's /dev/shm named by the prefixes noted in
    ``run_dir``; return their names."""
    prefixes: set[str] = set()
    for path in Path(run_dir).glob(_NOTE.format("*")):
        try:
            lines = path.read_text().split()
        except OSError:
            continue
        prefixes.update(p for p in lines if _PREFIX.fullmatch(p))
    return remove_prefixed(prefixes)


def remove_prefixed(prefixes: set[str] | list[str]) -> list[str]:
    """Remove the files of this host's /dev/shm whose names start with one of
    ``prefixes`` (job prefixes, as :func:`job_prefixes` gives); return their names."""
    if not prefixes:
        return []
    starts = tuple(prefixes)
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return _unlink(n for n in names if n.startswith(starts))


def _unlink(names: Iterable[str]) -> list[str]:
    """Remove the files ``names`` of /dev/shm; the names of those it removed."""
    removed = []
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            continue
        removed.append(name)
    return removed


def _shm_files(maps: str) -> list[str]:
    """The names of the /dev/shm files mapped in ``maps`` (a /proc/PID/maps text)."""
    names = []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].startswith(SHM_DIR + "/"):
            names.append(os.path.basename(fields[5]))
    return names


_SETTLE = 1.0  # seconds: Open MPI maps a segment microseconds after it makes it


def remove_unmapped(since: float) -> list[str]:
    """Remove this host's and this user's ``sm_segment.*`` files changed at or after
    ``since`` (a ``time.time()``) that no live process maps; return their names.

    Nothing is removed where live processes could be out of sight (this process runs
    in a PID namespace of its own, which may share /dev/shm with the host's). A file
    younger than a second may be one Open MPI has made and not mapped yet: such a file
    is looked at once it is a second old (this waits that long at most)."""
    host = socket.gethostname()  # Open MPI may name it by its first label only
    mine = tuple(f"sm_segment.{h}.{os.getuid()}." for h in {host, host.split(".")[0]})
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(mine)]
    except OSError:
        return []
    fresh = {}
    for name in names:
        try:
            st = os.stat(os.path.join(SHM_DIR, name))
        except OSError:
            continue
        if st.st_uid == os.getuid() and st.st_mtime >= since:
            fresh[name] = st.st_mtime
    if not fresh:
        return []
    time.sleep(max(0.0, max(fresh.values()) + _SETTLE - time.time()))
    in_use = _mapped_names()
    if in_use is None:
        return []
    return _unlink(n for n in fresh if n not in in_use)


def _mapped_names() -> set[str] | None:
    """The /dev/shm files that this user's live processes have mapped; None where that
    cannot be known (processes out of sight)."""
    if _in_nested_pid_namespace():
        return None
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            maps = Path(entry.path, "maps").read_text()
        except OSError:  # gone meanwhile, another user's, or not dumpable (an init, a
            continue  # setuid program): no MPI rank is either
        found.update(_shm_files(maps))
    return found


def _in_nested_pid_namespace() -> bool:
    """Whether this process's PID namespace is a child's (``NSpid`` lists one pid per
    level): processes of the levels above, which may share /dev/shm, are not in /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) > 2
    except OSError:
        return True
    return False
