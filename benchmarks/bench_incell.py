"""Recovery inside a training cell: the time a death costs, and what auto-respawn costs.

Run: python benchmarks/bench_incell.py [--rounds 3] [--ranks 2 4] [--mb 100] [--aa-rounds 7]
     [--chaos 6 --chaos-steps 300 --seed 1]

On a ``Cluster(n, fault_tolerant=True, torch=True)`` with ``cluster.auto_respawn = True``
(what ``%mpi start --respawn`` sets), answers two questions:

1. **Time lost per death**: the same training cell run undisturbed (``calm``) and with
   ``k`` ranks SIGKILLed inside it (``wild``), rounds interleaved (the order turned each
   round); lost per death = (wild - calm) / k, per round, then median and span. Loops:
   ``steps``: a plain ``DataParallel`` loop under ``train.steps`` (the tests' MLP with
   dropout, and ``--mb`` MB of float32 ``Linear(2048, 2048)`` + ``Tanh`` layers);
   ``fit``: ``Trainer.fit`` on the tests' MLP (``--no-fit`` skips it). The set-up
   (model, DataParallel, optimizer) is its own cell before the timed loop cell, run
   again before every timed cell (untimed). A rank dies by its own SIGKILL at the start
   of a drawn step (``steps``) or at a batch's end (``fit``); a marker file per kill
   makes each kill happen once (the redone step, or the new rank, does not die again).
   Each wild run is checked: one in-cell replacement per kill, the killed ranks' pids
   changed, every rank at the last step, and the final weights against the calm run's
   (max |difference| on every rank, printed). ``recover`` is the client's own figure
   (death seen to the new rank running the cell), median over the kills. Each death of a
   ``steps`` loop is also told as a timeline from the death (its marker file's time): the
   timed parts of the recovery on rank 0 and on the new rank (``rank._respawn.phases``:
   shrink, spawn, merge, pickle, send, receive, load, rebuild...), rank 0's return to the
   loop and its next steps; a table of their medians per case ends the run.
2. **Overhead of auto-respawn with no death**: the ``steps`` loop (small MLP) and a
   plain torch DDP loop (gloo, no ``steps``) timed with ``auto_respawn`` False (A),
   True (B) and False again (A'), interleaved per round; B/A against the A/A band
   (A'/A) (``_harness.aa_verdict``). Each switch is followed by one untimed empty cell,
   so arming the ranks (once per set of processes in real use) is not in the timing.

``--algorithm`` (default ``mpi``) is put in the ranks' ``CLUSTERKERNEL_ALGORITHM``:
with ``auto`` a model whose gradient buckets reach comm's zero-copy size (the 100 MB
one) has ``DataParallel`` average them in shared memory, and a survivor waiting there
for the dead rank spins and is never told (the cell hangs; ``--cell-timeout`` ends it
and the case is reported failed). ``mpi`` keeps every all-reduce on MPI, where ULFM
tells the survivors.

``--chaos K`` adds a longer case: the small model's ``steps`` loop of ``--chaos-steps``
steps with K SIGKILLs of random ranks at random steps (seeded by ``--seed``; kills in
neighbouring steps hit the step right after a recovery), checked and timed as above.

Takes the MPI lock (``/tmp/ck-mpi.lock``) itself, or uses the one ``flock`` holds.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from clusterkernel import Cluster
from clusterkernel.client.cluster import _incell

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

ENV = {"OMP_NUM_THREADS": "1"}

SMALL_NET = (
    "torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.2), torch.nn.Tanh(), "
    "torch.nn.Linear(8, 1))"
)
BIG_NET = (
    "torch.nn.Sequential(*[m for _ in range({layers}) "
    "for m in (torch.nn.Linear(2048, 2048), torch.nn.Tanh())])"
)

# the set-up cell: model, optimizer, DataParallel, data by (step, rank), the kill plan
SETUP = """
import os, signal, time, torch
from torch.utils.data import TensorDataset
from clusterkernel import comm, train
from clusterkernel.train import DataParallel, Trainer
torch.manual_seed(0)
net = {net}
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
KILLS, MARKS = {kills!r}, {marks!r}          # {{step: rank}}; a marker file per kill done
def maybe_die(step):
    if KILLS.get(step) == comm.rank():
        mark = os.path.join(MARKS, str(step))
        if not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
