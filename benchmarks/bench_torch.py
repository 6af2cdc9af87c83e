"""Issue 22: your torch.distributed code in %%mpi cells vs the same code under torchrun.

Two questions, each side by side in one run, rounds interleaved:

- ``ddp``: DDP (gloo, CPU) training throughput of one training function, run by
  ``torchrun --standalone --nproc-per-node N`` and in a ``Cluster(n=N, torch=True)``
  through ``cluster.run`` (what a ``%%mpi`` cell does). Samples/s = samples trained
  by all ranks / the slowest rank's time; warm-up steps are not timed. The cluster is
  started once (start time is the other question). Target: >= 0.98x torchrun.
- ``start``: ``Cluster(n=4).start()`` vs ``Cluster(n=4, torch=True).start()`` (the
  group made on every rank), each stopped again, and the ``--torch`` start with
  torch.distributed's import left to the group's set-up (``CLUSTERKERNEL_PREIMPORT=""``,
  how it was before the engines imported it while registering). Target: under 1 s more.

Run from the repository root, under the MPI lock, on a quiet machine::

    flock /tmp/ck-mpi.lock python benchmarks/bench_torch.py [--part ddp|start|all] [--rounds 5]
    python benchmarks/bench_torch.py --part ddp --device cuda --ranks 1 --batch 4096 --steps 1000  # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _harness as h

# One training function, the same text for both sides.
_TRAIN = """
def train(steps=200, warmup=10, batch=64, device="cpu"):
    import os, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    if device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    torch.manual_seed(0)
    teacher = torch.nn.Linear(256, 10).to(device)
    net = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
        torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
    ddp = DDP(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator(device=device).manual_seed(dist.get_rank())
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            dist.barrier()
            t0 = time.perf_counter()
        x = torch.randn(batch, 256, generator=g, device=device)
        y = teacher(x).argmax(1)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    sync()
    elapsed = time.perf_counter() - t0
    slowest = torch.tensor([elapsed], device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return steps * batch * dist.get_world_size() / slowest.item()
"""

_TORCHRUN_MAIN = """
import json, sys, torch.distributed as dist
device, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("nccl" if device == "cuda" else "gloo")
rate = train(steps=steps, device=device, batch=batch)
if dist.get_rank() == 0:
    print("RATE", json.dumps(rate), flush=True)
dist.destroy_process_group()
"""


def _torchrun(n: int, script: Path, device: str, batch: int, steps: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # the torchrun command
    out = subprocess.run(
        [
            *torchrun,
            "--standalone",
            f"--nproc-per-node={n}",
            str(script),
            device,
            str(batch),
            str(steps),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RATE "):
            return json.loads(line[5:])
    raise RuntimeError(f"torchrun gave no rate:\n{out.stdout}\n{out.stderr}")


def _cluster_rate(cluster, device: str, batch: int, steps: int) -> float:
    cluster.run(f"rate = train(steps={steps}, device={device!r}, batch={batch})")
    return cluster.pull("rate")[0]


def part_ddp(n: int, rounds: int, device: str = "cpu", batch: int = 64, steps: int = 200) -> None:
    from clusterkernel import Cluster

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train_ddp.py"
        script.write_text(_TRAIN + _TORCHRUN_MAIN)
        cluster = Cluster(n=n, torch=True, env={"OMP_NUM_THREADS": "1"}).start()
        try:
            cluster.run(_TRAIN)
            ours, theirs = [], []
            for r in range(rounds):
                got = {}
                for side in h.order(("torchrun", "cluster"), r):
                    got[side] = (
                        _torchrun(n, script, device, batch, steps)
                        if side == "torchrun"
                        else _cluster_rate(cluster, device, batch, steps)
                    )
                ours.append(got["cluster"])
                theirs.append(got["torchrun"])
                print(
                    f"round {r + 1}: %%mpi {got['cluster']:.0f} samples/s, torchrun "
                    f"{got['torchrun']:.0f} samples/s, ratio {got['cluster'] / got['torchrun']:.3f}",
                    flush=True,
                )
        finally:
            cluster.stop()
    ratio = h.paired(ours, theirs)
    print(
        f"\n{device}, batch {batch} per rank:\n| ranks | %%mpi samples/s (median) | torchrun samples/s (median) | ratio (median of rounds) | middle half |"
    )
    print("|---|---|---|---|---|")
    print(
        f"| {n} | {h.median(ours):.0f} | {h.median(theirs):.0f} | "
        f"{ratio[0]:.3f}x | {ratio[1]:.3f}-{ratio[2]:.3f} |"
    )


# the three starts: ranks only; --torch as shipped (torch.distributed imported while
# the engines register); --torch with that import left to the group's set-up (before)
_STARTS = {
    "plain": {"torch": False},
    "torch": {"torch": True},
    "torch, late import": {"torch": True, "env": {"CLUSTERKERNEL_PREIMPORT": ""}},
}


def part_start(n: int, rounds: int) -> None:
    from clusterkernel import Cluster

    times: dict[str, list[float]] = {side: [] for side in _STARTS}
    sides = list(_STARTS)
    for r in range(rounds):
        for side in h.order(sides, r):  # each side goes first in turn
            t0 = time.perf_counter()
            c = Cluster(n=n, **_STARTS[side]).start()
            times[side].append(time.perf_counter() - t0)
            c.stop()
        print(
            f"round {r + 1}: " + ", ".join(f"{s} {times[s][-1]:.2f} s" for s in sides), flush=True
        )
    med = {side: h.median(t) for side, t in times.items()}
    plain = med["plain"]
    print(
        "\n| ranks | start | start --torch | difference | --torch, import not early | difference |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| {n} | {plain:.2f} s | {med['torch']:.2f} s | {med['torch'] - plain:+.2f} s "
        f"| {med['torch, late import']:.2f} s | {med['torch, late import'] - plain:+.2f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("ddp", "start", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2, help="ranks for the ddp part")
    parser.add_argument("--start-ranks", type=int, default=4, help="ranks for the start part")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="ddp part: cuda trains on the ranks' GPUs over NCCL")  # fmt: skip
    parser.add_argument("--batch", type=int, default=64, help="ddp part: samples per rank per step")
    parser.add_argument("--steps", type=int, default=200, help="ddp part: timed steps per round")
    args = parser.parse_args()
    with h.mpi_lock():
        if args.part in ("ddp", "all"):
            part_ddp(args.ranks, args.rounds, args.device, args.batch, args.steps)
        if args.part in ("start", "all"):
            part_start(args.start_ranks, args.rounds)


if __name__ == "__main__":
    main()
