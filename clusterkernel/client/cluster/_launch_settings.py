"""How a :class:`~clusterkernel.Cluster`'s ranks are launched, said once (client side).

:class:`LaunchSettings` holds every launch option of ``Cluster(...)`` and ``%mpi start``:
how many ranks, where (this machine, a host list, a Slurm job) and the Slurm job's shape.
It is made once, from ``Cluster``'s keyword arguments or from ``%mpi start``'s options
(:meth:`LaunchSettings.from_args`); :meth:`~LaunchSettings.build` gives the launcher,
which keeps it as ``launcher.settings``, and a kept cluster's record stores it for
``attach``. No layer lists the options again.

Where each check lives, so that each is made once: the options on their own (rank
count, hosts or hostfile, launcher name) here, when the settings are made; what a
launcher cannot do with them (hosts under Slurm, Slurm's options for ``mpiexec``, more
ranks than slots) in that launcher, when it is built; the ``#SBATCH`` values in
:class:`~clusterkernel.client.export._sbatch.SbatchOptions`. All of it before anything starts.

Example::

    # not run: it asks Slurm for two nodes
    settings = LaunchSettings(n=8, launcher="slurm", nodes=2)
    launcher = settings.build()        # a SlurmLauncher; launcher.settings is settings
    Cluster(launcher=settings)         # the same as Cluster(n=8, launcher="slurm", nodes=2)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusterkernel.client.export._sbatch import DEFAULT_TIME, SbatchOptions

if TYPE_CHECKING:
    from clusterkernel.client.cluster._launch import Launcher

LAUNCHERS = ("mpiexec", "slurm")

# %mpi start's options that only a Slurm job takes; without --slurm they are refused
_SLURM_FLAGS = ("nodes", "partition", "account", "gpus_per_node", "gres")


@dataclass(frozen=True)
class LaunchSettings:
    """The launch options of one cluster, checked when made (a ``ValueError`` names the
    bad one). Fields are ``Cluster(...)``'s keyword arguments of the same names;
    ``launcher`` None picks Slurm inside an allocation, else ``mpiexec``.

    Example::

        from clusterkernel.client.cluster import LaunchSettings
        launcher = LaunchSettings(n=4).build()   # mpiexec here; hosts="a:2,b:2": two machines
        launcher.kind, launcher.n                # ('mpiexec', 4)
        try:
            LaunchSettings(n=0)
        except ValueError as e:
            print(e)                             # n must be a positive integer number of ...
    """

    n: int | None = None
    hosts: str | tuple[str, ...] | None = None
    hostfile: str | None = None
    mpiexec: str | None = None
    launcher: str | None = None
    nodes: int | None = None
    partition: str | None = None
    time: str | None = DEFAULT_TIME
    account: str | None = None
    slurm_args: tuple[str, ...] = ()
    controller_ip: str | None = None
    fault_tolerant: bool = False

    def __post_init__(self) -> None:
        # lists become tuples: the settings are a value, compared and kept as one
        if isinstance(self.hosts, list):
            object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "slurm_args", tuple(str(a) for a in self.slurm_args))
        n = self.n
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"n must be a positive integer number of ranks, got {n!r}.")
        if self.hosts and self.hostfile:
            raise ValueError("Give either hosts= or hostfile=, not both.")
        if self.hostfile and not os.path.isfile(self.hostfile):
            raise FileNotFoundError(f"Hostfile {self.hostfile!r} does not exist.")
        if self.launcher is not None and self.launcher not in LAUNCHERS:
            raise ValueError(
                f"launcher must be one of {', '.join(LAUNCHERS)} (or a LaunchSettings); "
                f"got {self.launcher!r}."
            )

    @classmethod
    def from_args(cls, args: Any) -> LaunchSettings:
        """The settings of ``%mpi start``'s parsed options (an argparse namespace).

        Options named like a field are taken as they are; ``--slurm`` is
        ``launcher="slurm"``; ``--gpus-per-node``/``--gres`` become ``slurm_args``,
        checked as an exported job's are. Slurm's options without ``--slurm`` are refused.

        Example::

            # not run: start_args is the %mpi start magic's parser, inside the magics
            args = parse_argstring(start_args, "-n 8 --slurm --nodes 2 --gres gpu:4")
            LaunchSettings.from_args(args)
            # LaunchSettings(n=8, launcher='slurm', nodes=2, slurm_args=('--gres=gpu:4',), ...)
        """
        given = vars(args)
        gpu_request = SbatchOptions(
            time=None, gpus_per_node=given.get("gpus_per_node"), gres=given.get("gres")
        ).directives()
        if not given.get("slurm") and any(given.get(flag) for flag in _SLURM_FLAGS):
            raise ValueError(
                "--nodes, --partition, --account, --gpus-per-node and --gres go with --slurm."
            )
        named = {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given}
        return cls(
            **{k: v for k, v in named.items() if v is not None},
            launcher="slurm" if given.get("slurm") else None,
            slurm_args=gpu_request,
        )

    def kind(self) -> str:
        """``"mpiexec"`` or ``"slurm"``: the one asked for, else the one this process's
        place picks (Slurm inside an allocation unless hosts are given)."""
        from clusterkernel.client.cluster._slurm import in_allocation

        if self.launcher is not None:
            return self.launcher
        return "slurm" if in_allocation() and not (self.hosts or self.hostfile) else "mpiexec"

    def build(self) -> Launcher:
        """The launcher these settings ask for, checked against what it can do."""
        from clusterkernel.client.cluster._launch import MpiexecLauncher
        from clusterkernel.client.cluster._slurm import SlurmLauncher

        return SlurmLauncher(self) if self.kind() == "slurm" else MpiexecLauncher(self)

    def record(self) -> dict[str, Any]:
        """The settings as ``Cluster(...)``'s keyword arguments, plain JSON values (a kept
        cluster's record: ``Cluster(**record)`` makes the same settings again)."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }


def launcher_for(launcher: str | LaunchSettings | Launcher | None, options: LaunchSettings):
    """The launcher of ``Cluster(launcher=..., <options>)``.

    ``launcher`` a name (or None): ``options`` with it, built. A :class:`LaunchSettings`
    or a launcher it built carries every launch option itself, so ``options`` must then
    be the defaults: one object says how the ranks start, never two.
    """
    if launcher is None or isinstance(launcher, str):
        return dataclasses.replace(options, launcher=launcher).build()
    if not isinstance(launcher, LaunchSettings) and not hasattr(launcher, "settings"):
        # not a launcher: refused with the name check's message
        return dataclasses.replace(options, launcher=launcher).build()
    if options != LaunchSettings():
        changed = [
            f"{f.name}=" for f in dataclasses.fields(options)
            if getattr(options, f.name) != f.default
        ]  # fmt: skip
        raise ValueError(
            f"launcher= is a {type(launcher).__name__}, which holds every launch option: "
            f"give {', '.join(changed)} in it, not beside it."
        )
    return launcher.build() if isinstance(launcher, LaunchSettings) else launcher