"""
SETUP_STEPS = """
dp = DataParallel(net, optimizer=opt)
def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, {din}, generator=g), torch.randn(8, {dout}, generator=g)
"""
SETUP_FIT = """
g = torch.Generator().manual_seed(7)
data = TensorDataset(torch.randn(1024, 6, generator=g), torch.randn(1024, 1, generator=g))
trainer = Trainer(net, opt, torch.nn.functional.mse_loss, data, batch_size=32, prefetch=False)
trainer.add_hook("on_batch_end", lambda t: maybe_die(t.global_step))
"""

LOOP_STEPS = """
_ends = []                                   # (step, wall clock at its end): the phases' view
for s in train.steps({steps}, model=net, optimizer=opt):
    with s:
        maybe_die(s.index)
        x, y = batch(s.index, comm.rank())
        opt.zero_grad()
        torch.nn.functional.mse_loss(dp(x), y).backward()
        opt.step()
    _ends.append((s.index, time.time()))
last = s.index + 1
"""
LOOP_FIT = "trainer.fit({epochs})\nlast = trainer.global_step\n"

# untimed: the calm run's weights saved by rank 0; every rank's max |difference| to them
SAVE_REF = """
_w = torch.cat([p.detach().flatten() for p in net.parameters()])
if comm.rank() == 0:
    torch.save(_w, {ref!r})
comm.barrier()
del _w
"""
# untimed, after a wild cell: each rank's timed parts of its respawns (rank._respawn.phases)
PHASES = "from clusterkernel.rank._respawn import phases as _p\n_phases = _p()\ndel _p\n"

DIFF_REF = """
_w = torch.cat([p.detach().flatten() for p in net.parameters()])
_diff = float((_w - torch.load({ref!r})).abs().max())
del _w
"""

DDP_SETUP = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
dnet = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
ddp = DDP(dnet)
dopt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
"""
DDP_LOOP = """
for i in range({steps}):
    g = torch.Generator().manual_seed(1000 * i + dist.get_rank())
    x, y = torch.randn(8, 256, generator=g), torch.randn(8, 1, generator=g)
    dopt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    dopt.step()
"""
DDP_FORGET = "del ddp, dnet, dopt\n"


class Replacements:
    """Every in-cell replacement the client makes (``_incell.Replacing``), kept to count
    them and read their ``seconds`` (death seen to the new rank running the cell)."""

    def __init__(self) -> None:
        self.made: list[_incell.Replacing] = []
        original = _incell.Replacing.__init__

        def init(rep, *a, **k):
            original(rep, *a, **k)
            self.made.append(rep)

        _incell.Replacing.__init__ = init

    def since(self, start: int) -> list:
        return self.made[start:]


