"""Open MPI's session directories: a killed launcher's leftover never stops a later job.

PRRTE names a launcher's session directory after its pid; a launcher that is killed
leaves it behind, and a later launcher given the same pid dies at start ("The PMIx
server's listener thread failed to start": once in this project's CI, notebook 00's
``%mpi start``). ``MPIRuntime.env`` keeps clusterkernel's session directories under
``session_root()`` and removes those of launchers that are gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterkernel.client.mpiexec import SESSION_ROOT_VAR, MPIRuntime, session_root

NEXT_PID = Path("/proc/sys/kernel/ns_last_pid")
PID_MAX = Path("/proc/sys/kernel/pid_max")
_SPAN = 1000  # pids planted after the pinned one: more than a launch's own forks and threads
_FAILED = "listener thread failed to start"


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_only_gone_launchers_directories_are_removed():
    root = Path(session_root())
    gone, alive = root / f"ompi.{_dead_pid()}", root / f"ompi.{os.getpid()}"
    other = root / "notes"  # not a session directory: left alone
    for d in (gone, alive, other):
        d.mkdir(exist_ok=True)
        (d / "pmix.host.tool").write_text("x")
    try:
        assert session_root() == str(root)
        assert not gone.exists() and alive.exists() and other.exists()
        assert root.stat().st_mode & 0o777 == 0o700
    finally:
        for d in (gone, alive, other):
            shutil.rmtree(d, ignore_errors=True)


def test_env_uses_it_unless_the_user_chose_a_place(tmp_path):
    rt = MPIRuntime.detect()
    if rt.flavor == "mpich":
        pytest.skip("an Open MPI (PRRTE) setting")
    assert rt.env(base={"PATH": os.environ["PATH"]})[SESSION_ROOT_VAR] == session_root()
    mine = {"PATH": os.environ["PATH"], SESSION_ROOT_VAR: str(tmp_path)}
    assert rt.env(base=mine)[SESSION_ROOT_VAR] == str(tmp_path)


def _leftover(rt: MPIRuntime, env: dict[str, str], keep: Path) -> Path:
    """A real leftover: the session directory of a launcher killed while its rank ran."""
    said = keep.parent / "launcher_pid"  # the launcher takes the rank's stdout with it
    kill_parent = (
        f"import os; open({str(said)!r}, 'w').write(str(os.getppid())); os.kill(os.getppid(), 9)"
    )
    out = subprocess.run(
        [*rt.command(1), sys.executable, "-c", kill_parent],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert said.exists(), (out.stdout, out.stderr)
    pid = int(said.read_text())
    left = Path(env[SESSION_ROOT_VAR]) / f"ompi.{pid}"
    assert left.is_dir(), (out.stdout, out.stderr, sorted(os.listdir(left.parent)))
    shutil.move(left, keep)
    return keep


def _launch_from(pid: int, rt: MPIRuntime, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Launch one rank with the kernel's next pid set to ``pid`` (root only)."""
    NEXT_PID.write_text(str(pid - 1))
    return subprocess.run(
        [*rt.command(1), sys.executable, "-c", "print('started')"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _free_stretch() -> int:
    """The first of ``_SPAN`` pids the kernel will not reach soon: half its range away."""
    last, top = int(NEXT_PID.read_text()), int(PID_MAX.read_text())
    return (last + top // 2) % (top - 2 * _SPAN) + _SPAN


def _plant(leftover: Path, root: str, first: int) -> None:
    for pid in range(first, first + _SPAN):
        shutil.copytree(leftover, Path(root) / f"ompi.{pid}", dirs_exist_ok=True)


@pytest.mark.skipif(not os.access(NEXT_PID, os.W_OK), reason="needs root to choose the next pid")
def test_a_launcher_given_a_killed_launchers_pid_starts(tmp_path):
    rt = MPIRuntime.detect()
    if rt.flavor == "mpich":
        pytest.skip("PRRTE's session directories")
    env = rt.env()
    leftover = _leftover(rt, env, tmp_path / "leftover")
    first = _free_stretch()
    try:
        # Without the sweep (env made before the leftovers appear): the launch dies.
        _plant(leftover, env[SESSION_ROOT_VAR], first)
        failed = _launch_from(first, rt, env)
        assert failed.returncode != 0 and _FAILED in failed.stdout + failed.stderr, failed
        # With it (env made now, as every launch does): the same leftovers, a clean start.
        _plant(leftover, env[SESSION_ROOT_VAR], first)
        started = _launch_from(first, rt, rt.env())
        assert started.returncode == 0 and "started" in started.stdout, started
    finally:
        session_root()  # sweeps every planted directory: their pids are gone
