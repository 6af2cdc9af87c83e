"""Issue 4 benchmark: pipeline-parallel (GPipe) training throughput, side by side.

Run (from the repository root; one MPI job at a time on a shared machine):

    flock /tmp/ck-mpi.lock python benchmarks/bench_pipeline.py [--ranks 2,4] [--chunks 1,4,8]

Same data, same initial weights, same stage split, global batch 256, plain SGD,
samples/s of:

- ``clusterkernel``     ``PipelineParallel(model, balance, chunks=C).train_step``
- ``torch_pipelining``  ``torch.distributed.pipelining``: ``PipelineStage`` +
  ``ScheduleGPipe(stage, C, loss_fn)`` over gloo
- ``single``            one process with the whole model, 1 and 2 torch threads

for an MLP 784-768-768-768-768-10 (ReLUs; 2.4M parameters, ~47 ms a step on one
core), whose split by parameter count is even at 2 and at 4 stages. The pipeline
variants run in one ``mpiexec`` job per rank count, every chunk count of both
libraries built up front and timed in interleaved rounds (slowest rank's time), so
machine noise hits all alike; the one-process runs go between the jobs. Each rank
uses one torch thread. The figure per variant is the median over rounds.

Each job also checks correctness once: a fresh pipeline of each library trains a
few steps at the largest chunk count, and the last rank compares the losses with
the whole model trained in one process on the same batches.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _harness as h
from bench_comm import mpi_launch
from bench_train import _free_port, _run, interleaved_rates, timed_loop

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 256
WIDTH, HIDDEN = 768, 4
LIBS = ("clusterkernel", "torch_pipelining")
CHECK_STEPS = 5


def make_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = [nn.Linear(784, WIDTH), nn.ReLU()]
    for _ in range(HIDDEN - 1):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    layers.append(nn.Linear(WIDTH, 10))
    return nn.Sequential(*layers)


def make_batches(n: int):
    """``n`` global batches, cycling over a fixed synthetic set (same in every process)."""
    from clusterkernel.data import teacher

    x, y = teacher(n=GLOBAL_BATCH * 8, in_features=784, classes=10, seed=0).tensors
    return [
        (x[(s % 8) * GLOBAL_BATCH : (s % 8 + 1) * GLOBAL_BATCH],
         y[(s % 8) * GLOBAL_BATCH : (s % 8 + 1) * GLOBAL_BATCH])
        for s in range(n)
    ]  # fmt: skip


# --------------------------------------------------------------------------- workers
def run_single(threads: int, steps: int, warmup: int) -> dict:
    import torch
    from torch.nn import functional as F

    torch.set_num_threads(threads)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(b):
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(b[0]), b[1]).backward()
        opt.step()

    elapsed = timed_loop(step, make_batches(steps + warmup), warmup)
    return {"samples_per_s": steps * GLOBAL_BATCH / elapsed}


def _make_step(lib: str, chunks: int, balance: list[int], losses: list[float]):
    """One training step of ``lib`` on a fresh copy of the model; the batch's mean
    loss is appended to ``losses`` on the last rank."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    from torch.nn import functional as F

    from clusterkernel.partition import split_sequential
    from clusterkernel.train import PipelineParallel

    rank, size = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == size - 1
    if lib == "clusterkernel":
        pipe = PipelineParallel(make_model(), balance=balance, chunks=chunks)
        opt = torch.optim.SGD(pipe.parameters(), lr=0.01)

        def step(b) -> None:
            opt.zero_grad(set_to_none=False)
            loss = pipe.train_step(b[0] if first else None, b[1] if last else None, F.cross_entropy)
            opt.step()
            if last:
                losses.append(loss)

        return step

    stage_mod = split_sequential(make_model(), balance)[rank]  # same seed on every rank
    stage = PipelineStage(stage_mod, rank, size, torch.device("cpu"))
    # scale_grads (the default) divides by the micro-batch count: the mean over the batch
    sched = ScheduleGPipe(stage, chunks, loss_fn=F.cross_entropy)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.01)

    def step(b) -> None:
        opt.zero_grad(set_to_none=False)
        if first:
            sched.step(b[0], return_outputs=False)
        elif last:
            mb: list = []
            sched.step(target=b[1], losses=mb, return_outputs=False)
            losses.append(float(torch.stack(mb).mean()))
        else:
            sched.step(return_outputs=False)
        opt.step()

    return step


def _check_losses(balance: list[int], chunks: int) -> dict | None:
    """Losses of fresh pipelines vs the whole model in one process, same batches."""
    import torch
    import torch.distributed as dist
    from torch.nn import functional as F

    batches = make_batches(CHECK_STEPS)
    got = {}
    for lib in LIBS:
        got[lib] = []
        step = _make_step(lib, chunks, balance, got[lib])
        for b in batches:
            step(b)
    if dist.get_rank() != dist.get_world_size() - 1:
        return None
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ref = []
    for x, y in batches:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        ref.append(loss.item())
    out = {"chunks": chunks, "steps": CHECK_STEPS, "single_last_loss": ref[-1]}
    for lib in LIBS:
        out[lib] = {
            "last_loss": got[lib][-1],
            "max_abs_diff": max(abs(a - b) for a, b in zip(got[lib], ref)),
        }
    return out


