"""A rank wedged in C code that holds Python's GIL: how long after the cell's timeout the
user has the report and working ranks again.

Run: python benchmarks/bench_wedged.py [--rounds 5] [--ranks 2] [--timeout 3]

Rank N-1 locks a pthread mutex twice through ``ctypes.PyDLL`` (which keeps the GIL):
no signal, control request or closed connection frees it, so the cell's timeout ends
in ``CellInterrupted`` saying the rank holds the GIL, and every rank is restarted.
Timed per round: the cell sent with ``timeout=T`` until ``CellInterrupted`` (printed
as the time past ``T``), then one ``comm.all_reduce`` cell on the restarted ranks.

There is no competitor that does this (raw ipyparallel's ``TimeoutError`` leaves the
engine wedged until the user restarts it by hand): the figure is compared across
commits, the same command run on each (BENCHMARKS.md says which).

Takes the MPI lock (``/tmp/ck-mpi.lock``) itself, or uses the one ``flock`` holds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from clusterkernel import Cluster
from clusterkernel.client.errors import CellInterrupted

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

WEDGE = """
import ctypes
from clusterkernel import comm
if comm.rank() == comm.size() - 1:
    libc = ctypes.PyDLL(None)
    m = ctypes.create_string_buffer(64)
    libc.pthread_mutex_init(m, None)
    libc.pthread_mutex_lock(m)
    libc.pthread_mutex_lock(m)
"""
COLLECTIVE = "import torch\nfrom clusterkernel import comm\nt = torch.ones(4)\ncomm.all_reduce(t)"


def one_round(cluster: Cluster, timeout: float) -> tuple[float, float]:
    """(seconds past the timeout to ``CellInterrupted``, seconds to the next collective)."""
    t0 = time.perf_counter()
    try:
        cluster.run(WEDGE, timeout=timeout)
    except CellInterrupted as e:
        said = "\n".join(e.render(color=False))
        assert "holds Python's GIL" in said and "all ranks were restarted" in said, said
    else:
        raise AssertionError("the wedged cell returned")
    t1 = time.perf_counter()
    cluster.run(COLLECTIVE)
    n = cluster.n
    assert cluster.pull("t") and all(float(v[0]) == n for v in cluster.pull("t").values())
    return t1 - t0 - timeout, time.perf_counter() - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3.0)
    args = ap.parse_args()
    with h.mpi_lock():
        cluster = Cluster(n=args.ranks).start()
        try:
            cluster.run(COLLECTIVE)  # imports done before the first round
            rounds = [one_round(cluster, args.timeout) for _ in range(args.rounds)]
        finally:
            cluster.stop()
    past = [r[0] for r in rounds]
    back = [r[1] for r in rounds]
    print(
        f"{args.ranks} ranks, timeout {args.timeout:g} s, {args.rounds} rounds, load {h.load():.2f}"
    )
    print(f"report past the timeout: {h.median(past):.2f} s [{h.span(past, '.2f')}]")
    print(
        f"then a collective on the restarted ranks: {h.median(back):.2f} s [{h.span(back, '.2f')}]"
    )


if __name__ == "__main__":
    main()
