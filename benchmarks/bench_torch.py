"""Issue 22: your torch.distributed code in %%mpi cells vs the same code under torchrun.

Each part side by side in one run, rounds interleaved:

- ``ddp``: DDP (gloo, CPU) training throughput of one training function, run by
  ``torchrun --standalone --nproc-per-node N`` and in a ``Cluster(n=N, torch=True)``
  through ``cluster.run`` (what a ``%%mpi`` cell does). Samples/s = samples trained
  by all ranks / the slowest rank's time; warm-up steps are not timed. The cluster is
  started once (start time is the other question). Target: >= 0.98x torchrun.
- ``ddp --aa``: the same, with a second torchrun each round, so the torchrun/torchrun
  ratio (A/A: the same side twice) shows how far two identical runs differ here.
- ``where`` (issue 36 item 8 on CPU): where each side's time goes in that training. Both
  sides run under clusterkernel's sampler (``cluster.run(..., profile=True)``; under
  torchrun the sampler an exported ``--profile`` job starts, ``clusterkernel.rank.
  _profile``) and count CPU seconds during ``train`` (after a one-step call, so both
  processes are warm): each rank's threads by name (``/proc/self/task``), the
  processes around the ranks (the notebook's client, the controller, the launcher;
  torchrun's agent, read by its worker from ``/proc``).
- ``start``: ``Cluster(n=4).start()`` vs ``Cluster(n=4, torch=True).start()`` (the
  group made on every rank), each stopped again, and the ``--torch`` start with
  torch.distributed's import left to the group's set-up (``CLUSTERKERNEL_PREIMPORT=""``,
  how it was before the engines imported it while registering). Target: under 1 s more.

Run from the repository root, under the MPI lock, on a quiet machine::

    flock /tmp/ck-mpi.lock python benchmarks/bench_torch.py [--part ddp|start|all] [--rounds 5]
    flock /tmp/ck-mpi.lock python benchmarks/bench_torch.py --part ddp --aa --rounds 9
    flock /tmp/ck-mpi.lock python benchmarks/bench_torch.py --part where --rounds 5
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


# ``where``: train() wrapped in CPU accounting, the same text on both sides; the sampler
# is started around it by cluster.run(profile=True) or, under torchrun, by the script.
_WHERE = """
def _thread_cpu():
    # CPU seconds of each thread of this process, by its Python name where it has one
    import os, threading
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        key = names.get(int(tid), "native:" + comm) + ":" + tid
        out[key] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _proc_cpu(pid):
    import os
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def train_where(**kw):
    # a short call first: the CPU counted below is the measured call's alone, on a warm
    # process on both sides (torchrun's worker is fresh; its first DDP set-up imports)
    import os, time
    train(**{**kw, "steps": 1})
    t0, a0, p0, w0 = _thread_cpu(), _proc_cpu(os.getppid()), time.process_time(), time.perf_counter()
    rate = train(**kw)
    t1, a1 = _thread_cpu(), _proc_cpu(os.getppid())
    threads = {k: t1[k] - t0.get(k, 0.0) for k in t1}
    return {"rate": rate, "wall": time.perf_counter() - w0, "cpu": time.process_time() - p0,
            "pid": os.getpid(),
            "threads": threads, "parent": a1 - a0, "main": threads.get(next(
                (k for k in t1 if k.startswith("MainThread:")), ""), 0.0)}
"""

_TORCHRUN_WHERE = """
import json, sys, torch.distributed as dist
from clusterkernel.rank import _profile
device, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
_profile.start()  # as an exported --profile job does
got = train_where(steps=steps, device=device, batch=batch)
got["profile"] = _profile.stop()
every = [None] * dist.get_world_size()
dist.all_gather_object(every, got)
if dist.get_rank() == 0:
    print("WHERE", json.dumps(every), flush=True)
