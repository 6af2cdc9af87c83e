"""The quick start, readable in a terminal: ``clusterkernel-quickstart``.

Runs a few cells through a real IPython shell, exactly as you would type them,
echoing each one first: start 4 ranks, run code on all of them, move a tensor
with a collective, push and pull a variable, see an error grouped by rank, stop.
The same cells make up the notebook ``00_quickstart.ipynb`` for JupyterLab, which
``clusterkernel notebooks DIR`` copies out of the installed package with the others.
"""

from __future__ import annotations

import argparse
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
    print(
        "\nDone. The same cells, and more, as notebooks for JupyterLab:\n"
        "  clusterkernel notebooks my-notebooks && jupyter lab my-notebooks/00_quickstart.ipynb"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
