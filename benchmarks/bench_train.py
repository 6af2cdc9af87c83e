"""Issue 4 benchmark: synchronous data-parallel training throughput, side by side.

Run (from the repository root; one MPI job at a time on a shared machine):

    flock /tmp/ck-mpi.lock python benchmarks/bench_train.py [--steps 150] [--rounds 3]

Same data, same models, global batch 128, plain SGD, samples/s of:

- ``clusterkernel``  ``DataParallel`` (bucketed async allreduce from grad hooks), 2 ranks,
  with comm's default ``algorithm="auto"``
  (its gradient buckets in shared memory, ``shared_buckets=None``: buckets of 1 MB
  and more are reduced in place)
- ``ck_plain``       the same with ordinary-memory buckets (``shared_buckets=False``)
- ``ck_mpi``         ordinary buckets on a group whose ``auto`` is forced to MPI
  (issue 13's end-to-end comparison)
- ``ck_again``       ``clusterkernel`` once more, on its own group: the A/A control
  (what "within noise" is for the ck variants in this run)
- ``ck_fixed``       ``clusterkernel`` on a group that keeps the table's choice
  (``CLUSTERKERNEL_AUTO_ADAPT=0`` at the group's set-up): what adapting costs
- ``ck_plain_fixed`` ``ck_plain`` on such a group (ordinary buckets adapt: 256 KB and up)
- ``ddp_gloo``       ``torch.nn.parallel.DistributedDataParallel`` over gloo, 2 ranks
- ``mpi4py_flat``    hand-written loop: flatten grads, one ``MPI.Allreduce``, unflatten
- ``per_param``      the tutorial's ``average_gradients`` (one allreduce per tensor)
- ``no_comm``        2 ranks that never exchange gradients: the ceiling for 2 ranks
- ``single``         one process, 2 torch threads, the whole batch

for an MLP 784-256-10, for a model of many small layers (where fusing the
gradients into few messages matters), and for ``big_mlp`` 784-2048-1024-10 (3.7M
parameters, two buckets of 6-8 MB; global batch 16, so communication is a real
share of the step). ``--ranks 4`` runs the multi-rank variants on 4 ranks;
``--variants`` a subset of them (e.g. the adapting default against the table's choice
and the A/A control: ``--variants clusterkernel,ck_again,ck_fixed,ck_plain,ck_plain_fixed``;
paired ratios per round against ``clusterkernel``/``ck_plain`` are printed with the
A/A band). Every ck variant has its own group, so each adapts on its own. The
variants run in one ``mpiexec`` job, interleaved per round with the one-process
run, so machine noise hits all alike; the figure per variant is the median over
rounds. Each rank uses one torch thread (2 ranks on 2 cores). Comm time per step is reported per rank where the
variant exposes it.

A third table runs :class:`~clusterkernel.train.Trainer` on a dataset whose
samples are decoded one by one (uint8 images -> float), with and without the
prefetch thread, on 1 rank (a core to spare) and on 2 ranks (none to spare),
and says what ``prefetch="auto"`` picks in each case.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import _harness as h
from bench_comm import mpi_launch

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 128
VARIANTS = (
    "clusterkernel",
    "ck_plain",
    "ck_mpi",
    "ck_again",
    "ck_fixed",
    "ck_plain_fixed",
    "ddp_gloo",
    "mpi4py_flat",
    "per_param",
    "no_comm",
)
_CK = ("clusterkernel", "ck_plain", "ck_mpi", "ck_again", "ck_fixed", "ck_plain_fixed")
_SHARED = ("clusterkernel", "ck_again", "ck_fixed")  # the default buckets (shared memory)
# What each ck variant's group sets at its auto set-up (the rest: the defaults).
_GROUP_ENV = {
    "ck_mpi": {"CLUSTERKERNEL_ALGORITHM": "mpi"},
    "ck_fixed": {"CLUSTERKERNEL_AUTO_ADAPT": "0"},
    "ck_plain_fixed": {"CLUSTERKERNEL_AUTO_ADAPT": "0"},
}
# The paired ratios printed: (variant, against); the A/A control's is the band.
_PAIRS = (
    ("ck_again", "clusterkernel"),
    ("ck_fixed", "clusterkernel"),
    ("ck_plain_fixed", "ck_plain"),
)
# Global batch per model: the big model's is small so the gradient exchange, not
# the compute, is a sizeable part of a step (as in fine-tuning with small batches).
BATCH = {"big_mlp": 16}


def global_batch(model: str) -> int:
    return BATCH.get(model, GLOBAL_BATCH)


# --------------------------------------------------------------------------- models
def make_model(name: str, seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    if name == "small_layers":
        layers = [nn.Linear(784, 64), nn.ReLU()]
        for _ in range(30):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        layers.append(nn.Linear(64, 10))
        return nn.Sequential(*layers)
    if name == "big_mlp":
        return nn.Sequential(
            nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10)
        )
    raise ValueError(name)


def make_batches(steps: int, per_rank: int, rank: int, batch: int = GLOBAL_BATCH):
    """The global batches of the run (same for every variant), this rank's slice."""
    from clusterkernel.data import teacher

    ds = teacher(n=batch * 16, in_features=784, classes=10, seed=0)
    x, y = ds.tensors
    out = []
    for s in range(steps):
        lo = (s % 16) * batch + rank * per_rank
        out.append((x[lo : lo + per_rank], y[lo : lo + per_rank]))
    return out


