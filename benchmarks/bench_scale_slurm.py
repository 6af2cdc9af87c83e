"""Slurm, 4 ranks on 2 nodes: how do start and cells compare with ipyparallel's own Slurm launcher?

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_scale_slurm.py --starts 3

(issue 11.) The two-node test bed of ``tests/slurm/_testbed.py`` (node2 a network + UTS
namespace). Starts alternate, ``--starts`` each: ``Cluster(n=4, launcher="slurm",
nodes=2)`` in this process, and ``ipyparallel.Cluster(engines="slurm", n=4,
controller_ip=bed.controller_address)`` in a worker process that never imports
clusterkernel (``_raw_ipp.py``), with a batch template that spreads the engines 2+2
(``--ntasks-per-node=2``) and starts them as one MPI job (``srun --mpi=pmix ...
--mpi``), both from a temporary directory (ipyparallel writes its batch file in the
current one). Cells after the first start of each: ``cluster.run`` and ``%%px``
interleaved on clusterkernel's cluster (``run / %%px`` paired per round), then
``%%px`` on the raw one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
from _scale import (  # noqa: E402
    CELLS,
    REPO,
    CkSide,
    RawSide,
    cell_stats,
    measure_cells,
    round_medians,
)

SLURM_TEMPLATE = """#!/bin/sh
#SBATCH --export=ALL
#SBATCH --job-name=ipengine-{cluster_id}
#SBATCH --ntasks={n}
#SBATCH --ntasks-per-node=2
srun --mpi=pmix {program_and_args} --mpi
"""


def run_slurm(starts: int, rounds: int, cells: int) -> dict:
    from tests.slurm._testbed import SlurmTestbed

    res: dict = {"start": {}, "cells": {}, "load_before": h.load()}
    bed = SlurmTestbed()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    tmp = tempfile.mkdtemp(prefix="ck-bench-slurm-")
    try:
        bed.start()
        os.environ.update(bed.env)  # the raw worker inherits it, and the directory
        os.chdir(tmp)
        for _ in range(starts):
            for side in (
                CkSide(4, launcher="slurm", nodes=2),
                RawSide(
                    4,
                    engines="slurm",
                    name="raw slurm",
                    controller_ip=bed.controller_address,
                    batch_template=SLURM_TEMPLATE,
                ),
            ):
                try:
                    t = side.start()
                    res["start"].setdefault(side.name, []).append(t)
                    print(f"[slurm] {side.name} start {t:.2f} s", flush=True)
                    if side.name not in res["cells"]:
                        if isinstance(side, CkSide):
                            ways = side.ways()
                            ways = {"mpi": ways["mpi"], "px": ways["px"]}
                            got = measure_cells(ways, rounds, cells)
                        else:
                            got = side.cells(["px"], rounds, cells)
                        res["cells"][side.name] = got
                finally:
                    side.stop()
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        bed.stop()
    res["load_after"] = h.load()
    return res


def report(res: dict) -> None:
    print(f"\nload average before {res['load_before']:.1f}, after {res['load_after']:.1f}")
    t = res["start"]
    ck, raw = t["clusterkernel"], t["raw slurm"]
    print("\nSlurm, 4 ranks on 2 nodes (2+2):")
    print("| measurement | clusterkernel | raw ipyparallel (Slurm launcher) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| start, median ({', '.join(f'{x:.1f}' for x in ck)} / "
        f"{', '.join(f'{x:.1f}' for x in raw)} s) | {h.median(ck):.2f} s "
        f"| {h.median(raw):.2f} s | {h.median(ck) / h.median(raw):.2f}x |"
    )
    for kind in CELLS:
        mine = res["cells"]["clusterkernel"][kind]
        a, b = cell_stats(mine["mpi"], 0), cell_stats(mine["px"], 0)
        c = cell_stats(res["cells"]["raw slurm"][kind]["px"], 0)
        ratio = h.paired(round_medians(mine["mpi"]), round_medians(mine["px"]))
        print(
            f"| {kind} cell, ms [round medians] | {a[0]:.1f} [{a[1]:.1f}-{a[2]:.1f}] "
            f"| `%%px` same cluster {b[0]:.1f} [{b[1]:.1f}-{b[2]:.1f}]; raw process and "
            f"cluster {c[0]:.1f} [{c[1]:.1f}-{c[2]:.1f}] | {h.fmt_ratio(ratio)} "
            f"({a[0] / c[0]:.2f}x of the raw cluster's) |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=3, help="starts of each side")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cells", type=int, default=20, help="cells per way per round")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    with h.mpi_lock():
        res = run_slurm(args.starts, args.rounds, args.cells)
    report(res)
    if args.json:
        args.json.write_text(json.dumps(res))


if __name__ == "__main__":
    main()