dist.destroy_process_group()
"""


def _torchrun(n: int, script: Path, device: str, batch: int, steps: int, tag: str = "RATE"):
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
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    raise RuntimeError(f"torchrun gave no {tag}:\n{out.stdout}\n{out.stderr}")


def _cluster_rate(cluster, device: str, batch: int, steps: int) -> float:
    cluster.run(f"rate = train(steps={steps}, device={device!r}, batch={batch})")
    return cluster.pull("rate")[0]


def part_ddp(
    n: int, rounds: int, device: str = "cpu", batch: int = 64, steps: int = 200, aa: bool = False
) -> None:
    from clusterkernel import Cluster

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train_ddp.py"
        script.write_text(_TRAIN + _TORCHRUN_MAIN)
        cluster = Cluster(n=n, torch=True, env={"OMP_NUM_THREADS": "1"}).start()
        try:
            cluster.run(_TRAIN)
            ours, theirs, again = [], [], []
            sides = ("torchrun", "cluster", "torchrun again") if aa else ("torchrun", "cluster")
            for r in range(rounds):
                got = {}
                for side in h.order(sides, r):
                    got[side] = (
                        _torchrun(n, script, device, batch, steps)
                        if side.startswith("torchrun")
                        else _cluster_rate(cluster, device, batch, steps)
                    )
                ours.append(got["cluster"])
                theirs.append(got["torchrun"])
                again.append(got.get("torchrun again", float("nan")))
                print(
                    f"round {r + 1}: %%mpi {got['cluster']:.0f} samples/s, torchrun "
                    f"{got['torchrun']:.0f} samples/s, ratio {got['cluster'] / got['torchrun']:.3f}"
                    + (f", torchrun again {again[-1]:.0f} samples/s" if aa else ""),
                    flush=True,
                )
        finally:
            cluster.stop()
    ratio = h.paired(ours, theirs)
    if aa:
        control = h.paired(again, theirs)
        print(
            f"\nA/A (torchrun again / torchrun): {h.fmt_ratio(control, 3)}; %%mpi / torchrun "
            f"{h.fmt_ratio(ratio, 3)}: within noise? {h.aa_verdict(ratio, control)}"
        )
    print(
        f"\n{device}, batch {batch} per rank:\n| ranks | %%mpi samples/s (median) | torchrun samples/s (median) | ratio (median of rounds) | middle half |"
    )
    print("|---|---|---|---|---|")
    print(
        f"| {n} | {h.median(ours):.0f} | {h.median(theirs):.0f} | "
        f"{ratio[0]:.3f}x | {ratio[1]:.3f}-{ratio[2]:.3f} |"
    )


# train()'s loop, by line: _TRAIN starts both the cell and the torchrun script, so its
# lines are the same numbers on both sides
_LOOP = tuple(
    i + 1
    for i, ln in enumerate(_TRAIN.splitlines())
    if "for step in range" in ln or ln == "    sync()"
)


def _leaves(data: dict) -> dict[str, float]:
    """Seconds of the main thread in train()'s loop by innermost frame (``file:function``);
    what train() does before its loop (DDP's set-up, first imports) is left out."""
    out: dict[str, float] = {}
    for thread, stack, secs in data.get("stacks", []):
        in_loop = any(f[2] == "train" and _LOOP[0] <= f[1] < _LOOP[1] for f in stack)
        if thread == "main" and in_loop:
            key = f"{Path(stack[-1][0]).name}:{stack[-1][2]}"
            out[key] = out.get(key, 0.0) + secs
    return out


def _role(proc) -> str:
    """What a process of the cluster's tree is, from its command line (its module)."""
    line = proc.cmdline()
    if "-m" in line[:-1]:
        return line[line.index("-m") + 1].rsplit(".", 1)[-1]
    return proc.name()


def _cluster_where(cluster, device: str, batch: int, steps: int) -> dict:
    import contextlib
    import io

    procs = h.tree([os.getpid()])[1:]
    ranks = set(cluster.pull("ck_pid").values())
    roles = {p.pid: "ranks" if p.pid in ranks else _role(p) for p in procs}
    before = {p.pid: h.cpu_seconds([p]) for p in procs}
    c0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):  # the profile shown under the cell
        cluster.run(
            f"where = train_where(steps={steps}, device={device!r}, batch={batch})", profile=True
        )
    client = time.process_time() - c0
    around: dict[str, float] = {"client": client}
    for p in procs:
        role = roles[p.pid]
        around[role] = around.get(role, 0.0) + h.cpu_seconds([p]) - before[p.pid]
    every = cluster.pull("where")
    for r, data in cluster.profile_result.ranks.items():
        every[r]["profile"] = data
    return {"ranks": [every[r] for r in sorted(every)], "around": around}


def _torchrun_where(n: int, script: Path, device: str, batch: int, steps: int) -> dict:
    c0 = time.process_time()
    every = _torchrun(n, script, device, batch, steps, tag="WHERE")
    # the agent is each worker's parent: its CPU during train(), as rank 0 read it
    around = {"client": time.process_time() - c0, "agent": every[0]["parent"]}
    return {"ranks": every, "around": around}