# --------------------------------------------------------------------------- loops
def timed_loop(step, batches, warmup: int) -> float:
    for b in batches[:warmup]:
        step(b)
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        step(b)
    return time.perf_counter() - t0


def run_single(model_name: str, steps: int, warmup: int) -> dict:
    import torch
    from torch.nn import functional as F

    torch.set_num_threads(2)
    model = make_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = global_batch(model_name)
    batches = make_batches(steps + warmup, batch, 0, batch)

    def step(b):
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(b[0]), b[1]).backward()
        opt.step()

    elapsed = timed_loop(step, batches, warmup)
    return {"samples_per_s": steps * batch / elapsed}


def variant_group(variant: str):
    """Every rank, as a group of its own for ``variant`` (collective): its ``auto``
    rules are made now, under the variant's :data:`_GROUP_ENV` (forced to MPI, or
    keeping the table's choice)."""
    from clusterkernel import comm

    g = comm.new_group(list(range(comm.size())))
    env = _GROUP_ENV.get(variant, {})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        comm.auto_choice("all_reduce", 0, g)  # the group's rules are made now
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    return g


def _make_step(variant: str, model_name: str, world, comm_times: list[float]):
    """One training step of ``variant`` on its own copy of the model."""
    import torch
    from mpi4py import MPI
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from clusterkernel.train import DataParallel, average_gradients

    size = world.Get_size()
    model = make_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    net = model
    if variant in _CK:  # opt.step() waits for the averages
        net = DataParallel(
            model,
            optimizer=opt,
            group=variant_group(variant),
            shared_buckets=None if variant in _SHARED else False,
        )
        assert net.shared_buckets is (variant in _SHARED and size > 1), variant
    elif variant == "ddp_gloo":
        net = DDP(model)
    params = list(model.parameters())

    def exchange() -> None:
        if variant in _CK:
            comm_times.append(net.last_comm_seconds)
        elif variant == "mpi4py_flat":
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            t0 = time.perf_counter()
            world.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
            comm_times.append(time.perf_counter() - t0)
            flat.div_(size)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        elif variant == "per_param":
            t0 = time.perf_counter()
            average_gradients(model)
            comm_times.append(time.perf_counter() - t0)

    def step(b) -> None:
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(net(b[0]), b[1]).backward()
        if variant not in _CK:
            exchange()
        opt.step()
        if variant in _CK:
            exchange()

    step.group = net.group if variant in _CK else None  # type: ignore[attr-defined]
    return step


def interleaved_rates(world, fns: dict, batches: list, rounds: int, batch: int) -> dict:
    """Samples/s of each step function in each round (collective on ``world``).

    Every round times each function over all ``batches`` in turn, starting one
    further along each round, so the machine's drifts hit all alike; a time is
    the slowest rank's.
    """
    from mpi4py import MPI

    keys = list(fns)
    rates: dict = {k: [] for k in keys}
    for r in range(rounds):
        for k in h.order(keys, r):
            world.Barrier()
            t0 = time.perf_counter()
            for b in batches:
                fns[k](b)
            slowest = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            rates[k].append(len(batches) * batch / slowest)
    return rates


