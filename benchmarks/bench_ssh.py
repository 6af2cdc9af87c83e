"""The notebook outside the cluster (``--ssh login``) vs inside it: start, empty cells, sync.

Run: flock /tmp/ck-ranks.lock .venv/bin/python benchmarks/bench_ssh.py [--rounds 3]

The test beds of ``tests/slurm/test_ssh.py``: the two-node Slurm bed
(``tests/slurm/_testbed.py``) and the login bed (``/work/shared/login/testbed.sh``), whose
"laptop" network namespace reaches the cluster only by SSH to the login node. Each
round runs two worker processes, one after the other, their order alternating by round:

- ``inside``: a notebook on the login node (this machine's root namespace, the Slurm
  bed's environment): ``Cluster(n=2, launcher="slurm", nodes=2)``;
- ``outside``: the same in the laptop namespace with ``ssh="login"``: the scheduler's
  commands and the controller on the login node, the notebook's connections through
  ipyparallel's SSH tunnels over one master connection.

Each worker times its start (``Cluster.start()``, the job on node1 and node2), then
``--cells`` empty cells (``cluster.run("pass")``, the ``%%mpi`` path, after 5 not timed),
then ``%mpi sync`` of a fresh 1 MB package (``bench_sync``'s: 21 files), its import on
every rank, a one-line edit synced and reloaded, and the stop. Ratios are outside /
inside, paired by round (median and range of the rounds). The login side is a veth
on this machine: the ratios are the cost of the SSH path (tunnels, the remote
controller, scp), not of a distant network's latency.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LOGIN_BED = Path("/work/shared/login/testbed.sh")
WARMUP = 5


def _trace_processes(began: float) -> list:
    """Every process this one starts from now: ``[start, seconds or None, argv]`` (seconds
    once waited for), to see where a start's time goes (``--trace``)."""
    seen: list = []
    init, wait = subprocess.Popen.__init__, subprocess.Popen.wait

    def traced_init(self, args, *a, **kw):
        self._ck_row = [time.perf_counter() - began, None, args]
        seen.append(self._ck_row)
        init(self, args, *a, **kw)

    def traced_wait(self, timeout=None):
        code = wait(self, timeout)
        if self._ck_row[1] is None:
            self._ck_row[1] = time.perf_counter() - began - self._ck_row[0]
        return code

    subprocess.Popen.__init__ = traced_init  # type: ignore[method-assign]
    subprocess.Popen.wait = traced_wait  # type: ignore[method-assign]
    return seen


def _worker(ssh: str | None, cells: int, trace: bool = False) -> dict:
    """One start, ``cells`` empty cells, a 1 MB sync and an edit, the stop: their times."""
    sys.path.insert(0, str(HERE))
    from bench_sync import _package

    from clusterkernel import Cluster
    from clusterkernel.client.output import TerminalRenderer
    from clusterkernel.client.sync import _files, sync

    out: dict = {}
    kw = {"ssh": ssh} if ssh else {}
    t0 = time.perf_counter()
    seen = _trace_processes(t0) if trace else []
    steps: list = []
    cluster = Cluster(n=2, launcher="slurm", nodes=2, **kw).start(
        progress=lambda line: steps.append((time.perf_counter() - t0, line))
    )
    out["start"] = time.perf_counter() - t0
    for at, line in steps if trace else ():
        print(f"TRACE {at:6.2f} s  step: {line}", file=sys.stderr)
    for at, took, argv in seen:
        shown = " ".join(map(str, argv)) if isinstance(argv, list) else str(argv)
        took = f"{took:5.2f} s" if took is not None else "  ... "
        print(f"TRACE {at:6.2f} s  {took}  {shown[-150:]}", file=sys.stderr)
    try:
        hosts = {info["host"] for info in cluster.rank_info.values()}
        assert hosts == {"node1", "node2"}, hosts
        times = []
        for i in range(WARMUP + cells):
            quiet = TerminalRenderer(cluster.ranks, stream=io.StringIO())
            t0 = time.perf_counter()
            cluster.run("pass", renderer=quiet)
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
        out["cell"] = statistics.median(times)
        with tempfile.TemporaryDirectory() as tmp:
            pkg = _package(Path(tmp), modules=20, kib=51)
            out["sync_bytes"] = sum(p.stat().st_size for p in pkg.iterdir())
            _files._compiled.clear()  # compiled as new sources, as a first sync of them is
            t0 = time.perf_counter()
            report = sync(cluster, [pkg], cwd=tmp)
            out["sync_first"] = time.perf_counter() - t0
            assert len(report.sent) == 21 and len(report.hosts) == 2, report
            cluster.run(f"import {pkg.name}")
            target = pkg / "m3.py"
            target.write_text(target.read_text().replace("x * 1 + y", "x * 1 + y + 1", 1))
            t0 = time.perf_counter()
            report = sync(cluster, [pkg], cwd=tmp)
            out["sync_edit"] = time.perf_counter() - t0
            assert report.reloaded == {f"{pkg.name}.m3": [0, 1]}, report
            cluster.run(f"assert {pkg.name}.m3.f_3_1(1) == 6")
    finally:
        t0 = time.perf_counter()
        cluster.stop()
        out["stop"] = time.perf_counter() - t0
    return out


