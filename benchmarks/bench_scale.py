"""Issue 11: scale. Start, restart, an empty and a print cell at 4-32 ranks vs raw ipyparallel.

One process, one cluster at a time (start, measure, stop), never two at once. At each
size, in turn:

- ``clusterkernel``: ``Cluster(n).start()``; cells four ways on its engines, interleaved
  in rounds (A B C D A B C D ...): ``cluster.run(code)`` (the ``%%mpi`` path, output to
  a ``TerminalRenderer`` on an ``io.StringIO``), ``%%px`` (a real IPython
  ``InteractiveShell`` with ipyparallel's magics, ``client.activate()``),
  ``client[:].execute(code, block=True)`` and, as an EXPERIMENT, ``cluster.run`` with
  ``Cluster.view`` patched in this process to return ipyparallel's BroadcastView (one
  request message per cell for all engines; see ``--profile`` and BENCHMARKS.md);
  then ``cluster.restart()``;
- ``raw``: ``ipyparallel.Cluster(engines="mpi", n=n)`` with its default configuration
  (heartbeat 3 s), ``start_and_connect_sync()`` + ``wait_for_engines(n)``; ``%%px`` and
  ``execute`` cells; restart = ``stop_engines_sync()``, wait until the old engines have
  unregistered, ``start_engines_sync(n)`` + ``wait_for_engines(n)``;
- ``raw200``: the same with the controller's heartbeat at 200 ms
  (``--HeartMonitor.period=200``): start and restart only.

Raw ipyparallel gets the very MPI job clusterkernel starts: ``mpiexec`` and its flags
and environment from ``clusterkernel.mpiexec.MPIRuntime`` (root, oversubscription,
shared-memory transport), set through ``MPIEngineSetLauncher.mpi_cmd/mpi_args/
environment`` as ``clusterkernel/cluster/_launch.py`` does.

Per cell: wall time and the notebook process's CPU time (``time.process_time()``: every
thread, ipyparallel's IO thread included; ``time.thread_time()`` for the calling thread
alone). At the sizes in ``--idle-sizes`` each cluster also sits idle ``--idle`` seconds
while the CPU time of its controller (with its schedulers) and its MPI job (mpiexec,
prterun, engines, nannies) is read (the heartbeat's cost: 500 / 3000 / 200 ms).

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_scale.py
    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_scale.py --profile 16
    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_scale.py \
        --heartbeat 500 3000 200 --sizes 32
    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_scale.py --slurm
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import ipyparallel as ipp
import psutil
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clusterkernel import Cluster  # noqa: E402
from clusterkernel.cluster._launch import HEARTBEAT_MS, LOCAL_ONLY_ENV  # noqa: E402
from clusterkernel.mpiexec import MPIRuntime  # noqa: E402
from clusterkernel.output import TerminalRenderer  # noqa: E402

SETUP = "from mpi4py import MPI\nrank = MPI.COMM_WORLD.Get_rank()"
CELLS = {"empty": "pass", "print": "print(rank)"}
WARMUP = 3  # cells of each way before the rounds


# ------------------------------------------------------------------ processes
def _tree(pids: list[int]) -> list[psutil.Process]:
    """The processes ``pids`` and all their descendants."""
    out: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out[p.pid] = p
            for c in p.children(recursive=True):
                out[c.pid] = c
        except psutil.Error:
            pass
    return list(out.values())


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _wait_gone(procs: list[psutil.Process], timeout: float = 20.0) -> None:
    """Return once ``procs`` have exited (so two clusters never overlap)."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:  # ours, started by this process: never leave them running
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


# ------------------------------------------------------------------ the shell
_SHELL: InteractiveShell | None = None


def shell() -> InteractiveShell:
    global _SHELL
    if _SHELL is None:
        _SHELL = InteractiveShell.instance()
    return _SHELL


