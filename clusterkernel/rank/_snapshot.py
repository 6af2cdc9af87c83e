"""A rank's variables kept on its own node, to come back from (rank side).

``%mpi snapshot [NAMES]`` writes each rank's picklable variables (torch state dicts,
models and optimizers included; one pickle, so shared objects stay shared) to a file
of its own in the cluster's private run directory; ``%mpi restore`` loads them back
into the same or new processes (after ``%mpi restart``, or ``respawn
--from-snapshot`` for a rank that died). The files go with the run directory when the
cluster stops. A file is loaded only if this user owns it and nobody else may write
it: unpickling runs code, so only the user's own ranks' files are trusted.

Example (what the client runs on every rank)::

    save("/home/me/.clusterkernel/clusters/cluster-123456", ["model", "opt"])
    load("/home/me/.clusterkernel/clusters/cluster-123456")
"""

from __future__ import annotations

import os
import pickle
import stat

from clusterkernel.rank._respawn import _namespace, _pickled
from clusterkernel.rank._world import world


def path(run_dir: str, rank: int) -> str:
    """Where rank ``rank``'s snapshot lives."""
    return os.path.join(run_dir, "snapshots", f"rank-{rank}.pkl")


def save(run_dir: str, names: list[str] | None = None) -> dict:
    """Write this rank's picklable variables (``names``, or all) to its snapshot file.

    Returns ``{"saved": [...], "skipped": {name: why}, "missing": [...], "bytes": n}``.
    """
    ns = _namespace()
    missing = [n for n in names or [] if n not in ns]
    chosen = ns if names is None else {n: ns[n] for n in names if n in ns}
    blob, saved, skipped = _pickled(chosen)
    target = path(run_dir, world().Get_rank())
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    tmp = f"{target}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    os.replace(tmp, target)  # a rank that dies while writing leaves the last snapshot whole
    return {
        "saved": saved,
        "skipped": skipped,
        "missing": missing,
        "bytes": len(blob),
    }


def load(run_dir: str, names: list[str] | None = None) -> dict:
    """Load this rank's snapshot (``names`` of it, or all) into its namespace.

    Returns ``{"restored": [...], "missing": [...]}``; raises FileNotFoundError when
    this rank has no snapshot, PermissionError for a file it must not trust.
    """
    import importlib

    source = path(run_dir, world().Get_rank())
    if not os.path.exists(source):
        raise FileNotFoundError(
            f"rank {world().Get_rank()} has no snapshot: %mpi snapshot (cluster.snapshot()) "
            "keeps one"
        )
    with open(source, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise PermissionError(f"{source}: not this user's own private file; not loaded")
        values, modules = pickle.load(f)
    wanted = set(names) if names is not None else None
    missing = sorted(wanted - {*values, *modules}) if wanted is not None else []
    ns = _namespace()
    restored = []
    for name, module in modules.items():
        if wanted is None or name in wanted:
            ns[name] = importlib.import_module(module)
            restored.append(name)
    for name, value in values.items():
        if wanted is None or name in wanted:
            ns[name] = value
            restored.append(name)
    return {"restored": sorted(restored), "missing": missing}
