"""Issue 5 benchmark: the training modes side by side, allreduce SGD as the reference.

Run (from the repository root; one MPI job at a time on a shared machine):

    flock /tmp/ck-mpi.lock python benchmarks/bench_modes.py [--rounds 2] [--epochs 30]

One ``mpiexec -n 4`` job trains the same model (digits MLP 64-256-256-10, the same
initial weights) on the same data (1,440 training digits, global batch 48, plain
SGD lr 0.1 momentum 0.5) with ``Trainer(mode=...)`` for every mode, in alternating
order over ``--rounds`` rounds:

- ``allreduce``  synchronous data parallel (``DataParallel``), 4 workers;
- ``ps``         parameter server (rank 0) + 3 workers, consistent reads;
- ``ps_s1``      the same with bounded staleness ``s = 1``;
- ``async``      parameter server with inconsistent reads (asynchronous SGD);
- ``easgd``      EASGD, center on rank 0, 3 workers, ``tau = 4``;
- ``easgd_sync`` EASGD through ``all_reduce``, 4 workers, ``tau = 4``;
- ``gossip``     GoSGD, 4 ranks, rate 0.1.

Per mode: wall time of ``fit`` (slowest rank), training samples/s over all
workers, model updates/s (allreduce: global steps; ps/async: gradients applied by
the server; easgd: local steps of all workers plus center exchanges; gossip: local
steps of all ranks plus mixes), time until the training loss (an exponential moving
average over every worker's steps, in time order) first drops below ``--target``,
final test accuracy and loss (``Trainer.evaluate``, 357 held-out digits), and per
rank the seconds spent blocked communicating (the sum of the Trainer's ``comm_s``).
Rates and times are medians over rounds. The figure plots that moving-average loss
against wall time for every mode (round 1), saved as a PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIGURE = REPO / "benchmarks" / "figures" / "issue5_modes_loss.png"
RESULTS = REPO / "test-artifacts" / "issue5_modes.json"  # raw curves, not committed
MODES = {
    "allreduce": ("allreduce", {}),
    "ps": ("ps", {}),
    "ps_s1": ("ps", {"staleness": 1}),
    "async": ("async", {}),
    "easgd": ("easgd", {"tau": 4}),
    "easgd_sync": ("easgd", {"tau": 4, "synchronous": True}),
    "gossip": ("gossip", {"rate": 0.1}),
}
BATCH, LR, MOMENTUM, EMA = 48, 0.1, 0.5, 0.05


# ------------------------------------------------------------------ on every rank
def _model(hidden: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )  # fmt: skip


def _one_run(name: str, epochs: int, hidden: int, train, test) -> dict:
    """Train ``name`` once; every rank returns what it saw (gathered on rank 0)."""
    import torch
    from torch.nn import functional as F

    from clusterkernel import comm, metrics
    from clusterkernel.train import Trainer

    mode, options = MODES[name]
    model = _model(hidden)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    trainer = Trainer(
        model, opt, F.cross_entropy, train, mode=mode, mode_options=options,
        batch_size=BATCH, prefetch=False,
    )  # fmt: skip
    rec = metrics.recorder()
    first = len(rec.scalars)
    comm.barrier()
    t0 = time.perf_counter()  # CLOCK_MONOTONIC: comparable between ranks of one host
    trainer.fit(epochs)
    t_end = time.perf_counter()
    ev = trainer.evaluate(test)
    steps = [(t - t0, v["loss"], v["comm_s"]) for _, t, v in rec.scalars[first:] if "loss" in v]
    mode_obj = trainer.mode
    out = {
        "rank": comm.rank(),
        "serves": mode_obj.serves,
        "seconds": t_end - t0,
        "steps": [(t, loss) for t, loss, _ in steps],
        "comm_s": sum(c for _, _, c in steps),
        "samples": trainer.global_step * _per_rank(mode_obj),
        "eval": ev,
        "stats": {k: v for k, v in getattr(mode_obj, "stats", {}).items() if k != "seconds"},
        "mixed": getattr(mode_obj, "mixed", 0),
    }
    trainer.close()
    gathered = [None] * comm.size()
    comm.gather_object(out, gathered if comm.rank() == 0 else None, dst=0)
    return gathered


def _per_rank(mode) -> int:
    return BATCH // mode.shard()[1]


def rank_job(args) -> None:
    import torch

    from clusterkernel import comm
    from clusterkernel.data import digits
    from clusterkernel.partition import DataPartitioner

    torch.set_num_threads(1)
    split = DataPartitioner(digits(), [1440, 357], seed=0)
    train, test = split.use(0), split.use(1)
    names = list(MODES)
    rounds = []
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        rounds.append({n: _one_run(n, args.epochs, args.hidden, train, test) for n in order})
    if comm.rank() == 0:
        print("RESULT " + json.dumps(rounds), flush=True)


# ------------------------------------------------------------------ the driver
def _ema_curve(ranks: list[dict]) -> list[tuple[float, float]]:
    steps = sorted(s for r in ranks for s in r["steps"])
    curve, avg = [], None
    for t, loss in steps:
        avg = loss if avg is None else (1 - EMA) * avg + EMA * loss
        curve.append((t, avg))
    return curve


def _summary(name: str, ranks: list[dict], target: float) -> dict:
    workers = [r for r in ranks if not r["serves"]]
    servers = [r for r in ranks if r["serves"]]
    wall = max(r["seconds"] for r in ranks)
    samples = sum(r["samples"] for r in workers)
    local_steps = sum(len(r["steps"]) for r in workers)
    if name == "allreduce" or name == "easgd_sync":
        updates = len(workers[0]["steps"]) if name == "allreduce" else local_steps
    elif servers:
        updates = sum(s["stats"]["updates"] for s in servers)
        if name == "easgd":
            updates += local_steps
    else:
        updates = local_steps + sum(r["mixed"] for r in workers)
    curve = _ema_curve(ranks)
    hit = next((t for t, v in curve if v < target), None)
    return {
        "wall_s": wall,
        "samples_per_s": samples / wall,
        "updates_per_s": updates / wall,
        "time_to_target_s": hit,
        "accuracy": ranks[0]["eval"]["accuracy"],
        "test_loss": ranks[0]["eval"]["loss"],
        "comm_s": [None if r["serves"] else r["comm_s"] for r in ranks],
        "max_staleness": max(
            (s["stats"]["max_staleness"] for s in servers if "max_staleness" in s["stats"]),
            default=None,
        ),
        "curve": curve,
    }


def _key(value) -> float:
    return -1 if value is None else value


def _median(values):
    values = [v for v in values if v is not None]
    return h.median(values) if values else None


def _table(per_round: list[dict], target: float) -> str:
    ref_ttt = _median([r["allreduce"]["time_to_target_s"] for r in per_round])
    lines = [
        f"| mode | wall s | samples/s | updates/s | s to loss < {target} | vs allreduce "
        "| test acc | test loss | comm s per rank (0..3) | max staleness |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in MODES:
        m = {k: _median([r[name][k] for r in per_round]) for k in ("wall_s", "samples_per_s",
             "updates_per_s", "time_to_target_s", "accuracy", "test_loss")}  # fmt: skip
        comm_cols = []
        for i in range(len(per_round[0][name]["comm_s"])):
            v = _median([r[name]["comm_s"][i] for r in per_round])
            comm_cols.append("server" if v is None else f"{v:.2f}")
        ttt = m["time_to_target_s"]
        ratio = f"{ttt / ref_ttt:.2f}x" if ttt and ref_ttt else "-"
        stale = max((r[name]["max_staleness"] for r in per_round), default=None, key=_key)
        lines.append(
            f"| {name} | {m['wall_s']:.2f} | {m['samples_per_s']:,.0f} | "
            f"{m['updates_per_s']:,.0f} | {'-' if ttt is None else f'{ttt:.2f}'} | {ratio} | "
            f"{m['accuracy']:.3f} | {m['test_loss']:.3f} | {', '.join(comm_cols)} | "
            f"{'-' if stale is None else stale} |"
        )
    return "\n".join(lines)


def _plot(summary: dict, target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for name, s in summary.items():
        t, v = zip(*s["curve"])
        ax.plot(t, v, label=name, lw=1.4)
    ax.axhline(target, color="gray", ls=":", lw=1)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel(f"training loss (EMA {EMA} over all workers' steps)")
    ax.set_yscale("log")
    ax.set_title("digits MLP 64-256-256-10, 4 ranks, same data and start")
    ax.legend(ncol=2, fontsize=8)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--target", type=float, default=0.1)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument(
        "--replot", action="store_true", help=f"redraw table and figure from {RESULTS.name}"
    )
    ap.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_job:
        rank_job(args)
        return
    if args.replot:
        saved = json.loads(RESULTS.read_text())
        _report(saved["rounds"], saved["args"]["target"])
        return

    sys.path.insert(0, str(REPO))
    from clusterkernel.client.mpiexec import MPIRuntime

    rt = MPIRuntime.detect()
    env = rt.env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    cmd = [*rt.command(args.ranks), sys.executable, __file__, "--rank-job",
           "--rounds", str(args.rounds), "--epochs", str(args.epochs),
           "--hidden", str(args.hidden)]  # fmt: skip
    with h.mpi_lock():
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"the benchmark job failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    rounds = json.loads(lines[0][len("RESULT ") :])
    per_round = [{n: _summary(n, rnd[n], args.target) for n in MODES} for rnd in rounds]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "rounds": per_round}))
    _report(per_round, args.target)


def _report(per_round: list[dict], target: float) -> None:
    _plot(per_round[0], target, FIGURE)
    print(_table(per_round, target))
    print(f"\nfigure: {FIGURE.relative_to(REPO)}; raw: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
