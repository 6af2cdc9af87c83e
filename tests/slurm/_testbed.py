"""A real two-node Slurm cluster on the test machine.

Debian's slurmctld and slurmd, with munge for authentication, run for real;
"node2" is a network and UTS namespace joined to this machine by a veth pair, so
it has its own address and host name, as a second machine would. Both fake nodes
share the file system (as cluster nodes share a home directory).

Layout, and why:

- munged runs with a private key and socket in the test bed's directory; Slurm
  finds it through ``AuthInfo=socket=...``, so nothing in /etc is used.
- node1's slurmctld and slurmd run in this network namespace under a UTS and
  mount namespace of their own (host name ``node1``, a private /etc/hosts).
- node2's slurmd is entered with ``nsenter --net`` (``ip netns exec`` remounts
  /sys, and slurmd then finds no cgroup file system) and its own UTS namespace.
- Each node has its own TmpFS and spool (the nodes share /tmp, and Slurm's PMIx
  plugin creates per-job directories there that would collide).
- Nodes declare 4 CPUs on a 2-core machine (``config_overrides``), so PRRTE's
  default binding is switched off for jobs.

Every process the test bed starts carries ``CK_SLURM_TESTBED=<dir>`` in its
environment, and everything a job runs lives in node1's or node2's UTS
namespace; :meth:`SlurmTestbed.stop` sweeps both, never by process name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

NEEDED = (
    "slurmctld",
    "slurmd",
    "sinfo",
    "sbatch",
    "srun",
    "squeue",
    "scancel",
    "munged",
    "mungekey",
    "unshare",
    "nsenter",
    "ip",
)

_CONF = """\
ClusterName=cktest
SlurmctldHost=node1({a1})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge/munge.socket.2
SlurmUser=root
SlurmdUser=root
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
TmpFS={base}/tmp/%n
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=5
Waittime=0
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
NodeName=node1 NodeAddr={a1} CPUs={cpus} RealMemory=1000 State=UNKNOWN
NodeName=node2 NodeAddr={a2} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def missing_programs() -> list[str]:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [p for p in NEEDED if shutil.which(p, path=path) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_subnet() -> str:
    """The first 10.231.X.0/24 that no route or address on this machine uses."""
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
    addrs = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
    for x in range(256):
        net = f"10.231.{x}."
        if net not in routes and net not in addrs:
            return f"10.231.{x}"
    raise RuntimeError("no free 10.231.X.0/24 subnet for the Slurm test bed")


def _run(*cmd: str, env: dict | None = None) -> None:
    subprocess.run(cmd, check=True, capture_output=True, env=env)


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"Slurm test bed: {what} did not happen within {timeout:.0f}s")
        time.sleep(0.1)


