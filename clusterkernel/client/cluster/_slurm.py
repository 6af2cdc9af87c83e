"""Engines as a Slurm job: the launcher beside ``mpiexec`` (client side).

Two ways, picked by where the notebook runs:

- outside an allocation (a login node, JupyterHub): the engines are one batch job,
  ``sbatch`` of a script whose ``srun --mpi=pmix`` starts one engine per task, so
  they form one MPI world over the nodes (ipyparallel's ``SlurmEngineSetLauncher``
  with our own script: its default packs every engine onto one node);
- inside an allocation (the notebook itself started by ``salloc``/``sbatch``, as
  batchspawner does): a job step, ``srun --mpi=pmix`` in that allocation, with as
  many ranks as it has tasks unless told otherwise.

The controller listens on the one address through which this machine reaches the
nodes, never on every interface unless asked.

Example::

    launcher = LaunchSettings(n=8, launcher="slurm", nodes=2).build()   # a SlurmLauncher
    launcher.controller_ip()     # e.g. "10.1.2.3"
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from collections import Counter
from typing import TYPE_CHECKING

from traitlets.config import Config

from clusterkernel.client.cluster._launch import _base_config, engine_cmd, process_ended, tail
from clusterkernel.client.errors import ClusterError
from clusterkernel.client.export._sbatch import SbatchOptions
from clusterkernel.client.mpiexec import QUIET_OSC
from clusterkernel.protocol._net import route_source

if TYPE_CHECKING:
    from clusterkernel.client.cluster._launch_settings import LaunchSettings

# Job states in which the engines are still to come or still there.
_ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING", "REQUEUED"}
_POLL = 1.0  # seconds between squeue calls (the notebook polls faster than that)


class SlurmError(ClusterError):
    """Slurm refused the job or cannot be reached."""


def in_allocation() -> bool:
    """Whether this process runs inside a Slurm allocation (``salloc``/``sbatch``)."""
    return bool(os.environ.get("SLURM_JOB_ID"))


def allocation_size() -> tuple[int, int]:
    """``(tasks, nodes)`` of the allocation this process runs in."""
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    ntasks = os.environ.get("SLURM_NTASKS") or os.environ.get("SLURM_NPROCS")
    if ntasks:
        return int(ntasks), nodes
    # "2(x3),1": two tasks on each of three nodes, then one
    total = 0
    for count, _, times in re.findall(
        r"(\d+)(\(x(\d+)\))?", os.environ.get("SLURM_TASKS_PER_NODE", "")
    ):
        total += int(count) * int(times or 1)
    return (total or nodes), nodes


def _which(program: str) -> str:
    exe = shutil.which(program)
    if exe is None:
        raise SlurmError(
            f"`{program}` is not on PATH: Slurm's client commands are needed for "
            "launcher='slurm' (load your site's Slurm module, or run on a login node)."
        )
    return exe


def _slurm(*args: str, timeout: float = 30) -> str:
    exe = _which(args[0])
    try:
        done = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(args)}` did not answer within {timeout:.0f}s.") from None
    if done.returncode != 0:
        raise SlurmError(f"`{' '.join(args)}` failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def node_addresses(partition: str | None = None, names: list[str] | None = None) -> list[str]:
    """Addresses of the Slurm nodes of ``partition`` (or named), from ``scontrol``."""
    addrs = []
    for line in _slurm("scontrol", "show", "node", "-o").splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if not fields.get("NodeName"):
            continue
        if names is not None and fields["NodeName"] not in names:
            continue
        if partition and partition not in fields.get("Partitions", "").split(","):
            continue
        addrs.append(fields.get("NodeAddr") or fields["NodeName"])
    return addrs


def controller_address(nodes: list[str]) -> str:
    """The one local address through which every node is reached."""
    sources = Counter()
    for node in nodes:
        try:
            sources[route_source(node)] += 1
        except OSError:
            continue
    if not sources:
        raise SlurmError(
            f"No route from this machine to the Slurm nodes ({', '.join(nodes) or 'none'}). "
            "Pass controller_ip= (the address the nodes can reach this machine on)."
        )
    if len(sources) > 1:
        raise SlurmError(
            "The Slurm nodes are reached through different addresses of this machine "
            f"({', '.join(sources)}); pass controller_ip= with the one they all reach, "
            'or controller_ip="*" to listen on every interface.'
        )
    return next(iter(sources))


class SlurmLauncher:
    """Engines as a Slurm job (or a job step inside the current allocation), as
    ``settings`` say.

    Refuses, before anything starts, what Slurm cannot do with them: hosts (Slurm
    chooses), ``fault_tolerant``, more ranks than the allocation's tasks. Its job's
    ``#SBATCH`` options (defaults and checks) are
    :class:`~clusterkernel.client.export._sbatch.SbatchOptions`, the same as an exported job's.

    Example::

        launcher = SlurmLauncher(LaunchSettings(n=4, launcher="slurm", time="2:00:00"))
        launcher.batch_script()      # the job script; "#SBATCH --time=2:00:00" among its lines
    """

    kind = "slurm"
    multi_node = True

    def __init__(self, settings: LaunchSettings) -> None:
        if settings.hosts or settings.hostfile:
            raise ValueError("Slurm chooses the hosts: leave out hosts=/hostfile=.")
        if settings.fault_tolerant:
            raise ValueError("fault_tolerant=True needs launcher='mpiexec' (Open MPI's ULFM).")
        self.settings = settings
        self.step = in_allocation()
        n, nodes = settings.n, settings.nodes
        if n is None:
            if not self.step:
                raise ValueError(
                    "Give the number of ranks (n= / -n): this process is not inside a "
                    "Slurm allocation whose size could be used."
                )
            n, alloc_nodes = allocation_size()
            nodes = nodes or alloc_nodes
        elif self.step:
            tasks, _ = allocation_size()
            if n > tasks:
                raise ValueError(
                    f"{n} ranks, but this Slurm allocation has {tasks} tasks (SLURM_NTASKS): "
                    f"ask for at most {tasks}, or leave n out to use the whole allocation."
                )
        self.sbatch = SbatchOptions(  # checked here, before anything starts
            nodes=nodes,
            ntasks_per_node=-(-n // nodes) if isinstance(nodes, int) and nodes > 0 else None,
            time=settings.time,
            partition=settings.partition,
            account=settings.account,
            extra=settings.slurm_args,
        )
        if nodes is not None and nodes > n:
            raise ValueError(f"nodes must be between 1 and n={n}, got {nodes}.")
        self.n = n
        self.nodes = nodes  # the allocation's inside one, when not given
        self._controller_ip = settings.controller_ip
        self.job_id: str | None = None
        self._state: tuple[str, str] | None = None
        self._state_at = 0.0

    def engines(self) -> str:
        return "mpi" if self.step else "slurm"

    def describe(self) -> str:
        return "slurm step" if self.step else "slurm"

    def controller_ip(self) -> str:
        if self._controller_ip is None:
            if self.step:
                names = _slurm(
                    "scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")
                ).split()
                addrs = node_addresses(names=names) or names
            else:
                addrs = node_addresses(self.settings.partition)
            self._controller_ip = controller_address(addrs)
        return self._controller_ip

    # ------------------------------------------------------------ configuration
    @property
    def _per_node(self) -> int:
        # spread evenly, neighbouring ranks on one node (Slurm's block default
        # would fill the first node's CPUs first)
        return -(-self.n // self.nodes)

    def _srun_options(self) -> list[str]:
        opts = ["--mpi=pmix", "--kill-on-bad-exit=1"]
        if self.step and self.nodes:
            opts += [f"--nodes={self.nodes}", f"--ntasks-per-node={self._per_node}"]
        return opts + (list(self.settings.slurm_args) if self.step else [])

    def batch_script(self) -> str:
        """The job script (an ipyparallel template: ``{program_and_args}`` and friends)."""

        def esc(text: str) -> str:  # literal text in a str.format template
            return text.replace("{", "{{").replace("}", "}}")

        lines = [
            "#!/bin/sh",
            "#SBATCH --job-name=clusterkernel-{cluster_id}",
            "#SBATCH --ntasks={n}",
            "#SBATCH --output={output_file}",
            "#SBATCH --export=ALL",
            *(esc(line) for line in self.sbatch.lines()),
        ]
        srun = " ".join(shlex.quote(o) for o in self._srun_options())
        lines.append(f"exec srun {srun} {{program_and_args}}")
        return "\n".join(lines) + "\n"

    def config(self, env: dict[str, str], run_dir: str) -> Config:
        cfg = _base_config()
        quiet = {k: os.environ.get(k, v) for k, v in QUIET_OSC.items()}
        full = {"PATH": os.environ.get("PATH", ""), **quiet, **env}
        if self.step:
            launcher = cfg.MPIEngineSetLauncher
            launcher.mpi_cmd = [_which("srun")]
            launcher.mpi_args = self._srun_options()
            launcher.engine_args = ["--log-level=WARN"]  # MPIEngineSetLauncher adds --mpi
        else:
            launcher = cfg.SlurmEngineSetLauncher
            launcher.batch_template = self.batch_script()
            # absolute: ipyparallel joins it to its work_dir, the current directory
            launcher.batch_file_name = os.path.join(run_dir, "engines.sbatch")
            launcher.output_file = os.path.join(run_dir, "engines.out")
            launcher.engine_args = ["--log-level=WARN", "--mpi"]
        launcher.environment = full
        launcher.engine_cmd = engine_cmd(full)
        return cfg

    # ------------------------------------------------------------ the job
    def _job_state(self, engine_set) -> tuple[str, str] | None:
        """``(state, reason)`` of the engines' job, at most one squeue call a second."""
        job = getattr(engine_set, "job_id", None)
        if not job:
            return None
        now = time.monotonic()
        if self._state is None or job != self.job_id or now - self._state_at > _POLL:
            self.job_id = job
            try:
                out = _slurm("squeue", "-h", "--states=all", "-j", job, "-o", "%T|%r").strip()
            except SlurmError:
                out = ""  # a job Slurm has forgotten has ended
            state, _, reason = out.partition("|")
            self._state, self._state_at = (state or "GONE", reason), now
        return self._state

    def waiting(self, engine_set) -> str | None:
        state = None if self.step else self._job_state(engine_set)
        if state is None or state[0] not in ("PENDING", "CONFIGURING"):
            return None
        reason = f" ({state[1]})" if state[1] and state[1] != "None" else ""
        return f"Slurm job {self.job_id}: {state[0].lower()}{reason}"

    def ended(self, engine_set) -> bool:
        if self.step:
            return process_ended(engine_set)
        state = self._job_state(engine_set)
        return state is not None and state[0] not in _ALIVE

    def output(self, engine_set, lines: int = 40) -> str:
        if self.step:
            return tail(engine_set.get_output() if engine_set is not None else "", lines)
        # read the file each time: the launcher caches its first read
        try:
            with open(getattr(engine_set, "output_file", "") or os.devnull) as f:
                return tail(f.read(), lines)
        except OSError:
            return ""

    def stopped(self, engine_set, timeout: float) -> None:
        """After ``scancel``: wait until Slurm has the job's processes gone."""
        if self.step or not getattr(engine_set, "job_id", None):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._state = None
            state = self._job_state(engine_set)
            if state is None or state[0] not in _ALIVE | {"COMPLETING"}:
                return
            time.sleep(0.2)
