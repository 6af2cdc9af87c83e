"""The user's own modules on this rank: the files the notebook synced (rank side).

The notebook (:mod:`clusterkernel.client.sync`) sends the changed files of the user's
modules to one rank per host, which writes them into this host's sync directory
(:func:`write`): ``sync/<host>`` in the cluster's run directory, as the engine's
environment names it, 0700 like the run directory. Every rank then puts that directory
first on ``sys.path`` and reloads the changed modules it has imported (:func:`load`)
with IPython's autoreload machinery (``superreload``, as ``%autoreload 2`` reloads a
module): functions and classes are updated in place, so objects made before the sync
run the new code and the rank's variables stay. A rank that starts later (a restart, a
respawn) finds the directory at set-up (:func:`restore_path`). Both edits of
``sys.path`` wait for the rank's completer, which swaps ``sys.path`` while it looks
modules up (:func:`clusterkernel.rank._completion.completer_still`).

The notebook calls these by name (``clusterkernel.protocol._targets``)::

    rank_call(SYNC_WRITE, {"model.py": b"def f(): ..."}, {"model.py": "<sha256>"})
    # {"dir": ".../sync/node1", "missing": []}: files it lacks or holds otherwise
    rank_call(SYNC_LOAD, ["model.py"])    # {"dir": ..., "reloaded": ["model"], "failed": {}}
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import socket
import sys
from typing import Any

from clusterkernel.protocol._names import RUN_DIR_ENV
from clusterkernel.rank._completion import completer_still

# path -> (mtime_ns, size, sha256): a file is hashed again only when it changed on disk
_hashes: dict[str, tuple[int, int, str]] = {}
# superreload's record of each module's earlier objects, so an object made two syncs
# ago is updated too (autoreload keeps it in its ModuleReloader for the same reason)
_old_objects: dict[Any, list] = {}


def directory() -> str:
    """This host's sync directory (it may not exist yet)."""
    base = os.environ.get(RUN_DIR_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "clusterkernel"
    )
    return os.path.join(base, "sync", socket.gethostname())


def _inside(root: str, rel: str) -> str:
    """``root/rel``, refusing a name that would leave ``root``."""
    parts = rel.split("/")
    if not rel or os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a file name inside the sync directory: {rel!r}")
    return os.path.join(root, *parts)


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def _sha(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    seen = _hashes.get(path)
    if seen is not None and seen[:2] == (st.st_mtime_ns, st.st_size):
        return seen[2]
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    _hashes[path] = (st.st_mtime_ns, st.st_size, sha)
    return sha


def write(files: dict[str, bytes], expect: dict[str, str]) -> dict:
    """Write ``files`` (name in the sync directory -> content) on this host; return the
    directory and the names of ``expect`` (name -> sha256) it lacks or holds otherwise.

    Each file is written beside its place and renamed over it, so a rank importing it
    meanwhile reads the old or the new one whole; its bytecode is removed, because
    Python trusts a ``.pyc`` whose source has the same size and second.
    """
    root = directory()
    _private_dir(os.path.dirname(root))
    _private_dir(root)
    for rel, data in files.items():
        path = _inside(root, rel)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        if path.endswith(".py"):
            try:
                os.remove(importlib.util.cache_from_source(path))
            except (OSError, ValueError):  # none written yet
                pass
    missing = sorted(rel for rel, sha in expect.items() if _sha(_inside(root, rel)) != sha)
    return {"dir": root, "missing": missing}


def restore_path() -> None:
    """At a rank's set-up: the host's synced files first on ``sys.path``, if it has any."""
    root = directory()
    if os.path.isdir(root):
        _first_on_path(root)


def _first_on_path(root: str) -> None:
    # not beside a completion: jedi would put back a sys.path from before this edit
    with completer_still():
        if sys.path[:1] != [root]:
            while root in sys.path:
                sys.path.remove(root)
            sys.path.insert(0, root)


def _module_name(rel: str) -> str | None:
    """``"pkg/sub.py"`` -> ``"pkg.sub"``, ``"pkg/__init__.py"`` -> ``"pkg"``; None for data."""
    if not rel.endswith(".py"):
        return None
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or None


def load(changed: list[str]) -> dict:
    """The sync directory first on ``sys.path``; every module this rank imported from a
    file in ``changed`` reloaded. Returns the directory, the modules reloaded and, for a
    module whose new code raised while it ran, the error (that module keeps its old
    contents: ``superreload`` puts them back).

    A module of the same name imported from elsewhere (a package of the environment)
    is left alone; one imported from the notebook's own directory before the first sync
    is the same file and comes from the synced copy from then on.
    """
    root = directory()
    _first_on_path(root)
    importlib.invalidate_caches()  # new files in a directory the finders already listed
    wanted = {_module_name(rel): rel for rel in changed}
    wanted.pop(None, None)
    reloaded: list[str] = []
    failed: dict[str, str] = {}
    if not wanted:
        return {"dir": root, "reloaded": reloaded, "failed": failed}
    from IPython.extensions.autoreload import superreload

    for name, module in list(sys.modules.items()):
        rel = wanted.get(name)
        where = (getattr(module, "__file__", None) or "").replace(os.sep, "/")
        if rel is None or not where.endswith("/" + rel):
            continue
        try:
            superreload(module, importlib.reload, _old_objects)
        except Exception as e:
            failed[name] = f"{type(e).__name__}: {e}"
        else:
            reloaded.append(name)
    return {"dir": root, "reloaded": reloaded, "failed": failed}
