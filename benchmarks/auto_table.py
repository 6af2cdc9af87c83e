"""Measure the table that ``algorithm="auto"`` ships with (clusterkernel/comm/_auto/auto_table.json).

Run from the repository root, under the MPI lock, on a quiet machine::

    python benchmarks/auto_table.py              # 2 and 4 ranks on this machine
    python benchmarks/auto_table.py --ranks 2 --out /tmp/table.json

Each job runs ``comm.tune(save=False)`` (every algorithm per op and size, side by
side) and adds its rows to the table file; the printout is the crossovers it found.
A user's own machine gets its own table with ``comm.tune()`` (cached per machine).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import _harness as h
from bench_comm import mpi_launch

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "clusterkernel" / "comm" / "_auto" / "auto_table.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4", help="comma-separated job sizes")
    parser.add_argument("--out", type=Path, default=SHIPPED)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rt, env = mpi_launch()
    with h.mpi_lock():
        for n in (int(r) for r in args.ranks.split(",")):
            print(f"=== {n} ranks ===", flush=True)
            cmd = [*rt.command(n), sys.executable, "-m", "clusterkernel.comm._auto.table"]
            cmd += ["--out", str(args.out), "--rounds", str(args.rounds)]
            subprocess.run(cmd, env=env, check=True, timeout=1800)


if __name__ == "__main__":
    main()
