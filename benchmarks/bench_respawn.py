"""Recovery after a fault: respawn vs restart, and a gloo hang freed keeping the models.

Run: python benchmarks/bench_respawn.py [--rounds 3] [--ranks 2 4] [--mb 100]

Answers two questions, each beside its competitor in the same run, rounds interleaved
(the order turned each round), medians and paired ratios per round (``_harness``):

1. **A rank dies**: the time from its SIGKILL (its pid, between cells) to N healthy
   ranks with the state, i.e. a collective across all N answered. ``respawn``: a
   ``Cluster(n, fault_tolerant=True)``; the death is noticed (``live_ranks``), then
   ``cluster.respawn(source=0)`` (ULFM shrink, spawn, merge, rank 0's picklable
   variables copied), then one ``comm.all_reduce`` cell. ``restart``: what a user does
   without respawn, on a plain ``Cluster(n)``: the death noticed (the job ends), then
   ``cluster.restart()``, then the set-up cells run again (imports; the model made and,
   for the large state, its weights loaded from the checkpoint file the set-up saved),
   then the same collective cell. Two states: ``small`` (imports, a ``Linear(16, 4)``,
   a dict, an int) and ``model`` (``--mb`` MB of float32 ``Linear(2048, 2048)`` layers,
   copied by respawn, loaded from a ``torch.save`` file by restart). Both clusters are
   up at once so the rounds interleave. The respawn is broken down: notice (kill to
   death seen), grow (the survivors' ``_respawn.grow``: ``shrink``, ``spawn`` = spawn +
   merge, and the new engine's registration), torch/ranks-up bookkeeping, copy, DDP
   re-attach, collective.
2. **A gloo hang with a DDP model alive** (``Cluster(n=2, torch=True)``): rank 0 enters
   ``dist.all_reduce`` that rank 1 skips. ``freed``: ``cluster.run(cell, timeout=T)``
   raises ``CellInterrupted`` with every variable kept (the group's TCP connections
   closed, a new default group made); timed to the exception, then to one
   ``dist.all_reduce`` answered on the new group. ``restart``: the same hang sent
   without a timeout, ``T`` s waited, then ``cluster.restart()`` and the set-up cell
   (imports, DDP model made, weights loaded from its checkpoint) run again, then the
   same collective. After each ``freed`` round the weights are checked unchanged and
   the model re-wrapped (``torchdist.rewrap``, untimed) so the next round hangs with a
   live DDP model again.

Takes the MPI lock (``/tmp/ck-mpi.lock``) itself, or uses the one ``flock`` holds.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from clusterkernel import Cluster
from clusterkernel.client.cluster import _respawn as respawn_mod
from clusterkernel.client.errors import CellInterrupted

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

ENV = {"OMP_NUM_THREADS": "1"}

IMPORTS = "import os, torch\nfrom clusterkernel import comm\n"

SMALL = IMPORTS + (
    "torch.manual_seed(0)\n"
    "net = torch.nn.Linear(16, 4)\n"
    "config = {'lr': 0.1, 'steps': 100, 'name': 'run-7'}\n"
    "step = 7\n"
)

MODEL_DEF = IMPORTS + (
    "model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range({layers})])\n"
)
# the first set-up: the model trained (here: seeded) and saved, as a notebook would
MODEL_FIRST = MODEL_DEF + (
    "torch.manual_seed(0)\n"
    "for p in model.parameters():\n    torch.nn.init.normal_(p.data)\n"
    "if comm.rank() == 0:\n    torch.save(model.state_dict(), {ckpt!r})\n"
    "comm.barrier()\n"
)
# the set-up cells a user re-runs after a restart
MODEL_AGAIN = MODEL_DEF + "_ = model.load_state_dict(torch.load({ckpt!r}))\n"

FORGET = "for _k in ('net', 'config', 'step', 'model'):\n    globals().pop(_k, None)\n"

COLLECTIVE = "_t = torch.ones(1)\ncomm.all_reduce(_t)\n_v = _t.item()\n"

CHECK = {
    "small": "_chk = (float(net.weight.detach().double().sum()), config['name'], step)",
    "model": "_chk = float(sum(p.detach().double().sum() for p in model.parameters()))",
}

# on rank 0 (a survivor): keep what the survivors' grow returns (shrink, spawn seconds)
TIME_GROW = """
import clusterkernel.rank._respawn as _R
if not hasattr(_R, "_bench_grow"):
    _R._bench_grow = _R.grow
    def _grow_timed(*a, **k):
        _R._bench_last = _R._bench_grow(*a, **k)
        return _R._bench_last
    _R.grow = _grow_timed
