"""Raw ipyparallel for the scale benchmarks, in a process that never imports clusterkernel.

clusterkernel adapts ipyparallel's client in the process that starts a ``Cluster``
(``clusterkernel/client/cluster/_ipp.py``: the reply-date parser), so a "raw ipyparallel"
baseline measured in that process is not raw. The benchmarks therefore start this
file as a worker (``python benchmarks/_raw_ipp.py``): it imports ipyparallel, IPython,
traitlets, psutil and ``_harness`` (standard library only), never clusterkernel, and
every reply says so (``clusterkernel_imported``, checked by the caller; the worker also
refuses to answer once it finds clusterkernel in ``sys.modules``).

Protocol: one JSON request per line on stdin, one JSON reply per line on the
original stdout (the worker's own stdout goes to stderr, so ``%%px`` output and logs
cannot garble it):

- ``{"op": "start", "n", "engines": "mpi"|"slurm", "heartbeat_ms", "mpi_cmd",
  "mpi_args", "env", "controller_ip", "batch_template"}`` -> ``{"t": seconds}``:
  ``ipyparallel.Cluster(...)``, ``start_and_connect_sync()``, ``wait_for_engines(n)``;
- ``{"op": "restart"}`` -> ``{"t"}``: ``stop_engines_sync()``, wait until the old
  engines have unregistered, ``start_engines_sync(n)`` + ``wait_for_engines(n)``;
- ``{"op": "cells", "ways": [...], "rounds", "cells"}`` -> ``{"cells": ...}``
  (:func:`measure_cells` with ``%%px`` and/or ``execute``);
- ``{"op": "idle", "seconds"}`` -> CPU of the controller and MPI job while idle;
- ``{"op": "stop"}``; end of input ends the worker (stopping a cluster left running).

The parts both sides use (:func:`measure_cells`, :func:`raw_ways`, :data:`CELLS`) live
here so the clusterkernel side measures its cells with the very same code.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as h  # noqa: E402
import ipyparallel as ipp  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from traitlets.config import Config  # noqa: E402

SETUP = "from mpi4py import MPI\nrank = MPI.COMM_WORLD.Get_rank()"
CELLS = {"empty": "pass", "print": "print(rank)"}
WARMUP = 3  # cells of each way before the rounds
WORKER = Path(__file__).resolve()

_SHELL: InteractiveShell | None = None


def shell() -> InteractiveShell:
    """One IPython shell per process (``%%px`` runs through its magics)."""
    global _SHELL
    if _SHELL is None:
        _SHELL = InteractiveShell.instance()
    return _SHELL


def raw_ways(rc: ipp.Client) -> dict[str, Callable[[str], object]]:
    """``%%px`` through the shell's magics, and ``rc[:].execute``, on ``rc``'s engines."""
    shell()  # activate() registers %%px with the shell that exists then
    rc.activate()  # a blocking DirectView on all engines behind %%px

    def px(code: str) -> object:
        return shell().run_cell_magic("px", "", code)

    def execute(code: str) -> object:
        return rc[:].execute(code, block=True)

    return {"px": px, "execute": execute}


def measure_cells(
    ways: dict[str, Callable[[str], object]], rounds: int, cells: int
) -> dict[str, dict[str, list[list[tuple[float, float, float]]]]]:
    """``{kind: {way: [round: [(wall s, process CPU s, calling thread CPU s)]]}}``.

    Ways interleaved in rounds (A B C ... A B C ...), ``cells`` cells of one way at a
    time; stdout goes to a ``StringIO`` for every way alike."""
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


def measure_idle(procs: list, seconds: float) -> dict[str, float]:
    """CPU seconds of ``procs`` over ``seconds`` of idling (after 1 s to settle)."""
    time.sleep(1.0)
    c0, w0 = h.cpu_seconds(procs), time.perf_counter()
    time.sleep(seconds)
    c1, w1 = h.cpu_seconds(procs), time.perf_counter()
    return {"cpu_s": c1 - c0, "wall_s": w1 - w0, "processes": len(procs)}


class RawCluster:
    """``ipyparallel.Cluster(engines=..., n=n)`` with its defaults plus what ``req`` sets."""

    def __init__(self, req: dict) -> None:
        self.n = req["n"]
        self.engines = req.get("engines", "mpi")
        cfg = Config()
        if req.get("heartbeat_ms") is not None:
            cfg.LocalControllerLauncher.controller_args = [
                f"--HeartMonitor.period={req['heartbeat_ms']}"
            ]
        if self.engines == "mpi":
            cfg.MPIEngineSetLauncher.mpi_cmd = req["mpi_cmd"]
            cfg.MPIEngineSetLauncher.mpi_args = req["mpi_args"]
            cfg.MPIEngineSetLauncher.environment = req["env"]
        elif req.get("batch_template"):
            cfg.SlurmEngineSetLauncher.batch_template = req["batch_template"]
        self.cfg = cfg
        self.controller_ip = req.get("controller_ip")
        self.profile = tempfile.mkdtemp(prefix="ck-bench-ipp-")
        self.cluster: ipp.Cluster | None = None
        self.rc: ipp.Client | None = None

    def start(self) -> float:
        kw = {"controller_ip": self.controller_ip} if self.controller_ip else {}
        t0 = time.perf_counter()
        self.cluster = ipp.Cluster(
            engines=self.engines,
            n=self.n,
            config=self.cfg,
            profile_dir=self.profile,
            log_level=40,
            **kw,
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

    def _pids(self) -> list[int]:
        assert self.cluster is not None
        launchers = [self.cluster.controller, *self.cluster.engines.values()]
        return [lc.pid for lc in launchers if lc is not None and getattr(lc, "pid", None)]

    def cells(self, ways: list[str], rounds: int, cells: int) -> dict:
        assert self.rc is not None
        self.rc[:].execute(SETUP, block=True)
        every = raw_ways(self.rc)
        return measure_cells({w: every[w] for w in ways}, rounds, cells)

    def idle(self, seconds: float) -> dict[str, float]:
        return measure_idle(h.tree(self._pids()), seconds)

    def stop(self) -> None:
        if self.cluster is None:
            return
        procs = h.tree(self._pids())
        if self.rc is not None:
            with contextlib.suppress(Exception):
                self.rc.close()
        self.cluster.stop_cluster_sync()
        h.wait_gone(procs)
        self.cluster = self.rc = None


def serve(inp, out) -> None:
    """Answer requests from ``inp`` on ``out`` until end of input."""
    cluster: RawCluster | None = None
    try:
        for line in inp:
            if not line.strip():
                continue
            req = json.loads(line)
            op = req["op"]
            reply: dict = {}
            try:
                if op == "start":
                    shell()  # the shell exists before the cluster, as on the other side
                    cluster = RawCluster(req)
                    reply["t"] = cluster.start()
                elif op == "restart":
                    reply["t"] = cluster.restart()
                elif op == "cells":
                    reply["cells"] = cluster.cells(req["ways"], req["rounds"], req["cells"])
                elif op == "idle":
                    reply.update(cluster.idle(req["seconds"]))
                elif op == "stop":
                    if cluster is not None:
                        cluster.stop()
                    cluster = None
                else:
                    raise ValueError(f"unknown op {op!r}")
            except Exception as e:  # reported to the caller, which raises it
                reply = {"error": f"{type(e).__name__}: {e}"}
            reply["clusterkernel_imported"] = "clusterkernel" in sys.modules
            reply["pid"] = os.getpid()
            out.write(json.dumps(reply) + "\n")
            out.flush()
            if reply["clusterkernel_imported"]:
                raise SystemExit("clusterkernel was imported in the raw ipyparallel worker")
    finally:
        if cluster is not None:
            cluster.stop()


def main() -> None:
    assert "clusterkernel" not in sys.modules
    proto = os.fdopen(os.dup(1), "w")  # the replies; fd 1 itself now goes to stderr
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", closefd=False)
    serve(sys.stdin, proto)


if __name__ == "__main__":
    main()
