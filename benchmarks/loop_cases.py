"""Run comm and DataParallel cases many times and count aborts (issue 27 item 7).

Run from the repository root (one MPI job at a time on this machine)::

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/loop_cases.py --rounds 10
    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/loop_cases.py --rounds 10 --load 2
    .venv/bin/python benchmarks/loop_cases.py --cases dp:2,comm_shm:3 --minutes 7

Each round runs every case of ``--cases`` once, each a fresh ``mpiexec -n N`` with
``PYTHONFAULTHANDLER=1`` (a rank that dies on a signal prints every thread's Python
stack) and one OpenMP thread per rank. Per job it records the exit status, the
signal Open MPI reports a rank died of, and the time; a failed job's whole output
goes to ``--log`` (one file per failure), and the end prints a summary per case.
``--load K`` runs K busy loops (``yes > /dev/null``) beside the jobs, started and
killed by this script (killed in a ``finally``: none is left behind). ``--minutes``
stops before starting a round that would begin after that many minutes, so a chunk
holds the machine's lock for a bounded time.

Cases (``name:ranks``):

- ``dp``        tests/train/workers/data_parallel.py: DataParallel against one process
  (equivalence, no_sync, unused parameters, buffers, fp16, misuse);
- ``dp_bench``  benchmarks/bench_train.py's variants worker on big_mlp, 30 steps:
  DataParallel beside the hand-written mpi4py loop and DDP over gloo in one job;
- ``comm``      every comm case file (tests/comm/mpi, pytest on each rank);
- ``comm_shm``  the shared-memory, async, fusion and C-path case files only.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
sys.path.insert(0, str(REPO))

import _harness as h  # noqa: E402

from tests._mpirun import kill_session  # noqa: E402

PY = sys.executable
CASE_DIR = REPO / "tests" / "comm" / "mpi"
_PYTEST = [
    "-m", "pytest", "-q", "--color=no", "-x", "-p", "no:cacheprovider",
    f"--confcutdir={CASE_DIR}", "-o", "python_files=case_*.py",
    "-o", "timeout=90", "-o", "timeout_method=thread",
]  # fmt: skip
SHM_FILES = ["case_shm.py", "case_shm_empty.py", "case_async.py", "case_fusion.py"]
SHM_FILES += ["case_fastpath.py"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def case_args(name: str) -> tuple[list[str], Path]:
    """What follows the interpreter for case ``name``, and the directory to run it in."""
    if name == "dp":
        return [str(REPO / "tests/train/workers/data_parallel.py")], REPO
    if name == "dp_bench":
        args = [str(REPO / "benchmarks/bench_train.py"), "--worker", "variants"]
        args += ["--model", "big_mlp", "--steps", "30", "--warmup", "5", "--rounds", "1"]
        return [*args, "--port", str(_port())], REPO
    if name == "comm":
        return [*_PYTEST, "."], CASE_DIR
    if name == "comm_shm":
        return [*_PYTEST, *SHM_FILES], CASE_DIR
    raise SystemExit(f"unknown case {name!r}")


_SIGNAL = re.compile(r"exited on signal (\d+)|signal (\d+) \(|Fatal Python error: (\w+)")


def run_case(name: str, n: int, timeout: float) -> dict:
    """One job of case ``name`` on ``n`` ranks: rc, signals seen, seconds, output."""
    from clusterkernel.client.mpiexec import MPIRuntime

    rt = MPIRuntime.detect()
    env = rt.env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    args, cwd = case_args(name)
    cmd = [*rt.command(n), "--tag-output", PY, *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
        hung = False
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, _ = proc.communicate()
        hung = True
    took = time.perf_counter() - t0
    sigs = sorted({next(g for g in m.groups() if g) for m in _SIGNAL.finditer(out)})
    return {"rc": proc.returncode, "hung": hung, "signals": sigs, "s": took, "out": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="dp:2,dp_bench:2,comm_shm:2")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--load", type=int, default=0, help="busy loops beside the jobs")
    ap.add_argument("--minutes", type=float, default=7.0, help="start no round after this")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    ap.add_argument("--log", default="/tmp/ck-loop-cases", help="failed jobs' output here")
    args = ap.parse_args()
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    log = Path(args.log)
    log.mkdir(parents=True, exist_ok=True)
    stats = {c: {"jobs": 0, "failed": 0, "aborts": 0, "hung": 0, "s": []} for c in cases}
    start = time.monotonic()
    rounds = 0
    with h.mpi_lock(), h.busy_loops(args.load):
        for r in range(args.rounds):
            if time.monotonic() - start > args.minutes * 60:
                break
            rounds += 1
            for name, n in cases:
                res = run_case(name, n, args.timeout)
                st = stats[(name, n)]
                st["jobs"] += 1
                st["s"].append(res["s"])
                bad = res["rc"] != 0 or res["hung"]
                line = f"round {r + 1} {name}:{n} rc={res['rc']} {res['s']:.1f} s"
                if bad:
                    st["failed"] += 1
                    st["hung"] += res["hung"]
                    st["aborts"] += "6" in res["signals"] or "SIGABRT" in res["out"]
                    f = log / f"{name}-{n}-load{args.load}-{int(time.time())}-{r}.log"
                    f.write_text(res["out"])
                    line += f" FAILED signals={res['signals']} hung={res['hung']} log {f}"
                print(line, flush=True)
    print(f"\nsummary: {rounds} rounds, load {args.load}, 1-min load avg now {h.load():.2f}")
    print("case | jobs | failed | aborts (signal 6) | hung | median s")
    for (name, n), st in stats.items():
        print(
            f"{name}:{n} | {st['jobs']} | {st['failed']} | {st['aborts']} | {st['hung']} | "
            f"{h.median(st['s']):.1f}"
        )


if __name__ == "__main__":
    main()