"""

DDP_DEF = (
    "import os, torch, torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "from clusterkernel import torchdist\n"
    "net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))\n"
)
DDP_FIRST = DDP_DEF + (
    "torch.manual_seed(0)\n"
    "ddp = DDP(net)\n"
    "opt = torch.optim.SGD(ddp.parameters(), lr=0.1)\n"
    "x = torch.randn(8, 256, generator=torch.Generator().manual_seed(dist.get_rank()))\n"
    "opt.zero_grad(); ddp(x).square().mean().backward(); opt.step()\n"
    "if dist.get_rank() == 0:\n    torch.save(net.state_dict(), {ckpt!r})\n"
    "dist.barrier()\n"
)
DDP_AGAIN = DDP_DEF + (
    "_ = net.load_state_dict(torch.load({ckpt!r}))\n"
    "ddp = DDP(net)\n"
    "opt = torch.optim.SGD(ddp.parameters(), lr=0.1)\n"
)
DDP_SNAPSHOT = "_before = [p.detach().clone() for p in ddp.parameters()]\n_pid = os.getpid()\n"
HANG = "_t = torch.ones(3)\nif dist.get_rank() == 0:\n    dist.all_reduce(_t)\n"
DIST_COLLECTIVE = "_t = torch.ones(1)\ndist.all_reduce(_t)\n_v = _t.item()\n"


# ------------------------------------------------------------------ helpers
def wait(pred: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def collective(cluster: Cluster, n: int, code: str = COLLECTIVE) -> None:
    cluster.run(code)
    got = cluster.pull("_v")
    assert set(got.values()) == {float(n)} and len(got) == n, got


def checksum(cluster: Cluster, state: str) -> set:
    cluster.run(CHECK[state])
    return set(cluster.pull("_chk").values())


class Timed:
    """Wraps the client side's respawn steps to time them (``seconds[name]``, last call)."""

    def __init__(self, cluster: Cluster) -> None:
        self.seconds: dict[str, float] = {}
        for name in ("_copy", "_rebuild"):
            setattr(respawn_mod, name, self.wrap(name, getattr(respawn_mod, name)))
        cluster.ranks_respawned = self.wrap("ranks_up", cluster.ranks_respawned)

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[name] = time.perf_counter() - t0

        return timed


