"""Slurm as a :class:`~clusterkernel.client.scheduler.BatchSystem` (client side).

Two ways, picked by where the notebook runs:

- outside an allocation (a login node, JupyterHub): the engines are one batch job,
  ``sbatch`` of a script whose launch line starts one engine per task, so they form one
  MPI world over the nodes: ``srun --mpi=pmix`` (a job step, :attr:`Slurm.launch`), or
  ``mpiexec`` inside the job (``launch_line(..., how="mpiexec")``: Open MPI reads the
  allocation);
- inside an allocation (the notebook itself started by ``salloc``/``sbatch``, as
  batchspawner does): a job step, ``srun --mpi=pmix`` in that allocation
  (:meth:`Slurm.step_command`), with as many ranks as it has tasks unless told otherwise.

:class:`SbatchOptions` is the one writer of ``#SBATCH`` lines, for a started job and an
exported one alike: one set of defaults, one validation.

Example::

    SbatchOptions(nodes=2, ntasks_per_node=4, partition="gpu").lines()
    # ['#SBATCH --nodes=2', '#SBATCH --ntasks-per-node=4',
    #  '#SBATCH --time=01:00:00', '#SBATCH --partition=gpu']
    Slurm(n=8, values={"nodes": 2}).directives("job", "job.out")[:2]
    # ['--job-name=job', '--ntasks=8']
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from clusterkernel.client.scheduler._system import (
    DEFAULT_TIME,
    BatchSystem,
    CommandHost,
    SchedulerError,
    SchedulerOption,
)

# minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch --time), or no limit
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|(?i:unlimited|infinite)")
_NAME = re.compile(r"[\w.+-]+")
_PARTITIONS = re.compile(r"[\w.+-]+(,[\w.+-]+)*")  # sbatch takes a list: gpu,cpu
_GRES = re.compile(r"[\w.:,]+")


def _count(flag: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"--{flag} must be a positive integer; got {value!r}")


@dataclass(frozen=True)
class SbatchOptions:
    """A Slurm job's resource request, checked when made; :meth:`lines` are its
    ``#SBATCH`` lines. ``None`` leaves a directive out (Slurm's or the site's default);
    ``extra`` are further sbatch options, one each (``"--constraint=a100"``), last, so
    they override the ones before.

    Example::

        SbatchOptions(time="2:00:00").lines()   # ['#SBATCH --time=2:00:00']
    """

    nodes: int | None = None
    ntasks_per_node: int | None = None
    time: str | None = DEFAULT_TIME
    partition: str | None = None
    account: str | None = None
    gpus_per_node: int | None = None
    gres: str | None = None
    extra: tuple[str, ...] = ()
    job_name: str | None = None
    output: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", tuple(self.extra))
        _count("nodes", self.nodes)
        _count("ntasks-per-node", self.ntasks_per_node)
        _count("gpus-per-node", self.gpus_per_node)
        if self.time is not None and not (
            isinstance(self.time, str) and _TIME.fullmatch(self.time)
        ):
            raise ValueError(
                f"--time {self.time!r}: use minutes, HH:MM:SS or D-HH:MM:SS, e.g. "
                f"{DEFAULT_TIME} (the default), or UNLIMITED"
            )
        if self.gres is not None and not (
            isinstance(self.gres, str) and _GRES.fullmatch(self.gres)
        ):
            raise ValueError(f"--gres {self.gres!r}: use Slurm's form, e.g. gpu:4 or gpu:a100:2")
        if self.partition is not None and not (
            isinstance(self.partition, str) and _PARTITIONS.fullmatch(self.partition)
        ):
            raise ValueError(
                f"--partition {self.partition!r}: use letters, digits, '.', '_', '+', '-' "
                "(several: gpu,cpu)"
            )
        for flag, value in (("account", self.account), ("job-name", self.job_name)):
            if value is not None and not (isinstance(value, str) and _NAME.fullmatch(value)):
                raise ValueError(f"--{flag} {value!r}: use letters, digits, '.', '_', '+', '-'")
        if self.output is not None and re.search(r"\s", self.output):
            raise ValueError(f"{self.output}: Slurm's --output cannot hold spaces; move the script")
        for arg in self.extra:
            if not isinstance(arg, str) or not arg.strip() or re.search(r"[\r\n]", arg):
                raise ValueError(
                    f"Slurm option {arg!r} (slurm_args=): give each option as a string "
                    "on one line, e.g. '--constraint=a100'"
                )

    def directives(self) -> list[str]:
        """The sbatch options, in the order :meth:`lines` writes them."""
        named = (
            ("job-name", self.job_name),
            ("nodes", self.nodes),
            ("ntasks-per-node", self.ntasks_per_node),
            ("time", self.time),
            ("partition", self.partition),
            ("account", self.account),
            ("gpus-per-node", self.gpus_per_node),
            ("gres", self.gres),
            ("output", self.output),
        )
        return [f"--{flag}={value}" for flag, value in named if value] + list(self.extra)

    def lines(self) -> list[str]:
        """``#SBATCH`` lines, one per option given."""
        return [f"#SBATCH {d}" for d in self.directives()]


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


