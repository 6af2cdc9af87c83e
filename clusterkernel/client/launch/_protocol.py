"""The :class:`Launcher` protocol: what a way of starting the ranks gives ``Cluster`` (client side).

A launcher is built from a :class:`~clusterkernel.client.launch.LaunchSettings` (the
registry, :mod:`clusterkernel.client.launch._registry`, says which class a kind is
built by) and keeps those settings, the rank count filled in: ``launcher.settings.n``
is the one place a cluster's ``n`` is held.

Example::

    from clusterkernel.client.launch import LaunchSettings
    launcher = LaunchSettings(n=4).build()     # an MpiexecLauncher, a Launcher
    launcher.settings.n, launcher.describe()   # (4, 'openmpi')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from traitlets.config import Config

    from clusterkernel.client.launch._settings import LaunchSettings


class Launcher(Protocol):
    """What :class:`~clusterkernel.Cluster` needs from a way of starting engines.

    ``engine_set`` below is ipyparallel's engine-set launcher this one configured (None
    before a start). Cancelling a job is the engine set's ``stop()`` (a scheduler's
    class runs the command); the launcher says when its processes are gone.
    """

    kind: str  # "mpiexec" or a scheduler's name ("slurm", "sge")
    # what it was built from, the rank count filled in (a kept cluster's record)
    settings: LaunchSettings
    multi_node: bool  # ranks may run on other machines: the controller listens for them

    @property
    def n(self) -> int:
        """The ranks it starts: ``settings.n``, the one place the count is held."""
        ...

    def engines(self) -> str | type:
        """ipyparallel's engine launcher: its name or class."""
        ...

    def controller_ip(self) -> str | None:
        """The address the controller listens on (None: ipyparallel's default, local)."""
        ...

    def config(self, env: dict[str, str], run_dir: str) -> Config:
        """ipyparallel's configuration that starts the ranks with ``env`` added."""
        ...

    def ended(self, engine_set: Any) -> bool:
        """Whether the ranks' job (or mpiexec) has ended."""
        ...

    def killed_by(self, engine_set: Any) -> int | None:
        """The signal that ended the launcher's own process (mpiexec), where one did."""
        ...

    def output(self, engine_set: Any, lines: int = 40) -> str:
        """The last ``lines`` of what the launcher (mpiexec, the job) said."""
        ...

    def waiting(self, engine_set: Any) -> str | None:
        """Why no rank can come yet (a job waiting in the queue), else None."""
        ...

    def stopped(self, engine_set: Any, timeout: float) -> None:
        """After a stop: wait (up to ``timeout``) until the job's processes are gone."""
        ...

    def describe(self) -> str:
        """How the ranks run, in a word or two (``"openmpi"``, ``"slurm step"``)."""
        ...
