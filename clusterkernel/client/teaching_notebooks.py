"""The teaching notebooks that ship inside the package, and ``clusterkernel notebooks DIR``.

A pip user has no ``notebooks/`` folder: the wheel carries the notebooks as package
data (``clusterkernel/notebooks``, a link to the repository's ``notebooks/`` that the
wheel build copies), and this command copies them out::

    clusterkernel notebooks my-notebooks          # then: jupyter lab my-notebooks
    clusterkernel notebooks my-notebooks --force  # overwrite earlier copies

From Python: ``copy_notebooks("my-notebooks")`` returns the files it wrote.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from importlib import resources
from pathlib import Path


class NotebookCopyError(Exception):
    """The notebooks cannot be copied as asked (the message says what to do)."""


def notebook_names() -> list[str]:
    """File names of the notebooks shipped with the package, sorted.

    Example::

        notebook_names()[0]   # "00_quickstart.ipynb"
    """
    folder = resources.files("clusterkernel") / "notebooks"
    if not folder.is_dir():
        raise NotebookCopyError(
            "this installation of clusterkernel carries no notebooks "
            f"(looked in {folder}); reinstall it from a wheel or the repository"
        )
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".ipynb"))
    if not names:
        raise NotebookCopyError(f"no notebooks in {folder}; reinstall clusterkernel")
    return names


def copy_notebooks(dest: str | Path, force: bool = False) -> list[Path]:
    """Copy every shipped notebook into ``dest`` (made if missing); return the new files.

    Refuses, before writing anything, when a notebook of the same name is already
    in ``dest``, unless ``force`` (so an edited copy is never lost by accident).

    Example::

        copy_notebooks("my-notebooks")   # [PosixPath('my-notebooks/00_quickstart.ipynb'), ...]
    """
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise NotebookCopyError(f"{dest} is a file; name a folder to copy the notebooks into")
    names = notebook_names()
    there = [n for n in names if (dest / n).exists()]
    if there and not force:
        raise NotebookCopyError(
            f"{dest} already holds {', '.join(there)}; nothing was copied. Name another "
            "folder, or add --force to overwrite them"
        )
    dest.mkdir(parents=True, exist_ok=True)
    folder = resources.files("clusterkernel") / "notebooks"
    written = []
    for name in names:
        with resources.as_file(folder / name) as src:
            written.append(Path(shutil.copyfile(src, dest / name)))
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``clusterkernel notebooks``."""
    parser.add_argument("dir", help="folder to copy the notebooks into (made if missing)")
    parser.add_argument(
        "--force", action="store_true", help="overwrite notebooks of the same name in DIR"
    )


def main(args: argparse.Namespace) -> int:
    """``clusterkernel notebooks DIR [--force]``."""
    try:
        written = copy_notebooks(args.dir, force=args.force)
    except NotebookCopyError as e:
        print(f"clusterkernel notebooks: {e}", file=sys.stderr)
        return 2
    print(f"Copied {len(written)} notebooks into {args.dir}:")
    for path in written:
        print(f"  {path.name}")
    print(f"Open them with: jupyter lab {Path(args.dir) / written[0].name}")
    return 0
