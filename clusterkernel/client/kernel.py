"""A Jupyter kernel whose every cell runs on MPI ranks: "Python 3 (MPI, 4 ranks)".

It is the standard IPython kernel (ipykernel) with the clusterkernel extension
loaded and kernel mode on: every cell runs as if it started with ``%%mpi`` (the
same per-rank output), a cell starting with ``%%local`` runs in the kernel's own
process, and ``%mpi`` line magics work as usual. The ranks start with the first
cell that needs them and stop with the kernel; the kernel menu's interrupt reaches
the running ``%%mpi`` cell as KeyboardInterrupt, and its shutdown and restart stop
the ranks (or let kept ones go) before the kernel ends; a kernel killed outright has
its guard process stop them.

Install it once, then pick it in JupyterLab's launcher::

    clusterkernel install-kernel -n 4 --user     # or --sys-prefix, --prefix P
    clusterkernel install-kernel -n 2 --name slurm --start-options "--slurm --nodes 2 --ssh login"
    clusterkernel uninstall-kernel

The kernelspec runs ``python -m clusterkernel.client.kernel -f {connection_file} --ranks 4``
(and ``--start-options=...``: the rest of ``%mpi start``'s options, checked at install by
``%mpi start``'s own parser).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

DEFAULT_NAME = "clusterkernel"
_NAME_RE = re.compile(r"^[a-z0-9._-]+$", re.IGNORECASE)  # what jupyter_client accepts


def display_name(ranks: int, torch: bool = False, start: str = "") -> str:
    """The launcher's label, e.g. ``Python 3 (MPI, 4 ranks)``, ``Python 3 (MPI, 2 ranks,
    torch.distributed)`` for a kernel whose ranks get the default process group, followed
    by the kernel's other ``%mpi start`` options (``start``), if any.

    Example::

        display_name(2, start="--slurm --ssh login")   # 'Python 3 (MPI, 2 ranks) --slurm --ssh login'
    """
    group = ", torch.distributed" if torch else ""
    where = f" {' '.join(start.split())}" if start.strip() else ""
    return f"Python 3 (MPI, {ranks} rank{'s' if ranks != 1 else ''}{group}){where}"


def start_line(ranks: int, torch: bool = False, keep: str | None = None, start: str = "") -> str:
    """The ``%mpi start`` options the kernel starts its ranks with: ``-n``, ``--torch``,
    ``--keep`` and the rest (``start``, as ``--start-options`` gave them).

    Example::

        start_line(2, keep="2h", start="--slurm --ssh login")   # '-n 2 --keep 2h --slurm --ssh login'
    """
    line = f"-n {ranks}" + (" --torch" if torch else "") + (f" --keep {keep}" if keep else "")
    return f"{line} {start.strip()}" if start.strip() else line


# what install-kernel takes as its own options: in --start-options they would say it twice
_OWN = {"n": "-n N", "torch": "--torch", "keep": "--keep TIME"}


def check_start(ranks: int, torch: bool = False, keep: str | None = None, start: str = "") -> None:
    """Refuse, with a ``ValueError`` that says what to write, options the kernel could not
    start its ranks with: ``start`` read by ``%mpi start``'s own parser and the whole line
    checked as ``%mpi start`` checks it before it starts anything (nothing is started here,
    and nothing is asked of a login node or a scheduler).

    Example::

        check_start(2, start="--slurm --nodes 2 --ssh login")   # fine
        check_start(2, start="--nodes 2")   # ValueError: ... --nodes: they go with --slurm ...
    """
    from IPython.core.error import UsageError

    from clusterkernel.client.magics._args import start_args
    from clusterkernel.client.magics._parse import parse
    from clusterkernel.client.magics._subcommands import cluster_for

    try:
        given = vars(parse(start_args, start))
    except UsageError as e:
        raise ValueError(f"--start-options {start.strip()!r}: {e}") from None
    twice = [flag for name, flag in _OWN.items() if given[name] not in (None, False)]
    if twice:
        raise ValueError(
            f"--start-options: give {', '.join(twice)} as install-kernel's own option "
            f"(clusterkernel install-kernel {' '.join(twice)} --start-options ...), not in it."
        )
    try:
        cluster_for(start_line(ranks, torch, keep, start))
    except UsageError as e:
        raise ValueError(str(e)) from None


def kernel_spec(ranks: int, torch: bool = False, keep: str | None = None, start: str = "") -> dict:
    """The kernel.json of the MPI kernel with ``ranks`` ranks (``torch``: as ``%mpi start
    --torch``; ``keep``: as ``%mpi start --keep``, and a restarted kernel attaches again;
    ``start``: more ``%mpi start`` options, e.g. ``--slurm --nodes 2 --ssh login``).

    Example::

        kernel_spec(4)["argv"][-2:]   # ['--ranks', '4']
        kernel_spec(2, start="--slurm --ssh login")["argv"][-1]   # '--start-options=--slurm --ssh login'
    """
    return {
        "argv": [sys.executable, "-m", "clusterkernel.client.kernel", "-f", "{connection_file}"]
        + ["--ranks", str(ranks)]
        + (["--torch"] if torch else [])
        + (["--keep", keep] if keep else [])
        # one word with "=": argparse would take a lone "--slurm" for an option of its own
        + ([f"--start-options={start.strip()}"] if start.strip() else []),
        "display_name": display_name(ranks, torch, start),
        "language": "python",
        "interrupt_mode": "signal",  # SIGINT: %%mpi's KeyboardInterrupt handling
        "metadata": {"debugger": False},
    }


def _check(ranks: int, name: str) -> None:
    if ranks < 1:
        raise SystemExit(f"-n takes a number of ranks of at least 1, got {ranks}.")
    if not _NAME_RE.match(name):
        raise SystemExit(
            f"--name {name!r}: a kernel name has only letters, digits, '.', '_' and '-'."
        )


def install(
    ranks: int = 4,
    name: str = DEFAULT_NAME,
    *,
    user: bool = False,
    prefix: str | None = None,
    torch: bool = False,
    keep: str | None = None,
    start: str = "",
) -> str:
    """Install the kernelspec; return the directory it went to.

    ``user=True``: the user's Jupyter data dir; ``prefix``: ``PREFIX/share/jupyter``
    (``sys.prefix`` for a virtualenv); neither: the system-wide location. ``torch``:
    the ranks start with torch.distributed's default group (``%mpi start --torch``).
    ``keep``: the ranks outlive the kernel for that long (``%mpi start --keep``), and a
    restarted kernel (the kernel menu's restart) attaches to them again. ``start``: the
    rest of ``%mpi start``'s options (``--slurm --nodes 2 --ssh login``), checked now
    (:func:`check_start`: a ``ValueError``), not at the first cell.

    Example::

        install(4, user=True)   # ~/.local/share/jupyter/kernels/clusterkernel
    """
    from ipykernel.kernelspec import RESOURCES
    from jupyter_client.kernelspec import KernelSpecManager

    _check(ranks, name)
    check_start(ranks, torch, keep, start)  # --keep's time too: refused now, not at the first cell
    with tempfile.TemporaryDirectory() as tmp:
        for logo in Path(RESOURCES).glob("logo-*.png"):  # the launcher tile's icon
            shutil.copy(logo, tmp)
        with open(os.path.join(tmp, "kernel.json"), "w") as f:
            json.dump(kernel_spec(ranks, torch, keep, start), f, indent=1)
        return KernelSpecManager().install_kernel_spec(
            tmp, kernel_name=name, user=user, prefix=prefix, replace=True
        )


def uninstall(name: str = DEFAULT_NAME, *, prefix: str | None = None) -> str:
    """Remove the kernelspec ``name``; return the directory removed.

    Without ``prefix`` it is looked up where Jupyter looks (user, env, system,
    ``JUPYTER_PATH``).

    Example::

        uninstall()    # removes the "clusterkernel" kernelspec
    """
    from jupyter_client.kernelspec import KernelSpecManager

    if prefix is not None:
        path = Path(prefix, "share", "jupyter", "kernels", name)
        if not (path / "kernel.json").exists():
            raise SystemExit(f"No kernelspec {name!r} in {path.parent}.")
        shutil.rmtree(path)
        return str(path)
    try:
        return KernelSpecManager().remove_kernel_spec(name)
    except KeyError:  # what remove_kernel_spec raises for an unknown name
        raise SystemExit(
            f"No kernelspec named {name!r} is installed (see: jupyter kernelspec list)."
        ) from None


# ------------------------------------------------------------------ subcommands
def _location(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="the user's Jupyter dir (default)")
    where.add_argument(
        "--sys-prefix", action="store_true", help=f"this Python's environment ({sys.prefix})"
    )
    where.add_argument("--prefix", help="PREFIX/share/jupyter/kernels")


def add_install_kernel_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``clusterkernel install-kernel``."""
    parser.add_argument("-n", "--ranks", type=int, default=4, help="MPI ranks (default 4)")
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"kernel name ({DEFAULT_NAME})")
    parser.add_argument(
        "--torch",
        action="store_true",
        help="start the ranks with torch.distributed's default process group (%%mpi start --torch)",
    )
    parser.add_argument(
        "--keep",
        metavar="TIME",
        help="the ranks outlive the kernel for TIME (e.g. 2h; %%mpi start --keep), and a "
        "restarted kernel attaches to them again",
    )
    parser.add_argument(
        "--start-options",
        metavar="OPTIONS",
        default="",
        help="the rest of %%mpi start's options, quoted as one, e.g. \"--slurm --nodes 2 --ssh "
        'login" (ranks under Slurm, from outside the cluster) or "--hosts a:2,b:2"; checked '
        "now by %%mpi start's parser (%%mpi help start lists them); one option alone: "
        "--start-options=--slurm",
    )
    _location(parser)


