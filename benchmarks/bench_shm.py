"""Shared-memory allreduce (``algorithm="shm"``) beside MPI, the ring and the memory floor.

Run from the repository root (under the MPI lock, on a quiet machine)::

    python benchmarks/bench_shm.py                       # 2 and 4 ranks; 4 KB, 1 MB, 64 MB
    python benchmarks/bench_shm.py --ranks 2 --sizes 4KB,4MB

Starts itself under ``mpiexec -n N``. Inside one job every method runs interleaved
over several rounds; a time is the slowest rank's mean per call, the best round is
kept (the machine is shared and noisy). float32 SUM, in place, OMP_NUM_THREADS=1.

- ``mpi4py``: ``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, ndarray)``
- ``mpi`` / ``ring`` / ``shm``: ``comm.all_reduce(t, algorithm=...)``
- ``floor``: the data movement of ``shm`` alone, every rank at once, with no
  synchronization: copy the input into this rank's slot of the same shared window,
  reduce this rank's share across all slots, copy the whole result out. No
  algorithm that moves the data through shared memory this way can beat it
  (``shm`` streams cache-sized chunks through small stage buffers instead, which
  can beat it).
- ``shm_zc``: ``comm.all_reduce(t, algorithm="shm")`` on a tensor from
  ``comm.shm_empty``: no copy in or out.
- ``floor_zc``: the data movement of ``shm_zc`` alone, every rank at once, with no
  synchronization: reduce this rank's share across all ranks' ``shm_empty``
  tensors into its own, then write that share into every other rank's tensor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _harness as h
from bench_comm import _fmt_bytes, _iters, _parse_bytes, run_job, time_calls  # one policy

REPO = Path(__file__).resolve().parents[1]
KB, MB = 1024, 1024 * 1024
ROUNDS = 5
METHODS = ("mpi4py", "mpi", "ring", "shm", "floor", "shm_zc", "floor_zc")


def report(n: int, rows: list[dict]) -> None:
    print(f"\n=== {n} ranks: time per allreduce (us), best of {ROUNDS} rounds ===")
    head = " | ".join(f"{m:>9}" for m in METHODS)
    ratios = ("shm/mpi4py", "floor/shm", "zc/mpi4py", "flzc/zc")
    print(f"{'size':>6} | {head} | " + " | ".join(f"{r:>10}" for r in ratios))
    for row in rows:
        cells = " | ".join(f"{row[m] * 1e6:9.1f}" for m in METHODS)
        got = (
            row["mpi4py"] / row["shm"],
            row["floor"] / row["shm"],
            row["mpi4py"] / row["shm_zc"],
            row["floor_zc"] / row["shm_zc"],
        )
        print(f"{_fmt_bytes(row['bytes']):>6} | {cells} | " + " | ".join(f"{x:9.2f}x" for x in got))
    print(
        "(shm/mpi4py, zc/mpi4py: speed relative to mpi4py; floor/shm: fraction of the floor's "
        "speed reached by shm; flzc/zc: the same for shm_zc and floor_zc)"
    )


def parent(args: argparse.Namespace) -> None:
    with h.mpi_lock():
        for n in args.ranks:
            report(n, run_job(n, args.sizes, __file__))


def worker(out_path: str, sizes: list[int]) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    from clusterkernel import comm, metrics
    from clusterkernel.comm._shm import steps as shm_steps

    torch.set_num_threads(1)
    metrics.enable(False)  # the same for every method; this measures the data path
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()

    def timed(fn, iters: int) -> float:
        return time_calls(world, fn, iters)

    rows = []
    for nb in sizes:
        count = nb // 4
        arr = np.zeros(count, dtype=np.float32)  # zeros stay zeros under repeated sums
        ts = {m: torch.zeros(count) for m in ("mpi", "ring", "shm", "floor")}
        comm.all_reduce(ts["shm"], algorithm="shm")  # makes the segment
        seg = comm.WORLD._shm
        seg.reserve(nb)  # the floor's full-size slots (collective: every rank grows)
        slots = seg.rows(0, torch.float32)[:, :count]
        a, b = shm_steps.share(count, n, rank, 4)
        ft = ts["floor"]

        def floor(slots=slots, a=a, b=b, ft=ft):
            slots[rank].copy_(ft)
            acc = slots[0, a:b]
            for j in range(1, n):
                acc.add_(slots[j, a:b])
            ft.copy_(slots[0])

        zt = comm.shm_empty(count)  # collective: every rank, same shape
        zt.zero_()
        arena = seg.arenas[-1]
        zs = [p[: count * 4].view(torch.float32) for p in arena.parts]

        def floor_zc(zs=zs, a=a, b=b):
            acc = zs[rank][a:b]
            for j in range(n):
                if j != rank:
                    acc.add_(zs[j][a:b])
            for j in range(n):
                if j != rank:
                    zs[j][a:b].copy_(acc)

        methods = {
            "mpi4py": lambda arr=arr: world.Allreduce(MPI.IN_PLACE, arr),
            "mpi": lambda t=ts["mpi"]: comm.all_reduce(t, algorithm="mpi"),
            "ring": lambda t=ts["ring"]: comm.all_reduce(t, algorithm="ring"),
            "shm": lambda t=ts["shm"]: comm.all_reduce(t, algorithm="shm"),
            "floor": floor,
            "shm_zc": lambda t=zt: comm.all_reduce(t, algorithm="shm"),
            "floor_zc": floor_zc,
        }
        iters = _iters(nb)
        ways = {name: (lambda fn=fn, k=iters: timed(fn, k)) for name, fn in methods.items()}
        # interleaved: noise hits every method alike; the same order on every rank
        best = {name: min(ts) for name, ts in h.interleaved(ways, ROUNDS, rotate=False).items()}
        best["bytes"] = nb
        rows.append(best)
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", default="4KB,1MB,64MB")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [_parse_bytes(s) for s in args.sizes.split(",")]
    if args.worker:
        sys.path.insert(0, str(REPO))
        worker(args.worker, sizes)
    else:
        args.sizes = sizes
        parent(args)


if __name__ == "__main__":
    main()
