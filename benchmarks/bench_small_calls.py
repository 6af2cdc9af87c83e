"""Small allreduces against the MPI floor: what ``comm.all_reduce`` adds at 64 B and 4 KB.

Run from the repository root (it takes the one benchmark lock, :mod:`_harness`)::

    python benchmarks/bench_small_calls.py               # 2 and 4 ranks, 15 rounds
    python benchmarks/bench_small_calls.py --ranks 2 --rounds 9

Starts itself under ``mpiexec -n N``. In one job, interleaved over rounds (the
order shuffled each round, the same on every rank), each variant makes 3,000
float32 allreduces of 64 B and of 4 KB:

- ``mpi4py``: raw ``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)`` on a preallocated
  numpy array: the floor
- ``mpi4py-again``: the same once more in the round (the A/A control: what two runs
  of the same code differ by here)
- ``mpi4py-tensor``: raw mpi4py on ``t.numpy()`` taken each call (what a user
  writing mpi4py against torch tensors pays)
- ``default``: ``comm.all_reduce(t)`` as shipped: flight recorder on, timing
  record on, the check of new signatures
- ``no-flight``: the same with the flight recorder off (``comm.set_flight(False)``)
- ``no-check``: the same with ``set_check("off")``
- ``no-record``: the same with the metrics recorder off (no timing record)
- ``bare``: flight recorder, check and timing record all off
- ``python``: ``default`` with the C fast path off (``_fastpath.enable(False)``)
- ``avg-async``: ``comm.all_reduce(t, op=comm.AVG, async_op=True).wait()``, the
  shape of DataParallel's bucket hook
- ``python-pyw``, ``avg-async-pyw``: ``python`` and ``avg-async`` with the Python
  path's ring writers in Python (``_fastpath.writers(False)``: what runs where the
  extension is not built) instead of the C extension's

A time is the slowest rank's mean per call in one round; the table shows the
median over rounds, and ratios to ``mpi4py`` are paired per round (median and
middle half, 25th-75th percentile). The last table gives what each part of the
default costs per call: ``default`` minus the variant without it, paired per round
(median microseconds).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import _harness as h  # noqa: E402

SIZES = [64, 4096]
ITERS = 3000
VARIANTS = [
    "mpi4py",
    "mpi4py-again",
    "mpi4py-tensor",
    "default",
    "no-flight",
    "no-check",
    "no-record",
    "bare",
    "python",
    "avg-async",
    "python-pyw",
    "avg-async-pyw",
]


def worker(rounds: int) -> None:
    import torch
    from mpi4py import MPI

    from clusterkernel import comm, metrics
    from clusterkernel.comm import _fastpath

    world = MPI.COMM_WORLD
    rng = random.Random(11)  # the same order on every rank

    rec = metrics.recorder()

    def setup(variant: str) -> None:
        comm.set_flight(variant not in ("bare", "no-flight"))
        comm.set_check("off" if variant in ("bare", "no-check") else "new")
        rec.enabled = variant not in ("bare", "no-record")
        if _fastpath.available():
            _fastpath.enable(not variant.startswith("python"))
            _fastpath.writers(not variant.endswith("-pyw"))

    def loop(variant: str, t, a) -> None:
        allreduce, in_place = world.Allreduce, MPI.IN_PLACE
        if variant.startswith("mpi4py") and variant != "mpi4py-tensor":
            for _ in range(ITERS):
                allreduce(in_place, a)
        elif variant == "mpi4py-tensor":
            for _ in range(ITERS):
                allreduce(in_place, t.numpy())
        elif variant.startswith("avg-async"):
            avg, all_reduce = comm.AVG, comm.all_reduce
            for _ in range(ITERS):
                all_reduce(t, op=avg, async_op=True).wait()
        else:
            all_reduce = comm.all_reduce
            for _ in range(ITERS):
                all_reduce(t)

    results: dict[int, dict[str, list[float]]] = {}
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        a = t.numpy().copy()
        per = results.setdefault(nbytes, {v: [] for v in VARIANTS})
        for variant in VARIANTS:  # warm each path (first signatures agreed)
            setup(variant)
            loop(variant, t, a)
        for _ in range(rounds):
            order = VARIANTS[:]
            rng.shuffle(order)
            for variant in order:
                setup(variant)
                t.fill_(1.0)
                a.fill(1.0)
                world.Barrier()
                t0 = time.perf_counter()
                loop(variant, t, a)
                mean = (time.perf_counter() - t0) / ITERS
                per[variant].append(world.allreduce(mean, op=MPI.MAX))
    setup("default")
    if world.Get_rank() == 0:
        fast = _fastpath.available()
        print("RESULT " + json.dumps({"ranks": world.Get_size(), "fast": fast, "results": results}))


def _ratio(per: dict, num: str) -> str:
    return h.fmt_ratio(h.paired(per[num], per["mpi4py"]))


def report(res: dict) -> str:
    head = f"{res['ranks']} ranks (C path {'built' if res['fast'] else 'absent'})"
    lines = [f"{head} | " + " | ".join(VARIANTS), "---|" * len(VARIANTS) + "---"]
    for nbytes, per in res["results"].items():
        cells = " | ".join(f"{h.median(per[v]) * 1e6:.2f} us" for v in VARIANTS)
        lines.append(f"{nbytes} B | {cells}")
    lines += ["", f"{res['ranks']} ranks: / mpi4py | " + " | ".join(VARIANTS[1:])]
    lines.append("---|" * (len(VARIANTS) - 1) + "---")
    for nbytes, per in res["results"].items():
        lines.append(f"{nbytes} B | " + " | ".join(_ratio(per, v) for v in VARIANTS[1:]))
    parts = [("flight entry", "no-flight"), ("check", "no-check"), ("timing record", "no-record")]
    parts += [("all three", "bare"), ("C path vs Python", "python")]
    writers = [("python", "python-pyw"), ("avg-async", "avg-async-pyw")]
    lines += ["", f"{res['ranks']} ranks: cost per call | " + " | ".join(p for p, _ in parts)]
    lines.append("---|" * len(parts) + "---")
    for nbytes, per in res["results"].items():
        cells = [_cost(per, without) for _, without in parts]
        lines.append(f"{nbytes} B | " + " | ".join(cells))
    lines += ["", f"{res['ranks']} ranks: ring writers in Python minus in C | python | avg-async"]
    lines.append("---|---|---")
    for nbytes, per in res["results"].items():
        cells = [_cost(per, c, py) for c, py in writers]
        lines.append(f"{nbytes} B | " + " | ".join(cells))
    return "\n".join(lines)


def _cost(per: dict, without: str, base: str = "default") -> str:
    """``base`` minus ``without``, paired per round (median microseconds)."""
    diffs = [(a - b) * 1e6 for a, b in zip(per[base], per[without])]
    return f"{h.median(diffs):+.2f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds)
        return
    with h.mpi_lock():
        for n in args.ranks:
            print(report(h.mpi_job(__file__, n, ["--rounds", str(args.rounds)])), flush=True)
            print()


if __name__ == "__main__":
    main()
