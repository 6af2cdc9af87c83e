"""What an MPI rank's start costs: Open MPI's default transports against clusterkernel's.

Run (from the repository root; takes the one MPI lock itself):

    python benchmarks/bench_mpi_init.py [--rounds 7] [--ranks 1 2 4]

Each job is ``mpiexec -n N python -c "import mpi4py.MPI"`` (``MPI_Init`` and nothing
else), timed from the launch to its end, in three environments, interleaved per round:

- ``default``: what a user's own ``mpiexec`` gets (``MPIRuntime.env`` without the
  one-machine transports: root and oversubscription only);
- ``no-ofi``: the same with only Open MPI's OFI transport left out (``btl=^ofi``);
- ``clusterkernel``: ``MPIRuntime.env()`` as every job on this machine gets it
  (shared memory and self only, ``LOCAL_ONLY_ENV``).

Why it exists: Open MPI 5.0's OFI transport (``btl/ofi``) sleeps one second in its
component's close, which every process runs at ``MPI_Init`` when the transport is
not used. A job on one machine never uses it; naming the transports skips it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import median, mpi_lock, order  # noqa: E402

from clusterkernel.client.mpiexec import LOCAL_ONLY_ENV, MPIRuntime  # noqa: E402


def environments(rt: MPIRuntime) -> dict[str, dict[str, str]]:
    ours = rt.env()
    default = {k: v for k, v in ours.items() if k not in LOCAL_ONLY_ENV}
    return {
        "default": default,
        "no-ofi": {**default, "OMPI_MCA_btl": "^ofi"},
        "clusterkernel": ours,
    }


def one_job(rt: MPIRuntime, n: int, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [*rt.command(n), sys.executable, "-c", "import mpi4py.MPI"],
        env=env, check=True, timeout=120,
    )  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    rt = MPIRuntime.detect()
    envs = environments(rt)
    times: dict[tuple[int, str], list[float]] = {}
    with mpi_lock():
        for r in range(args.rounds):
            for n in args.ranks:
                for name in order(list(envs), r):
                    times.setdefault((n, name), []).append(one_job(rt, n, envs[name]))
    names = list(envs)
    print(f"ranks | {' | '.join(names)} | default / clusterkernel")
    print("---|" + "---|" * len(names) + "---")
    for n in args.ranks:
        cells = [f"{median(times[n, name]):.2f} s" for name in names]
        ratio = median(times[n, "default"]) / median(times[n, "clusterkernel"])
        print(f"{n} | {' | '.join(cells)} | {ratio:.2f}x")
    print(f"\nmedian of {args.rounds} rounds, launch to end of `import mpi4py.MPI`")


if __name__ == "__main__":
    main()