def run_variants(
    model_name: str, steps: int, warmup: int, port: int, rounds: int, variants: list[str]
) -> None:
    """Worker under mpiexec: ``variants``, interleaved for ``rounds`` rounds."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    batch = global_batch(model_name)
    batches = make_batches(steps + warmup, batch // size, rank, batch)
    comm_times: dict[str, list[float]] = {v: [] for v in variants}
    steps_fn = {v: _make_step(v, model_name, world, comm_times[v]) for v in variants}
    for v in variants:  # warm up every variant before timing any
        for b in batches[:warmup]:
            steps_fn[v](b)
        comm_times[v].clear()
    rates = interleaved_rates(world, steps_fn, batches[warmup:], rounds, batch)
    results = {}
    for v in variants:
        mine = h.median(comm_times[v]) * 1e3 if comm_times[v] else None
        per_rank = world.gather(mine, root=0)
        results[v] = {
            "rounds": rates[v],
            "comm_ms_per_rank": None if rank or per_rank[0] is None else per_rank,
            "auto": _auto_picks(steps_fn[v]),
        }
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def _auto_picks(step) -> list[str]:
    """What ``auto`` ran last on a ck variant's group, per adaptive size class that had
    blocking calls (``'all_reduce 1024KB: shm (switch), 470 calls'``; zero-copy buckets
    run outside the classes); [] for the others."""
    from clusterkernel import comm

    group = getattr(step, "group", None)
    if group is None:
        return []
    return [
        f"{op} {size >> 10}KB: {s['algorithm']} ({s['why']}), {s['calls']} calls"
        for (op, size), s in comm.auto_state(group).items()
        if s["calls"]
    ]


# ---------------------------------------------------------------- Trainer prefetch
def run_trainer(steps_epochs: int) -> None:
    """Worker under mpiexec -n 2: Trainer with and without the prefetch thread."""
    import numpy as np
    import torch
    from torch.nn import functional as F
    from torch.utils.data import Dataset

    from clusterkernel import comm
    from clusterkernel.train import Trainer, spare_core

    torch.set_num_threads(1)

    class Images(Dataset):
        """uint8 images decoded to float one sample at a time (like an image folder)."""

        def __init__(self, n=4096):
            rng = np.random.default_rng(0)
            self.raw = rng.integers(0, 256, size=(n, 784), dtype=np.uint8)
            self.labels = rng.integers(0, 10, size=n)

        def __len__(self):
            return len(self.raw)

        def __getitem__(self, i):
            x = torch.from_numpy(self.raw[i].astype(np.float32) / 255.0)
            return (x - 0.5) / 0.25, int(self.labels[i])

    data = Images()
    rates: dict[str, list[float]] = {"no_prefetch": [], "prefetch": []}
    for r in range(4):  # alternate the order so drift hits both alike
        for prefetch in h.order((False, True), r):
            model = make_model("mlp")
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            t = Trainer(
                model, opt, F.cross_entropy, data, batch_size=GLOBAL_BATCH, prefetch=prefetch
            )
            comm.barrier()
            t0 = time.perf_counter()
            t.fit(steps_epochs)
            elapsed = time.perf_counter() - t0
            t.close()
            slowest = [None] * comm.size()
            comm.all_gather_object(slowest, elapsed)
            key = "prefetch" if prefetch else "no_prefetch"
            rates[key].append(steps_epochs * len(data) / max(slowest))
    if comm.rank() == 0:
        out = {k: h.median(v) for k, v in rates.items()}
        out["auto_chooses_prefetch"] = spare_core(comm.size())
        print("RESULT " + json.dumps(out), flush=True)


# --------------------------------------------------------------------------- driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], env: dict) -> dict:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"no RESULT from {cmd}:\n{proc.stdout}\n{proc.stderr}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per variant per job")
    ap.add_argument("--jobs", type=int, default=2, help="mpiexec jobs per model")
    ap.add_argument("--models", default="mlp,small_layers,big_mlp")
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="the multi-rank variants, comma-separated"
    )
    ap.add_argument("--ranks", type=int, default=2, help="ranks of the multi-rank variants")
    ap.add_argument("--no-trainer", action="store_true", help="skip the Trainer table")
    ap.add_argument("--json", help="also write all figures to this file")
    ap.add_argument("--worker", choices=["single", "variants", "trainer"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker == "single":
        print("RESULT " + json.dumps(run_single(args.model, args.steps, args.warmup)))
        return
    if args.worker == "variants":
        run_variants(
            args.model, args.steps, args.warmup, args.port, args.rounds, args.variants.split(",")
        )
        return
    if args.worker == "trainer":
        run_trainer(args.steps)
        return
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    with h.mpi_lock():
        drive(args)


def drive(args: argparse.Namespace) -> None:
    """The parent: every job of the run, one after another."""
    rt, env = mpi_launch()
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    report: dict = {"global_batch": GLOBAL_BATCH, "ranks": args.ranks, "models": {}}
    variants = args.variants.split(",")
    for model in args.models.split(","):
        rounds: dict[str, list[float]] = {v: [] for v in ("single", *variants)}
        comm_ms: dict[str, list[list[float]]] = {v: [] for v in variants}
        picks: dict[str, list[list[str]]] = {v: [] for v in variants}
        for _ in range(args.jobs):
            single_env = dict(env, OMP_NUM_THREADS="2")
            for _ in range(args.rounds):
                out = _run([*me, "--worker", "single", "--model", model, *common], single_env)
                rounds["single"].append(out["samples_per_s"])
            multi = _run(
                [*rt.command(args.ranks), *me, "--worker", "variants", "--model", model,
                 "--port", str(_free_port()), "--rounds", str(args.rounds),
                 "--variants", args.variants, *common],
                env,
            )  # fmt: skip
            for v in variants:
                rounds[v] += multi[v]["rounds"]
                picks[v].append(multi[v]["auto"])
                if multi[v]["comm_ms_per_rank"]:
                    comm_ms[v].append(multi[v]["comm_ms_per_rank"])
        summary = {}
        for v, rs in rounds.items():
            cm = comm_ms.get(v)
            summary[v] = {
                "samples_per_s": h.median(rs),
                "rounds": [round(r) for r in rs],
                "comm_ms_per_rank": [
                    round(h.median(c[i] for c in cm), 3) for i in range(args.ranks)
                ]
                if cm
                else None,
            }
            if v in picks:
                summary[v]["auto_per_job"] = picks[v]
        summary["pairs"] = _pairs(rounds)
        report["models"][model] = summary
        _print_table(model, summary, args.ranks)

    if args.no_trainer:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
        return
    report["trainer_prefetch"] = {}
    print("\nTrainer, per-sample-decoded images, 1 epoch x 4 rounds (median samples/s):")
    for n in (1, 2):
        res = _run([*rt.command(n), *me, "--worker", "trainer", "--steps", "1"], env)
        report["trainer_prefetch"][n] = res
        ratio = res["prefetch"] / res["no_prefetch"]
        print(
            f"  {n} rank(s): no prefetch {res['no_prefetch']:8.0f}  prefetch "
            f"{res['prefetch']:8.0f}  ({ratio:.2f}x)  auto picks prefetch: "
            f"{res['auto_chooses_prefetch']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


def _pairs(rounds: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per :data:`_PAIRS` present: the median and middle half of the per-round ratios
    of samples/s (variant / against; the rounds of all jobs, paired as they ran)."""
    return {
        f"{a} / {b}": list(h.paired(rounds[a], rounds[b]))
        for a, b in _PAIRS
        if a in rounds and b in rounds
    }