# ------------------------------------------------------------------ 1. a rank dies
class Death:
    """One ``n``: a fault-tolerant cluster (respawn) and a plain one (restart), both up."""

    def __init__(self, n: int, ckpt: str, layers: int) -> None:
        self.n, self.victim = n, n - 1
        self.ckpt, self.layers = ckpt, layers
        self.ft = Cluster(n=n, fault_tolerant=True, env=ENV).start()
        self.plain = Cluster(n=n, env=ENV).start()
        self.timed = Timed(self.ft)
        self.ft.run(TIME_GROW, ranks=[0])
        self.breakdown: list[dict] = []
        self.restarts: list[dict] = []
        self.state = ""
        self.expect: set = set()

    def setup(self, state: str) -> None:
        """Both clusters hold ``state`` (untimed)."""
        self.state = state
        if state == "small":
            first = again = SMALL
        else:
            first = MODEL_FIRST.format(layers=self.layers, ckpt=self.ckpt)
            again = MODEL_AGAIN.format(layers=self.layers, ckpt=self.ckpt)
        for c, code in ((self.ft, first), (self.plain, again)):
            c.run(FORGET)
            c.run(code)
        self.expect = checksum(self.ft, state)
        assert len(self.expect) == 1 and checksum(self.plain, state) == self.expect

    def again_cells(self) -> list[str]:
        if self.state == "small":
            return [SMALL]
        return [MODEL_AGAIN.format(layers=self.layers, ckpt=self.ckpt)]

    def kill(self, cluster: Cluster) -> float:
        pid = cluster.rank_info[self.victim]["pid"]
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        return t0

    def respawn(self) -> float:
        c = self.ft
        t0 = self.kill(c)
        wait(lambda: self.victim not in c.live_ranks, "the death seen")
        t1 = time.perf_counter()
        report = c.respawn(source=0)
        t2 = time.perf_counter()
        collective(c, self.n)
        t3 = time.perf_counter()
        assert report.ranks == [self.victim], report
        assert checksum(c, self.state) == self.expect  # untimed: the copy is right
        c.run("_g = _R._bench_last", ranks=[0])
        grow = c.pull("_g", ranks=[0])[0]
        s = self.timed.seconds
        rest = report.seconds - s["_copy"] - s["_rebuild"] - s["ranks_up"]
        self.breakdown.append(
            {
                "state": self.state,
                "notice": t1 - t0,
                "shrink": grow["shrink"],
                "spawn": grow["spawn"],
                "register": rest - grow["shrink"] - grow["spawn"],
                "ranks_up": s["ranks_up"],
                "copy": s["_copy"],
                "rebuild": s["_rebuild"],
                "respawn": report.seconds,
                "respawn_call": t2 - t1,
                "collective": t3 - t2,
                "mib": report.bytes / 2**20,
            }
        )
        return t3 - t0

    def restart(self) -> float:
        c = self.plain
        t0 = self.kill(c)
        # the job ends with its rank (not fault-tolerant): seen once its engines go
        wait(
            lambda: c.job_ended or len(c.client.ids) < self.n,
            "the job's end seen",
        )
        t1 = time.perf_counter()
        c.restart()
        t2 = time.perf_counter()
        for code in self.again_cells():
            c.run(code)
        t3 = time.perf_counter()
        collective(c, self.n)
        t4 = time.perf_counter()
        assert checksum(c, self.state) == self.expect
        self.restarts.append(
            {
                "state": self.state,
                "notice": t1 - t0,
                "restart": t2 - t1,
                "set-up": t3 - t2,
                "collective": t4 - t3,
            }
        )
        return t4 - t0

    def stop(self) -> None:
        for c in (self.ft, self.plain):
            with contextlib.suppress(Exception):
                c.stop()


def deaths(args: argparse.Namespace, ckpt: str) -> list[dict]:
    layers = max(1, round(args.mb * 1e6 / ((2048 * 2048 + 2048) * 4)))
    rows = []
    for n in args.ranks:
        d = Death(n, ckpt, layers)
        try:
            for state in ("small", "model"):
                d.setup(state)
                got = h.interleaved({"respawn": d.respawn, "restart": d.restart}, args.rounds)
                rows.append(
                    {
                        "n": n,
                        "state": state,
                        "respawn": got["respawn"],
                        "restart": got["restart"],
                        "breakdown": [b for b in d.breakdown if b["state"] == state],
                        "restarts": [b for b in d.restarts if b["state"] == state],
                    }
                )
                report_death(rows[-1], layers)
        finally:
            d.stop()
    return rows


def report_death(row: dict, layers: int) -> None:
    r, s = h.median(row["respawn"]), h.median(row["restart"])
    ratio = h.paired(row["respawn"], row["restart"])
    mb = layers * (2048 * 2048 + 2048) * 4 / 1e6
    what = "small namespace" if row["state"] == "small" else f"{mb:.0f} MB model"
    print(f"\n{row['n']} ranks, {what}, kill -> collective across all answered:")
    print(
        f"  respawn {r:6.2f} s [{h.span(row['respawn'], '.2f')}]   "
        f"restart + set-up {s:6.2f} s [{h.span(row['restart'], '.2f')}]   "
        f"respawn/restart {h.fmt_ratio(ratio)}"
    )
    keys = ["notice", "shrink", "spawn", "register", "ranks_up", "copy", "rebuild", "collective"]
    med = {k: h.median(b[k] for b in row["breakdown"]) for k in keys}
    print("  respawn, medians: " + "  ".join(f"{k} {v:.2f}" for k, v in med.items()))
    med = {k: h.median(b[k] for b in row["restarts"]) for k in row["restarts"][0] if k != "state"}
    print("  restart path, medians: " + "  ".join(f"{k} {v:.2f}" for k, v in med.items()))
    print(
        f"  respawn report .seconds {h.median(b['respawn'] for b in row['breakdown']):.2f} s, "
        f"copied {h.median(b['mib'] for b in row['breakdown']):.1f} MiB"
    )
    sys.stdout.flush()


