"""What ``%mpi sync`` costs: a 1 MB package sent to the ranks, then a one-line edit.

Run: flock /tmp/ck-ranks.lock python benchmarks/bench_sync.py [--ranks 2 4] [--rounds 5]

Per rank count, one cluster on this machine (one host: one writing rank); per round a
fresh package (``--modules`` modules of ``--kib`` KiB of plain functions, 1 MB by
default) in a temporary folder:

- ``first``: ``sync(cluster, [pkg])`` of the whole package (read, hashed, compiled on
  the notebook's side, sent, written, nothing to reload yet);
- the package is imported on every rank (not timed);
- ``edit``: one line of one module changed, synced again (that file alone is sent,
  compiled, written, and reloaded on every rank with autoreload's ``superreload``);
- ``same``: a sync with nothing changed (hashing and the hosts' check).

Each time is the wall time of the ``sync`` call in the notebook's process; medians
(min-max) over rounds, and the client-side share of ``first`` (collect + compile,
timed alone on the same files). Target (issue 48): under 1 s for ``first`` and ``edit``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path

from clusterkernel import Cluster
from clusterkernel.client.sync import _files, sync


def _module(i: int, kib: int) -> str:
    lines, size, n = [], 0, 0
    while size < kib * 1024:
        text = (
            f"def f_{i}_{n}(x, y=1):\n"
            f'    """Function {n} of module {i}."""\n'
            f"    total = x * {n} + y\n"
            f"    for k in range(3):\n"
            f"        total += k * y\n"
            f"    return total\n\n\n"
        )
        lines.append(text)
        size += len(text)
        n += 1
    return "".join(lines)


def _package(root: Path, modules: int, kib: int) -> Path:
    pkg = root / f"benchpkg_{secrets.token_hex(4)}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("".join(f"from . import m{i}\n" for i in range(modules)))
    for i in range(modules):
        (pkg / f"m{i}.py").write_text(_module(i, kib))
    return pkg


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _stat(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:7.1f} ms ({min(xs) * 1000:.0f}-{max(xs) * 1000:.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modules", type=int, default=20)
    ap.add_argument("--kib", type=int, default=51, help="KiB per module")
    args = ap.parse_args()
    for n in args.ranks:
        first, edit, same, local = [], [], [], []
        with Cluster(n=n) as cluster, tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.rounds):
                pkg = _package(Path(tmp), args.modules, args.kib)
                size = sum(p.stat().st_size for p in pkg.iterdir())
                _files._compiled.clear()  # every round's sources compiled as new ones
                dt, _ = _timed(lambda pkg=pkg: _files.check_syntax(_files.collect([pkg], tmp), tmp))
                local.append(dt)
                _files._compiled.clear()  # the sync below compiles them again, as a first would
                dt, report = _timed(lambda pkg=pkg: sync(cluster, [pkg], cwd=tmp))
                assert len(report.sent) == args.modules + 1, report
                first.append(dt)
                cluster.run(f"import {pkg.name}")
                target = pkg / "m3.py"
                target.write_text(target.read_text().replace("x * 1 + y", "x * 1 + y + 1", 1))
                dt, report = _timed(lambda pkg=pkg: sync(cluster, [pkg], cwd=tmp))
                assert report.sent == [f"{pkg.name}/m3.py"], report
                assert report.reloaded == {f"{pkg.name}.m3": list(range(n))}, report
                edit.append(dt)
                cluster.run(f"assert {pkg.name}.m3.f_3_1(1) == 6")
                dt, report = _timed(lambda pkg=pkg: sync(cluster, [pkg], cwd=tmp))
                assert report.sent == [], report
                same.append(dt)
        print(
            f"{n} ranks, {args.modules + 1} files, {size / 2**20:.2f} MB, {args.rounds} rounds: "
            f"first {_stat(first)} [collect+compile {_stat(local)}]; "
            f"one-line edit {_stat(edit)}; unchanged {_stat(same)}",
            flush=True,
        )
    print(f"(pid {os.getpid()}; {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