def _bcast_view(self: Cluster, ranks: list[int] | None = None) -> ipp.DirectView:
    """EXPERIMENT (this process only): ``Cluster.view`` returning a BroadcastView."""
    ranks = self.live_ranks if ranks is None else list(ranks)
    return self.client.broadcast_view([self.engine_id(r) for r in ranks])


@contextlib.contextmanager
def broadcast_views() -> Iterator[None]:
    """EXPERIMENT: ``Cluster.view`` patched to :func:`_bcast_view` inside the block."""
    saved = Cluster.view
    Cluster.view = _bcast_view  # type: ignore[method-assign]
    try:
        yield
    finally:
        Cluster.view = saved  # type: ignore[method-assign]


def _fast_parse_date(s):
    """EXPERIMENT: ``ipyparallel.util._parse_date`` without dateutil (same result)."""
    if isinstance(s, str) and ipp.util.ISO8601_PAT.match(s):
        try:
            dt = datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith("Z") else s)
        except ValueError:
            return _SLOW_PARSE_DATE(s)
        return ipp.util._ensure_tzinfo(dt)
    return s


_SLOW_PARSE_DATE = ipp.util._parse_date


@contextlib.contextmanager
def fast_dates() -> Iterator[None]:
    """EXPERIMENT: every reply's ``started`` parsed by ``datetime``, not dateutil."""
    ipp.util._parse_date = _fast_parse_date
    try:
        yield
    finally:
        ipp.util._parse_date = _SLOW_PARSE_DATE


@contextlib.contextmanager
def proposed() -> Iterator[None]:
    """EXPERIMENT: both changes proposed in BENCHMARKS.md (issue 11)."""
    with broadcast_views(), fast_dates():
        yield


# ------------------------------------------------------------------ the sides
class CkSide:
    """clusterkernel: ``Cluster(n)``."""

    name = "clusterkernel"
    heartbeat_ms = HEARTBEAT_MS

    def __init__(self, n: int, **kw) -> None:
        self.n = n
        self.kw = kw
        self.cluster: Cluster | None = None

    def start(self) -> float:
        t0 = time.perf_counter()
        self.cluster = Cluster(n=self.n, **self.kw).start()
        return time.perf_counter() - t0

    def restart(self) -> float:
        assert self.cluster is not None
        t0 = time.perf_counter()
        self.cluster.restart()
        return time.perf_counter() - t0

    @property
    def client(self) -> ipp.Client:
        assert self.cluster is not None
        return self.cluster.client

    def idle_processes(self) -> list[psutil.Process]:
        assert self.cluster is not None and self.cluster._engines.guard is not None
        guard = self.cluster._engines.guard.pid
        return [p for p in _tree(self.cluster.processes()) if p.pid != guard]

    def stop(self) -> None:
        if self.cluster is None:
            return
        procs = _tree(self.cluster.processes())
        self.cluster.stop()
        _wait_gone(procs)
        self.cluster = None

    def ways(self) -> dict[str, Callable[[str], object]]:
        c = self.cluster
        assert c is not None

        def mpi(code: str) -> object:
            return c.run(code, renderer=TerminalRenderer(c.ranks, stream=io.StringIO()))

        def patched(ctx: Callable) -> Callable[[str], object]:
            def run(code: str) -> object:
                with ctx():
                    return mpi(code)

            return run

        # the last two: EXPERIMENTS, patched in this process only (see the module doc)
        return {
            "mpi": mpi,
            **raw_ways(c.client),
            "mpi+dates": patched(fast_dates),
            "mpi+proposed": patched(proposed),
        }


def raw_config(n: int, heartbeat_ms: int | None) -> Config:
    """ipyparallel's defaults plus the MPI job clusterkernel would start (``_launch.py``)."""
    rt = MPIRuntime.detect()
    cfg = Config()
    if heartbeat_ms is not None:
        cfg.LocalControllerLauncher.controller_args = [f"--HeartMonitor.period={heartbeat_ms}"]
    env = rt.env({"PATH": os.environ.get("PATH", "")})
    for key, value in LOCAL_ONLY_ENV.items():
        env.setdefault(key, value)
    cfg.MPIEngineSetLauncher.mpi_cmd = [rt.mpiexec]
    cfg.MPIEngineSetLauncher.mpi_args = rt.args(n)
    cfg.MPIEngineSetLauncher.environment = env
    return cfg