# ------------------------------------------------------------------ 2. a gloo hang
class Hang:
    def __init__(self, timeout: float, ckpt: str) -> None:
        self.timeout, self.ckpt = timeout, ckpt
        self.c = Cluster(n=2, torch=True, env=ENV).start()
        self.c.run(DDP_FIRST.format(ckpt=ckpt))
        self.c.run(DDP_SNAPSHOT)
        self.after: list[float] = []

    def freed(self) -> float:
        c = self.c
        pids = c.pull("_pid")
        t0 = time.perf_counter()
        try:
            c.run(HANG, timeout=self.timeout)
        except CellInterrupted:
            pass
        else:
            raise SystemExit("the hang was not interrupted")
        t1 = time.perf_counter()
        collective(c, 2, DIST_COLLECTIVE)
        self.after.append(time.perf_counter() - t1)
        # untimed: the same processes, the weights untouched; DDP on the new group
        assert c.pull("_pid") == pids
        c.run("_same = all(torch.equal(a, b) for a, b in zip(_before, ddp.parameters()))")
        assert set(c.pull("_same").values()) == {True}
        c.run("ddp = torchdist.rewrap(ddp)\n" + DDP_SNAPSHOT)
        return t1 - t0

    def restart(self) -> float:
        c = self.c
        t0 = time.perf_counter()
        c.view().execute(HANG, block=False)
        time.sleep(self.timeout)  # the same wait the user gives the cell
        c.restart()
        c.run(DDP_AGAIN.format(ckpt=self.ckpt))
        collective(c, 2, DIST_COLLECTIVE)
        t1 = time.perf_counter()
        c.run(DDP_SNAPSHOT)
        return t1 - t0

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.c.stop()


def hangs(args: argparse.Namespace, ckpt: str) -> dict:
    hg = Hang(args.timeout, ckpt)
    try:
        got = h.interleaved({"freed": hg.freed, "restart": hg.restart}, args.rounds)
    finally:
        hg.stop()
    f, s, a = h.median(got["freed"]), h.median(got["restart"]), h.median(hg.after)
    print(f"\ngloo hang, 2 ranks, DDP model alive, cell timeout {args.timeout:g} s:")
    print(
        f"  freed (variables kept) {f:6.2f} s [{h.span(got['freed'], '.2f')}] = timeout "
        f"+ {f - args.timeout:.2f} s; then a dist.all_reduce {a:.2f} s"
    )
    print(
        f"  timeout + restart + set-up + dist.all_reduce {s:6.2f} s "
        f"[{h.span(got['restart'], '.2f')}]   (freed + all_reduce)/restart "
        f"{h.fmt_ratio(h.paired([x + y for x, y in zip(got['freed'], hg.after)], got['restart']))}"
    )
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--mb", type=float, default=100.0, help="size of the large model")
    ap.add_argument("--timeout", type=float, default=4.0, help="the hang cell's timeout")
    ap.add_argument("--skip", choices=["death", "hang"], default=None)
    args = ap.parse_args()
    with h.mpi_lock(), tempfile.TemporaryDirectory(prefix="ck-bench-respawn-") as tmp:
        t0 = time.perf_counter()
        print(
            f"{datetime.datetime.now():%Y-%m-%d %H:%M}, load {h.load():.2f}, cpus {os.cpu_count()}"
        )
        if args.skip != "death":
            deaths(args, os.path.join(tmp, "model.pt"))
        if args.skip != "hang":
            hangs(args, os.path.join(tmp, "ddp.pt"))
        print(f"\ntotal {time.perf_counter() - t0:.0f} s, load {h.load():.2f}")


if __name__ == "__main__":
    main()
