"""A rank's variables kept on its own node, to come back from (rank side).

``%mpi snapshot [NAMES]`` writes each rank's picklable variables (torch state dicts,
models and optimizers included; one pickle, so shared objects stay shared) to a file
of its own in the cluster's private run directory; ``%mpi restore`` loads them back
into the same or new processes (after ``%mpi restart``, or ``respawn
--from-snapshot`` for a rank that died), into the user namespace itself: functions
defined in cells keep ``globals()`` as theirs (``_variables``). The file holds the list
of its names, then the variables, so what a snapshot holds is read without loading it.
The files go with the run directory when the cluster stops. A file is loaded only if
this user owns it and nobody else may write it: unpickling runs code, so only the
user's own ranks' files are trusted.

Example (what the client runs on every rank)::

    save("/home/me/.clusterkernel/clusters/cluster-123456", ["model", "opt"])
    held("/home/me/.clusterkernel/clusters/cluster-123456")    # ['model', 'opt']
    load("/home/me/.clusterkernel/clusters/cluster-123456")
"""

from __future__ import annotations

import os
import pickle
import stat
from typing import BinaryIO

from clusterkernel.rank._variables import pickled, put_back, user_namespace
from clusterkernel.rank._world import world


def path(run_dir: str, rank: int) -> str:
    """Where rank ``rank``'s snapshot lives."""
    return os.path.join(run_dir, "snapshots", f"rank-{rank}.pkl")


def save(run_dir: str, names: list[str] | None = None) -> dict:
    """Write this rank's picklable variables (``names``, or all) to its snapshot file.

    Returns ``{"saved": [...], "skipped": {name: why}, "missing": [...], "bytes": n}``.
    """
    ns = user_namespace()
    missing = [n for n in names or [] if n not in ns]
    chosen = ns if names is None else {n: ns[n] for n in names if n in ns}
    blob, saved, skipped = pickled(chosen)
    target = path(run_dir, world().Get_rank())
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    tmp = f"{target}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(saved, f, protocol=5)
        f.write(blob)
    os.replace(tmp, target)  # a rank that dies while writing leaves the last snapshot whole
    return {
        "saved": saved,
        "skipped": skipped,
        "missing": missing,
        "bytes": len(blob),
    }


def _open(run_dir: str) -> BinaryIO:
    """This rank's snapshot file, opened after the checks, at the list of its names."""
    source = path(run_dir, world().Get_rank())
    if not os.path.exists(source):
        raise FileNotFoundError(
            f"rank {world().Get_rank()} has no snapshot: %mpi snapshot (cluster.snapshot()) "
            "keeps one"
        )
    f = open(source, "rb")  # noqa: SIM115 (the caller closes it)
    info = os.fstat(f.fileno())
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        f.close()
        raise PermissionError(f"{source}: not this user's own private file; not loaded")
    return f


def held(run_dir: str) -> list[str]:
    """The names this rank's snapshot holds (its variables are not loaded)."""
    with _open(run_dir) as f:
        return pickle.load(f)


def load(run_dir: str, names: list[str] | None = None) -> dict:
    """Load this rank's snapshot (``names`` of it, or all) into its user namespace.

    Returns ``{"restored": [...], "missing": [...]}``; raises FileNotFoundError when
    this rank has no snapshot, PermissionError for a file it must not trust.
    """
    with _open(run_dir) as f:
        pickle.load(f)  # the names
        values, modules = pickle.load(f)
    wanted = set(names) if names is not None else None
    missing = sorted(wanted - {*values, *modules}) if wanted is not None else []
    return {"restored": put_back(values, modules, wanted), "missing": missing}
