"""Where does a cell's per-rank cost go in the notebook process?

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_scale_cell_profile.py 16
    .venv/bin/python benchmarks/bench_scale_cell_profile.py 16 --cells 20 --rounds 4

(issue 11.) One ``Cluster(n)``: ``10 * --cells`` x ``cluster.run("pass")`` under cProfile,
the calling thread and ipyparallel's IO thread (where replies and output land) profiled
separately; both profiles printed (own time, cumulative) and saved to
``test-artifacts/bench_scale_<n>_{main,io}.pstats``. Then, without the profiler, an A/B
on the same engines, variants interleaved in ``--rounds`` rounds of ``--cells`` cells:
``as is``, ``as is again`` (the A/A control), ``dateutil dates`` (ipyparallel's own
reply-date parser: clusterkernel's ``_ipp.parse_date`` undone) and ``broadcast view``
(EXPERIMENT: ``Cluster.view`` returning ipyparallel's BroadcastView); each against
``as is`` as a paired ratio with its middle half.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
from _scale import (  # noqa: E402
    REPO,
    CkSide,
    broadcast_views,
    cell_stats,
    dateutil_dates,
    measure_cells,
    round_medians,
)

VARIANTS = {
    "as is": contextlib.nullcontext,
    "as is again": contextlib.nullcontext,
    "dateutil dates": dateutil_dates,
    "broadcast view": broadcast_views,
}


def profile(n: int, cells: int, rounds: int, out_dir: Path) -> None:
    side = CkSide(n)
    side.start()
    try:
        c = side.cluster
        assert c is not None
        mpi = side.ways()["mpi"]
        for _ in range(10):
            mpi("pass")
        main, io_prof = cProfile.Profile(), cProfile.Profile()
        loop = c.client._io_loop  # ipyparallel's IO thread: replies and output land there
        started = threading.Event()

        def _enable_io() -> None:
            io_prof.enable()
            started.set()

        loop.add_callback(_enable_io)
        started.wait(5)
        c0, w0 = time.process_time(), time.perf_counter()
        main.enable()
        for _ in range(cells * 10):
            mpi("pass")
        main.disable()
        c1, w1 = time.process_time(), time.perf_counter()
        stopped = threading.Event()
        loop.add_callback(lambda: (io_prof.disable(), stopped.set()))
        stopped.wait(5)
        print(
            f"\nprofile: {cells * 10} x cluster.run('pass') at {n} ranks: "
            f"{1e2 * (w1 - w0) / cells:.1f} ms wall, {1e2 * (c1 - c0) / cells:.1f} ms CPU per "
            "cell (profiled, so slower than the tables)"
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, prof in (("main", main), ("io", io_prof)):
            path = out_dir / f"bench_scale_{n}_{name}.pstats"
            prof.dump_stats(path)
            print(f"\n--- {name} thread (by own time), saved to {path}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
            print(f"--- {name} thread (cumulative)")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)

        def way(ctx):
            def run(code: str) -> object:
                with ctx():
                    return mpi(code)

            return run

        ab = measure_cells({k: way(v) for k, v in VARIANTS.items()}, rounds, cells)
        print(
            f"\nA/B at {n} ranks, {rounds} rounds x {cells} cells: median ms per cell; "
            "vs as is: paired per round [middle half]"
        )
        print("| `cluster.run` | empty: wall | vs as is | empty: CPU | print: wall | vs as is "
              "| print: CPU |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for k in VARIANTS:
            cols = [k]
            for kind in ("empty", "print"):
                rm = {v: round_medians(ab[kind][v]) for v in VARIANTS}
                cols += [
                    f"{cell_stats(ab[kind][k], 0)[0]:.1f}",
                    h.fmt_ratio(h.paired(rm[k], rm["as is"])),
                    f"{cell_stats(ab[kind][k], 1)[0]:.1f}",
                ]
            print("| " + " | ".join(cols) + " |")
    finally:
        side.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ranks", type=int, nargs="?", default=16)
    ap.add_argument("--cells", type=int, default=20, help="cells per variant and round; "
                    "10x this many are profiled")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    with h.mpi_lock():
        print(f"load average {h.load():.1f}")
        profile(args.ranks, args.cells, args.rounds, REPO / "test-artifacts")
        print(f"load average {h.load():.1f}")


if __name__ == "__main__":
    main()