# ------------------------------------------------------------------ 1. deaths
class Case:
    """One training cell on one cluster: its set-up, its loop, its kills."""

    def __init__(self, c: Cluster, reps: Replacements, tmp: str, name: str, model: str, **kw):
        self.c, self.reps, self.tmp = c, reps, tmp
        self.name, self.model = name, model
        self.net, self.extra, self.loop = kw["net"], kw["extra"], kw["loop"]
        self.timeout = kw["timeout"]
        self.kills_at = kw["kills"]  # steps in the loop -> {step: rank}
        self.kills: dict[int, int] = {}
        self.ref = os.path.join(tmp, f"ref-{name}-{model}-{c.n}.pt")
        self.lost: list[float] = []
        self.calm: list[float] = []
        self.wild: list[float] = []
        self.recover: list[float] = []
        self.diffs: list[float] = []
        self.deaths: list[dict] = []  # each death's timeline (see timeline())
        self.calm_step: list[float] = []  # rank 0's median step in the calm runs
        self.checked = 0
        self.runs = 0
        self._steps: int | None = None

    def setup(self, kills: dict[int, int]) -> str:
        self.runs += 1
        marks = os.path.join(self.tmp, f"marks-{self.name}-{self.model}-{self.c.n}-{self.runs}")
        os.makedirs(marks)
        self.c.run(SETUP.format(net=self.net, kills=kills, marks=marks) + self.extra)
        return marks

    def timed(self) -> float:
        t0 = time.perf_counter()
        self.c.run(self.loop, timeout=self.timeout)
        return time.perf_counter() - t0

    def whole(self, expect_last: int) -> None:
        c = self.c
        assert c.live_ranks == list(range(c.n)) and not c.dead, (c.live_ranks, c.dead)
        assert set(c.pull("last").values()) == {expect_last}, c.pull("last")

    def run_calm(self) -> float:
        self.setup({})
        t = self.timed()
        if self._steps is None:  # Trainer.fit: as many steps as the calm run made
            self._steps = self.c.pull("last")[0]
        self.whole(self.steps)
        if self.loop is not LOOP_FIT:
            ends = [t for _, t in self.c.pull("_ends")[0]]
            self.calm_step.append(h.median([b - a for a, b in zip(ends, ends[1:])]))
        if not os.path.exists(self.ref):
            self.c.run(SAVE_REF.format(ref=self.ref))
        else:  # the calm run itself is deterministic
            self.c.run(DIFF_REF.format(ref=self.ref))
            assert max(self.c.pull("_diff").values()) < 1e-5
        self.calm.append(t)
        return t

    def run_wild(self) -> float:
        c = self.c
        marks = self.setup(self.kills)
        pids = {r: c.rank_info[r]["pid"] for r in c.ranks}
        first = len(self.reps.made)
        t = self.timed()
        made = self.reps.since(first)
        done = len(os.listdir(marks))
        killed = set(self.kills.values())
        changed = {r for r in c.ranks if c.rank_info[r]["pid"] != pids[r]}
        assert done == len(self.kills), f"{done} of {len(self.kills)} kills happened"
        assert sum(len(rep.dead) for rep in made) == len(self.kills), [rep.dead for rep in made]
        assert changed == killed, (changed, killed)
        self.whole(self.steps)
        c.run(PHASES)
        ends = c.pull("_ends")[0] if self.loop is not LOOP_FIT else []
        self.deaths += timeline(self.kills, marks, c.pull("_phases"), ends)
        for d in self.deaths[-len(self.kills) :]:
            print(told(d))
        c.run(DIFF_REF.format(ref=self.ref))
        self.diffs.append(max(c.pull("_diff").values()))
        self.recover += [rep.seconds for rep in made if rep.seconds is not None]
        self.checked += 1
        self.wild.append(t)
        return t

    @property
    def steps(self) -> int:
        return self._steps

    def measure(self, rounds: int, steps: int | None) -> None:
        self._steps = steps
        self.run_calm()  # first: the reference weights, and a warm-up (not counted)
        self.calm.clear()
        self.kills = self.kills_at(self.steps)
        got = h.interleaved({"calm": self.run_calm, "wild": self.run_wild}, rounds)
        k = len(self.kills)
        self.lost = [(w - q) / k for w, q in zip(got["wild"], got["calm"])]

    def row(self) -> dict:
        return {
            "n": self.c.n,
            "model": self.model,
            "loop": self.name,
            "k": len(self.kills),
            "calm": self.calm,
            "wild": self.wild,
            "lost": self.lost,
            "recover": self.recover,
            "diff": max(self.diffs) if self.diffs else float("nan"),
            "deaths": self.deaths,
            "step": h.median(self.calm_step) if self.calm_step else float("nan"),
            "checked": self.checked,
        }


def timeline(
    kills: dict[int, int], marks: str, phases: dict[int, list[dict]], ends: list
) -> list[dict]:
    """Each death of a wild run, in seconds from it (its marker file's time: written just
    before the SIGKILL): the timed parts of the recovery (``rank._respawn.phases``) on
    rank 0 (never killed here: the rank copied from) and on the new rank, rank 0's end of
    the recovery (the failed step's ``with`` block left) and the lengths of its next steps
    (the failed one redone first)."""
    deaths = sorted(
        (os.path.getmtime(os.path.join(marks, str(step))), step, rank)
        for step, rank in kills.items()
    )
    out = []
    for i, (at, step, rank) in enumerate(deaths):
        until = deaths[i + 1][0] if i + 1 < len(deaths) else float("inf")

        def parts(r: int, at: float = at, until: float = until) -> list[tuple[str, float, float]]:
            return [
                (p["phase"], p["at"] - at, p["seconds"])
                for p in phases.get(r, [])
                if at <= p["at"] < until
            ]

        # the failed step's block left twice: at the recovery's end, then the step redone
        redo = [i for i, (s, t) in enumerate(ends) if s == step and at <= t < until]
        back = ends[redo[0]][1] - at if redo else float("nan")
        times = [t for _, t in ends[redo[0] :]] if redo else []
        steps = [b - a for a, b in zip(times, times[1:])][:3]
        out.append(
            {"step": step, "rank": rank, "root": parts(0), "new": parts(rank), "back": back,
             "after": steps}
        )  # fmt: skip
    return out