class RawSide:
    """Raw ipyparallel: ``ipyparallel.Cluster(engines="mpi", n=n)``."""

    def __init__(self, n: int, heartbeat_ms: int | None = None) -> None:
        self.n = n
        self.heartbeat_ms = heartbeat_ms or 3000  # ipyparallel's default period
        self.name = "raw" if heartbeat_ms is None else f"raw{heartbeat_ms}"
        self.cfg = raw_config(n, heartbeat_ms)
        self.profile = tempfile.mkdtemp(prefix="ck-bench-ipp-")
        self.cluster: ipp.Cluster | None = None
        self.rc: ipp.Client | None = None

    def start(self) -> float:
        t0 = time.perf_counter()
        self.cluster = ipp.Cluster(
            engines="mpi", n=self.n, config=self.cfg, profile_dir=self.profile, log_level=40
        )
        self.rc = self.cluster.start_and_connect_sync()
        self.rc.wait_for_engines(self.n, timeout=120)
        return time.perf_counter() - t0

    def restart(self) -> float:
        assert self.cluster is not None and self.rc is not None
        t0 = time.perf_counter()
        self.cluster.stop_engines_sync()
        # Restarted engines take the old ids: wait for the old ones to go first, or
        # wait_for_engines counts them.
        deadline = time.monotonic() + 60
        while self.rc.ids:
            if time.monotonic() > deadline:
                raise RuntimeError(f"old engines still registered: {self.rc.ids}")
            time.sleep(0.05)
        self.cluster.start_engines_sync(self.n)
        self.rc.wait_for_engines(self.n, timeout=120)
        return time.perf_counter() - t0

    @property
    def client(self) -> ipp.Client:
        assert self.rc is not None
        return self.rc

    def _pids(self) -> list[int]:
        assert self.cluster is not None
        launchers = [self.cluster.controller, *self.cluster.engines.values()]
        return [lc.pid for lc in launchers if lc is not None and getattr(lc, "pid", None)]

    def idle_processes(self) -> list[psutil.Process]:
        return _tree(self._pids())

    def stop(self) -> None:
        if self.cluster is None:
            return
        procs = _tree(self._pids())
        if self.rc is not None:
            with contextlib.suppress(Exception):
                self.rc.close()
        self.cluster.stop_cluster_sync()
        _wait_gone(procs)
        self.cluster = self.rc = None

    def ways(self) -> dict[str, Callable[[str], object]]:
        return raw_ways(self.client)


def raw_ways(rc: ipp.Client) -> dict[str, Callable[[str], object]]:
    """``%%px`` through the shell's magics, and ``rc[:].execute``, on ``rc``'s engines."""
    rc.activate()  # a blocking DirectView on all engines behind %%px

    def px(code: str) -> object:
        return shell().run_cell_magic("px", "", code)

    def execute(code: str) -> object:
        return rc[:].execute(code, block=True)

    return {"px": px, "execute": execute}


# ------------------------------------------------------------------ measuring
def measure_cells(
    ways: dict[str, Callable[[str], object]], rounds: int, cells: int
) -> dict[str, dict[str, list[list[tuple[float, float, float]]]]]:
    """``{kind: {way: [round: [(wall s, process CPU s, calling thread CPU s)]]}}``."""
    out: dict[str, dict[str, list]] = {k: {w: [] for w in ways} for k in CELLS}
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        for code in CELLS.values():
            for fn in ways.values():
                for _ in range(WARMUP):
                    fn(code)
        for kind, code in CELLS.items():
            for _ in range(rounds):
                for way, fn in ways.items():
                    got = []
                    for _ in range(cells):
                        w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
                        fn(code)
                        got.append(
                            (
                                time.perf_counter() - w0,
                                time.process_time() - c0,
                                time.thread_time() - t0,
                            )
                        )
                    out[kind][way].append(got)
                sink.seek(0)
                sink.truncate()
    return out


