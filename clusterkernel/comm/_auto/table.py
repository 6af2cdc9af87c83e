"""``mpiexec -n N python -m clusterkernel.comm._auto.table --out FILE``: measure this
job's rows of ``algorithm="auto"``'s table (:func:`~clusterkernel.comm.tune`) and
add them to FILE, a table that ``CLUSTERKERNEL_AUTO_TABLE`` reads (and that
benchmarks/auto_table.py writes into the package's shipped table).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mpi4py import MPI

from clusterkernel.comm import _auto
from clusterkernel.comm._auto.tune import merge_rows, table_row, tune
from clusterkernel.comm._groups import WORLD


def main(argv: list[str] | None = None) -> None:
    """Measure with :func:`tune` and add this job's rows to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="table file to create or update")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    result = tune(rounds=args.rounds, save=False)
    nodes = _auto.node_count(WORLD)
    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        try:
            table = json.loads(args.out.read_text())  # keeps its other rows and notes
            old = table["rules"]
        except _auto._UNREADABLE:
            table, old = {"version": 1}, []
        rows = [table_row(op, nodes, world.Get_size(), r) for op, r in result.items()]
        table.update(machine=_auto.machine_id(), rules=merge_rows(old, rows))
        args.out.write_text(json.dumps(table, indent=1) + "\n")
        for op, r in result.items():
            print(f"{op}: {r['algs']} split at {r['limits']} bytes")


if __name__ == "__main__":
    main()