def install_kernel_main(args: argparse.Namespace) -> int:
    """``clusterkernel install-kernel``: install the "Python 3 (MPI, N ranks)" kernelspec."""
    prefix = sys.prefix if args.sys_prefix else args.prefix
    try:
        path = install(
            args.ranks, args.name, user=not prefix, prefix=prefix, torch=args.torch,
            keep=args.keep, start=args.start_options,
        )  # fmt: skip
    except ValueError as e:
        raise SystemExit(f"{e} Nothing was installed.") from None
    label = display_name(args.ranks, args.torch, args.start_options)
    print(f"Installed kernelspec {args.name!r} ({label}) in {path}")
    return 0


def add_uninstall_kernel_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``clusterkernel uninstall-kernel``."""
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"kernel name ({DEFAULT_NAME})")
    parser.add_argument("--prefix", help="remove it from PREFIX/share/jupyter/kernels")


def uninstall_kernel_main(args: argparse.Namespace) -> int:
    """``clusterkernel uninstall-kernel``: remove the kernelspec."""
    print(f"Removed {uninstall(args.name, prefix=args.prefix)}")
    return 0


# ------------------------------------------------------------------ the kernel
def _kernel_cell(lines: list[str]) -> list[str]:
    """Input transformer of kernel mode: ``%%local`` cells run here, others on the ranks.

    The ``%%local`` line is dropped rather than run as a magic, so the cell is an
    ordinary cell: its last value is shown, its error fails the cell.
    """
    from clusterkernel.client.magics._subcommands import auto_mpi

    if lines and lines[0].split()[:1] == ["%%local"]:
        return lines[1:]
    return auto_mpi(lines)


cast(Any, _kernel_cell).sends_to_ranks = True


def kernel_mode(
    shell,
    ranks: int,
    torch: bool = False,
    keep: str | None = None,
    origin: str | None = None,
    start: str = "",
) -> None:
    """Run every cell of ``shell`` on ``ranks`` ranks, started when a cell first needs them.

    Loads the clusterkernel extension if it is not loaded yet. ``keep``: the ranks outlive
    the kernel (``%mpi start --keep``); a kernel of the same ``origin`` (a restart keeps
    the connection file) attaches to them instead of starting new ones (on the login node
    of ``--ssh HOST`` from outside). ``start``: more ``%mpi start`` options.

    Example::

        kernel_mode(get_ipython(), 4)
    """
    # the kernel asks for it, but a user's IPython config may replace the extension list
    shell.extension_manager.load_extension("clusterkernel")
    magics = shell.magics_manager.registry["MPIMagics"]
    magics.autostart = start_line(ranks, torch, keep, start)
    if keep:
        magics.origin = origin
    if _kernel_cell not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(_kernel_cell)


def _stop_at_shutdown(shell) -> None:
    """A shutdown (and restart) of this kernel first stops its ranks, or lets kept ones
    go: at exit, once ipykernel has closed its sockets, the cluster's client waits for
    replies that never come until Jupyter kills the kernel (SIGTERM to its process group
    2.5 s after the shutdown request, SIGKILL 2.5 s later)."""
    magics = shell.magics_manager.registry.get("MPIMagics")
    if magics is not None:
        magics._stop_quietly()


def main(argv: list[str] | None = None) -> None:
    """Start the kernel (the kernelspec's argv): ipykernel with kernel mode on."""
    from ipykernel.kernelapp import IPKernelApp

    from clusterkernel.protocol._ipykernel import before_shutdown

    parser = argparse.ArgumentParser(prog="python -m clusterkernel.client.kernel", add_help=False)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--torch", action="store_true")
    parser.add_argument("--keep")
    parser.add_argument("--start-options", default="")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.ranks < 1:
        raise SystemExit(f"--ranks must be at least 1, got {args.ranks}.")
    app = IPKernelApp.instance(extensions=["clusterkernel"])
    app.initialize(rest)
    before_shutdown(app.kernel, lambda: _stop_at_shutdown(app.shell))
    # a restart from the kernel menu keeps the connection file: it names this notebook's kernel
    origin = f"kernel {os.path.abspath(app.connection_file)}"
    kernel_mode(app.shell, args.ranks, args.torch, args.keep, origin, args.start_options)
    app.start()


if __name__ == "__main__":
    main()