def run_variants(chunk_counts: list[int], steps: int, warmup: int, port: int, rounds: int):
    """Worker under mpiexec -n N: both libraries at every chunk count, interleaved."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from clusterkernel.partition import balance_by_size

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    balance = balance_by_size(make_model(), size)
    check = _check_losses(balance, max(chunk_counts))
    batches = make_batches(steps + warmup)
    variants = [(lib, c) for c in chunk_counts for lib in LIBS]
    fns = {v: _make_step(*v, balance, []) for v in variants}
    for v in variants:  # warm up every variant before timing any
        for b in batches[:warmup]:
            fns[v](b)
    rates = interleaved_rates(world, fns, batches[warmup:], rounds, GLOBAL_BATCH)
    check = world.bcast(check, root=size - 1)
    if rank == 0:
        results = {f"{lib}:{c}": rs for (lib, c), rs in rates.items()}
        print("RESULT " + json.dumps({"balance": balance, "rates": results, "check": check}))
    dist.destroy_process_group()


# --------------------------------------------------------------------------- driver
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4", help="pipeline lengths (ranks), comma-separated")
    ap.add_argument("--chunks", default="1,4,8", help="micro-batch counts, comma-separated")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per variant per job")
    ap.add_argument("--jobs", type=int, default=2, help="mpiexec jobs per rank count")
    ap.add_argument("--json", help="also write all figures to this file")
    ap.add_argument("--worker", choices=["single", "variants"], help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    chunk_counts = [int(c) for c in args.chunks.split(",")]

    if args.worker == "single":
        print("RESULT " + json.dumps(run_single(args.threads, args.steps, args.warmup)))
        return
    if args.worker == "variants":
        run_variants(chunk_counts, args.steps, args.warmup, args.port, args.rounds)
        return
    with h.mpi_lock():
        drive(args, chunk_counts)


def drive(args: argparse.Namespace, chunk_counts: list[int]) -> None:
    """The parent: every job of the run, one after another."""
    rt, env = mpi_launch()
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    report: dict = {"global_batch": GLOBAL_BATCH, "model": _model_name(), "runs": {}}
    for n in (int(r) for r in args.ranks.split(",")):
        rounds: dict[str, list[float]] = {}
        checks, balance = [], None
        for _ in range(args.jobs):
            for threads in (1, 2):
                for _ in range(args.rounds):
                    out = _run(
                        [*me, "--worker", "single", "--threads", str(threads), *common],
                        dict(env, OMP_NUM_THREADS=str(threads)),
                    )
                    rounds.setdefault(f"single:{threads}", []).append(out["samples_per_s"])
            multi = _run(
                [*rt.command(n), *me, "--worker", "variants", "--chunks", args.chunks,
                 "--port", str(_free_port()), "--rounds", str(args.rounds), *common],
                env,
            )  # fmt: skip
            balance = multi["balance"]
            checks.append(multi["check"])
            for k, rs in multi["rates"].items():
                rounds.setdefault(k, []).extend(rs)
        summary = {
            k: {"samples_per_s": h.median(rs), "rounds": [round(r) for r in rs]}
            for k, rs in rounds.items()
        }
        report["runs"][n] = {"balance": balance, "summary": summary, "checks": checks}
        _print_table(n, balance, chunk_counts, summary)
        _print_check(checks[0])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


def _model_name() -> str:
    return "MLP 784-" + "-".join([str(WIDTH)] * HIDDEN) + "-10"


def _print_table(n: int, balance, chunk_counts: list[int], summary: dict) -> None:
    one, two = (summary[f"single:{t}"]["samples_per_s"] for t in (1, 2))
    print(
        f"\n{_model_name()}, global batch {GLOBAL_BATCH}, {n} ranks, balance {balance} "
        "(median of rounds)\n"
    )
    print("| variant | chunks | samples/s | ms/step | vs 1 process 1 thread "
          "| vs 1 process 2 threads | clusterkernel / torch |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    rows = [("one process, 1 thread", "-", one, None), ("one process, 2 threads", "-", two, None)]
    for c in chunk_counts:
        ck = summary[f"clusterkernel:{c}"]["samples_per_s"]
        tp = summary[f"torch_pipelining:{c}"]["samples_per_s"]
        rows += [("clusterkernel", c, ck, f"**{ck / tp:.2f}x**"), ("torch_pipelining", c, tp, "")]
    for name, c, rate, ratio in rows:
        print(
            f"| {name} | {c} | {rate:,.0f} | {GLOBAL_BATCH / rate * 1e3:.1f} | {rate / one:.2f}x "
            f"| {rate / two:.2f}x | {ratio if ratio is not None else '-'} |"
        )


def _print_check(check: dict) -> None:
    print(
        f"\nloss check ({check['steps']} steps from the same weights, chunks={check['chunks']}): "
        f"one process {check['single_last_loss']:.6f} at the last step"
    )
    for lib in LIBS:
        c = check[lib]
        print(
            f"  {lib:17s} {c['last_loss']:.6f}  max |diff| over the steps "
            f"{c['max_abs_diff']:.1e} ({'match' if c['max_abs_diff'] < 1e-5 else 'MISMATCH'})"
        )


if __name__ == "__main__":
    main()
