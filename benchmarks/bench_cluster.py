"""Issue 2 benchmark: %%mpi vs raw ipyparallel %%px, and cluster start time.

Run: python benchmarks/bench_cluster.py [--cells 200] [--starts 3]

Both sides run in this one process, interleaved, on the same machine:
- start: clusterkernel.Cluster(n=4).start() vs ipyparallel.Cluster(engines="mpi",
  n=4).start_and_connect_sync() (with the root/oversubscribe environment the raw one
  needs set by hand);
- stop, of the clusters just started: Cluster.stop() (returns once every process is
  gone) vs ipyparallel's stop_cluster_sync();
- round trip of an empty cell on the same 4-rank cluster: %%mpi vs %%px.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import ipyparallel as ipp
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from clusterkernel import Cluster
from clusterkernel.client.mpiexec import MPIRuntime

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

STOPS: dict[str, list[float]] = {"ck": [], "raw": []}


def time_start_ck(n: int) -> float:
    t0 = time.perf_counter()
    c = Cluster(n=n).start()
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()
    c.stop()
    STOPS["ck"].append(time.perf_counter() - t1)
    return dt


def time_start_raw(n: int) -> float:
    t0 = time.perf_counter()
    c = ipp.Cluster(engines="mpi", n=n, log_level=40)
    c.start_and_connect_sync()
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()
    c.stop_cluster_sync()
    STOPS["raw"].append(time.perf_counter() - t1)
    return dt


def cell_round_trips(cells: int) -> tuple[list[float], list[float]]:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clusterkernel")
    cluster = Cluster(n=4).start()
    ck_magics._magics.cluster = cluster
    view = cluster.client[:]
    view.block = True  # %%px waits for the cell, as %%mpi does
    view.activate()  # registers %%px on the same engines
    for _ in range(10):  # warm-up both paths
        shell.run_cell_magic("mpi", "", "pass")
        shell.run_cell_magic("px", "", "pass")

    def cell(magic: str) -> Callable[[], float]:
        def one() -> float:
            t0 = time.perf_counter()
            shell.run_cell_magic(magic, "", "pass")
            return time.perf_counter() - t0

        return one

    got = h.interleaved({"mpi": cell("mpi"), "px": cell("px")}, cells, rotate=False)
    cluster.stop()
    return got["mpi"], got["px"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=200)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--profile", action="store_true", help="cells only (for a profiler)")
    args = ap.parse_args()
    # what a user of raw ipyparallel must set by hand here (root, 2 cores < 4 ranks)
    os.environ.update(MPIRuntime.detect().env({}))
    os.environ["PATH"] = MPIRuntime.detect().env()["PATH"]

    with h.mpi_lock():
        measure(args)


def measure(args: argparse.Namespace) -> None:
    mpi, px = cell_round_trips(args.cells)
    if args.profile:
        return
    m, p = h.median(mpi), h.median(px)
    print(f"empty cell, {args.n} ranks, median of {args.cells} interleaved:")
    print(
        f"  %%mpi {m * 1e3:7.2f} ms   %%px {p * 1e3:7.2f} ms   ratio {m / p:.3f}x (target <= 1.15x)"
    )

    ways = {"ck": lambda: time_start_ck(args.n), "raw": lambda: time_start_raw(args.n)}
    starts = h.interleaved(ways, args.starts, rotate=False)
    c, r = h.median(starts["ck"]), h.median(starts["raw"])
    print(f"cluster start, {args.n} ranks, median of {args.starts} interleaved:")
    print(
        f"  clusterkernel {c:6.2f} s   raw ipyparallel {r:6.2f} s   ratio {c / r:.3f}x (target <= 1.1x)"
    )
    c, r = h.median(STOPS["ck"]), h.median(STOPS["raw"])
    print(f"cluster stop, {args.n} ranks, median of {args.starts} interleaved:")
    print(f"  clusterkernel {c:6.2f} s   raw ipyparallel {r:6.2f} s   ratio {c / r:.3f}x")


if __name__ == "__main__":
    main()