def check_print_output(side: CkSide) -> dict[str, bool]:
    """Both ways of ``cluster.run`` show one line per rank with its own rank."""
    c = side.cluster
    assert c is not None
    ok = {}
    for name, ctx in (("mpi", contextlib.nullcontext()), ("mpi+proposed", proposed())):
        stream = io.StringIO()
        with ctx:
            run = c.run("print(rank)", renderer=TerminalRenderer(c.ranks, stream=stream, hold=0))
        text = stream.getvalue()
        per_rank = [run.output(r).stdout for r in c.ranks]
        engines = [md["engine_id"] for md in run.ar.metadata]
        ok[name] = (
            per_rank == [f"{r}\n" for r in c.ranks]
            and engines == [c.engine_id(r) for r in c.ranks]
            and bool(text)
        )
    return ok


def measure_idle(side, seconds: float) -> dict[str, float]:
    procs = side.idle_processes()
    time.sleep(1.0)  # let the start-up settle
    c0, w0 = _cpu(procs), time.perf_counter()
    time.sleep(seconds)
    c1, w1 = _cpu(procs), time.perf_counter()
    return {"cpu_s": c1 - c0, "wall_s": w1 - w0, "processes": len(procs)}


def run_sizes(args) -> dict:
    res: dict = {"sizes": {}, "load_before": os.getloadavg()}
    shell()  # the shell exists before any cluster, for every side alike
    for n in args.sizes:
        rounds = args.rounds if n <= 16 else max(2, args.rounds // 2)
        starts = args.starts if n <= 4 else max(1, args.starts - (1 if n <= 16 else 2))
        r: dict = {"start": {}, "restart": {}, "cells": {}, "idle": {}, "load": []}
        for rep in range(starts):
            for kind, kw in ((CkSide, {}), (RawSide, {}), (RawSide, {"heartbeat_ms": 200})):
                side = kind(n, **kw)
                try:
                    t = side.start()
                    r["start"].setdefault(side.name, []).append(t)
                    print(f"[{n} ranks] {side.name} start {t:.2f} s", flush=True)
                    if rep == 0 and side.name != "raw200":
                        side.client[:].execute(SETUP, block=True)
                        cells = measure_cells(side.ways(), rounds, args.cells)
                        r["cells"][side.name] = cells
                        if isinstance(side, CkSide):
                            r["output_check"] = check_print_output(side)
                        print(f"[{n} ranks] {side.name} cells done", flush=True)
                    if rep == 0 and n in args.idle_sizes:
                        r["idle"][side.name] = {
                            **measure_idle(side, args.idle),
                            "heartbeat_ms": side.heartbeat_ms,
                        }
                    t = side.restart()
                    r["restart"].setdefault(side.name, []).append(t)
                    print(f"[{n} ranks] {side.name} restart {t:.2f} s", flush=True)
                finally:
                    side.stop()
                r["load"].append(os.getloadavg()[0])
        res["sizes"][n] = r
    res["load_after"] = os.getloadavg()
    return res


# ------------------------------------------------------------------ report
def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _cell_stats(rounds: list[list[tuple]], i: int) -> tuple[float, float, float]:
    """Median over all cells, and the lowest and highest round median (ms)."""
    per_round = [_med([c[i] for c in rnd]) * 1e3 for rnd in rounds]
    return _med([c[i] for rnd in rounds for c in rnd]) * 1e3, min(per_round), max(per_round)


def _fmt(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.1f} [{t[1]:.1f}-{t[2]:.1f}]"


def report(res: dict) -> None:
    sizes = sorted(res["sizes"], key=int)
    print(f"\nload average before {res['load_before']}, after {res['load_after']}")
    print("\nStart and restart (median, seconds; every run in brackets):")
    print(
        "| ranks | clusterkernel start | raw start (3 s heartbeat) | raw start (200 ms) "
        "| ck / raw | ck / raw200 | ck restart | raw restart | raw200 restart "
        "| ck / raw | ck / raw200 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        r = res["sizes"][n]
        row = [str(n)]
        for what in ("start", "restart"):
            t = {k: r[what].get(k, []) for k in ("clusterkernel", "raw", "raw200")}
            m = {k: _med(v) for k, v in t.items()}
            row += [f"{m[k]:.2f} ({', '.join(f'{x:.1f}' for x in t[k])})" for k in t]
            row += [
                f"{m['clusterkernel'] / m['raw']:.2f}x",
                f"{m['clusterkernel'] / m['raw200']:.2f}x",
            ]
        print("| " + " | ".join(row) + " |")

    for kind in CELLS:
        print(
            f"\n{kind} cell ({CELLS[kind]!r}): wall ms, median of all cells [lowest-highest "
            "round median]; ratios of medians"
        )
        print(
            "| ranks | `cluster.run` | `%%px` | `execute` | run / %%px | run / execute "
            "| exp. A: fast dates | A / %%px | exp. B: fast dates + broadcast | B / %%px "
            "| raw cluster: `%%px` | raw cluster: `execute` |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n in sizes:
            ck = res["sizes"][n]["cells"]["clusterkernel"][kind]
            raw = res["sizes"][n]["cells"]["raw"][kind]
            s = {w: _cell_stats(v, 0) for w, v in ck.items()}
            sr = {w: _cell_stats(v, 0) for w, v in raw.items()}
            px = s["px"][0]
            print(
                f"| {n} | {_fmt(s['mpi'])} | {_fmt(s['px'])} | {_fmt(s['execute'])} "
                f"| {s['mpi'][0] / px:.2f}x | {s['mpi'][0] / s['execute'][0]:.2f}x "
                f"| {_fmt(s['mpi+dates'])} | {s['mpi+dates'][0] / px:.2f}x "
                f"| {_fmt(s['mpi+proposed'])} | {s['mpi+proposed'][0] / px:.2f}x "
                f"| {_fmt(sr['px'])} | {_fmt(sr['execute'])} |"
            )
        print(f"\n{kind} cell: notebook process CPU ms per cell, median (calling thread alone)")
        print(
            "| ranks | `cluster.run` | `%%px` | `execute` | exp. A: fast dates "
            "| exp. B: + broadcast | run / %%px | A / %%px | B / %%px |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        ways = ("mpi", "px", "execute", "mpi+dates", "mpi+proposed")
        for n in sizes:
            ck = res["sizes"][n]["cells"]["clusterkernel"][kind]
            c = {w: _cell_stats(v, 1)[0] for w, v in ck.items()}
            t = {w: _cell_stats(v, 2)[0] for w, v in ck.items()}
            cols = [f"{c[w]:.1f} ({t[w]:.1f})" for w in ways]
            cols += [f"{c[w] / c['px']:.2f}x" for w in ("mpi", "mpi+dates", "mpi+proposed")]
            print(f"| {n} | " + " | ".join(cols) + " |")

    idle = [(n, res["sizes"][n]["idle"]) for n in sizes if res["sizes"][n]["idle"]]
    for n, by in idle:
        print(f"\nidle {n} ranks: CPU of controller + MPI job while idle (heartbeat)")
        print("| cluster | heartbeat | CPU % of one core | processes |")
        print("|---|---|---|---|")
        for name, d in sorted(by.items(), key=lambda kv: kv[1]["heartbeat_ms"]):
            pct = 100 * d["cpu_s"] / d["wall_s"]
            print(f"| {name} | {d['heartbeat_ms']} ms | {pct:.1f} % | {d['processes']} |")
    for n in sizes:
        chk = res["sizes"][n].get("output_check")
        if chk:
            print(f"print cell output per rank correct at {n} ranks: {chk}")


# ------------------------------------------------------------------ profile
def profile(n: int, cells: int, rounds: int, out_dir: Path) -> None:
    """cProfile of ``cluster.run('pass')`` at ``n`` ranks: calling thread and IO thread."""
    side = CkSide(n)
    side.start()
    try:
        c = side.cluster
        assert c is not None
        c.client[:].execute(SETUP, block=True)
        mpi = side.ways()["mpi"]
        for _ in range(10):
            mpi("pass")
        main, io_prof = cProfile.Profile(), cProfile.Profile()
        loop = c.client._io_loop  # ipyparallel's IO thread: replies and output land there
        started = threading.Event()

        def _enable_io() -> None:
            io_prof.enable()
            started.set()

        loop.add_callback(_enable_io)
        started.wait(5)
        c0, w0 = time.process_time(), time.perf_counter()
        main.enable()
        for _ in range(cells):
            mpi("pass")
        main.disable()
        c1, w1 = time.process_time(), time.perf_counter()
        stopped = threading.Event()
        loop.add_callback(lambda: (io_prof.disable(), stopped.set()))
        stopped.wait(5)
        print(
            f"\nprofile: {cells} x cluster.run('pass') at {n} ranks: "
            f"{1e3 * (w1 - w0) / cells:.1f} ms wall, {1e3 * (c1 - c0) / cells:.1f} ms CPU per "
            "cell (profiled, so slower than the tables)"
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, prof in (("main", main), ("io", io_prof)):
            path = out_dir / f"bench_scale_{n}_{name}.pstats"
            prof.dump_stats(path)
            print(f"\n--- {name} thread (by own time), saved to {path}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
            print(f"--- {name} thread (cumulative)")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        # Each change alone and both, on the same engines, interleaved (no profiler).
        variants = {
            "as is": contextlib.nullcontext,
            "broadcast view": broadcast_views,
            "fast dates": fast_dates,
            "both (proposed)": proposed,
        }

        def way(ctx):
            def run(code: str) -> object:
                with ctx():
                    return mpi(code)

            return run

        ab = measure_cells({k: way(v) for k, v in variants.items()}, rounds, cells // 10)
        print(f"\nA/B at {n} ranks, {rounds} rounds x {cells // 10} cells: median ms per cell")
        print("| `cluster.run` | empty: wall | empty: CPU | print: wall | print: CPU |")
        print("|---|---|---|---|---|")
        for k in variants:
            e, p = ab["empty"][k], ab["print"][k]
            print(
                f"| {k} | {_cell_stats(e, 0)[0]:.1f} | {_cell_stats(e, 1)[0]:.1f} "
                f"| {_cell_stats(p, 0)[0]:.1f} | {_cell_stats(p, 1)[0]:.1f} |"
            )
    finally:
        side.stop()


# ------------------------------------------------------------------ heartbeat
def _groups(cluster: Cluster) -> dict[str, list[psutil.Process]]:
    ipc = cluster._engines.ipp
    assert ipc is not None
    engines = [lc.pid for lc in ipc.engines.values() if getattr(lc, "pid", None)]
    return {"controller": _tree([ipc.controller.pid]), "MPI job": _tree(engines)}


def _idle_by_group(cluster: Cluster, seconds: float) -> dict[str, float]:
    """CPU % of one core per process group over ``seconds`` of idling, and the top process."""
    groups = _groups(cluster)
    procs = [p for g in groups.values() for p in g]
    before = {p.pid: _cpu([p]) for p in procs}
    time.sleep(seconds)
    used = {p.pid: _cpu([p]) - before[p.pid] for p in procs}
    out = {k: 100 * sum(used[p.pid] for p in g) / seconds for k, g in groups.items()}
    top = max(procs, key=lambda p: used[p.pid])
    with contextlib.suppress(psutil.Error):
        out["top"] = f"{top.name()} {100 * used[top.pid] / seconds:.1f} %"
    return out


def heartbeat(n: int, periods: list[int], seconds: float, cells: int) -> dict:
    """Idle CPU of one ``Cluster(n)`` per heartbeat period: fresh, then after ``cells`` cells.

    ``clusterkernel.cluster._launch.HEARTBEAT_MS`` is patched in this process for each period.
    """
    from clusterkernel.cluster import _launch

    res = {}
    saved = _launch.HEARTBEAT_MS
    for ms in periods:
        _launch.HEARTBEAT_MS = ms
        side = CkSide(n)
        try:
            t = side.start()
            c = side.cluster
            assert c is not None
            time.sleep(1.0)
            fresh = _idle_by_group(c, seconds)
            w0 = time.perf_counter()
            for _ in range(cells):
                c.run("pass", renderer=TerminalRenderer(c.ranks, stream=io.StringIO()))
            per_cell = (time.perf_counter() - w0) / max(cells, 1)
            time.sleep(1.0)
            after = _idle_by_group(c, seconds)
            res[ms] = {"start": t, "fresh": fresh, "after": after, "cell": per_cell}
            print(f"[heartbeat {ms} ms] {res[ms]}", flush=True)
        finally:
            _launch.HEARTBEAT_MS = saved
            side.stop()
    return res


def report_heartbeat(res: dict, n: int, seconds: float, cells: int) -> None:
    print(
        f"\nheartbeat, Cluster(n={n}) idle {seconds:g} s: CPU % of one core (fresh | after "
        f"{cells} empty cells)"
    )
    print("| heartbeat | start s | controller | MPI job | busiest process | empty cell ms |")
    print("|---|---|---|---|---|---|")
    for ms, d in res.items():
        f, a = d["fresh"], d["after"]
        print(
            f"| {ms} ms | {d['start']:.1f} | {f['controller']:.1f} \\| {a['controller']:.1f} "
            f"| {f['MPI job']:.1f} \\| {a['MPI job']:.1f} | {f.get('top')} \\| {a.get('top')} "
            f"| {1e3 * d['cell']:.1f} |"
        )


# ------------------------------------------------------------------ slurm
SLURM_TEMPLATE = """#!/bin/sh
#SBATCH --export=ALL
#SBATCH --job-name=ipengine-{cluster_id}
#SBATCH --ntasks={n}
#SBATCH --ntasks-per-node=2
srun --mpi=pmix {program_and_args} --mpi
"""


class RawSlurmSide(RawSide):
    """ipyparallel's own Slurm launcher, engines spread 2+2, one MPI job (pmix)."""

    def __init__(self, n: int, controller_ip: str) -> None:
        self.n = n
        self.name = "raw slurm"
        self.heartbeat_ms = 3000
        self.cfg = Config()
        self.cfg.SlurmEngineSetLauncher.batch_template = SLURM_TEMPLATE
        self.controller_ip = controller_ip
        self.profile = tempfile.mkdtemp(prefix="ck-bench-ipp-")
        self.cluster = None
        self.rc = None

    def start(self) -> float:
        t0 = time.perf_counter()
        self.cluster = ipp.Cluster(
            engines="slurm",
            n=self.n,
            controller_ip=self.controller_ip,
            config=self.cfg,
            profile_dir=self.profile,
            log_level=40,
        )
        self.rc = self.cluster.start_and_connect_sync()
        self.rc.wait_for_engines(self.n, timeout=120)
        return time.perf_counter() - t0

    def stop(self) -> None:
        if self.cluster is None:
            return
        procs = _tree(self._pids())
        with contextlib.suppress(Exception):
            self.rc.close()
        self.cluster.stop_cluster_sync()
        _wait_gone(procs)
        self.cluster = self.rc = None


def run_slurm(args) -> dict:
    sys.path.insert(0, str(REPO))
    from tests.slurm._testbed import SlurmTestbed

    res: dict = {"start": {}, "cells": {}, "load_before": os.getloadavg()}
    bed = SlurmTestbed()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    tmp = tempfile.mkdtemp(prefix="ck-bench-slurm-")
    try:
        bed.start()
        os.environ.update(bed.env)
        os.chdir(tmp)  # ipyparallel writes its batch file in the current directory
        shell()
        for _ in range(args.starts):
            for make in (
                lambda: CkSide(4, launcher="slurm", nodes=2),
                lambda: RawSlurmSide(4, bed.controller_address),
            ):
                side = make()
                try:
                    t = side.start()
                    res["start"].setdefault(side.name, []).append(t)
                    print(f"[slurm] {side.name} start {t:.2f} s", flush=True)
                    if side.name not in res["cells"]:
                        side.client[:].execute(SETUP, block=True)
                        ways = side.ways()
                        if isinstance(side, CkSide):
                            ways = {"mpi": ways["mpi"], "px": ways["px"]}
                        else:
                            ways = {"px": ways["px"]}
                        res["cells"][side.name] = measure_cells(ways, args.rounds, args.cells)
                finally:
                    side.stop()
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        bed.stop()
    res["load_after"] = os.getloadavg()
    return res


def report_slurm(res: dict) -> None:
    print(f"\nload average before {res['load_before']}, after {res['load_after']}")
    t = res["start"]
    ck, raw = t["clusterkernel"], t["raw slurm"]
    print("\nSlurm, 4 ranks on 2 nodes (2+2):")
    print("| measurement | clusterkernel | raw ipyparallel (Slurm launcher) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| start, median ({', '.join(f'{x:.1f}' for x in ck)} / "
        f"{', '.join(f'{x:.1f}' for x in raw)} s) | {_med(ck):.2f} s | {_med(raw):.2f} s "
        f"| {_med(ck) / _med(raw):.2f}x |"
    )
    for kind in CELLS:
        a = _cell_stats(res["cells"]["clusterkernel"][kind]["mpi"], 0)
        b = _cell_stats(res["cells"]["clusterkernel"][kind]["px"], 0)
        c = _cell_stats(res["cells"]["raw slurm"][kind]["px"], 0)
        print(
            f"| {kind} cell, ms [round medians] | {a[0]:.1f} [{a[1]:.1f}-{a[2]:.1f}] "
            f"| `%%px` same cluster {b[0]:.1f} [{b[1]:.1f}-{b[2]:.1f}]; raw cluster "
            f"{c[0]:.1f} [{c[1]:.1f}-{c[2]:.1f}] | {a[0] / b[0]:.2f}x |"
        )


# ------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32], help="ranks")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of cells (halved above 16)")
    ap.add_argument("--cells", type=int, default=20, help="cells per way per round")
    ap.add_argument(
        "--starts",
        type=int,
        default=3,
        help="start+restart cycles per side at 4 ranks (one fewer up to 16, two fewer above)",
    )
    ap.add_argument("--idle", type=float, default=10.0, help="seconds idle for the heartbeat")
    ap.add_argument("--idle-sizes", type=int, nargs="*", default=[32])
    ap.add_argument("--profile", type=int, metavar="N", help="instead: profile at N ranks")
    ap.add_argument("--slurm", action="store_true", help="instead: the two-node Slurm test bed")
    ap.add_argument(
        "--heartbeat",
        type=int,
        nargs="*",
        metavar="MS",
        help="instead: idle CPU of Cluster(max(sizes)) at these heartbeat periods (ms)",
    )
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    if args.profile:
        profile(args.profile, args.cells * 10, args.rounds, REPO / "test-artifacts")
        return
    if args.heartbeat:
        n = max(args.sizes)
        hb = heartbeat(n, args.heartbeat, args.idle, args.cells * 2)
        report_heartbeat(hb, n, args.idle, args.cells * 2)
        if args.json:
            args.json.write_text(json.dumps(hb))
        return
    if args.slurm:
        res = run_slurm(args)
        report_slurm(res)
    else:
        res = run_sizes(args)
        report(res)
    if args.json:
        args.json.write_text(json.dumps(res))


if __name__ == "__main__":
    main()
