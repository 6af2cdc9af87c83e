"""``%mpi start --ssh login``: a notebook outside the cluster (the login bed's laptop
namespace, which reaches the cluster by SSH to the login node only) starts ranks on
the Slurm bed's two nodes, runs cells there and leaves nothing behind.

The login bed is ``/work/shared/login/testbed.sh`` (one per module, stopped by the
module fixture); the Slurm bed is the session's. Each check is a real IPython shell
run as a script inside the laptop namespace.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

LOGIN_BED = Path("/work/shared/login/testbed.sh")

pytestmark = pytest.mark.skipif(not LOGIN_BED.exists(), reason="no login test bed")


@pytest.fixture(scope="module")
def laptop(slurm_testbed):
    """``run(script)``: a Python script in the laptop namespace, ``ssh login`` to a login
    node whose sessions see the Slurm bed; the login bed is stopped at the end."""
    base = Path(tempfile.mkdtemp(prefix="ck-login-"))
    env_sh = base / "slurm-env.sh"
    env_sh.write_text(
        "".join(f"export {k}={shlex.quote(v)}\n" for k, v in slurm_testbed.env.items())
    )
    bed = base / "bed"
    started = subprocess.run(
        ["bash", str(LOGIN_BED), "start", str(bed), str(env_sh)], capture_output=True, text=True
    )

    def stop() -> None:
        subprocess.run(["bash", str(LOGIN_BED), "stop", str(bed)], capture_output=True)

    if started.returncode != 0:
        stop()
        pytest.fail(f"the login bed did not start: {started.stdout}{started.stderr}")

    def run(code: str, timeout: float = 180) -> subprocess.Popen:
        script = base / f"s{time.monotonic_ns()}.py"
        script.write_text(textwrap.dedent(code))
        return subprocess.Popen(
            ["bash", str(LOGIN_BED), "run", str(bed), sys.executable, "-u", str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=os.getcwd(),
        )  # fmt: skip

    run.slurm = slurm_testbed  # type: ignore[attr-defined]
    yield run
    stop()


_SHELL = """
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "clusterkernel")
"""


def _output(proc: subprocess.Popen, timeout: float = 180) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def test_ranks_on_both_nodes_from_outside_then_nothing_left(laptop):
    proc = laptop(
        _SHELL
        + """
ip.run_line_magic("mpi", "start -n 2 --slurm --nodes 2 --ssh login --torch")
ip.run_cell_magic("mpi", "", '''
import socket, torch, torch.distributed as dist
from clusterkernel import comm
t = torch.tensor([comm.rank() + 1.0])
dist.all_reduce(t)
print("on", socket.gethostname(), "sum", t.item())
''')
cluster = ip.user_ns["cluster"]
print("JOB", cluster.job_id, "CONTROLLER", cluster._ranks.engines.ipp.controller.pid)
ip.run_line_magic("mpi", "stop")
"""
    )
    out = _output(proc)
    assert proc.returncode == 0, out
    assert "[rank 0] on node1 sum 3.0" in out, out
    assert "[rank 1] on node2 sum 3.0" in out, out
    job, _, controller = out.split("JOB ", 1)[1].split()[:3]
    assert job not in laptop.slurm.jobs(), out
    assert not any(laptop.slurm.leftovers()), laptop.slurm.leftovers()
    # the controller ran on the login side (this machine's root namespace)
    assert (
        not psutil.pid_exists(int(controller))
        or psutil.Process(int(controller)).status() == psutil.STATUS_ZOMBIE
    )


def test_a_killed_kernel_has_its_job_released_from_the_login_side(laptop):
    proc = laptop(
        _SHELL
        + """
import time
ip.run_line_magic("mpi", "start -n 2 --slurm --nodes 2 --ssh login")
print("JOB", ip.user_ns["cluster"].job_id, flush=True)
time.sleep(600)
"""
    )
    job = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("JOB "):
            job = line.split()[1]
            break
    assert job is not None and job in laptop.slurm.jobs()
    # the python in the laptop namespace: ip netns exec replaced itself by it
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    while job in laptop.slurm.jobs():  # the guard on the login node cancels it
        time.sleep(0.5)


def test_bad_hosts_are_refused_clearly_and_start_nothing(laptop):
    proc = laptop(
        _SHELL
        + """
from clusterkernel import Cluster
for host, python in (
    ("no-such-host.invalid", None), ("nobody@login", None), ("login", "/no/python"),
):
    try:
        Cluster(n=2, launcher="slurm", ssh=host, remote_python=python).start()
    except Exception as e:
        print("ERR", host, type(e).__name__, str(e).splitlines()[0])
"""
    )
    out = _output(proc, timeout=120)
    assert "ERR no-such-host.invalid LoginError ssh no-such-host.invalid: unknown host" in out, out
    assert "ERR nobody@login LoginError ssh nobody@login: the key was refused" in out, out
    assert "ERR login LoginError /no/python on login cannot import clusterkernel" in out, out
    assert not laptop.slurm.jobs()
