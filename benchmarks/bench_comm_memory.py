"""Does the memory under a buffer decide an allreduce's speed? mpi4py and comm on
numpy arrays, torch tensors and huge pages, side by side.

Run from the repository root (takes the benchmark lock itself)::

    flock /tmp/ck-ranks.lock .venv/bin/python benchmarks/bench_comm_memory.py --ranks 2 --sizes 4MB,16MB

Question: bench_comm's mpi4py (``Allreduce`` on a numpy array) beat every comm algorithm
on a torch tensor at 4-16 MB on 2 ranks. Is that the buffer's memory (numpy asks the
kernel for huge pages on large arrays, torch's allocator does not) or comm's code? Each
way below reduces float32 zeros in place, SUM, all in one job, interleaved over rounds
(the slowest rank's mean per call; best round and the median of rounds shown):

- ``np``: ``MPI.COMM_WORLD.Allreduce(IN_PLACE, np.zeros(n))``, as bench_comm's mpi4py
- ``np_touched``: the same on ``np.ones(n) * 0`` (pages written before the first call)
- ``torch_view``: mpi4py ``Allreduce`` on ``torch.zeros(n).numpy()``
- ``torch_huge``: the same on a tensor collapsed into huge pages first
- ``comm_mpi``: ``comm.all_reduce(torch.zeros(n), algorithm="mpi")``
- ``comm_mpi_np``: the same on ``torch.from_numpy(np.zeros(n))``
- ``comm_mpi_huge``: the same on a tensor collapsed into huge pages before its first
  call (comm itself collapses a buffer at its third call)
- ``comm_shm`` / ``comm_shm_np``: ``algorithm="shm"`` on those two
- ``comm_auto`` / ``comm_auto_np``: the default on those two (its pick printed)

and, per buffer, how much of it is in huge pages at the end (``AnonHugePages``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _harness import median, mpi_lock  # noqa: E402
from bench_comm import _fmt_bytes, _iters, _parse_bytes, mpi_launch, time_calls  # noqa: E402

WAYS = (
    "np",
    "np_touched",
    "torch_view",
    "torch_huge",
    "comm_mpi",
    "comm_mpi_np",
    "comm_mpi_huge",
    "comm_shm",
    "comm_shm_np",
    "comm_auto",
    "comm_auto_np",
)


def worker(out_path: str, sizes: list[int], rounds: int) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    from clusterkernel import comm
    from clusterkernel.comm import _hugepages

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rows = []
    for nb in sizes:
        n = nb // 4
        bufs = {
            "np": np.zeros(n, dtype=np.float32),
            "np_touched": np.ones(n, dtype=np.float32) * 0,
            "torch_view": torch.zeros(n).numpy(),
            "torch_huge": torch.zeros(n).numpy(),
        }
        _hugepages.collapse(bufs["torch_huge"].ctypes.data, nb)
        tensors = {
            "comm_mpi": torch.zeros(n),
            "comm_mpi_np": torch.from_numpy(np.zeros(n, dtype=np.float32)),
            "comm_mpi_huge": torch.zeros(n),
            "comm_shm": torch.zeros(n),
            "comm_shm_np": torch.from_numpy(np.zeros(n, dtype=np.float32)),
            "comm_auto": torch.zeros(n),
            "comm_auto_np": torch.from_numpy(np.zeros(n, dtype=np.float32)),
        }
        huge = tensors["comm_mpi_huge"]
        _hugepages.collapse(huge.data_ptr(), nb)
        ways = {k: (lambda a=a: world.Allreduce(MPI.IN_PLACE, a)) for k, a in bufs.items()}
        for k, t in tensors.items():
            alg = k.split("_")[1]
            if alg == "auto":
                ways[k] = lambda t=t: comm.all_reduce(t)
            else:
                ways[k] = lambda t=t, alg=alg: comm.all_reduce(t, algorithm=alg)
        iters = _iters(nb)
        times: dict[str, list[float]] = {k: [] for k in ways}
        for r in range(rounds):
            keys = list(ways)
            shift = r % len(keys)
            for k in keys[shift:] + keys[:shift]:
                times[k].append(time_calls(world, ways[k], iters))
        huge = {k: _hugepages.huge_kb(a.ctypes.data) for k, a in bufs.items()}
        huge.update({k: _hugepages.huge_kb(t.data_ptr()) for k, t in tensors.items()})
        state = comm.auto_state()
        picks = {
            f"{op} {size}": f"{s['algorithm']} ({s['why']})" for (op, size), s in state.items()
        }
        rows.append({"bytes": nb, "times": times, "huge_kb": huge, "auto": picks})
        comm.barrier()
    if world.Get_rank() == 0:
        Path(out_path).write_text(json.dumps(rows))


def parent(args: argparse.Namespace) -> None:
    import subprocess

    rt, env = mpi_launch()
    for n in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            cmd = [*rt.command(n), sys.executable, __file__, "--worker", str(out)]
            cmd += ["--sizes", args.sizes, "--rounds", str(args.rounds)]
            subprocess.run(cmd, env=env, check=True, timeout=1800)
            rows = json.loads(out.read_text())
        print(f"\n=== {n} ranks, us per call: best round / median of {args.rounds} rounds ===")
        for row in rows:
            print(f"{_fmt_bytes(row['bytes'])}: auto's arms {row['auto']}")
            base = median(row["times"]["np"])
            for k in WAYS:
                ts = row["times"][k]
                print(
                    f"  {k:13s} {min(ts) * 1e6:9.1f} {median(ts) * 1e6:9.1f}  "
                    f"median/np {median(ts) / base:5.2f}x  huge pages {row['huge_kb'][k]} kB"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2])
    ap.add_argument("--sizes", default="4MB,16MB")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.path.insert(0, str(REPO))
        worker(args.worker, [_parse_bytes(s) for s in args.sizes.split(",")], args.rounds)
    else:
        with mpi_lock():
            parent(args)


if __name__ == "__main__":
    main()
