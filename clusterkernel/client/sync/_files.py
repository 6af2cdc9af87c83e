"""What a sync sends: the user's files, read, hashed, size- and syntax-checked (client side).

Example::

    files = collect(None, cwd="/home/me/project")       # the folder's *.py files
    files = collect(["mypkg", "train.py"], cwd="/home/me/project")
    [f.rel for f in files]       # ["mypkg/__init__.py", "mypkg/layers.py", "train.py"]
    check_syntax(files)          # SyncError naming file and line, or None
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass

from clusterkernel.protocol._errors import ClusterkernelError

MAX_FILE_BYTES = 10 * 2**20  # one file
MAX_TOTAL_BYTES = 50 * 2**20  # everything one sync names

_MOVE_DATA = (
    "%mpi sync is for code. Put data on the cluster's side once, with scp or rsync "
    "(rsync -a data/ HOST:project/data/) or on a path the ranks share, and read it there "
    "in a cell."
)


class SyncError(ClusterkernelError, ValueError):
    """A sync refused before anything was sent (a missing path, a file too large, a syntax
    error), or a rank that could not take the files; the message says what to do."""


@dataclass(frozen=True)
class Source:
    """One file to sync: ``rel``, its name in the ranks' sync directory (``"pkg/a.py"``);
    ``path``, where it is on the notebook's side; its bytes and their sha256."""

    rel: str
    path: str
    data: bytes
    sha: str


def _skipped(name: str) -> bool:
    """Hidden files and folders, bytecode and editors' leftovers are not the user's code."""
    return name.startswith(".") or name == "__pycache__" or name.endswith((".pyc", ".pyo", "~"))


def _package_files(folder: str) -> list[tuple[str, str]]:
    """``(rel, path)`` of every file in a package folder, its subfolders included."""
    top = os.path.basename(os.path.normpath(folder))
    found = []
    for here, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not _skipped(d))
        inner = os.path.relpath(here, folder)
        for name in sorted(n for n in names if not _skipped(n)):
            rel = name if inner == "." else os.path.join(inner, name)
            path = os.path.join(here, name)
            if os.path.isfile(path):
                found.append((f"{top}/{rel.replace(os.sep, '/')}", path))
    return found


def _named(paths: Iterable[str | os.PathLike], cwd: str) -> list[tuple[str, str]]:
    found = []
    for named in paths:
        path = os.path.abspath(os.path.join(cwd, os.fspath(named)))
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "__init__.py")):
                raise SyncError(
                    f"{named} is a folder without __init__.py: name a package (a folder with "
                    "__init__.py) or the files in it."
                )
            found += _package_files(path)
        elif os.path.isfile(path):
            found.append((os.path.basename(path), path))
        else:
            raise SyncError(f"{named}: no such file or folder (from {cwd}).")
    return found


def _default(cwd: str) -> list[tuple[str, str]]:
    names = sorted(n for n in os.listdir(cwd) if n.endswith(".py") and not _skipped(n))
    found = [(n, os.path.join(cwd, n)) for n in names if os.path.isfile(os.path.join(cwd, n))]
    if not found:
        raise SyncError(
            f"No .py files in {cwd}: name the files or packages to send, e.g. %mpi sync mypkg "
            "(sync(cluster, ['mypkg']))."
        )
    return found


def _shown(path: str, cwd: str) -> str:
    """A path as the user names it: from ``cwd`` when inside it."""
    return os.path.relpath(path, cwd) if path.startswith(cwd + os.sep) else path


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def collect(
    paths: Iterable[str | os.PathLike] | None,
    cwd: str | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
) -> list[Source]:
    """The files a sync of ``paths`` sends, read and hashed, in name order.

    ``paths``: files (each lands at the top of the sync directory) and package folders
    (with their subfolders), relative to ``cwd`` (default: the current directory); None:
    ``cwd``'s own ``*.py`` files, not its subfolders. A file above ``max_file_bytes`` or
    a total above ``max_total_bytes`` is refused, naming the largest, before any is read.
    """
    cwd = os.path.abspath(cwd or os.getcwd())
    pairs = _default(cwd) if paths is None else _named(paths, cwd)
    where: dict[str, str] = {}
    for rel, path in pairs:
        if where.get(rel, path) != path:
            raise SyncError(f"Two files would be {rel} on the ranks: {where[rel]} and {path}.")
        where[rel] = path
    sizes = {rel: os.path.getsize(path) for rel, path in where.items()}
    big = sorted(
        (r for r in sizes if sizes[r] > max_file_bytes), key=sizes.__getitem__, reverse=True
    )
    if big:
        listed = ", ".join(f"{_shown(where[r], cwd)} ({_mb(sizes[r])})" for r in big[:3])
        raise SyncError(
            f"Not synced: {listed} above the {_mb(max_file_bytes)} a sync sends per file. "
            + _MOVE_DATA
        )
    total = sum(sizes.values())
    if total > max_total_bytes:
        largest = sorted(sizes, key=sizes.__getitem__, reverse=True)[:3]
        listed = ", ".join(f"{_shown(where[r], cwd)} ({_mb(sizes[r])})" for r in largest)
        raise SyncError(
            f"Not synced: {len(sizes)} files of {_mb(total)}, above the "
            f"{_mb(max_total_bytes)} one sync sends (largest: {listed}). " + _MOVE_DATA
        )
    sources = []
    for rel in sorted(where):
        with open(where[rel], "rb") as f:
            data = f.read()
        sources.append(Source(rel, where[rel], data, hashlib.sha256(data).hexdigest()))
    return sources


_compiled: set[str] = set()  # sha256 of sources that compiled: checked once per content


def check_syntax(sources: Iterable[Source], cwd: str | None = None) -> None:
    """Compile every Python source not checked before; a :class:`SyncError` naming each
    file and line that does not compile (nothing is sent then)."""
    cwd = os.path.abspath(cwd or os.getcwd())
    errors = []
    for src in sources:
        if not src.rel.endswith(".py") or src.sha in _compiled:
            continue
        shown = _shown(src.path, cwd)
        try:
            compile(src.data, src.path, "exec", dont_inherit=True)
        except SyntaxError as e:
            text = f" ({e.text.strip()})" if e.text and e.text.strip() else ""
            errors.append(f"{shown}, line {e.lineno}: {e.msg}{text}")
        except ValueError as e:  # a null byte, an encoding Python cannot read
            errors.append(f"{shown}: {e}")
        else:
            _compiled.add(src.sha)
    if errors:
        raise SyncError(
            "Not synced, the ranks keep the code they have: "
            + "; ".join(errors)
            + ". Fix it and sync again."
        )
