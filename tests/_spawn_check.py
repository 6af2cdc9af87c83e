"""A test that starts MPI ranks, a kernel or a cluster must carry the ``cluster`` marker:
checked while the tests run, so the marker lists in ``tests/_markers.py`` cannot
drift from what the tests do.

A pytest plugin (``tests/conftest.py`` registers it; ``pytest -p tests._spawn_check``
loads it alone). While a test without the marker runs (its setup and its call), two
things watch for a cluster process being started:

- an audit hook (``sys.addaudithook``) sees every ``subprocess.Popen``,
  ``os.posix_spawn`` and ``os.system`` of this process, however short-lived the child;
- a thread looks at this process's descendants every 0.2 s, so an ``mpiexec`` or a
  kernel started by a child (a script that makes a ``Cluster``) is seen too, if it
  lives that long (a rank start takes about a second).

What counts is :func:`cluster_process_kind`: an MPI or Slurm launcher (``mpiexec``,
``mpirun``, ``prterun``, ``srun``, ``sbatch``, ... other than ``--version``/``--help``),
an ipyparallel controller, engine or ``ipcluster``, or a Jupyter kernel (ipykernel,
the MPI kernel) started with its connection file, as Jupyter starts one. The test then fails, naming what it started and the marker to add.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading

import psutil
import pytest

POLL_S = 0.2

_LAUNCHERS = frozenset(
    {"mpiexec", "mpirun", "prterun", "prte", "orterun", "mpiexec.hydra", "srun", "sbatch", "salloc"}
)
_INFO_ONLY = frozenset({"--version", "-V", "--help", "-h", "-help", "--usage"})
_IPP = (
    "ipyparallel.engine", "ipyparallel.controller", "ipyparallel.cluster", "ipyparallel.apps",
    "clusterkernel.rank._warm_start",  # the ranks' engine command (it runs ipyparallel's)
    "clusterkernel.client.launch._handover",  # the login node's controller, from outside
)  # fmt: skip
_IPP_SCRIPTS = frozenset({"ipengine", "ipcontroller", "ipcluster"})
_KERNELS = ("ipykernel_launcher", "clusterkernel.client.kernel", "clusterkernel.kernel")


def cluster_process_kind(argv: list[str] | tuple[str, ...]) -> str | None:
    """What a process with command line ``argv`` starts: ``"MPI ranks"``, ``"an
    ipyparallel cluster"``, ``"a kernel"``, or None for anything else.

    Example::

        cluster_process_kind(["/venv/bin/mpiexec", "-n", "2", "python", "x.py"])  # "MPI ranks"
        cluster_process_kind(["mpiexec", "--version"])                            # None
    """
    argv = [str(a) for a in argv]
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name in _LAUNCHERS:
        return None if set(argv[1:]) <= _INFO_ONLY and len(argv) > 1 else "MPI ranks"
    if name in _IPP_SCRIPTS or any(a.startswith(_IPP) for a in argv[1:3]):
        return "an ipyparallel cluster"
    kernel = any(a in _KERNELS for a in argv[1:3]) or argv[1:3] == ["-m", "ipykernel"]
    # as Jupyter starts one: with its connection file (a bare ``python -m
    # clusterkernel.kernel --ranks 0`` only checks its arguments)
    if kernel and any(a == "-f" or a.startswith("--f=") for a in argv[3:]):
        return "a kernel"
    return None


class _Watch:
    """What one unmarked test started: ``[(kind, command line)]``."""

    def __init__(self, nodeid: str):
        self.nodeid = nodeid
        self.found: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._before = _descendant_pids()
        self._seen: set[int] = set()
        self._thread = threading.Thread(target=self._poll, name="spawn-check", daemon=True)
        self._thread.start()

    def note(self, argv) -> None:
        kind = cluster_process_kind(argv)
        if kind is not None:
            with self._lock:
                self.found.append((kind, shlex.join(str(a) for a in argv)))

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            self.scan()

    def scan(self) -> None:
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            if child.pid in self._before or child.pid in self._seen:
                continue
            self._seen.add(child.pid)
            try:
                argv = child.cmdline()
            except psutil.Error:
                continue
            self.note(argv)

    def stop(self) -> list[tuple[str, str]]:
        self._stop.set()
        self._thread.join()
        self.scan()
        with self._lock:
            # one line per command line, in the order they were seen
            return list(dict.fromkeys(self.found))


def _descendant_pids() -> set[int]:
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


_watch: _Watch | None = None
_hook_installed = False


def _audit(event: str, args: tuple) -> None:
    watch = _watch
    if watch is None:
        return
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        if isinstance(argv, (str, bytes)):
            argv = [os.fsdecode(argv)] if executable is None else shlex.split(os.fsdecode(argv))
        watch.note([os.fsdecode(a) for a in argv])
    elif event == "os.posix_spawn":
        watch.note([os.fsdecode(a) for a in args[1]])
    elif event == "os.system":
        try:
            watch.note(shlex.split(os.fsdecode(args[0])))
        except ValueError:
            pass


def message(nodeid: str, found: list[tuple[str, str]]) -> str:
    """The failure of an unmarked test that started ``found``."""
    lines = [
        f"{nodeid} started {found[0][0]} but carries no `cluster` marker. Tests that start "
        "MPI ranks, a kernel or a cluster must run under the `cluster` marker (one at a "
        "time, left out by -m 'not cluster'): use a fixture that has it (no_shared_cluster, "
        "cluster) or add the test to STARTS_RANKS in tests/_markers.py. It started:"
    ]
    lines += [f"  {kind}: {cmd[:300]}" for kind, cmd in found]
    return "\n".join(lines)


def pytest_configure(config) -> None:
    global _hook_installed
    if not _hook_installed:  # an audit hook cannot be removed: one for the process
        sys.addaudithook(_audit)
        _hook_installed = True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    global _watch
    if item.get_closest_marker("cluster") is None:
        _watch = _Watch(item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    global _watch
    watch = _watch
    if watch is None or watch.nodeid != item.nodeid:
        return
    report = outcome.get_result()
    if call.when == "call" or (call.when == "setup" and not report.passed):
        _watch = None
        found = watch.stop()
        if found and not report.skipped:
            text = message(item.nodeid, found)
            if report.failed:
                text += f"\n\n(and the test itself failed:)\n{report.longreprtext}"
            report.outcome = "failed"
            report.longrepr = text


def pytest_runtest_logfinish(nodeid, location) -> None:
    global _watch
    watch = _watch
    if watch is not None and watch.nodeid == nodeid:  # a test whose call never ran
        _watch = None
        watch.stop()
