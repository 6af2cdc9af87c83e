"""The ``clusterkernel`` command (also ``python -m clusterkernel``).

Each subcommand lives in the module that does the work; this file only
dispatches, so ``clusterkernel --help`` lists them all::

    clusterkernel export notebook.ipynb -o job.py --sbatch job.sbatch
    clusterkernel run -n 2 job.py
    clusterkernel install-kernel -n 4 --user
    clusterkernel uninstall-kernel
    clusterkernel notebooks my-notebooks
    clusterkernel list
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help). The module has ``add_arguments(parser)``
# and ``main(args) -> int`` for it (a module may serve several subcommands: it
# then names them ``add_<sub>_arguments`` / ``<sub>_main`` with "-" as "_").
_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "export": ("clusterkernel.client.export", "turn a notebook's %%mpi cells into a batch job"),
    "run": (
        "clusterkernel.client.export",
        "run an exported job on N ranks of this machine's MPI (root, oversubscribed)",
    ),
    "install-kernel": (
        "clusterkernel.client.kernel",
        'install the "Python 3 (MPI, N ranks)" kernel',
    ),
    "uninstall-kernel": ("clusterkernel.client.kernel", "remove the MPI kernel's kernelspec"),
    "notebooks": (
        "clusterkernel.client.teaching_notebooks",
        "copy the teaching notebooks into a folder",
    ),
    "list": (
        "clusterkernel.client.cluster._kept_list",
        "your kept clusters (%mpi start --keep): %mpi attach",
    ),
}


def _entry(sub: str, module) -> tuple:
    name = sub.replace("-", "_")
    if hasattr(module, f"{name}_main"):
        return getattr(module, f"add_{name}_arguments"), getattr(module, f"{name}_main")
    return module.add_arguments, module.main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="clusterkernel", description="A notebook as the live front end of an MPI job."
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for sub, (modname, help_text) in _SUBCOMMANDS.items():
        add_arguments, _ = _entry(sub, importlib.import_module(modname))
        # argparse %-formats help (not description): "%%mpi" must stay "%%mpi" in both
        help_escaped = help_text.replace("%", "%%")
        add_arguments(subs.add_parser(sub, help=help_escaped, description=help_text))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    _, run = _entry(args.command, importlib.import_module(_SUBCOMMANDS[args.command][0]))
    return int(run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
