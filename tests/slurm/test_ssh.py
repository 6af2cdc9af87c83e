"""``%mpi start --ssh login``: a notebook outside the cluster (the login bed's laptop
namespace, which reaches the cluster by SSH to the login node only) starts ranks on
the Slurm bed's two nodes, runs cells there, syncs and reloads the user's module on
both, respawns a dead rank in a fault-tolerant job, survives a network drop that loses
its SSH connection mid-cell, and leaves nothing behind.

The login bed is ``/work/shared/login/testbed.sh`` (one per module, stopped by the
module fixture); the Slurm bed is the session's. Each check is a real IPython shell
run as a script inside the laptop namespace.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import psutil
import pytest

from tests._login_bed import LOGIN_BED, laptop_bed

pytestmark = pytest.mark.skipif(not LOGIN_BED.exists(), reason="no login test bed")


@pytest.fixture(scope="module")
def laptop(slurm_testbed):
    """``run(script)``: a Python script in the laptop namespace, ``ssh login`` to a login
    node whose sessions see the Slurm bed (tests/_login_bed.py); stopped at the end."""
    with laptop_bed(slurm_testbed.env) as run:
        run.slurm = slurm_testbed
        yield run


_SHELL = """
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "clusterkernel")
"""


def _relays() -> list[psutil.Process]:
    """The dashboard's relays running on the login side (this machine's root namespace)."""
    return [
        p for p in psutil.process_iter(["cmdline"])
        if "clusterkernel.client.launch._relay" in (p.info["cmdline"] or [])
    ]  # fmt: skip


def _output(proc: subprocess.Popen, timeout: float = 180) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def _output_until(proc: subprocess.Popen, prefix: str, timeout: float = 180) -> str:
    """What ``proc`` said up to its line starting with ``prefix`` (all of it if none
    came; ``proc`` is killed after ``timeout``, not left to sleep out its script): not
    until its output ends, which a killed kernel's children (an ssh of ipyparallel's
    waiting on the controller) hold open for a while."""
    said = []
    assert proc.stdout is not None
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            said.append(line)
            if line.startswith(prefix):
                break
    finally:
        watchdog.cancel()
    return "".join(said)


def _on_login(module: str, cluster_id: str) -> list[psutil.Process]:
    """Processes of ``module`` on the login side (this machine's root namespace) for the
    kept cluster ``cluster_id`` (its id is in their command lines)."""
    return [
        p for p in psutil.process_iter(["cmdline"])
        if module in (p.info["cmdline"] or []) and cluster_id in " ".join(p.info["cmdline"])
    ]  # fmt: skip


def test_ranks_on_both_nodes_from_outside_kept_through_a_killed_kernel_then_nothing_left(laptop):
    """Everything a session does from outside, in one kept job (``--keep forever``); its
    kernel then dies (SIGKILL), a new one lists and attaches the job, runs a cell with
    the first one's variables, then one through a short network drop that loses its SSH
    connection (made again as after a start: every line shown once), and stops it:
    nothing is left on the login node nor on the nodes."""
    proc = laptop(
        _SHELL
        + """
import json, os, signal, tempfile, threading
ip.run_line_magic("mpi", "start -n 2 --slurm --nodes 2 --ssh login --torch --keep forever")
ip.run_cell_magic("mpi", "", '''
import socket, torch, torch.distributed as dist
from clusterkernel import comm
t = torch.tensor([comm.rank() + 1.0])
dist.all_reduce(t)
print("on", socket.gethostname(), "sum", t.item())
''')
cluster = ip.user_ns["cluster"]
print("JOB", cluster.job_id, "CONTROLLER", cluster._ranks.engines.ipp.controller.pid)
# the dashboard's live stream: the nodes' records reach the laptop's store
dash = cluster.dashboard()
ip.run_cell_magic("mpi", "", "import clusterkernel\\nfor s in range(3): clusterkernel.log(step=s, loss=1.0)")
try:
    dash.sync(timeout=10)
    print("STREAMED TO", dash._address, "RECEIVED ON", dash.receiver.address)
    print("RECORDS", sorted((r["rank"], r["step"]) for r in dash.records("scalar")))
except Exception as e:
    print("DASH", type(e).__name__, e)
# a profile of a short cell, every rank's samples back on the laptop
ip.run_cell_magic("mpi", "--profile", "import time\\nt0 = time.time()\\nwhile time.time() - t0 < 0.3: pass")
with tempfile.TemporaryDirectory() as kept:
    prof = json.loads(cluster.profile_result.save(kept + "/p.speedscope.json").read_text())
print("PROFILED", sorted(p["name"] for p in prof["profiles"] if " thread " not in p["name"]))
# a kernel interrupt (SIGINT, as the kernel menu sends it) of a sleeping cell
previous = signal.signal(signal.SIGINT, signal.default_int_handler)
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    ip.run_cell_magic("mpi", "", "import time\\ntime.sleep(60)")
except Exception as e:
    print("INTERRUPTED", type(e).__name__, "SIGINT" in str(e))
signal.signal(signal.SIGINT, previous)
# the user's module, edited in a folder of the laptop's, synced to both nodes
import os, tempfile
from IPython.core.error import UsageError
os.chdir(tempfile.mkdtemp(prefix="ck-laptop-nb-"))
print("NOTEBOOK", os.getcwd())
def edit(text):
    with open("lapmod.py", "w") as f:
        f.write(text)
edit("VERSION = 1\\ndef version():\\n    return VERSION\\n")
ip.run_line_magic("mpi", "sync lapmod.py")
ip.run_cell_magic("mpi", "", '''
import os, lapmod
get, kept = lapmod.version, 41   # made before the edit: both must last through it
print("imported", os.path.realpath(lapmod.__file__), get())
''')
edit("VERSION = 2\\ndef version():\\n    return VERSION * 10\\n")
ip.run_line_magic("mpi", "sync lapmod.py")
edit("def version(:\\n")
try:
    ip.run_line_magic("mpi", "sync lapmod.py")
except UsageError as e:
    print("REFUSED", str(e).splitlines()[0])
ip.run_cell_magic("mpi", "", 'print("edited", socket.gethostname(), get(), kept + 1, lapmod.VERSION)')
import shutil
shutil.rmtree(os.getcwd())  # the laptop's notebook folder
print("KEPT", cluster.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the kernel dies: the ranks are kept
"""
    )
    out = _output_until(proc, "KEPT ")
    assert proc.wait(timeout=30) == -signal.SIGKILL, out
    proc.stdout.close()
    cluster_id = out.split("KEPT ", 1)[1].split()[0]
    job = out.split("JOB ", 1)[1].split()[0]
    assert job in laptop.slurm.jobs(), out
    # a new kernel on the laptop: the job listed and attached through the login node,
    # the first kernel's variables on its ranks, then stopped
    again = laptop(
        _SHELL
        + f"""
import os
ip.run_line_magic("mpi", "list --ssh login")
ip.run_line_magic("mpi", "attach {cluster_id} --ssh login")
ip.run_cell_magic("mpi", "", 'print("back", socket.gethostname(), get(), kept)')
# the connection lost mid-cell (the test cuts it): made again, every line shown once
ip.run_cell_magic("mpi", "", "import time\\nfor i in range(28):\\n    print('tick', i, 'on', socket.gethostname(), flush=True)\\n    time.sleep(0.25)")
cluster = ip.user_ns["cluster"]
print("RUN_DIR", cluster.run_dir)
# a hang (rank 1 skips the collective) under a timeout: the report names who waits
try:
    cluster.run("t = torch.ones(4)\\nif comm.rank() == 0:\\n    dist.all_reduce(t)", timeout=2)
except Exception as e:
    print("HANG", type(e).__name__, " ".join(str(getattr(e, "note", e)).split()))
ip.run_line_magic("mpi", "stop")
"""
    )
    # a short network drop in which the attached session's SSH connection is lost
    back = _output_until(again, "[rank 1] tick 2 ")
    _drop(laptop, cut_after=0.5, back_after=0.5)
    back += _output(again)
    assert again.returncode == 0, back
    assert _ticks(back, 0) == list(range(28)) and _ticks(back, 1) == list(range(28)), back
    listed = next(line for line in back.splitlines() if line.startswith(cluster_id))
    assert " 2 " in listed and f"job {job}" in listed and "never" in listed, back
    assert f"Attached to 2 MPI ranks (cluster {cluster_id})." in back, back
    assert "[rank 0] back node1 20 41" in back, back
    assert "[rank 1] back node2 20 41" in back, back
    assert "HANG CellInterrupted" in back, back
    assert re.search(r"rank 0 waits in all_reduce #\d+ \(gloo", back), back
    assert "Stopped all MPI ranks." in back, back
    # the cluster's directory on the login node (under its home) and here are gone
    run_dir = back.split("RUN_DIR ", 1)[1].split()[0]
    remote = Path(os.path.expanduser("~root")) / os.path.relpath(run_dir, laptop.home)
    assert remote.name == f"cluster-{cluster_id}" and not remote.exists(), remote
    assert not Path(run_dir).exists(), run_dir
    # its keeper (the guard) and the sessions' holds on its record have left the login node
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        _on_login("clusterkernel.client.launch._guard", cluster_id)
        or _on_login("clusterkernel.client.cluster._kept_login", cluster_id)
    ):
        time.sleep(0.2)
    assert not _on_login("clusterkernel.client.launch._guard", cluster_id)
    assert not _on_login("clusterkernel.client.cluster._kept_login", cluster_id)
    assert "[rank 0] on node1 sum 3.0" in out, out
    assert "[rank 1] on node2 sum 3.0" in out, out
    assert "ProfileCreate" not in out, out  # ipyparallel's remote profile: made quietly
    # each node imports its own synced copy, written on the cluster's side, never the
    # laptop's file (the beds share one file system: the path tells them apart)
    notebook = out.split("NOTEBOOK ", 1)[1].split()[0]
    for rank, node in ((0, "node1"), (1, "node2")):
        where, value = out.split(f"[rank {rank}] imported ", 1)[1].split()[:2]
        assert where.endswith(f"/sync/{node}/lapmod.py") and value == "1", out
        assert not where.startswith(notebook), out
        # the edit reached the function made before it, and the rank's variables stayed
        assert f"[rank {rank}] edited {node} 20 42 2" in out, out
    # the dashboard's records came from both nodes, by the relay on the login node
    # (its address towards the nodes) to the laptop's loopback
    assert "RECORDS [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]" in out, out
    streamed, received = re.search(r"STREAMED TO tcp://(\S+) RECEIVED ON tcp://(\S+)", out).groups()
    assert received.startswith("127.0.0.1:") and not streamed.startswith("127."), out
    assert "PROFILED ['rank 0', 'rank 1']" in out, out
    assert "INTERRUPTED CellInterrupted True" in out, out
    assert "Synced 1 file to 2 hosts" in out, out
    assert "reloaded lapmod on ranks 0-1" in out, out
    assert "REFUSED Not synced, the ranks keep the code they have: lapmod.py, line 1" in out, out
    job, _, controller = out.split("JOB ", 1)[1].split()[:3]
    assert job not in laptop.slurm.jobs(), out
    assert not any(laptop.slurm.leftovers()), laptop.slurm.leftovers()
    assert not _relays(), _relays()
    # the controller ran on the login side (this machine's root namespace)
    assert (
        not psutil.pid_exists(int(controller))
        or psutil.Process(int(controller)).status() == psutil.STATUS_ZOMBIE
    )


def test_a_rank_respawned_from_outside_then_a_killed_kernel_has_its_job_released(laptop):
    """A fault-tolerant job from outside (the ranks under the login node's ``mpiexec``
    inside the job): rank 1, on node2, SIGKILLed, ``%mpi respawn --from 0`` brings it back
    with rank 0's variables; a cell is exported as a Slurm job, written for the login
    node and sent there; then the notebook is SIGKILLed and the guard on the login node
    cancels the job (and the dashboard's relay there leaves). The exported job, submitted
    from the laptop as printed, runs a rank on each node. The login node's Python is
    named apart from the laptop's (another name of the same venv's interpreter), so
    that the job's files show which one they run."""
    there = str(Path(sys.executable).with_name("python3.11"))  # the login node's Python
    script = (
        _SHELL
        + f"""
import os, tempfile, time
ip.run_line_magic("mpi", "start -n 2 --slurm --nodes 2 --ssh login --fault-tolerant --remote-python {there}")"""
        + """
ip.run_cell_magic("mpi", "", "import os, socket\\nbefore, x = os.getpid(), 7\\nprint('on', socket.gethostname())")
try:
    ip.run_cell_magic("mpi", "--ranks 1", "os.kill(os.getpid(), 9)")
except Exception as e:
    print("CELL", type(e).__name__)
ip.run_line_magic("mpi", "respawn --from 0")
ip.run_cell_magic("mpi", "", '''
import os, socket
from mpi4py import MPI
from clusterkernel import comm
total = comm.WORLD.comm.allreduce(comm.WORLD.comm.Get_rank() + 1)
print("after", socket.gethostname(), "same" if before == os.getpid() else "new", x, total)
''')
# a cell of the notebook (in its history) exported from a folder under the laptop's home
os.chdir(tempfile.mkdtemp(prefix="ck-export-", dir=os.path.expanduser("~")))
ip.run_cell("%%mpi\\nimport socket\\nprint('job on', socket.gethostname())", store_history=True)
ip.run_line_magic("mpi", "export job.py --sbatch job.sbatch --nodes 2")
ip.user_ns["cluster"].dashboard()  # its relay on the login node must go with the kernel
print("JOB", ip.user_ns["cluster"].job_id, flush=True)
time.sleep(600)
"""
    )
    proc, out = _respawned_from_outside(laptop, script)
    job = out.split("JOB ", 1)[1].split()[0] if "JOB " in out else None
    assert job is not None and job in laptop.slurm.jobs(), out
    assert "CELL RankError" in out, out
    assert "[rank 0] on node1" in out and "[rank 1] on node2" in out, out
    assert "[rank 0] after node1 same 7 3" in out, out
    # a new process with rank 0's variables, in the world of both ranks again (placed
    # where the job has room: no survivor shows node2 still up)
    assert re.search(r"\[rank 1\] after node[12] new 7 3", out), out
    # the python in the laptop namespace: ip netns exec replaced itself by it
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    while job in laptop.slurm.jobs():  # the guard on the login node cancels it
        time.sleep(0.5)
    while _relays():  # its ssh's stdin closed with the kernel: the relay leaves
        time.sleep(0.2)
    # the export: the job's files on the login side (the same place under its home as
    # the laptop's folder under the laptop's), naming the login node's Python and paths
    submit = out.split("or submit it:", 1)[1].split("\n", 1)[0].split()
    assert submit[:3] == ["ssh", "login", "sbatch"] and len(submit) == 4, out
    sbatch = Path(submit[3])
    folder = Path(os.path.expanduser("~root")) / sbatch.parent.name
    try:
        assert sbatch.parent == folder and (laptop.home / folder.name / "job.sbatch").exists()
        assert f"srun --mpi=pmix {there} {folder}/job.py" in sbatch.read_text()
        assert (
            f"{there} -m clusterkernel run -n 2 {folder}/job.py" in (folder / "job.py").read_text()
        )
        run = out.split("Run it on 2 ranks:", 1)[1].split("\n", 1)[0].split()
        assert run[:3] == ["ssh", "login", there] and run[-1] == f"{folder}/job.py", out
        # submitted from the laptop as printed, then awaited here (sbatch --wait polls
        # Slurm seconds apart)
        ran = laptop(
            "import subprocess\n"
            f"done = subprocess.run({[*submit[:3], '--parsable', *submit[3:]]!r})\n"
            "print('SUBMITTED', done.returncode)\n"
        )
        said = _output(ran, timeout=60)
        assert "SUBMITTED 0" in said, said
        deadline = time.monotonic() + 60
        while laptop.slurm.jobs() and time.monotonic() < deadline:
            time.sleep(0.2)
        (log,) = folder.glob("job-*.out")
        assert "[rank 0] job on node1" in log.read_text(), log.read_text()
        assert "[rank 1] job on node2" in log.read_text(), log.read_text()
        assert not laptop.slurm.jobs()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# what the respawn's error says where Open MPI failed inside itself (tests/_open_mpi.py)
_OPEN_MPI_FAILED = re.compile(
    r"Open MPI's launcher aborted|Open MPI's daemon on \S+ died|the launcher \(mpiexec\) crashed"
)


def _respawned_from_outside(laptop, script: str) -> tuple[subprocess.Popen, str]:
    """The kernel of ``script`` and what it said up to its line "JOB "; once more in a
    fresh kernel and job where the respawn failed inside Open MPI (not ours: see
    tests/_open_mpi.py), after the first is killed and its job gone."""
    proc = laptop(script)
    out = _output_until(proc, "JOB ")
    failed = _OPEN_MPI_FAILED.search(out)
    if "Respawning rank 1 failed" not in out or failed is None:
        return proc, out
    proc.kill()
    proc.wait()
    laptop.slurm.clear()
    print(f"attempt 1 said:\n{out}")
    warnings.warn(f"Open MPI failed in the respawn ({failed.group(0)}); once more", stacklevel=2)
    proc = laptop(script)
    return proc, _output_until(proc, "JOB ")


def _cut(laptop) -> int:
    """Kill the laptop's master connections to the login node (ssh's ``[mux]``
    processes in its namespace): the connection is lost, as ssh gives it up after
    ``ServerAliveCountMax`` unanswered probes or the laptop's address changes. How many."""
    ids = subprocess.run(["ip", "netns", "pids", laptop.netns], capture_output=True, text=True)
    cut = 0
    for pid in map(int, ids.stdout.split()):
        try:
            if "[mux]" in " ".join(psutil.Process(pid).cmdline()):
                os.kill(pid, signal.SIGKILL)
                cut += 1
        except (psutil.Error, ProcessLookupError):
            continue
    return cut


def _firewall(laptop, action: str) -> None:
    """Drop (``-I``) or let through again (``-D``) every packet between the laptop and
    the login node, in the laptop namespace's firewall: its network is cut, its TCP
    connections stall (nothing tells either end they are gone)."""
    for chain, way in (("OUTPUT", "-d"), ("INPUT", "-s")):
        rule = [chain, "1"] if action == "-I" else [chain]
        subprocess.run(
            ["ip", "netns", "exec", laptop.netns, "iptables", action, *rule,
             way, laptop.login_addr, "-j", "DROP"],
            check=True,
        )  # fmt: skip


def _drop(laptop, cut_after: float, back_after: float) -> None:
    """Cut the laptop's network (:func:`_firewall`), its SSH connection lost ``cut_after``
    seconds in (:func:`_cut`), and let it through again ``back_after`` seconds later."""
    _firewall(laptop, "-I")
    try:
        time.sleep(cut_after)
        assert _cut(laptop) >= 1, "no master connection to cut"
        time.sleep(back_after)
    finally:
        _firewall(laptop, "-D")


def _ticks(out: str, rank: int) -> list[int]:
    """The numbers of the ``tick N`` lines ``rank`` is shown with in ``out``, in order."""
    return [int(n) for n in re.findall(rf"^\[rank {rank}\] tick (\d+) on ", out, re.M)]


def test_a_network_drop_mid_cell_loses_the_connection_and_the_cell_completes(laptop):
    """The laptop's network is cut for 12 s while a cell runs on both nodes, and its SSH
    connection is lost in it (shorter than the guard's bound, ``$CLUSTERKERNEL_SSH_GRACE``):
    the connection, its forwards and the guard are made again; rank 0, which runs on,
    has what it printed in the drop filled in from the controller's record before what
    it prints after; rank 1, which ended while the network was cut, has its reply and
    its output read from the record: every line of each rank shown once, in order. The
    next cell runs and stop leaves no job."""
    proc = laptop(
        _SHELL
        + """
ip.run_line_magic("mpi", "start -n 2 --slurm --nodes 2 --ssh login")
print("JOB", ip.user_ns["cluster"].job_id, flush=True)
ip.run_cell_magic("mpi", "", "import time, socket\\nfrom clusterkernel import comm\\nfor i in range(50 if comm.rank() == 0 else 8):\\n    print('tick', i, 'on', socket.gethostname(), flush=True)\\n    time.sleep(0.5)")
print("CELL DONE", flush=True)
ip.run_cell_magic("mpi", "", "print('next', comm.rank())")
ip.run_line_magic("mpi", "stop")
print("STOPPED", flush=True)
"""
    )
    out = _output_until(proc, "[rank 1] tick 2 ")
    assert "[rank 1] tick 2 on node2" in out, out
    _drop(laptop, cut_after=2, back_after=10)
    out += _output_until(proc, "STOPPED")
    assert proc.wait(timeout=60) == 0, out
    assert _ticks(out, 0) == list(range(50)) and _ticks(out, 1) == list(range(8)), out
    assert "CELL DONE" in out, out
    assert "[rank 0] next 0" in out and "[rank 1] next 1" in out, out
    job = out.split("JOB ", 1)[1].split()[0]
    assert job not in laptop.slurm.jobs(), out


_KERNEL = """
import subprocess, sys, time
from jupyter_client.manager import start_new_kernel

def shown(kc, code):
    said = []
    def hook(msg):
        content = msg["content"]
        if msg["msg_type"] == "stream":
            said.append(content["text"])
        elif msg["msg_type"] in ("display_data", "update_display_data", "execute_result"):
            said.append(content["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            said.append("ERROR " + content["ename"] + " " + content["evalue"])
    kc.execute_interactive(code, timeout=180, output_hook=hook)
    return "".join(said)

def squeue():
    return subprocess.run(["ssh", "login", "squeue", "-h", "-o", "%i"], capture_output=True,
                          text=True, check=True).stdout.split()
"""


def _guide_command(text: str) -> list[str]:
    """The GUIDE's ``clusterkernel install-kernel`` block containing ``text``, as argv."""
    from tests._examples import doc_blocks

    [block] = [
        b for b in doc_blocks()
        if b.lang == "bash" and "install-kernel" in b.code and text in b.code
    ]  # fmt: skip
    assert block.checked_by == "tests/slurm/test_ssh.py", block.name
    return shlex.split(block.code.strip())


def _in_laptop(laptop) -> set[int]:
    """The processes in the laptop's network namespace."""
    ids = subprocess.run(["ip", "netns", "pids", laptop.netns], capture_output=True, text=True)
    return set(map(int, ids.stdout.split()))


def _naming(text: str) -> list[psutil.Process]:
    """Processes of this machine (the login side, node1) whose command line has ``text``."""
    return [
        p for p in psutil.process_iter(["cmdline"])
        if text in " ".join(p.info["cmdline"] or [])
    ]  # fmt: skip


def test_the_mpi_kernel_installed_on_the_laptop_runs_its_cells_on_both_nodes(laptop):
    """The MPI kernel whose ranks start under Slurm through ``ssh login``, installed in the
    laptop as the GUIDE types it (``--user``: the laptop's home): its first cell runs on
    both nodes, and its shutdown (JupyterLab's) cancels the job and leaves no process but
    the ssh master connection (for its ControlPersist time)."""
    argv = _guide_command("--ssh login")
    assert argv[:2] == ["clusterkernel", "install-kernel"] and argv[-1] == "--user", argv
    name, start = (argv[argv.index(flag) + 1] for flag in ("--name", "--start-options"))
    before = _in_laptop(laptop)
    proc = laptop(
        _KERNEL
        + f"""
done = subprocess.run([sys.executable, "-m", "clusterkernel", *{argv[1:]!r}],
                      capture_output=True, text=True)
print("INSTALLED", done.returncode, done.stdout, done.stderr)
km, kc = start_new_kernel(kernel_name={name!r}, startup_timeout=60)
print("FIRST", shown(kc, "import socket\\nfrom clusterkernel import comm\\nprint('on', comm.rank(), socket.gethostname())"))
print("JOB", shown(kc, "%%local\\nprint(cluster.job_id, cluster.id)"), flush=True)
job = shown(kc, "%%local\\nprint(cluster.job_id)").strip()
kc.stop_channels()
kernel = km.provisioner.process
km.shutdown_kernel()  # JupyterLab's: SIGTERM 2.5 s after the request, if it has not ended
deadline = time.monotonic() + 20
while job in squeue() and time.monotonic() < deadline:
    time.sleep(0.25)
print("SHUT", kernel.returncode, job in squeue(), flush=True)
"""
    )
    out = _output(proc, timeout=180)
    assert proc.returncode == 0, out
    assert f"INSTALLED 0 Installed kernelspec {name!r} (Python 3 (MPI, 2 ranks) {start})" in out
    assert f"{laptop.home}/.local/share/jupyter/kernels/{name}" in out, out
    first = out.split("FIRST ", 1)[1].split("JOB ", 1)[0]
    assert "Started 2 MPI ranks (slurm) on 2 nodes (node1, node2)." in first, out
    assert "on 0 node1" in first and "on 1 node2" in first, out
    job, cluster_id = out.split("JOB ", 1)[1].split()[:2]
    assert job.isdigit() and re.search(r"^SHUT -?\d+ False$", out, re.M), out
    # Jupyter's SIGTERM to the kernel's process group (2.5 s after its shutdown request)
    # ends the ssh commands of the kernel's stop: the job is cancelled, by the stop or by
    # the guard on the login node, but the master connection stays its ControlPersist time
    _nothing_left(laptop, before, cluster_id, masters=True)


def test_the_kept_mpi_kernel_on_the_laptop_attaches_again_after_a_restart(laptop):
    """The same kernel with ``--keep``: the kernel menu's restart (a clean shutdown, then a
    new kernel of the same connection file) attaches to its ranks again, through the login
    node's record of them, their variables intact; ``%mpi stop`` leaves nothing."""
    argv = _guide_command("--ssh login")
    start = argv[argv.index("--start-options") + 1]
    before = _in_laptop(laptop)
    proc = laptop(
        _KERNEL
        + f"""
from clusterkernel.client.kernel import install
install(2, "kept-login", user=True, keep="10m", start={start!r})
km, kc = start_new_kernel(kernel_name="kept-login", startup_timeout=60)
print("KEPT", shown(kc, "import os\\nbefore = os.getpid()\\nprint('kept')"))
print("KEPTID", shown(kc, "%%local\\nprint(cluster.job_id, cluster.id)"), flush=True)
km.restart_kernel(now=False)
kc.wait_for_ready(timeout=60)
print("AGAIN", shown(kc, "print('again', os.getpid() == before)"))
print("STOP", shown(kc, "%mpi stop"))
kc.stop_channels()
km.shutdown_kernel()
"""
    )
    out = _output(proc, timeout=180)
    assert proc.returncode == 0, out
    _, kept_id = out.split("KEPTID ", 1)[1].split()[:2]
    assert f"kept 10m without a session as cluster {kept_id}" in out.split("KEPTID ")[0], out
    again = out.split("AGAIN ", 1)[1].split("STOP ", 1)[0]
    assert f"Attached to 2 MPI ranks (cluster {kept_id})." in again, out
    assert "again True" in again and "ERROR" not in again, out
    assert "Stopped all MPI ranks." in out.split("STOP ", 1)[1], out
    _nothing_left(laptop, before, kept_id)


def _nothing_left(laptop, before: set[int], cluster_id: str, masters: bool = False) -> None:
    """No job, no process on the nodes, none of the cluster's on the login side, none
    new in the laptop (the kernel's, its ssh's); ``masters``: but for ssh's master
    connections (``[mux]``), which end by themselves after ControlPersist's 60 s."""
    assert not any(laptop.slurm.leftovers()), laptop.slurm.leftovers()

    def left() -> list[str]:
        cmds = []
        for pid in _in_laptop(laptop) - before:
            try:
                cmds.append(" ".join(psutil.Process(pid).cmdline()))
            except psutil.Error:
                continue
        return [c for c in cmds if not (masters and "[mux]" in c)]

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (left() or _naming(f"cluster-{cluster_id}")):
        time.sleep(0.25)
    assert not left(), left()
    assert not _naming(f"cluster-{cluster_id}")


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
try:
    Cluster.attach("123456", ssh="login")
except Exception as e:
    print("ATTACH", type(e).__name__, str(e).splitlines()[0])
"""
    )
    out = _output(proc, timeout=120)
    assert "ERR no-such-host.invalid LoginError ssh no-such-host.invalid: unknown host" in out, out
    assert "ERR nobody@login LoginError ssh nobody@login: the key was refused" in out, out
    assert "ERR login LoginError /no/python on login cannot import clusterkernel" in out, out
    assert "ATTACH ClusterError No kept cluster '123456' of yours" in out, out
    assert not laptop.slurm.jobs()
