"""The two sides of the scale benchmarks (``bench_scale_*.py``), one cluster at a time.

- :class:`CkSide`: ``clusterkernel.Cluster(n)`` in this process; its cells four ways
  on the same engines (``cluster.run`` = the ``%%mpi`` path, ``%%px``, ``execute``, and
  the EXPERIMENT ``cluster.run`` through ipyparallel's BroadcastView);
- :class:`RawSide`: raw ipyparallel in a worker process that never imports
  clusterkernel (``_raw_ipp.py``; every reply checked). It gets the very MPI job
  clusterkernel starts: ``mpiexec``, its flags and environment from
  ``clusterkernel.client.mpiexec.MPIRuntime`` (root, oversubscription, shared-memory
  transport, ``LOCAL_ONLY_ENV``), computed here and handed to the worker.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import ipyparallel as ipp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
from _raw_ipp import CELLS, SETUP, WORKER, measure_cells, measure_idle, raw_ways  # noqa: E402

from clusterkernel import Cluster  # noqa: E402
from clusterkernel.client.launch._engine_set import HEARTBEAT_MS  # noqa: E402
from clusterkernel.client.mpiexec import MPIRuntime  # noqa: E402
from clusterkernel.client.output import TerminalRenderer  # noqa: E402

__all__ = ["CELLS", "SETUP", "CkSide", "RawSide", "cell_stats", "fmt_cells", "measure_cells"]


# ------------------------------------------------------------------ experiments
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


@contextlib.contextmanager
def dateutil_dates() -> Iterator[None]:
    """ipyparallel's own reply-date parser (dateutil) inside the block: issue 11's change
    (``clusterkernel/client/cluster/_ipp.py``'s parser, installed at cluster start) undone."""
    from clusterkernel.client.cluster import _ipp

    saved = ipp.util._parse_date
    ipp.util._parse_date = _ipp._ORIGINAL
    try:
        yield
    finally:
        ipp.util._parse_date = saved


# ------------------------------------------------------------------ clusterkernel
class CkSide:
    """clusterkernel: ``Cluster(n)``, in this process."""

    name = "clusterkernel"
    heartbeat_ms = HEARTBEAT_MS

    def __init__(self, n: int, **kw) -> None:
        self.n = n
        self.kw = kw
        self.cluster: Cluster | None = None

    def start(self) -> float:
        import time

        t0 = time.perf_counter()
        self.cluster = Cluster(n=self.n, **self.kw).start()
        return time.perf_counter() - t0

    def restart(self) -> float:
        import time

        assert self.cluster is not None
        t0 = time.perf_counter()
        self.cluster.restart()
        return time.perf_counter() - t0

    def _idle_processes(self) -> list:
        c = self.cluster
        assert c is not None and c._engines is not None
        guard = c._engines.guard.pid if c._engines.guard is not None else None
        return [p for p in h.tree(c.processes()) if p.pid != guard]

    def idle(self, seconds: float) -> dict[str, float]:
        return measure_idle(self._idle_processes(), seconds)

    def stop(self) -> None:
        if self.cluster is None:
            return
        procs = h.tree(self.cluster.processes())
        self.cluster.stop()
        h.wait_gone(procs)
        self.cluster = None

    def ways(self, aa: bool = False, broadcast: bool = False) -> dict[str, Callable[[str], object]]:
        """``mpi`` (``cluster.run``), ``px`` and ``execute``; with ``aa`` also ``px again``
        (the A/A control); with ``broadcast`` also ``mpi+broadcast`` (EXPERIMENT, patched
        in this process only; interleaved with the others it kept this cluster's
        controller busy for a whole core: BENCHMARKS.md, "Re-run with raw ipyparallel in
        its own process")."""
        c = self.cluster
        assert c is not None
        c.client[:].execute(SETUP, block=True)

        def mpi(code: str) -> object:
            return c.run(code, renderer=TerminalRenderer(c.ranks, stream=io.StringIO()))

        def broadcast_run(code: str) -> object:
            with broadcast_views():
                return mpi(code)

        raw = raw_ways(c.client)
        ways = {"mpi": mpi, **raw}
        if aa:
            ways["px again"] = raw["px"]
        if broadcast:
            ways["mpi+broadcast"] = broadcast_run
        return ways

    def check_print_output(self, broadcast: bool = False) -> dict[str, bool]:
        """``cluster.run`` (and with ``broadcast`` the EXPERIMENT) shows one line per rank
        with its own rank, in rank order."""
        c = self.cluster
        assert c is not None
        ok = {}
        ctxs = [("mpi", contextlib.nullcontext())]
        if broadcast:
            ctxs.append(("mpi+broadcast", broadcast_views()))
        for name, ctx in ctxs:
            stream = io.StringIO()
            with ctx:
                run = c.run(
                    "print(rank)", renderer=TerminalRenderer(c.ranks, stream=stream, hold=0)
                )
            per_rank = [run.output(r).stdout for r in c.ranks]
            engines = [md["engine_id"] for md in run.ar.metadata]
            ok[name] = (
                per_rank == [f"{r}\n" for r in c.ranks]
                and engines == [c.engine_id(r) for r in c.ranks]
                and bool(stream.getvalue())
            )
        return ok


# ------------------------------------------------------------------ raw ipyparallel
def mpi_job(n: int) -> dict:
    """The MPI job clusterkernel would start (``client/launch/_mpiexec.py``), for the raw worker."""
    rt = MPIRuntime.detect()
    env = rt.env({"PATH": os.environ.get("PATH", "")})  # with LOCAL_ONLY_ENV, as a cluster
    return {"mpi_cmd": [rt.mpiexec], "mpi_args": rt.args(), "env": env}


class RawSide:
    """Raw ipyparallel in its own worker process (``_raw_ipp.py``), one per cluster."""

    def __init__(
        self,
        n: int,
        heartbeat_ms: int | None = None,
        engines: str = "mpi",
        name: str | None = None,
        **req,
    ) -> None:
        self.n = n
        self.heartbeat_ms = heartbeat_ms or 3000  # ipyparallel's default period
        self.name = name or ("raw" if heartbeat_ms is None else f"raw{heartbeat_ms}")
        self.req = {"n": n, "engines": engines, "heartbeat_ms": heartbeat_ms, **req}
        if engines == "mpi":
            self.req.update(mpi_job(n))
        self.proc: subprocess.Popen | None = None

    def _call(self, op: str, **kw) -> dict:
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"raw ipyparallel worker ended during {op!r}")
        reply = json.loads(line)
        if reply.get("clusterkernel_imported", True):
            raise RuntimeError("the raw ipyparallel worker imported clusterkernel")
        if "error" in reply:
            raise RuntimeError(f"raw ipyparallel worker, {op}: {reply['error']}")
        return reply

    def start(self) -> float:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env,
        )  # fmt: skip
        return self._call("start", **self.req)["t"]

    def restart(self) -> float:
        return self._call("restart")["t"]

    def cells(self, ways: list[str], rounds: int, cells: int) -> dict:
        return self._call("cells", ways=ways, rounds=rounds, cells=cells)["cells"]

    def idle(self, seconds: float) -> dict[str, float]:
        reply = self._call("idle", seconds=seconds)
        return {k: reply[k] for k in ("cpu_s", "wall_s", "processes")}

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                self._call("stop")
        finally:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


# ------------------------------------------------------------------ report helpers
def cell_stats(rounds: list[list], i: int) -> tuple[float, float, float]:
    """Median over all cells, and the lowest and highest round median (ms); ``i``: 0 wall,
    1 process CPU, 2 calling thread CPU."""
    per_round = [h.median(c[i] for c in rnd) * 1e3 for rnd in rounds]
    return h.median(c[i] for rnd in rounds for c in rnd) * 1e3, min(per_round), max(per_round)


def round_medians(rounds: list[list], i: int = 0) -> list[float]:
    """The median of each round (ms): what paired ratios compare."""
    return [h.median(c[i] for c in rnd) * 1e3 for rnd in rounds]


def fmt_cells(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.1f} [{t[1]:.1f}-{t[2]:.1f}]"
