"""The teaching notebooks that ship inside the package, and ``clusterkernel notebooks DIR``.

A pip user has no ``notebooks/`` folder: the wheel carries the notebooks as package
data (``clusterkernel/notebooks``, a link to the repository's ``notebooks/`` that the
wheel build copies), and this command copies them out::

    clusterkernel notebooks my-notebooks          # then: jupyter lab my-notebooks
    clusterkernel notebooks my-notebooks --force  # overwrite earlier copies

From Python: ``copy_notebooks("my-notebooks")`` returns the files it wrote.

The commands this module and the quick start print run as printed in a shell where the
virtual environment is not activated: they name the environment's own scripts by
absolute path (:func:`command`, :func:`lab_command`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import sysconfig
from importlib import resources
from pathlib import Path

from clusterkernel.protocol._errors import ClusterkernelError


class NotebookCopyError(ClusterkernelError):
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


def command(script: str, module: str) -> str:
    """A shell command that runs console script ``script`` of this Python's environment,
    with no activated venv and no ``PATH`` entry needed: the script's absolute path
    where it is installed next to this Python, else ``<this python> -m module``.

    Example::

        command("clusterkernel", "clusterkernel")   # '/home/me/.venv/bin/clusterkernel'
    """
    for folder in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        path = os.path.join(folder, script)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return shlex.quote(path)
    return f"{shlex.quote(sys.executable)} -m {module}"


def lab_command(notebook: str | Path) -> str:
    """A shell command that opens ``notebook`` in this environment's JupyterLab, as printed:
    ``--allow-root`` for root (JupyterLab refuses root without it); where JupyterLab
    is not installed, the pip command that installs it comes first.

    Example::

        lab_command("my-notebooks/00_quickstart.ipynb")
        # '/home/me/.venv/bin/jupyter lab my-notebooks/00_quickstart.ipynb'
    """
    line = f"{command('jupyter', 'jupyter')} lab {shlex.quote(str(notebook))}"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        line += " --allow-root"
    try:
        import jupyterlab  # noqa: F401 - only whether it is there
    except ImportError:
        pip = f"{shlex.quote(sys.executable)} -m pip install 'jupyterlab>=4' 'ipykernel>=6.25'"
        line = f"{pip} && {line}"
    return line


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
    print(f"Open them with: {lab_command(Path(args.dir) / written[0].name)}")
    return 0