def told(d: dict) -> str:
    """One death's timeline, two lines: ``phase +start (seconds)`` from the death."""

    def line(parts: list) -> str:
        return "  ".join(f"{name} +{start:.2f} ({sec:.2f})" for name, start, sec in parts)

    steps = " ".join(f"{x:.2f}" for x in d["after"])
    return (
        f"    rank {d['rank']} dies at step {d['step']}: rank 0 back in the loop "
        f"+{d['back']:.2f} s, the step redone and the next {steps} s\n"
        f"      rank 0: {line(d['root'])}\n      new {d['rank']}: {line(d['new'])}"
    )


def kills_for(n: int, steps: int, first: int = 0) -> dict[int, int]:
    """Two deaths, at a third and two thirds of the loop: the last rank, then rank 1 (at 2
    ranks rank 1 twice, its replacement the second time)."""
    return {first + steps // 3: n - 1, first + 2 * steps // 3: 1}


def chaos_kills(n: int, steps: int, k: int, seed: int) -> dict[int, int]:
    """``k`` deaths at seeded random steps of the loop (after its first 5), each of a
    random rank; neighbouring steps are allowed, so a rank can die in the step right
    after a recovery, a replacement among them."""
    rng = random.Random(seed)
    return {s: rng.randrange(n) for s in sorted(rng.sample(range(5, steps), k))}


def deaths(c: Cluster, reps: Replacements, tmp: str, args: argparse.Namespace) -> list[dict]:
    n, rows = c.n, []
    layers = max(1, round(args.mb * 1e6 / ((2048 * 2048 + 2048) * 4)))
    cases = [
        (
            "steps",
            "small",
            args.steps,
            dict(
                net=SMALL_NET,
                extra=SETUP_STEPS.format(din=6, dout=1),
                loop=LOOP_STEPS.format(steps=args.steps),
                kills=lambda steps: kills_for(n, steps),
            ),
        ),
    ]
    if args.chaos:
        cases.append(
            (
                "chaos",
                "small",
                args.chaos_steps,
                dict(
                    net=SMALL_NET,
                    extra=SETUP_STEPS.format(din=6, dout=1),
                    loop=LOOP_STEPS.format(steps=args.chaos_steps),
                    kills=lambda steps: chaos_kills(n, steps, args.chaos, args.seed + n),
                ),
            )
        )
    if not args.no_fit:
        cases.append(
            (
                "fit",
                "small",
                None,  # its steps: from the calm run
                dict(
                    net=SMALL_NET,
                    extra=SETUP_FIT,
                    loop=LOOP_FIT.format(epochs=args.epochs),
                    kills=lambda steps: kills_for(n, steps, first=1),
                ),
            )
        )
    if args.mb > 0:
        cases.append(
            (
                "steps",
                f"{layers * (2048 * 2048 + 2048) * 4 / 1e6:.0f} MB",
                args.big_steps,
                dict(
                    net=BIG_NET.format(layers=layers),
                    extra=SETUP_STEPS.format(din=2048, dout=2048),
                    loop=LOOP_STEPS.format(steps=args.big_steps),
                    kills=lambda steps: kills_for(n, steps),
                ),
            )
        )
    for name, model, steps, kw in cases:
        case = Case(c, reps, tmp, name, model, timeout=args.cell_timeout, **kw)
        try:
            case.measure(args.rounds, steps)
        except Exception as e:  # noqa: BLE001 (a failed or hung recovery: told, the n ends)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            print(f"  {n} ranks, {model}, {name}: FAILED: {type(e).__name__}: {first}")
            print("    " + "\n    ".join(str(e).strip().splitlines()[:12]))
            rows.append({**case.row(), "failed": f"{type(e).__name__}: {first}"})
            return rows
        rows.append(case.row())
        report_death(rows[-1])
    c.run("for _k in ('net', 'opt', 'dp', 'trainer', 'data'):\n    globals().pop(_k, None)\n")
    return rows


def report_death(r: dict) -> None:
    print(
        f"  {r['n']} ranks, {r['model']:>6}, {r['loop']:5}: calm {h.median(r['calm']):6.2f} s "
        f"[{h.span(r['calm'], '.2f')}]  {r['k']} deaths {h.median(r['wild']):6.2f} s "
        f"[{h.span(r['wild'], '.2f')}]  lost/death {h.median(r['lost']):5.2f} s "
        f"[{h.span(r['lost'], '.2f')}]  recover {h.median(r['recover']):.2f} s  "
        f"max|dw| {r['diff']:.1e}  kills checked {r['checked']}/{len(r['wild'])}"
    )
    sys.stdout.flush()


# ------------------------------------------------------------------ 2. overhead
def overhead(c: Cluster, args: argparse.Namespace) -> list[dict]:
    c.run(
        SETUP.format(net=SMALL_NET, kills={}, marks="")
        + SETUP_STEPS.format(din=6, dout=1)
        + DDP_SETUP
    )
    rows = []
    for name, loop in (
        ("steps", LOOP_STEPS.format(steps=args.aa_steps)),
        ("ddp", DDP_LOOP.format(steps=args.aa_steps)),
    ):

        def way(on: bool, loop: str = loop) -> float:
            c.auto_respawn = on
            c.run("pass")  # arms (or disarms) the ranks: once per set of processes
            t0 = time.perf_counter()
            c.run(loop, timeout=600)
            return time.perf_counter() - t0

        got = h.interleaved(
            {"off": lambda: way(False), "on": lambda: way(True), "off2": lambda: way(False)},
            args.aa_rounds,
        )
        on, aa = h.paired(got["on"], got["off"]), h.paired(got["off2"], got["off"])
        rows.append({"n": c.n, "loop": name, **got, "ratio": on, "aa": aa})
        print(
            f"  {c.n} ranks, {name:5} {args.aa_steps} steps: off {h.median(got['off']):.3f} s "
            f"[{h.span(got['off'], '.3f')}]  on {h.median(got['on']):.3f} s "
            f"[{h.span(got['on'], '.3f')}]  on/off {h.fmt_ratio(on, 3)}  "
            f"A/A {h.fmt_ratio(aa, 3)}  {h.aa_verdict(on, aa)}"
        )
        sys.stdout.flush()
    c.auto_respawn = True
    c.run(DDP_FORGET)
    return rows


def phases_table(death_rows: list[dict]) -> None:
    """Where a death's time goes, per case: each timed part of the recovery on rank 0 and
    on the new rank, median start (from the death) and length over the deaths."""
    print("\n| ranks | model | loop | where | part | starts s after the death | takes s |")
    print("|---|---|---|---|---|---|---|")
    for r in death_rows:
        if not r.get("deaths"):
            continue
        head = f"| {r['n']} | {r['model']} | {r['loop']} "
        for where in ("root", "new"):
            named: dict[str, list[tuple[float, float]]] = {}
            for d in r["deaths"]:
                seen: dict[str, int] = {}
                for name, start, sec in d[where]:  # a part done twice (rounds): numbered
                    seen[name] = seen.get(name, 0) + 1
                    key = name if seen[name] == 1 else f"{name} #{seen[name]}"
                    named.setdefault(key, []).append((start, sec))
            for name, xs in sorted(named.items(), key=lambda kv: h.median(x for x, _ in kv[1])):
                print(
                    f"{head}| {'rank 0' if where == 'root' else 'new rank'} | {name} "
                    f"| {h.median(x for x, _ in xs):.2f} | {h.median(y for _, y in xs):.2f} |"
                )
        back = [d["back"] for d in r["deaths"]]
        first = [d["after"][0] for d in r["deaths"] if d["after"]]
        print(f"{head}| rank 0 | back in the loop | {h.median(back):.2f} | |")
        if first:
            print(
                f"{head}| rank 0 | the step redone (calm step {r['step']:.2f} s) | "
                f"| {h.median(first):.2f} |"
            )


def table(death_rows: list[dict], aa_rows: list[dict]) -> None:
    print("\n| ranks | model | loop | calm s | with 2 deaths s | lost per death s | recover s "
          "| max abs dw | kills checked |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in death_rows:
        if "failed" in r:
            print(f"| {r['n']} | {r['model']} | {r['loop']} | FAILED: {r['failed']} |")
            continue
        print(
            f"| {r['n']} | {r['model']} | {r['loop']} | {h.median(r['calm']):.2f} "
            f"[{h.span(r['calm'], '.2f')}] | {h.median(r['wild']):.2f} "
            f"[{h.span(r['wild'], '.2f')}] | **{h.median(r['lost']):.2f}** "
            f"[{h.span(r['lost'], '.2f')}] | {h.median(r['recover']):.2f} | {r['diff']:.1e} "
            f"| {r['checked']}/{len(r['wild'])} |"
        )
    phases_table(death_rows)
    print("\n| ranks | loop | off s | on s | on/off | A/A (off again/off) | within noise |")
    print("|---|---|---|---|---|---|---|")
    for r in aa_rows:
        print(
            f"| {r['n']} | {r['loop']} | {h.median(r['off']):.3f} | {h.median(r['on']):.3f} "
            f"| {h.fmt_ratio(r['ratio'], 3)} | {h.fmt_ratio(r['aa'], 3)} "
            f"| {h.aa_verdict(r['ratio'], r['aa'])} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3, help="calm/wild rounds per case")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--mb", type=float, default=100.0, help="size of the large model (0: none)")
    ap.add_argument("--steps", type=int, default=60, help="steps of the small model's loop")
    ap.add_argument("--big-steps", type=int, default=12, help="steps of the large model's loop")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of the Trainer.fit case")
    ap.add_argument("--no-fit", action="store_true", help="skip the Trainer.fit case")
    ap.add_argument("--aa-rounds", type=int, default=7, help="rounds of the overhead A/B/A'")
    ap.add_argument("--aa-steps", type=int, default=1000, help="steps of the overhead loops")
    ap.add_argument("--algorithm", default="mpi", help="the ranks' CLUSTERKERNEL_ALGORITHM")
    ap.add_argument("--cell-timeout", type=float, default=300.0, help="a timed cell's limit")
    ap.add_argument("--skip", choices=["death", "overhead"], default=None)
    ap.add_argument("--chaos", type=int, default=0, help="also a loop with this many random deaths")
    ap.add_argument("--chaos-steps", type=int, default=300, help="steps of the chaos loop")
    ap.add_argument("--seed", type=int, default=1, help="the chaos loop's draw (plus the ranks)")
    args = ap.parse_args()
    print("$ python benchmarks/bench_incell.py " + " ".join(sys.argv[1:]))
    reps = Replacements()
    death_rows: list[dict] = []
    aa_rows: list[dict] = []
    with h.mpi_lock(), tempfile.TemporaryDirectory(prefix="ck-bench-incell-") as tmp:
        t0 = time.perf_counter()
        print(
            f"{datetime.datetime.now():%Y-%m-%d %H:%M}, load {h.load():.2f}, cpus {os.cpu_count()}"
        )
        for n in args.ranks:
            env = {**ENV, "CLUSTERKERNEL_ALGORITHM": args.algorithm}
            c = Cluster(n=n, fault_tolerant=True, torch=True, env=env).start()
            try:
                c.auto_respawn = True
                c.run("import clusterkernel as _ck\n_ck_file = _ck.__file__\ndel _ck")
                print(
                    f"\n{n} ranks (clusterkernel from {sorted(set(c.pull('_ck_file').values()))}):"
                )
                if args.skip != "overhead":
                    aa_rows += overhead(c, args)
                if args.skip != "death":
                    death_rows += deaths(c, reps, tmp, args)
            finally:
                c.auto_respawn = False
                with contextlib.suppress(Exception):
                    c.stop()
        table(death_rows, aa_rows)
        print(f"\ntotal {time.perf_counter() - t0:.0f} s, load {h.load():.2f}")


if __name__ == "__main__":
    main()
