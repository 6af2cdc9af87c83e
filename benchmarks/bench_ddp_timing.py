"""What each way of seeing DDP's all-reduces on gloo costs a training step (issue 38).

Run from the repository root::

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_ddp_timing.py
    .venv/bin/python benchmarks/bench_ddp_timing.py --ranks 2 --rounds 9 --steps 60

Starts itself under ``mpiexec -n N`` with torchrun's variables and a gloo group, the
flight recorder on (``TORCH_FR_BUFFER_SIZE``, as on clusterkernel's ranks). One DDP
model per variant (the same MLP, 2 gradient buckets), interleaved in rounds (the
order turned each round); a time is the slowest rank's mean step (forward, backward
with DDP's all-reduces, SGD step) in one round:

- ``plain``: ``DistributedDataParallel(model)``, nothing else (torch's C++ all-reduce)
- ``plain-again``: ``plain`` once more (the A/A control: what two runs of the same
  code differ by here)
- ``hook``: the timed Python comm hook clusterkernel registers on every DDP model
  (``clusterkernel.torchdist._ddp``): exact per-bucket start and duration
- ``flight``: ``plain`` while a thread reads torch's flight recorder once a second
  (what the metrics stream does); gloo's entries carry a start but no duration
- ``profiler``: ``plain`` inside ``torch.profiler.profile()`` (CPU activities), the
  collectives read from its events

The report prints the median step per variant and the paired ratios to ``plain``
with their middle half, and whether each lies within the A/A noise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import _harness as h  # noqa: E402

VARIANTS = ["plain", "plain-again", "hook", "flight", "profiler"]


def worker(rounds: int, steps: int) -> None:
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "200")
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    os.environ.update(
        RANK=str(world.Get_rank()), WORLD_SIZE=str(world.Get_size()),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("CK_BENCH_PORT", "29581"),
    )  # fmt: skip
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from clusterkernel import metrics
    from clusterkernel.torchdist import _ddp
    from clusterkernel.torchdist._flight import dump

    torch.set_num_threads(1)
    dist.init_process_group("gloo")

    def model():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                            nn.Linear(512, 10))  # fmt: skip
        return net

    # bucket_cap_mb 0.5: ~1.3 MB of gradients, all-reduced in 2 buckets a step
    models = {v: DDP(model(), bucket_cap_mb=0.5) for v in ("plain", "plain-again", "flight",
                                                           "profiler")}  # fmt: skip
    _ddp.watch()  # DDP models made from here on are timed
    models["hook"] = DDP(model(), bucket_cap_mb=0.5)
    assert getattr(models["hook"], "_ck_timed", None) is not None
    assert getattr(models["plain"], "_ck_timed", None) is None
    opts = {v: torch.optim.SGD(m.parameters(), lr=0.01) for v, m in models.items()}
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    rec = metrics.recorder()

    def run(variant: str) -> float:
        net, opt = models[variant], opts[variant]
        stop = threading.Event()
        poller = None
        if variant == "flight":
            poller = threading.Thread(
                target=lambda: [dump() for _ in iter(lambda: stop.wait(1.0), True)]
            )
            poller.start()
        prof = None
        if variant == "profiler":
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        elapsed = time.perf_counter() - t0
        if prof is not None:
            prof.__exit__(None, None, None)
            # what the dashboard would read: the collectives among the events
            calls = [e for e in prof.events() if "all_reduce" in e.name or "allreduce" in e.name]
            assert calls, "the profiler saw no all-reduce"
        if poller is not None:
            stop.set()
            poller.join()
        return world.allreduce(elapsed / steps, op=MPI.MAX)

    for v in VARIANTS:  # warm up every path
        run(v)
    rec.clear()
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(rounds):
        for v in h.order(VARIANTS, i):
            per[v].append(run(v))
    timed = [r for r in rec.records("comm") if r["op"] == "torch all_reduce"]
    buckets = len(timed) // (steps * rounds)  # every bucket of every step of the hook's
    assert buckets >= 2 and len(timed) == buckets * steps * rounds, len(timed)
    if world.Get_rank() == 0:
        res = {"ranks": world.Get_size(), "per": per, "steps": steps, "buckets": buckets}
        print("RESULT " + json.dumps(res))
    dist.destroy_process_group()


def report(res: dict) -> str:
    per = res["per"]
    aa = h.paired(per["plain-again"], per["plain"])
    lines = [
        f"{res['ranks']} ranks, {res['steps']} steps a round ({res['buckets']} buckets a step), "
        f"{len(per['plain'])} rounds",
        "",
        "variant | median step | vs plain (middle half) | within A/A noise",
        "---|---|---|---",
    ]
    for v in VARIANTS:
        ratio = h.paired(per[v], per["plain"])
        verdict = "-" if v in ("plain", "plain-again") else h.aa_verdict(ratio, aa)
        lines.append(f"{v} | {h.median(per[v]) * 1e3:.2f} ms | {h.fmt_ratio(ratio, 3)} | {verdict}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[2])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.steps)
        return
    with h.mpi_lock():
        for n in args.ranks:
            print(report(h.mpi_job(__file__, n, ["--rounds", str(args.rounds), "--steps",
                                                 str(args.steps)])))  # fmt: skip
            print()


if __name__ == "__main__":
    main()