class Beds:
    """The Slurm bed and the login bed, started together, stopped together."""

    def __init__(self) -> None:
        sys.path.insert(0, str(REPO))
        from tests.slurm._testbed import SlurmTestbed

        self.base = Path(tempfile.mkdtemp(prefix="ck-bench-ssh-"))
        self.slurm = SlurmTestbed()
        self.login = self.base / "login"

    def start(self) -> None:
        self.slurm.start()
        env_sh = self.base / "slurm-env.sh"
        env_sh.write_text(
            "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.slurm.env.items())
        )
        subprocess.run(
            ["bash", str(LOGIN_BED), "start", str(self.login), str(env_sh)],
            check=True, capture_output=True,
        )  # fmt: skip

    def stop(self) -> None:
        subprocess.run(["bash", str(LOGIN_BED), "stop", str(self.login)], capture_output=True)
        self.slurm.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def run(self, side: str, cells: int, trace: bool = False) -> dict:
        """One worker, ``inside`` or ``outside``; its times (its trace printed)."""
        me = [sys.executable, "-u", str(Path(__file__).resolve()), "--worker", side]
        me += ["--cells", str(cells)] + (["--trace"] if trace else [])
        if side == "outside":
            argv = ["bash", str(LOGIN_BED), "run", str(self.login), *me]
            env = None
        else:
            argv, env = me, {**os.environ, **self.slurm.env}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"the {side} worker failed:\n{done.stdout}\n{done.stderr}")
        if trace:
            print("\n".join(x for x in done.stderr.splitlines() if x.startswith("TRACE")))
        return json.loads(lines[-1][len("RESULT ") :])


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.1f} ms ({min(xs) * 1000:.1f}-{max(xs) * 1000:.1f})"


def _s(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})"


def _ratio(a: list[float], b: list[float]) -> str:
    r = [x / y for x, y in zip(a, b)]
    return f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})"


def report(res: dict[str, list[dict]]) -> None:
    inside, outside = res["inside"], res["outside"]

    def col(rows: list[dict], key: str) -> list[float]:
        return [row[key] for row in rows]

    print(f"\n2 ranks on node1 + node2, {len(inside)} rounds; median (min-max)")
    print(
        "| measurement | inside (login node) | outside (--ssh login) | outside / inside | target |"
    )
    print("|---|---|---|---|---|")
    for key, what, fmt, target in (
        ("start", "start", _s, "<= 1.3x"),
        ("cell", "empty cell, median per round", _ms, "<= 1.5x"),
        ("sync_first", "sync, 1 MB package (21 files)", _ms, "< 1 s"),
        ("sync_edit", "sync, one-line edit + reload", _ms, "< 1 s"),
        ("stop", "stop", _s, ""),
    ):
        a, b = col(inside, key), col(outside, key)
        print(f"| {what} | {fmt(a)} | {fmt(b)} | {_ratio(b, a)} | {target} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cells", type=int, default=100, help="empty cells timed per start")
    ap.add_argument("--worker", choices=("inside", "outside"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--trace", action="store_true", help="print each start's processes and steps (stderr)"
    )
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    if args.worker:
        got = _worker("login" if args.worker == "outside" else None, args.cells, args.trace)
        print("RESULT " + json.dumps(got), flush=True)
        return
    beds = Beds()
    res: dict[str, list[dict]] = {"inside": [], "outside": []}
    try:
        beds.start()
        for i in range(args.rounds):
            for side in ("inside", "outside") if i % 2 == 0 else ("outside", "inside"):
                got = beds.run(side, args.cells, args.trace)
                res[side].append(got)
                print(
                    f"round {i + 1} {side}: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in got.items() if k != "sync_bytes"),
                    flush=True,
                )
                left = beds.slurm.jobs()
                assert not left, f"jobs left after the {side} worker: {left}"
    finally:
        beds.stop()
    report(res)
    if args.json:
        args.json.write_text(json.dumps(res))


if __name__ == "__main__":
    main()