@dataclass
class SlurmTestbed:
    """A two-node Slurm cluster; ``start()`` it, use :attr:`env`, always ``stop()``."""

    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ck-slurm-")))
    cpus: int = 4
    env: dict[str, str] = field(default_factory=dict)  # for clients and jobs
    net: str = ""
    ns: str = ""
    veth: str = ""
    _uts: dict[str, str] = field(default_factory=dict)  # node -> UTS namespace id

    @property
    def controller_address(self) -> str:
        return f"{self.net}.1"

    # ------------------------------------------------------------ start
    def start(self) -> SlurmTestbed:
        b = self.base
        for d in (
            "munge",
            "state",
            "spool/node1",
            "spool/node2",
            "tmp/node1",
            "tmp/node2",
            "run",
            "log",
        ):
            (b / d).mkdir(parents=True, exist_ok=True)
        b.chmod(0o755)  # munged refuses a group/other-writable path to its socket
        marker = {**os.environ, "CK_SLURM_TESTBED": str(b)}

        key = b / "munge" / "munge.key"
        _run("mungekey", "-c", "-k", str(key))
        _run(
            "munged",
            "--force",
            f"--key-file={key}",
            f"--socket={b}/munge/munge.socket.2",
            f"--pid-file={b}/munge/munged.pid",
            f"--log-file={b}/munge/munged.log",
            f"--seed-file={b}/munge/munged.seed",
            env=marker,
        )
        _wait(lambda: (b / "munge" / "munge.socket.2").exists(), 10, "munged start")

        self.net = _free_subnet()
        tag = f"{os.getpid() % 100000}"
        self.ns, self.veth, peer = f"ckslurm{tag}", f"cks{tag}a", f"cks{tag}b"
        a1, a2 = f"{self.net}.1", f"{self.net}.2"
        _run("ip", "netns", "add", self.ns)
        _run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", peer, "netns", self.ns)
        _run("ip", "addr", "add", f"{a1}/24", "dev", self.veth)
        _run("ip", "link", "set", self.veth, "up")
        _run("ip", "netns", "exec", self.ns, "ip", "addr", "add", f"{a2}/24", "dev", peer)
        _run("ip", "netns", "exec", self.ns, "ip", "link", "set", peer, "up")
        _run("ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up")
        (b / "hosts").write_text(f"127.0.0.1 localhost\n{a1} node1\n{a2} node2\n")

        conf = b / "slurm.conf"
        conf.write_text(
            _CONF.format(
                base=b,
                a1=a1,
                a2=a2,
                cpus=self.cpus,
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
            )
        )
        os.environ["SLURM_CONF"] = str(conf)  # for the sinfo below
        marker["SLURM_CONF"] = str(conf)
        node_sh = (
            'hostname "$1"; mount --bind "$0/hosts" /etc/hosts; '
            'readlink /proc/self/ns/uts > "$0/run/uts-$1"; '
        )
        _run(
            "unshare",
            "--uts",
            "--mount",
            "sh",
            "-c",
            node_sh + "slurmctld -i && slurmd -N node1",
            str(b),
            "node1",
            env=marker,
        )
        _run(
            "nsenter",
            f"--net=/run/netns/{self.ns}",
            "unshare",
            "--uts",
            "--mount",
            "sh",
            "-c",
            node_sh + "exec slurmd -N node2",
            str(b),
            "node2",
            env=marker,
        )
        _wait(self._both_idle, 30, "both nodes idle")
        self._uts = {n: (b / "run" / f"uts-{n}").read_text().strip() for n in ("node1", "node2")}
        self.env = {
            "SLURM_CONF": str(conf),
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            # 4 declared CPUs on 2 real cores: PRRTE's bind-to-core would refuse
            "PRTE_MCA_hwloc_default_binding_policy": "none",
            # ...and both nodes share those 2 cores: a rank waiting in MPI must yield
            # them, as Open MPI's ranks do on one machine under --oversubscribe (real
            # nodes have cores of their own; here a busy-polling rank starves the rest)
            "OMPI_MCA_mpi_yield_when_idle": "1",
            # ...and for the same reason one torch (OpenMP) thread per rank: under srun
            # each rank sees both cores and takes 2 threads, 8 on 2 cores, whose
            # spin-waits starve the ranks (notebook 08's batch job: 84 s, 17 s with 1;
            # under mpiexec --oversubscribe torch takes 1 by itself)
            "OMP_NUM_THREADS": "1",
            # node2 has only the veth: MPI's TCP and PRRTE's daemons must use it
            "PRTE_MCA_oob_tcp_if_include": f"{self.net}.0/24",
            "OMPI_MCA_btl_tcp_if_include": f"{self.net}.0/24",
        }
        return self

    def _both_idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-t", "idle", "-o", "%D"], capture_output=True, text=True
        ).stdout.strip()
        return out.isdigit() and int(out) >= 2

    # ------------------------------------------------------------ looking
    def pids_on(self, node: str) -> list[int]:
        """Processes running "on" a node, Slurm's daemons excluded: jobs' leftovers."""
        ns = self._uts.get(node)
        out = []
        for proc in psutil.process_iter(["name"]):
            try:
                if os.readlink(f"/proc/{proc.pid}/ns/uts") != ns:
                    continue
                if proc.info["name"] in ("slurmd", "slurmctld", "slurmscriptd", "slurmstepd"):
                    continue
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
            except (OSError, psutil.Error):
                continue
            out.append(proc.pid)
        return out

    def jobs(self) -> list[str]:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i"],
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
        ).stdout
        return out.split()

    def leftovers(self, timeout: float = 20.0) -> tuple[list, list, list]:
        """``(jobs, pids on node1, pids on node2)``, once all are empty or at ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = (self.jobs(), self.pids_on("node1"), self.pids_on("node2"))
            if not any(left) or time.monotonic() > deadline:
                return left
            time.sleep(0.25)

    def clear(self) -> None:
        """End every job and every process left on the nodes (after a failed test, so
        that what it left does not fail the next ones); the daemons keep running."""
        jobs = self.jobs()
        if jobs:
            env = {**os.environ, **self.env}
            subprocess.run(["scancel", "--full", *jobs], capture_output=True, env=env)
        if any(self.leftovers(timeout=10)):
            left = []
            for pid in self.pids_on("node1") + self.pids_on("node2"):
                try:
                    proc = psutil.Process(pid)
                    proc.kill()
                    left.append(proc)
                except psutil.Error:
                    pass
            psutil.wait_procs(left, timeout=5)

    # ------------------------------------------------------------ stop
    def stop(self) -> None:
        b = self.base
        env = {**os.environ, **self.env}
        if (b / "munge" / "munge.socket.2").exists():
            subprocess.run(["scancel", "--full", *self.jobs()], capture_output=True, env=env)
        for pidfile in (b / "run").glob("*.pid"):
            _kill(pidfile, signal.SIGTERM)
        time.sleep(0.5)
        victims = set()
        for proc in psutil.process_iter():
            try:
                marked = proc.environ().get("CK_SLURM_TESTBED") == str(b)
                on_node = os.readlink(f"/proc/{proc.pid}/ns/uts") in self._uts.values()
            except (OSError, psutil.Error):
                continue
            if (marked or on_node) and proc.pid != os.getpid():
                victims.add(proc)
        for proc in victims:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(list(victims), timeout=5)
        for f in Path("/dev/shm").glob("sm_segment.node[12].*"):
            f.unlink(missing_ok=True)
        if self.ns:
            subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        if os.environ.get("SLURM_CONF") == str(b / "slurm.conf"):
            del os.environ["SLURM_CONF"]
        shutil.rmtree(b, ignore_errors=True)


def _kill(pidfile: Path, sig: int) -> None:
    try:
        os.kill(int(pidfile.read_text().strip()), sig)
    except (OSError, ValueError):
        pass
