"""How a :class:`~clusterkernel.Cluster`'s ranks are launched, said once (client side).

:class:`LaunchSettings` holds every launch option of ``Cluster(...)`` and ``%mpi start``:
how many ranks, where (this machine, a host list, a scheduler's job) and the options of
that scheduler (declared by its class, :mod:`clusterkernel.client.scheduler`). It is made
once, from ``Cluster``'s keyword arguments or from ``%mpi start``'s options
(:meth:`LaunchSettings.from_args`); :meth:`~LaunchSettings.build` gives the launcher,
which keeps it as ``launcher.settings``, and a kept cluster's record stores it for
``attach``. No layer lists the options again.

Where each check lives, so that each is made once: the options on their own (rank
count, hosts or hostfile, launcher name, option names) here, when the settings are
made; what a launcher cannot do with them (hosts under a scheduler, a scheduler's
options for ``mpiexec``, more ranks than slots) in that launcher, when it is built; the
values of a scheduler's options in its class. All of it before anything starts.

Example::

    # not run: it asks Slurm for two nodes
    settings = LaunchSettings(n=8, launcher="slurm", nodes=2)
    launcher = settings.build()        # a BatchLauncher; launcher.settings is settings
    Cluster(launcher=settings)         # the same as Cluster(n=8, launcher="slurm", nodes=2)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clusterkernel.client import scheduler
from clusterkernel.client.launch._registry import launcher_class

if TYPE_CHECKING:
    from clusterkernel.client.launch._protocol import Launcher


# The ranks of a start on this machine or a host list that does not say how many.
DEFAULT_RANKS = 4


def launchers() -> tuple[str, ...]:
    """The names ``launcher=`` takes: ``mpiexec`` and every scheduler."""
    return ("mpiexec", *scheduler.schedulers())


def _default(name: str) -> Any:
    return scheduler.options()[name][0][1].default


def _same(value: Any, default: Any) -> bool:
    """Whether ``value`` says no more than ``default`` (None and () say nothing)."""
    empty = (None, ())
    return value == default or (value in empty and default in empty)


@dataclass(frozen=True, init=False)
class LaunchSettings:
    """The launch options of one cluster, checked when made (a ``ValueError`` names the
    bad one). Fields are ``Cluster(...)``'s keyword arguments of the same names, and
    further keywords are the scheduler's options (``nodes=``, ``queue=``...), read back
    as attributes; ``launcher`` None picks the scheduler whose job this process runs in
    (Slurm's allocation), else ``mpiexec``.

    Example::

        from clusterkernel.client.launch import LaunchSettings
        launcher = LaunchSettings(n=4).build()   # mpiexec here; hosts="a:2,b:2": two machines
        launcher.kind, launcher.n                # ('mpiexec', 4)
        LaunchSettings(n=4, launcher="sge", queue="all.q").queue   # 'all.q'
        try:
            LaunchSettings(n=0)
        except ValueError as e:
            print(e)                             # n must be a positive integer number of ...
    """

    # None until the launcher is built: it puts the count it starts here (DEFAULT_RANKS,
    # a Slurm allocation's tasks), so that the launcher's settings hold the one n
    n: int | None = None
    hosts: str | tuple[str, ...] | None = None
    hostfile: str | None = None
    mpiexec: str | None = None
    launcher: str | None = None
    controller_ip: str | None = None
    fault_tolerant: bool = False
    # after a cell that saw a rank die, bring it back (needs, so implies, fault_tolerant)
    respawn: bool = False
    # the login node (an SSH host) the scheduler's commands and the controller run on,
    # for a notebook outside the cluster; remote_python: the interpreter there that has
    # clusterkernel (default: this one's path, as where both share an installation)
    ssh: str | None = None
    remote_python: str | None = None
    # the scheduler's options given, as sorted (name, value) pairs; defaults left out
    scheduler_options: tuple[tuple[str, Any], ...] = field(default=())

    def __init__(
        self, n: int | None = None, hosts: str | list[str] | tuple[str, ...] | None = None,
        hostfile: str | None = None, mpiexec: str | None = None, launcher: str | None = None,
        controller_ip: str | None = None, fault_tolerant: bool = False, respawn: bool = False,
        scheduler_options: tuple[tuple[str, Any], ...] = (), ssh: str | None = None,
        remote_python: str | None = None, **options: Any,
    ) -> None:  # fmt: skip
        for name, value in (
            ("n", n), ("hosts", tuple(hosts) if isinstance(hosts, list) else hosts),
            ("hostfile", hostfile), ("mpiexec", mpiexec), ("launcher", launcher),
            ("controller_ip", controller_ip), ("fault_tolerant", fault_tolerant or respawn),
            ("respawn", respawn), ("ssh", ssh), ("remote_python", remote_python),
        ):  # fmt: skip
            object.__setattr__(self, name, value)
        options = {**dict(scheduler_options), **options}
        declared = scheduler.options()
        unknown = sorted(set(options) - set(declared))
        if unknown:
            raise TypeError(
                f"unknown launch option {', '.join(u + '=' for u in unknown)}: the schedulers' "
                f"options are {', '.join(sorted(declared))}"
            )
        if launcher in scheduler.schedulers():
            options = scheduler.get(launcher).normalize(options)
        # lists become tuples, defaults go: the settings are a value, compared and kept as one
        kept = {
            k: tuple(str(a) for a in v) if isinstance(v, (list, tuple)) else v
            for k, v in options.items()
        }
        kept = {k: v for k, v in kept.items() if not _same(v, _default(k))}
        object.__setattr__(self, "scheduler_options", tuple(sorted(kept.items())))
        self._check()

    def _check(self) -> None:
        n = self.n
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"n must be a positive integer number of ranks, got {n!r}.")
        if self.hosts and self.hostfile:
            raise ValueError("Give either hosts= or hostfile=, not both.")
        if self.hostfile and not os.path.isfile(self.hostfile):
            raise FileNotFoundError(f"Hostfile {self.hostfile!r} does not exist.")
        if self.ssh is not None and self.launcher in (None, "mpiexec"):
            names = " or ".join(repr(name) for name in scheduler.schedulers())
            raise ValueError(
                "ssh= starts the ranks as a scheduler's job from outside the cluster: give "
                f"the scheduler too (--slurm or --scheduler NAME, launcher={names})."
            )
        if self.remote_python is not None and self.ssh is None:
            raise ValueError("remote_python= is the interpreter on the ssh= host: give ssh= too.")
        if self.launcher is not None and self.launcher not in launchers():
            raise ValueError(
                f"launcher must be one of {', '.join(launchers())} (or a LaunchSettings); "
                f"got {self.launcher!r}."
            )

    def __getattr__(self, name: str) -> Any:
        # a scheduler's option: the value given, else its declared default
        if name.startswith("_") or name not in scheduler.options():
            raise AttributeError(name)
        return dict(self.scheduler_options).get(name, _default(name))

    def with_ranks(self, n: int) -> LaunchSettings:
        """These settings with ``n`` ranks (a launcher's, once it knows the count)."""
        return self if n == self.n else dataclasses.replace(self, n=n)

    def options(self) -> dict[str, Any]:
        """The scheduler's options given (those left at their default are not)."""
        return dict(self.scheduler_options)

    @classmethod
    def from_args(cls, args: Any) -> LaunchSettings:
        """The settings of ``%mpi start``'s parsed options (an argparse namespace).

        Options named like a field are taken as they are; ``--scheduler NAME`` (``--slurm``
        for Slurm) is ``launcher=NAME``, and that scheduler's options are taken by name.
        A scheduler's options without it are refused, saying which to add.

        Example::

            # not run: start_args is the %mpi start magic's parser, inside the magics
            args = parse_argstring(start_args, "-n 8 --slurm --nodes 2 --gres gpu:4")
            LaunchSettings.from_args(args)
            # LaunchSettings(n=8, launcher='slurm', scheduler_options=(('nodes', 2),
            #                ('slurm_args', ('--gres=gpu:4',))), ...)
        """
        given = vars(args)
        name = "slurm" if given.get("slurm") else given.get("scheduler")
        chosen = scheduler.get(name) if name else None
        mine = {o.name for o in chosen.options} if chosen else set()
        stray = sorted(
            (name_, owners) for name_, owners in scheduler.options().items()
            if name_ not in mine and given.get(name_) not in (None, _default(name_))
        )  # fmt: skip
        if stray:
            flags = ", ".join(owners[0][1].flag for _, owners in stray)
            owner = stray[0][1][0][0].name
            said = "--slurm or --scheduler slurm" if owner == "slurm" else f"--scheduler {owner}"
            raise ValueError(f"{flags}: they go with {said}.")
        named = {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given}
        opts = {k: given[k] for k in mine if given.get(k) is not None}
        return cls(
            **{k: v for k, v in named.items() if v is not None and k != "launcher"},
            launcher=name,
            **opts,
        )

    def kind(self) -> str:
        """``"mpiexec"`` or a scheduler's name: the one asked for, else the one this
        process's place picks (a step of the job it runs in unless hosts are given)."""
        if self.launcher is not None:
            return self.launcher
        if not (self.hosts or self.hostfile):
            for name, system in scheduler.schedulers().items():
                if system.steps_in_job():
                    return name
        return "mpiexec"

    def build(self) -> Launcher:
        """The launcher these settings ask for (the registry's class for :meth:`kind`),
        checked against what it can do."""
        return launcher_class(self.kind())(self)

    def record(self) -> dict[str, Any]:
        """The settings as ``Cluster(...)``'s keyword arguments, plain JSON values (a kept
        cluster's record: ``Cluster(**record)`` makes the same settings again)."""
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.name != "scheduler_options"
        }  # fmt: skip
        out.update(self.scheduler_options)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def launcher_for(launcher: str | LaunchSettings | Launcher | None, **options: Any) -> Launcher:
    """The launcher of ``Cluster(launcher=..., **options)``, ``options`` being the launch
    options given beside it (``n=``, ``hosts=``, a scheduler's ``nodes=``...).

    ``launcher`` a name (or None): a :class:`LaunchSettings` of it and ``options``, built.
    A :class:`LaunchSettings` or a launcher it built carries every launch option itself,
    so none may be given beside it: one object says how the ranks start, never two.
    """
    if launcher is None or isinstance(launcher, str):
        return LaunchSettings(launcher=launcher, **options).build()
    if not isinstance(launcher, LaunchSettings) and not hasattr(launcher, "settings"):
        # not a launcher: refused with the name check's message
        return LaunchSettings(launcher=launcher, **options).build()  # type: ignore[arg-type]
    beside = [f"{k}=" for k, v in options.items() if v not in (None, False, (), [])]
    if beside:
        raise ValueError(
            f"launcher= is a {type(launcher).__name__}, which holds every launch option: "
            f"give {', '.join(beside)} in it, not beside it."
        )
    return launcher.build() if isinstance(launcher, LaunchSettings) else launcher
