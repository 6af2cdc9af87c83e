"""Is a 64 MB allreduce's time steady from one job to the next? (issue 27 item 7)

Run from the repository root::

    python benchmarks/bench_64mb_spread.py              # 10 jobs of 2 ranks
    python benchmarks/bench_64mb_spread.py --jobs 5 --ranks 4

Each job is a fresh ``mpiexec -n N``: the default ``comm.all_reduce`` of a plain
64 MB float32 tensor and raw mpi4py (``Allreduce(IN_PLACE, ndarray)``) on an array of
the same size, interleaved, 12 calls each after 3 warm-up calls. Per job it prints
the median of each (slowest rank per call), what ``auto`` ran (from the timing
record), whether the tensor's pages became huge pages (``AnonHugePages`` of its
mapping), how often the ranks were preempted inside the timed calls (involuntary
context switches, summed over ranks and calls), and at the end the spread over jobs (min, median, max). ``--bind`` runs the jobs with
each rank bound to its own core.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import _harness as h  # noqa: E402

MB = 1 << 20
CALLS = 12


def worker() -> None:
    import torch
    from mpi4py import MPI

    from clusterkernel import comm, metrics
    from clusterkernel.comm._hugepages import huge_kb

    world = MPI.COMM_WORLD
    n = 64 * MB // 4
    t = torch.ones(n)
    a = t.numpy().copy()
    times: dict[str, list[float]] = {"comm": [], "mpi4py": []}
    switches = dict.fromkeys(times, 0)  # involuntary context switches inside the calls
    for i in range(3 + CALLS):
        for side in ("comm", "mpi4py"):
            world.Barrier()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
            t0 = time.perf_counter()
            if side == "comm":
                comm.all_reduce(t)
            else:
                world.Allreduce(MPI.IN_PLACE, a)
            took = time.perf_counter() - t0
            preempted = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - before
            took = world.allreduce(took, op=MPI.MAX)
            if i >= 3:
                times[side].append(took)
                switches[side] += world.allreduce(preempted)
    alg = metrics.recorder().comm[-1][2]
    huge = world.gather(huge_kb(t.data_ptr()), root=0)
    if world.Get_rank() == 0:
        out = {k: h.median(v) for k, v in times.items()}
        extra = {"alg": alg, "huge_kb": huge, "switches": switches}
        print("RESULT " + json.dumps({**out, **extra}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--bind", action="store_true", help="bind each rank to a core")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    print(
        f"{args.ranks} ranks | comm.all_reduce | mpi4py | comm / mpi4py | auto ran | huge kB"
        " | preempted in comm, mpi4py"
    )
    print("---|---|---|---|---|---|---")
    with h.mpi_lock():
        rows = []
        for job in range(args.jobs):
            r = h.mpi_job(__file__, args.ranks, bind="core" if args.bind else "none")
            rows.append(r)
            ratio = r["comm"] / r["mpi4py"]
            huge = ", ".join(str(k) for k in r["huge_kb"])
            print(
                f"job {job + 1} | {r['comm'] * 1e3:.1f} ms | {r['mpi4py'] * 1e3:.1f} ms | "
                f"{ratio:.2f}x | {r['alg']} | {huge} | {r['switches']['comm']}, "
                f"{r['switches']['mpi4py']}",
                flush=True,
            )
    for side in ("comm", "mpi4py"):
        v = sorted(r[side] * 1e3 for r in rows)
        print(f"{side}: min {v[0]:.1f} ms, median {h.median(v):.1f}, max {v[-1]:.1f}")


if __name__ == "__main__":
    main()
