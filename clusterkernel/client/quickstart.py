"""The quick start, readable in a terminal: ``clusterkernel-quickstart``.

Runs a few cells through a real IPython shell, exactly as you would type them,
echoing each one first: start 4 ranks, run code on all of them, move a tensor
with a collective, push and pull a variable, see an error grouped by rank, stop.
The same cells make up the notebook ``00_quickstart.ipynb`` for JupyterLab, which
``clusterkernel notebooks DIR`` copies out of the installed package with the others;
the last line printed is that command and the one that opens JupyterLab, with this
environment's paths (:func:`next_step`).
"""

from __future__ import annotations

import argparse
import shlex
import sys

CELLS = [
    "%load_ext clusterkernel",
    "%mpi start -n {n}",
    "%%mpi\nfrom clusterkernel import comm\nprint(f'hello from rank {{comm.rank()}} of {{comm.size()}}')",
    "%%mpi\nimport torch\nt = torch.full((3,), float(comm.rank()))\n"
    "comm.all_reduce(t, op=comm.SUM)\nprint('sum of ranks on every rank:', t.tolist())",
    "%mpi status",
    "x = 21\n%mpi push x",
    "%%mpi\ny = x * 2 + comm.rank()",
    "%mpi pull y",
    "%%mpi\nif comm.rank() % 2:\n    raise ValueError(f'odd rank {{comm.rank()}} says no')",
    "%mpi stop",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=4, help="number of MPI ranks")
    args = parser.parse_args(argv)

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    failed = 0
    for i, cell in enumerate(CELLS, 1):
        code = cell.format(n=args.n)
        print(f"\n\x1b[1;32mIn [{i}]:\x1b[0m " + code.replace("\n", "\n        "))
        result = shell.run_cell(code, store_history=True)
        if not result.success and "raise ValueError" not in code:
            failed += 1
    print(f"\nDone. The same cells, and more, as notebooks for JupyterLab:\n  {next_step()}")
    return 1 if failed else 0


def next_step(folder: str = "my-notebooks") -> str:
    """The command the quick start ends with: copy the notebooks out, open the first in
    JupyterLab; it runs as printed with the virtual environment not activated.

    Example::

        next_step()
        # '/home/me/.venv/bin/clusterkernel notebooks my-notebooks &&
        #  /home/me/.venv/bin/jupyter lab my-notebooks/00_quickstart.ipynb'
    """
    from clusterkernel.client.teaching_notebooks import command, lab_command

    copy = f"{command('clusterkernel', 'clusterkernel')} notebooks {shlex.quote(folder)}"
    return f"{copy} && {lab_command(f'{folder}/00_quickstart.ipynb')}"


if __name__ == "__main__":
    sys.exit(main())