def _print_table(model: str, summary: dict, ranks: int) -> None:
    pairs = summary.pop("pairs")
    single = summary["single"]["samples_per_s"]
    ck = summary.get("clusterkernel", summary["single"])["samples_per_s"]
    print(f"\n{model}: global batch {global_batch(model)}, {ranks} ranks (median of rounds)")
    print(
        f"  {'variant':14s} {'samples/s':>10s} {'vs single':>10s} {'ck / this':>10s}  comm ms/step per rank"
    )
    for v, s in summary.items():
        rate = s["samples_per_s"]
        comm_ms = s["comm_ms_per_rank"]
        comm_txt = ", ".join(f"{c:.3f}" for c in comm_ms) if comm_ms else "-"
        print(f"  {v:14s} {rate:10.0f} {rate / single:9.2f}x {ck / rate:9.2f}x  {comm_txt}")
        for job, picked in enumerate(s.get("auto_per_job", [])):
            if picked:
                print(f"  {'':14s} auto, job {job}: {'; '.join(picked)}")
    aa = pairs.get("ck_again / clusterkernel")
    for name, ratio in pairs.items():
        verdict = f"  within noise: {h.aa_verdict(tuple(ratio), tuple(aa))}" if aa else ""
        print(f"  samples/s {name}: {h.fmt_ratio(tuple(ratio), 3)} (per round){verdict}")
    summary["pairs"] = pairs


if __name__ == "__main__":
    main()