class Slurm(BatchSystem):
    """A Slurm job of ``n`` ranks (or a job step inside this process's allocation).

    Example::

        Slurm(n=4, values={"time": "2:00:00"}).sbatch.time    # '2:00:00'
    """

    name = "slurm"
    title = "Slurm"
    prefix = "#SBATCH"
    submit_command = ("sbatch", "--parsable")
    job_id_pattern = r"\d+"
    cancel_command = ("scancel",)
    live_states = frozenset(
        {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING", "REQUEUED"}
    )
    queued_states = frozenset({"PENDING", "CONFIGURING"})
    ending_states = frozenset({"COMPLETING"})
    launch = "step"
    export_flag = "--sbatch"
    report_prefixes = ("srun:", "slurmstepd:")
    in_job_env = "SLURM_JOB_ID"
    commands = ("sbatch", "scancel", "squeue", "scontrol", "srun", "salloc", "sacct")
    options = (
        SchedulerOption("nodes", "spread the ranks over this many nodes", int,
                        export=True, export_default=1),
        SchedulerOption("ntasks_per_node", "ranks per node (default: the ranks / nodes)", int,
                        magic=False, export=True),
        SchedulerOption("partition", "the partition (queue) to submit to", export=True),
        SchedulerOption("time", f"time limit (default {DEFAULT_TIME})",
                        default=DEFAULT_TIME, export=True, export_default=DEFAULT_TIME),
        SchedulerOption("account", "the account to charge", export=True),
        SchedulerOption("gpus_per_node", "GPUs to ask for on each node", int, export=True),
        SchedulerOption("gres", "a generic resource request, e.g. gpu:a100:4", export=True),
        SchedulerOption("slurm_args", "further sbatch options, one each (srun's inside an "
                        "allocation)", many=True, magic=False),
    )  # fmt: skip

    @classmethod
    def normalize(cls, values: dict[str, Any]) -> dict[str, Any]:
        """A GPU request (``gpus_per_node``, ``gres``) goes into ``slurm_args``, checked
        as an exported job's is: one spelling of the same launch."""
        values = dict(values)
        gpus = {k: values.pop(k) for k in ("gpus_per_node", "gres") if k in values}
        if any(v is not None for v in gpus.values()):
            extra = SbatchOptions(time=None, **gpus).directives()
            values["slurm_args"] = (*extra, *(values.get("slurm_args") or ()))
        if values.get("ntasks_per_node") is not None:
            raise ValueError("ntasks_per_node= is for an exported job: give nodes= and n=.")
        values.pop("ntasks_per_node", None)
        return values

    def check(self) -> None:
        v, n = self.values, self.n
        nodes = v["nodes"]
        self.sbatch = SbatchOptions(  # checked here, before anything starts
            nodes=nodes,
            ntasks_per_node=-(-n // nodes) if isinstance(nodes, int) and nodes > 0 else None,
            time=v["time"],
            partition=v["partition"],
            account=v["account"],
            gpus_per_node=v["gpus_per_node"],
            gres=v["gres"],
            extra=v["slurm_args"],
        )
        if nodes is not None and nodes > n:
            raise ValueError(f"nodes must be between 1 and n={n}, got {nodes}.")

    def directives(self, job_name: str, output: str) -> list[str]:
        return [
            f"--job-name={job_name}", f"--ntasks={self.n}", f"--output={output}",
            "--export=ALL", *self.sbatch.directives(),
        ]  # fmt: skip

    def step_options(self, in_allocation: bool = False) -> list[str]:
        """``srun``'s options for the ranks' step (in a job, or in this allocation)."""
        opts = ["--mpi=pmix", "--kill-on-bad-exit=1"]
        nodes = self.values["nodes"]
        if in_allocation and nodes:
            # spread evenly, neighbouring ranks on one node (Slurm's block default
            # would fill the first node's CPUs first)
            opts += [f"--nodes={nodes}", f"--ntasks-per-node={-(-self.n // nodes)}"]
        return opts + (list(self.values["slurm_args"]) if in_allocation else [])

    def step_line(self, command: str) -> str:
        return f"exec srun {' '.join(shlex.quote(o) for o in self.step_options())} {command}"

    def step_command(self) -> list[str]:
        """``srun`` and its options, for ranks started as a step of this allocation."""
        return [self.which("srun"), *self.step_options(in_allocation=True)]

    @classmethod
    def which(cls, program: str) -> str:
        import shutil

        exe = shutil.which(program)
        if exe is None:
            cls.run(program)  # raises, saying what is missing
        return cast(str, exe)

    def export_script(self, command: str, *, job_name: str, output: str, **kw: Any) -> str:
        """An sbatch file: ``nodes`` x ``ntasks_per_node`` ranks by ``srun --mpi=pmix``."""
        v = self.values
        options = SbatchOptions(
            nodes=v["nodes"], ntasks_per_node=v["ntasks_per_node"], time=v["time"],
            partition=v["partition"], account=v["account"], gpus_per_node=v["gpus_per_node"],
            gres=v["gres"], job_name=job_name, output=output,
        )  # fmt: skip
        preamble = kw.pop("preamble", ())
        lines = ["#!/bin/bash", *options.lines(), *preamble, f"srun --mpi=pmix {command}"]
        return "\n".join(lines) + "\n"

    def export_output(self, script: str) -> str:
        path = Path(script)
        return str(path.with_name(path.stem + "-%j.out"))

    # ------------------------------------------------------------ the job
    @classmethod
    def state(cls, job_id: str, on: CommandHost | None = None) -> tuple[str, str] | None:
        try:
            out = cls.run(
                "squeue", "-h", "--states=all", "-j", str(job_id), "-o", "%T|%r", on=on
            ).strip()
        except SchedulerError:
            out = ""  # a job Slurm has forgotten has ended
        if not out:
            return None
        state, _, reason = out.partition("|")
        return state, "" if reason == "None" else reason

    @classmethod
    def steps_in_job(cls) -> bool:
        """Inside an allocation the ranks are a step of it (no job of their own)."""
        return cls.in_job()

    @classmethod
    def job_size(cls) -> tuple[int, int]:
        return allocation_size()

    @classmethod
    def resolve(cls, n: int | None, values: dict[str, Any], step: bool) -> tuple[int, dict]:
        """``n`` and the options, the allocation's own where not given (inside one)."""
        if not step:
            if n is None:
                raise ValueError(
                    "Give the number of ranks (n= / -n): this process is not inside a "
                    "Slurm allocation whose size could be used."
                )
            return n, values
        tasks, alloc_nodes = allocation_size()
        if n is None:
            return tasks, {**values, "nodes": values.get("nodes") or alloc_nodes}
        if n > tasks:
            raise ValueError(
                f"{n} ranks, but this Slurm allocation has {tasks} tasks (SLURM_NTASKS): "
                f"ask for at most {tasks}, or leave n out to use the whole allocation."
            )
        return n, values

    def node_addresses(self, in_allocation: bool = False) -> list[str]:
        if in_allocation:
            names = self.run(  # inside an allocation: never from outside
                "scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")
            ).split()
            return _scontrol_addresses(self, names=names) or names
        return _scontrol_addresses(self, partition=self.values["partition"])


def _scontrol_addresses(
    slurm: Slurm, partition: str | None = None, names: list[str] | None = None
) -> list[str]:
    """Addresses of the Slurm nodes of ``partition`` (or named), from ``scontrol``."""
    addrs = []
    for line in slurm.run("scontrol", "show", "node", "-o", on=slurm.on).splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if not fields.get("NodeName"):
            continue
        if names is not None and fields["NodeName"] not in names:
            continue
        if partition and partition not in fields.get("Partitions", "").split(","):
            continue
        addrs.append(fields.get("NodeAddr") or fields["NodeName"])
    return addrs
