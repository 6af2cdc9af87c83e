"""What the flight recorder and the default mismatch check cost an allreduce.

Run from the repository root::

    python benchmarks/bench_flight.py              # 2 and 4 ranks
    python benchmarks/bench_flight.py --ranks 4 --rounds 9

Starts itself under ``mpiexec -n N``. In one job, interleaved over several rounds
(the order shuffled each round, the same on every rank), each variant runs
``comm.all_reduce`` on float32 at 4 KB, 64 KB and 1 MB:

- ``mpi4py``: raw ``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, ndarray)``
- ``bare``: ``comm.all_reduce`` with the flight recorder off and ``set_check("off")``
- ``bare-again``: ``bare`` once more in the same round (the A/A control: what two
  runs of the same code differ by on this machine)
- ``flight``: flight recorder on, no check
- ``default``: flight recorder on and the default check (new signatures), as shipped
- ``check-all``: ``set_check("every")``, every call checked (for reference)

A time is the slowest rank's mean per call in one round; the table shows the
median over rounds. Costs are judged on paired rounds (every variant runs once in
every round): the median of a per-round ratio and the middle half of those ratios
(25th to 75th percentile). Three ratios are shown: ``bare-again / bare`` (the
noise: the same code twice), ``flight / bare`` (the recorder, whose target is
"within noise of off") and ``default / flight`` (the default mismatch check, whose
target is "small at 4 KB"). Two readings of "within noise" are printed: ``A/A``
when the median ratio lies inside the middle half of the noise ratios (the cost is
no larger than what two runs of the same code differ by), and ``1.0`` when 1.0 lies
inside the ratio's own middle half (no systematic difference at all; with many
rounds this flags even a 0.3% cost).
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

KB = 1024
SIZES = [4 * KB, 64 * KB, 1024 * KB]
VARIANTS = ["mpi4py", "bare", "bare-again", "flight", "default", "check-all"]
# (label, numerator, denominator) of the paired ratios in the report
RATIOS = [
    ("noise: bare-again / bare", "bare-again", "bare"),
    ("recorder: flight / bare", "flight", "bare"),
    ("check: default / flight", "default", "flight"),
]


def _iters(nbytes: int) -> int:
    return max(50, min(3000, (64 * 1024 * 1024) // nbytes))


def worker(rounds: int) -> None:
    import torch
    from mpi4py import MPI

    from clusterkernel import comm

    world = MPI.COMM_WORLD
    rng = random.Random(7)  # the same order on every rank

    def setup(variant: str) -> None:
        bare = variant.startswith("bare")
        comm.set_flight(not bare)
        off = bare or variant == "flight"
        comm.set_check("off" if off else "every" if variant == "check-all" else "new")

    results: dict[int, dict[str, list[float]]] = {}
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        a = t.numpy()
        iters = _iters(nbytes)
        per = results.setdefault(nbytes, {v: [] for v in VARIANTS})
        for variant in VARIANTS:  # warm up each path once (first signature checks)
            setup(variant)
            comm.all_reduce(t)
        for _ in range(rounds):
            order = VARIANTS[:]
            rng.shuffle(order)
            for variant in order:
                setup(variant)
                world.Barrier()
                t0 = time.perf_counter()
                if variant == "mpi4py":
                    for _ in range(iters):
                        world.Allreduce(MPI.IN_PLACE, a)
                else:
                    for _ in range(iters):
                        comm.all_reduce(t)
                mean = (time.perf_counter() - t0) / iters
                per[variant].append(world.allreduce(mean, op=MPI.MAX))
    setup("default")
    if world.Get_rank() == 0:
        print("RESULT " + json.dumps({"ranks": world.Get_size(), "results": results}))


def _ratios(per: dict, num: str, den: str) -> tuple[float, float, float]:
    return h.paired(per[num], per[den])


def _paired(per: dict, num: str, den: str) -> str:
    ratio = _ratios(per, num, den)
    text = h.fmt_ratio(ratio, 3)
    if num == "bare-again":
        return text
    return f"{text} within noise: {h.aa_verdict(ratio, _ratios(per, 'bare-again', 'bare'))}"


def report(res: dict) -> str:
    labels = [label for label, _, _ in RATIOS]
    lines = [
        f"{res['ranks']} ranks | " + " | ".join(VARIANTS),
        "---|" + "---|" * (len(VARIANTS) - 1) + "---",
    ]
    for nbytes, per in res["results"].items():
        cells = " | ".join(f"{h.median(per[v]) * 1e6:.1f} us" for v in VARIANTS)
        lines.append(f"{int(nbytes) // KB} KB | {cells}")
    lines += [
        "",
        f"{res['ranks']} ranks | " + " | ".join(labels),
        "---|" + "---|" * (len(labels) - 1) + "---",
    ]
    for nbytes, per in res["results"].items():
        cells = " | ".join(_paired(per, num, den) for _, num, den in RATIOS)
        lines.append(f"{int(nbytes) // KB} KB | {cells}")
    return "\n".join(lines)


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
            print(report(h.mpi_job(__file__, n, ["--rounds", str(args.rounds)])))
            print()


if __name__ == "__main__":
    main()