def _where_table(runs: dict[str, list[dict]], steps: int) -> None:
    """Median over rounds (of the mean over ranks) of each measure, both sides."""
    sides = list(runs)

    def med(side: str, get) -> float:
        return h.median(sum(map(get, run["ranks"])) / len(run["ranks"]) for run in runs[side])

    print("\nper rank, mean of ranks, median of rounds:")
    print("| measure | " + " | ".join(sides) + " |")
    print("|---|" + "---|" * len(sides))
    rows = {
        "samples/s": lambda d: d["rate"],
        "train() wall s": lambda d: d["wall"],
        "process CPU s": lambda d: d["cpu"],
        "main thread CPU s": lambda d: d["main"],
        "other threads' CPU s": lambda d: d["cpu"] - d["main"],
        "main thread sampled in the loop s": lambda d: sum(_leaves(d["profile"]).values()),
    }
    for name, get in rows.items():
        print(f"| {name} | " + " | ".join(f"{med(s, get):.3f}" for s in sides) + " |")
    # the threads besides the main one, by name (their numbers stripped)
    names = sorted(
        {k.rsplit(":", 1)[0] for s in sides for run in runs[s] for d in run["ranks"]
         for k in d["threads"]} - {"MainThread"}
    )  # fmt: skip
    for name in names:

        def get(d, name=name):
            return sum(v for k, v in d["threads"].items() if k.rsplit(":", 1)[0] == name)

        if max(med(s, get) for s in sides) < 0.001:
            continue  # idle on both sides
        print(f"| thread {name} CPU s | " + " | ".join(f"{med(s, get):.3f}" for s in sides) + " |")
    print("\nprocesses around the ranks, CPU s during the run, median of rounds:")
    roles = sorted({k for s in sides for run in runs[s] for k in run["around"]})
    for role in roles:
        vals = [h.median(run["around"].get(role, 0.0) for run in runs[s]) for s in sides]
        print(f"| {role} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    loops = steps + 10 + 1 + 10  # the loop's iterations in both calls, warm-ups included
    print(f"\nmain thread in the loop by innermost frame, ms per iteration (of {loops}):")
    keys: dict[str, float] = {}
    for s in sides:
        for run in runs[s]:
            for d in run["ranks"]:
                for k, v in _leaves(d["profile"]).items():
                    keys[k] = keys.get(k, 0.0) + v
    print("| frame | " + " | ".join(sides) + " | difference |")
    print("|---|" + "---|" * (len(sides) + 1))
    for k in sorted(keys, key=keys.get, reverse=True)[:12]:
        vals = [
            1000 * med(s, lambda d, k=k: _leaves(d["profile"]).get(k, 0.0)) / loops for s in sides
        ]
        print(
            f"| {k} | " + " | ".join(f"{v:.3f}" for v in vals) + f" | {vals[0] - vals[-1]:+.3f} |"
        )


def part_where(n: int, rounds: int, device: str = "cpu", batch: int = 64, steps: int = 200) -> None:
    from clusterkernel import Cluster

    runs: dict[str, list[dict]] = {"%%mpi": [], "torchrun": []}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train_where.py"
        script.write_text(_TRAIN + _WHERE + _TORCHRUN_WHERE)
        cluster = Cluster(n=n, torch=True, env={"OMP_NUM_THREADS": "1"}).start()
        try:
            cluster.run(_TRAIN + _WHERE + "import os\nck_pid = os.getpid()\n")
            for r in range(rounds):
                for side in h.order(list(runs), r):
                    runs[side].append(
                        _torchrun_where(n, script, device, batch, steps)
                        if side == "torchrun"
                        else _cluster_where(cluster, device, batch, steps)
                    )
                rates = {s: min(d["rate"] for d in runs[s][-1]["ranks"]) for s in runs}
                print(
                    f"round {r + 1}: "
                    + ", ".join(f"{s} {v:.0f} samples/s" for s, v in rates.items())
                    + f", ratio {rates['%%mpi'] / rates['torchrun']:.3f}",
                    flush=True,
                )
        finally:
            cluster.stop()
    ours = [run["ranks"][0]["rate"] for run in runs["%%mpi"]]
    theirs = [run["ranks"][0]["rate"] for run in runs["torchrun"]]
    print(f"\nboth sampled: %%mpi / torchrun {h.fmt_ratio(h.paired(ours, theirs), 3)}")
    _where_table(runs, steps)


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
    parser.add_argument("--part", choices=("ddp", "where", "start", "all"), default="all")
    parser.add_argument("--aa", action="store_true",
                        help="ddp part: a second torchrun each round (A/A control)")  # fmt: skip
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
            part_ddp(args.ranks, args.rounds, args.device, args.batch, args.steps, args.aa)
        if args.part == "where":
            part_where(args.ranks, args.rounds, args.device, args.batch, args.steps)
        if args.part in ("start", "all"):
            part_start(args.start_ranks, args.rounds)


if __name__ == "__main__":
    main()
