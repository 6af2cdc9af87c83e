"""What the benchmarks share: the one lock, rounds, medians, paired ratios, the A/A control.

Every benchmark that starts MPI jobs, clusters, a browser or a Jupyter server runs under
one machine-wide lock, ``/tmp/ck-mpi.lock`` (``flock``), so two benchmarks (or a
benchmark and an MPI test) never overlap on this machine's two cores. Either form works::

    flock /tmp/ck-mpi.lock .venv/bin/python benchmarks/bench_scale_vs_ipyparallel.py
    .venv/bin/python benchmarks/bench_scale_vs_ipyparallel.py   # takes the lock itself

A script calls :func:`mpi_lock` around its work; under ``flock(1)`` the lock arrives as
an inherited descriptor and :func:`mpi_lock` uses it instead of waiting for itself.

The measuring policy, one place for all scripts:

- **rounds**: the variants run interleaved, once each per round (:func:`interleaved`,
  the order turned each round with ``rotate=True``), so a slow spell of the machine
  hits every variant alike;
- **medians** (:func:`median`) of rounds, never means;
- **paired ratios** (:func:`paired`): the ratio of two variants *within* each round,
  then the median of those ratios and their middle half (25th-75th percentile);
- **the A/A control** (:func:`aa_verdict`): one variant run twice per round; the
  middle half of ``A again / A`` is what two runs of the same code differ by here,
  and a ratio whose median lies inside it is "within noise".

This module imports only the standard library (``psutil`` inside the process helpers),
so a process that must not import clusterkernel (``_raw_ipp.py``) can use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

LOCK = "/tmp/ck-mpi.lock"

T = TypeVar("T")


# ------------------------------------------------------------------ the lock
def _inherited_lock_fd(path: str = LOCK) -> int | None:
    """An open descriptor of ``path`` that already holds its lock (``flock path cmd``)."""
    real = os.path.realpath(path)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if os.readlink(f"/proc/self/fd/{name}") != real:
                continue
            # Same open file description as the holder: succeeds only if it is ours.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue
        return fd
    return None


@contextlib.contextmanager
def mpi_lock(path: str = LOCK) -> Iterator[None]:
    """Hold the machine-wide benchmark lock inside the block (waiting for it if taken).

    Under ``flock /tmp/ck-mpi.lock ...`` the lock is already held through an inherited
    descriptor: nothing to do."""
    if _inherited_lock_fd(path) is not None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {path} (another benchmark or MPI test)", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# ------------------------------------------------------------------ MPI jobs


@contextlib.contextmanager
def busy_loops(k: int, cpu: int | None = None) -> Iterator[None]:
    """``k`` busy loops (``yes > /dev/null``) beside the block, on ``cpu`` if given (the
    load of "under load" runs); killed when the block ends, always."""
    pin = [] if cpu is None else ["taskset", "-c", str(cpu)]
    procs = [
        subprocess.Popen([*pin, "yes"], stdout=subprocess.DEVNULL, start_new_session=True)
        for _ in range(k)
    ]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def mpi_job(script: str, n: int, args: Sequence[str] = (), bind: str = "none") -> dict:
    """Run ``script --worker *args`` under ``mpiexec -n n`` (the venv's Open MPI,
    oversubscribed, ranks bound to ``bind``) and return the JSON its rank 0 printed on
    a ``RESULT `` line; exits with the job's output when there is none.

    Example: ``mpi_job(__file__, 2, ["--rounds", "9"])``
    """
    import json
    import subprocess

    exe = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = [exe, *root, "--oversubscribe", "--bind-to", bind, "-n", str(n)]
    cmd += [sys.executable, script, "--worker", *args]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, timeout=1800)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise SystemExit(f"no result from {n} ranks:\n{out.stdout}\n{out.stderr}")


# ------------------------------------------------------------------ rounds
def order(names: Sequence[T], round_index: int, rotate: bool = True) -> list[T]:
    """``names`` in the order of round ``round_index``: turned by one each round."""
    names = list(names)
    if not rotate or not names:
        return names
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def interleaved(
    ways: dict[str, Callable[[], T]], rounds: int, rotate: bool = True
) -> dict[str, list[T]]:
    """Run every way once per round, ``rounds`` times; ``{way: [result of each round]}``."""
    out: dict[str, list[T]] = {w: [] for w in ways}
    for r in range(rounds):
        for w in order(list(ways), r, rotate):
            out[w].append(ways[w]())
    return out


# ------------------------------------------------------------------ statistics
def median(xs: Iterable[float]) -> float:
    """The median; NaN for no values."""
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def middle_half(xs: Iterable[float]) -> tuple[float, float]:
    """25th and 75th percentile (both the value itself for one value; NaN for none)."""
    xs = sorted(xs)
    if len(xs) < 2:
        v = xs[0] if xs else float("nan")
        return v, v
    q1, _, q3 = statistics.quantiles(xs, n=4)
    return q1, q3


def paired(num: Sequence[float], den: Sequence[float]) -> tuple[float, float, float]:
    """Median and middle half (25th, 75th percentile) of the per-round ratios num / den."""
    ratios = [a / b for a, b in zip(num, den)]
    return (median(ratios), *middle_half(ratios))


def aa_verdict(ratio: tuple[float, float, float], aa: tuple[float, float, float]) -> str:
    """Whether a paired ratio is within noise, read two ways.

    ``A/A yes``: its median lies inside the middle half of the A/A ratios (the same code
    twice); ``1.0 yes``: 1.0 lies inside its own middle half."""
    med, q1, q3 = ratio
    _, n1, n3 = aa
    return f"A/A {'yes' if n1 <= med <= n3 else 'no'}, 1.0 {'yes' if q1 <= 1.0 <= q3 else 'no'}"


def fmt_ratio(ratio: tuple[float, float, float], digits: int = 2) -> str:
    """``1.02x [0.98-1.05]``: a paired ratio with its middle half."""
    med, q1, q3 = ratio
    return f"{med:.{digits}f}x [{q1:.{digits}f}-{q3:.{digits}f}]"


def span(values: Sequence[float], fmt: str) -> str:
    """``lo-hi`` formatted with ``fmt``, or one value when both print the same."""
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"


# ------------------------------------------------------------------ processes
def tree(pids: Iterable[int]) -> list:
    """The processes ``pids`` and all their descendants (``psutil.Process``)."""
    import psutil

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


def cpu_seconds(procs: Iterable) -> float:
    """User + system CPU seconds so far of ``procs`` (those still alive)."""
    import psutil

    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def wait_gone(procs: list, timeout: float = 20.0) -> None:
    """Return once ``procs`` have exited (so two clusters never overlap); kill the rest.

    Only for processes this benchmark started."""
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def load() -> float:
    """The 1-minute load average (printed with every run: others share this machine)."""
    return os.getloadavg()[0]
