"""Issue 22: your torch.distributed code in %%mpi cells vs the same code under torchrun.

Each part side by side in one run, rounds interleaved. Both sides make torch's default
group with the same backend (the torchrun side is given the ranks' own
``dist.get_backend_config()``: ``cpu:gloo,cuda:nccl`` on a GPU, ``gloo`` on CPU):

- ``ddp``: DDP training throughput of one training function, run by
  ``torchrun --standalone --nproc-per-node N`` and in a ``Cluster(n=N, torch=True)``
  through ``cluster.run`` (what a ``%%mpi`` cell does). Samples/s = samples trained
  by all ranks / the slowest rank's time; warm-up steps are not timed. The cluster is
  started once (start time is the other question). Target: >= 0.98x torchrun.
  ``--model``: ``mlp`` (a few small kernels a step: launch-bound on a GPU, where what
  the process around the loop costs shows), ``transformer`` (one pre-norm encoder block
  in bf16: compute-bound on a GPU), or both, each torchrun process running the cases
  in the same order the cells do. Each side also reports the timed loop's CPU per step
  (the main thread's, the process's) and the cores it may run on.
- ``ddp --aa`` (always with ``--device cuda``): a second torchrun each round, so the
  torchrun/torchrun ratio (A/A: the same side twice) shows how far two identical runs
  differ here. ``--rank-env``: a third torchrun with the ``TORCH*`` variables the
  ranks have (the flight recorder, NCCL's timing): is a gap those?
- ``ddp --profile-torch``: the first model's case plain and profiled on both sides,
  ``%%mpi --profile torch`` (``cluster.run(..., profile="torch")``) against
  ``torch.profiler`` with the same activities around the same call under torchrun
  (its trace exported, as ours is); the cost as plain / profiled samples/s (the loop)
  and profiled / plain seconds (the call: the cell as the notebook waits for it).
- ``where`` (issue 36 item 8): where each side's time goes in that training. Both
  sides run under clusterkernel's sampler (``cluster.run(..., profile=True)``; under
  torchrun the sampler an exported ``--profile`` job starts, ``clusterkernel.rank.
  _profile``) and count CPU seconds during ``train`` (after a one-step call, so both
  processes are warm): each rank's threads by name (``/proc/self/task``), the
  processes around the ranks (the notebook's client, the controller, the launcher;
  torchrun's agent, read by its worker from ``/proc``). The A/A control as ``ddp``'s.
- ``start``: ``Cluster(n=4).start()`` vs ``Cluster(n=4, torch=True).start()`` (the
  group made on every rank), each stopped again, and the ``--torch`` start with
  torch.distributed's import left to the group's set-up (``CLUSTERKERNEL_PREIMPORT=""``,
  how it was before the engines imported it while registering). Target: under 1 s more.

Run from the repository root, under the MPI lock, on a quiet machine::

    flock /tmp/ck-mpi.lock python benchmarks/bench_torch.py [--part ddp|start|all] [--rounds 5]
    flock /tmp/ck-mpi.lock python benchmarks/bench_torch.py --part ddp --aa --rounds 9
    flock /tmp/ck-mpi.lock python benchmarks/bench_torch.py --part where --rounds 5
    # on a GPU (benchmarks/gpu_check.sh runs these):
    python benchmarks/bench_torch.py --part ddp --device cuda --ranks 1 \\
        --model mlp,transformer --profile-torch --profile-steps 300 --rank-env
    python benchmarks/bench_torch.py --part where --device cuda --ranks 1 --rounds 3
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

# One training function, the same text for both sides. Two models: ``mlp``, a few
# small kernels a step (launch-bound on a GPU: what the process around the loop costs
# shows here), and ``transformer``, one pre-norm encoder block in bf16 (compute-bound on
# a GPU). ``train.last`` keeps what the timed loop cost this process's CPU.
_TRAIN = """
def train(steps=200, warmup=10, batch=64, device="cpu", model="mlp"):
    import os, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    if device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    torch.manual_seed(0)
    g = torch.Generator(device=device).manual_seed(dist.get_rank())
    if model == "mlp":
        teacher = torch.nn.Linear(256, 10).to(device)
        net = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
            torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)

        def loss_of(ddp):
            x = torch.randn(batch, 256, generator=g, device=device)
            y = teacher(x).argmax(1)
            return torch.nn.functional.cross_entropy(ddp(x), y)
    else:  # "transformer": batch sequences of seq tokens
        width, seq, heads = (2048, 512, 16) if device != "cpu" else (64, 32, 4)
        net = torch.nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        ).to(device, torch.bfloat16)

        def loss_of(ddp):
            x = torch.randn(batch, seq, width, generator=g, device=device, dtype=torch.bfloat16)
            return ddp(x).float().square().mean()
    ddp = DDP(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            dist.barrier()
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        opt.zero_grad()
        loss_of(ddp).backward()
        opt.step()
    sync()
    elapsed = time.perf_counter() - t0
    train.last = {"main_cpu": time.thread_time() - c0, "cpu": time.process_time() - p0,
                  "wall": elapsed, "cores": len(os.sched_getaffinity(0)),
                  "hooked": getattr(ddp, "_ck_timed", None) is not None}
    slowest = torch.tensor([elapsed], device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return steps * batch * dist.get_world_size() / slowest.item()
"""

# The torchrun side: the default group made with the backend the cluster's ranks have
# (their ``dist.get_backend_config()``: like with like), then the same calls the
# %%mpi side makes, in the same order, in one process: each case, then (with a profile
# case) that case plain and under torch.profiler with the settings ``--profile torch``
# uses (CPU ops, CUDA kernels where there is a GPU), its trace exported as ours is.
_TORCHRUN_MAIN = """
import json, os, sys, tempfile, time, torch, torch.distributed as dist
device, backend, cases, prof_case = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
dist.init_process_group(backend)


def timed(case):
    w0 = time.perf_counter()
    rate = train(device=device, **case)
    return {"rate": rate, "call": time.perf_counter() - w0, **train.last}


out = {"backend": dist.get_backend_config(), "cases": [timed(c) for c in cases]}
if prof_case:
    from torch.profiler import ProfilerActivity, profile
    out["plain"] = timed(prof_case)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    w0 = time.perf_counter()
    with profile(activities=acts) as prof:
        rate = train(device=device, **prof_case)
    last = train.last
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    prof.export_chrome_trace(path)
    os.unlink(path)
    out["profiled"] = {"rate": rate, "call": time.perf_counter() - w0, **last}
if dist.get_rank() == 0:
    print("RATE", json.dumps(out), flush=True)
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
device, backend, case = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
dist.init_process_group(backend)
_profile.start()  # as an exported --profile job does
got = train_where(device=device, **case)
got["profile"] = _profile.stop()
got["backend"] = dist.get_backend_config()
every = [None] * dist.get_world_size()
dist.all_gather_object(every, got)
if dist.get_rank() == 0:
    print("WHERE", json.dumps(every), flush=True)
dist.destroy_process_group()
"""

# what a case is when --batch/--steps are not given: (batch, steps) by model and device
_SIZES = {
    ("mlp", "cpu"): (64, 200),
    ("mlp", "cuda"): (4096, 600),
    ("transformer", "cpu"): (4, 20),
    ("transformer", "cuda"): (32, 60),
}


def cases_for(models: list[str], device: str, batch: int | None, steps: int | None) -> list[dict]:
    """The train() keyword arguments of each model's case."""
    out = []
    for model in models:
        b, s = _SIZES[model, device]
        out.append({"model": model, "batch": batch or b, "steps": steps or s})
    return out


def _torchrun(
    n: int, script: Path, device: str, backend: str, *args: str, tag="RATE", env: dict | None = None
):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # the torchrun command
    out = subprocess.run(
        [*torchrun, "--standalone", f"--nproc-per-node={n}", str(script), device, backend, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    for line in out.stdout.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    raise RuntimeError(f"torchrun gave no {tag}:\n{out.stdout}\n{out.stderr}")


def _backend(cluster) -> str:
    """The backend config of the cluster's default group (``cpu:gloo,cuda:nccl``, ``gloo``)."""
    cluster.run("import torch.distributed as dist\nck_backend = dist.get_backend_config()")
    return cluster.pull("ck_backend")[0]


def _rank_env(cluster) -> dict[str, str]:
    """The ``TORCH*`` variables the ranks have and this process has not (what the cluster
    sets for torch on its ranks: the flight recorder, NCCL's timing)."""
    cluster.run(
        "import os\nck_env = {k: v for k, v in os.environ.items() if k.startswith('TORCH')}"
    )
    return {k: v for k, v in cluster.pull("ck_env")[0].items() if os.environ.get(k) != v}


def _timed_cell(cluster, code: str, profile=False) -> float:
    import contextlib
    import io

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # a profile's tables
        cluster.run(code, profile=profile)
    return time.perf_counter() - t0


def _cluster_side(cluster, device: str, cases: list[dict], prof_case: dict | None) -> dict:
    """The calls torchrun's script makes, each a cell of its own, in the same order."""

    def one(case: dict, profile=False) -> dict:
        call = _timed_cell(
            cluster,
            f"ck_r = train(device={device!r}, **{case!r})\nck_r = (ck_r, train.last)",
            profile,
        )
        rate, last = cluster.pull("ck_r")[0]
        return {"rate": rate, "call": call, **last}

    out = {"cases": [one(c) for c in cases]}
    if prof_case:
        out["plain"] = one(prof_case)
        out["profiled"] = one(prof_case, profile="torch")
    return out


def _band(xs: list[float], digits: int = 3) -> str:
    med, q1, q3 = h.median(xs), *h.middle_half(xs)
    return f"{med:.{digits}f}x [{q1:.{digits}f}-{q3:.{digits}f}]"


def part_ddp(
    n: int,
    rounds: int,
    device: str = "cpu",
    cases: list[dict] | None = None,
    aa: bool = False,
    prof_case: dict | None = None,
    rank_env: bool = False,
) -> None:
    """Each case (and the profile pair) on both sides, rounds interleaved; the A/A
    control with ``aa`` (always on a GPU); with ``rank_env`` a torchrun more each round
    with the ``TORCH*`` variables the ranks get (is a gap theirs?)."""
    from clusterkernel import Cluster

    cases = cases or cases_for(["mlp"], device, None, None)
    aa = aa or device == "cuda"
    sides = ["torchrun", "%%mpi"] + ["torchrun again"] * aa + [_RANK_ENV] * rank_env
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train_ddp.py"
        script.write_text(_TRAIN + _TORCHRUN_MAIN)
        cluster = Cluster(n=n, torch=True, env={"OMP_NUM_THREADS": "1"}).start()
        try:
            cluster.run(_TRAIN)
            backend = _backend(cluster)
            print(f"the ranks' group: {backend}; torchrun's made with the same", flush=True)
            extra = _rank_env(cluster) if rank_env else {}
            if rank_env:
                print(f"{_RANK_ENV}: {extra}", flush=True)
            args = (json.dumps(cases), json.dumps(prof_case))
            for r in range(rounds):
                for side in h.order(sides, r):
                    if side == "%%mpi":
                        got = _cluster_side(cluster, device, cases, prof_case)
                    else:
                        env = extra if side == _RANK_ENV else None
                        got = _torchrun(n, script, device, backend, *args, env=env)
                        if got["backend"] != backend:
                            raise RuntimeError(
                                f"torchrun's group is {got['backend']}, ours {backend}"
                            )
                    runs[side].append(got)
                print(
                    f"round {r + 1}: "
                    + "; ".join(
                        f"{c['model']} "
                        + ", ".join(f"{s} {runs[s][-1]['cases'][i]['rate']:.0f}" for s in sides)
                        for i, c in enumerate(cases)
                    )
                    + " samples/s",
                    flush=True,
                )
        finally:
            cluster.stop()
    _ddp_table(runs, device, cases, aa)
    if prof_case:
        _profile_table(runs, prof_case, aa)


_RANK_ENV = "torchrun, ranks' env"


def _ddp_table(runs: dict[str, list[dict]], device: str, cases: list[dict], aa: bool) -> None:
    """Per case, a row per side: medians of rounds, the ratio to torchrun paired per round,
    and what the timed loop cost the process's CPU (its main thread, all its threads)."""

    def col(side: str, i: int, key: str) -> list[float]:
        return [run["cases"][i][key] for run in runs[side]]

    print(
        f"\n{device}, {len(runs['%%mpi'])} rounds: medians; ratios paired per round [middle half]"
    )
    for i, c in enumerate(cases):
        print(f"\n{c['model']}, batch {c['batch']} per rank, {c['steps']} timed steps:")
        print(
            "| side | samples/s | / torchrun | main thread CPU ms/step | process CPU ms/step "
            "| wall ms/step | cores | DDP comm hook (rounds) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for side in runs:

            def per_step(key: str, side: str = side, i: int = i, c: dict = c) -> str:
                return f"{1000 * h.median(col(side, i, key)) / c['steps']:.3f}"

            ratio = h.paired(col(side, i, "rate"), col("torchrun", i, "rate"))
            print(
                f"| {side} | {h.median(col(side, i, 'rate')):.0f} "
                f"| {'-' if side == 'torchrun' else h.fmt_ratio(ratio, 3)} "
                f"| {per_step('main_cpu')} | {per_step('cpu')} | {per_step('wall')} "
                f"| {h.median(col(side, i, 'cores')):.0f} | {sum(col(side, i, 'hooked')):.0f} |"
            )
        if aa:
            ratio = h.paired(col("%%mpi", i, "rate"), col("torchrun", i, "rate"))
            control = h.paired(col("torchrun again", i, "rate"), col("torchrun", i, "rate"))
            print(f"{c['model']}: %%mpi within noise? {h.aa_verdict(ratio, control)}")


def _profile_table(runs: dict[str, list[dict]], case: dict, aa: bool) -> None:
    """What profiling costs each side: plain / profiled loop rate, profiled / plain call
    time (the call: the cell as the notebook waits for it, or torchrun's call with its
    trace exported), both per round."""
    print(
        f"\nprofiled ({case['model']} batch {case['batch']} x {case['steps']} steps): "
        "cost = plain / profiled samples/s (the loop), profiled / plain seconds (the call)"
    )
    print("| side | loop cost | call cost | call plain s | call profiled s |")
    print("|---|---|---|---|---|")
    names = {"%%mpi": "%%mpi --profile torch", "torchrun": "torch.profiler under torchrun",
             "torchrun again": "torch.profiler under torchrun, again"}  # fmt: skip
    loop, call = {}, {}
    for side, rs in runs.items():
        loop[side] = [r["plain"]["rate"] / r["profiled"]["rate"] for r in rs]
        call[side] = [r["profiled"]["call"] / r["plain"]["call"] for r in rs]
        print(
            f"| {names.get(side, side)} | {_band(loop[side])} | {_band(call[side])} "
            f"| {h.median(r['plain']['call'] for r in rs):.3f} "
            f"| {h.median(r['profiled']['call'] for r in rs):.3f} |"
        )
    for what, got in (("loop", loop), ("call", call)):
        ours = [a / b for a, b in zip(got["%%mpi"], got["torchrun"])]
        line = f"ours / torch's own, {what} cost: {_band(ours)}"
        if aa:
            again = [a / b for a, b in zip(got["torchrun again"], got["torchrun"])]
            line += f" (A/A {_band(again)})"
        print(line)


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


def _cluster_where(cluster, device: str, case: dict) -> dict:
    import contextlib
    import io

    procs = h.tree([os.getpid()])[1:]
    ranks = set(cluster.pull("ck_pid").values())
    roles = {p.pid: "ranks" if p.pid in ranks else _role(p) for p in procs}
    before = {p.pid: h.cpu_seconds([p]) for p in procs}
    c0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):  # the profile shown under the cell
        cluster.run(f"where = train_where(device={device!r}, **{case!r})", profile=True)
    client = time.process_time() - c0
    around: dict[str, float] = {"client": client}
    for p in procs:
        role = roles[p.pid]
        around[role] = around.get(role, 0.0) + h.cpu_seconds([p]) - before[p.pid]
    every = cluster.pull("where")
    for r, data in cluster.profile_result.ranks.items():
        every[r]["profile"] = data
    return {"ranks": [every[r] for r in sorted(every)], "around": around}


def _torchrun_where(n: int, script: Path, device: str, backend: str, case: dict) -> dict:
    c0 = time.process_time()
    every = _torchrun(n, script, device, backend, json.dumps(case), tag="WHERE")
    if every[0]["backend"] != backend:
        raise RuntimeError(f"torchrun's group is {every[0]['backend']}, ours {backend}")
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
    print("| frame | " + " | ".join(sides) + " | %%mpi - torchrun |")
    print("|---|" + "---|" * (len(sides) + 1))
    for k in sorted(keys, key=keys.get, reverse=True)[:12]:
        vals = [
            1000 * med(s, lambda d, k=k: _leaves(d["profile"]).get(k, 0.0)) / loops for s in sides
        ]
        print(f"| {k} | " + " | ".join(f"{v:.3f}" for v in vals) + f" | {vals[0] - vals[1]:+.3f} |")


def part_where(
    n: int, rounds: int, device: str = "cpu", case: dict | None = None, aa: bool = False
) -> None:
    """Both sides under the sampler; the A/A control (a second torchrun) with ``aa``,
    always on a GPU."""
    from clusterkernel import Cluster

    case = case or cases_for(["mlp"], device, None, None)[0]
    sides = ["%%mpi", "torchrun"] + (["torchrun again"] if aa or device == "cuda" else [])
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train_where.py"
        script.write_text(_TRAIN + _WHERE + _TORCHRUN_WHERE)
        cluster = Cluster(n=n, torch=True, env={"OMP_NUM_THREADS": "1"}).start()
        try:
            cluster.run(_TRAIN + _WHERE + "import os\nck_pid = os.getpid()\n")
            backend = _backend(cluster)
            print(f"the ranks' group: {backend}; torchrun's made with the same", flush=True)
            for r in range(rounds):
                for side in h.order(list(runs), r):
                    runs[side].append(
                        _torchrun_where(n, script, device, backend, case)
                        if side.startswith("torchrun")
                        else _cluster_where(cluster, device, case)
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
    line = f"\nboth sampled: %%mpi / torchrun {h.fmt_ratio(h.paired(ours, theirs), 3)}"
    if "torchrun again" in runs:
        again = [run["ranks"][0]["rate"] for run in runs["torchrun again"]]
        line += f"; A/A: torchrun again / torchrun {h.fmt_ratio(h.paired(again, theirs), 3)}"
    print(line)
    _where_table(runs, case["steps"])


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
                        help="ddp/where: cuda trains on the ranks' GPUs (A/A control always on)")  # fmt: skip
    parser.add_argument("--model", default="mlp",
                        help="ddp/where: mlp (launch-bound on a GPU), transformer (one bf16 "
                             "block, compute-bound), or both: mlp,transformer (where: the first)")  # fmt: skip
    parser.add_argument("--batch", type=int, help="samples per rank per step (default by model)")
    parser.add_argument("--steps", type=int, help="timed steps per call (default by model)")
    parser.add_argument("--profile-torch", action="store_true",
                        help="ddp part: the first model also plain and profiled on both sides: "
                             "%%%%mpi --profile torch vs torch.profiler under torchrun")  # fmt: skip
    parser.add_argument("--profile-steps", type=int, help="steps of the profiled calls")
    parser.add_argument("--rank-env", action="store_true",
                        help="ddp part: a torchrun more each round with the ranks' TORCH* variables")  # fmt: skip
    args = parser.parse_args()
    models = args.model.split(",")
    if unknown := [m for m in models if m not in ("mlp", "transformer")]:
        parser.error(f"--model {','.join(unknown)}: use mlp, transformer or mlp,transformer")
    cases = cases_for(models, args.device, args.batch, args.steps)
    prof_case = None
    if args.profile_torch:
        prof_case = {**cases[0], "steps": args.profile_steps or cases[0]["steps"]}
    with h.mpi_lock():
        if args.part in ("ddp", "all"):
            part_ddp(args.ranks, args.rounds, args.device, cases, args.aa, prof_case, args.rank_env)
        if args.part == "where":
            part_where(args.ranks, args.rounds, args.device, cases[0], args.aa)
        if args.part in ("start", "all"):
            part_start(args.start_ranks, args.rounds)


if __name__ == "__main__":
    main()
