"""The one writer of ``#SBATCH`` lines: one set of defaults, one validation (client side).

Both Slurm paths use it: ``%mpi export --sbatch`` / ``clusterkernel export``
(:func:`clusterkernel.client.export.sbatch_script`) and ``%mpi start --slurm`` /
``Cluster(launcher="slurm")`` (:class:`clusterkernel.client.cluster._slurm.SlurmLauncher`, whose
batch script is an ipyparallel ``str.format`` template: it escapes these lines itself
and adds the template's own job name, ``--ntasks={n}`` and output file). A bad value is
refused here, before anything is written or submitted, with a ``ValueError`` that names
the option and says what to give instead.

Example::

    SbatchOptions(nodes=2, ntasks_per_node=4, partition="gpu").lines()
    # ['#SBATCH --nodes=2', '#SBATCH --ntasks-per-node=4',
    #  '#SBATCH --time=01:00:00', '#SBATCH --partition=gpu']
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_TIME = "01:00:00"  # the Slurm time limit when none is given, on both paths

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
