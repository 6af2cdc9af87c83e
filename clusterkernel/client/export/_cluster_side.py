"""Where an exported job goes when the notebook runs outside the cluster (client side).

A cluster started from outside (``%mpi start --ssh login``) runs its ranks behind the
login node: a job exported from its notebook must run there too. :class:`ClusterSide`
holds that login node (:class:`~clusterkernel.client.launch._ssh.Login`, the cluster's
own, with its master connection): the job's paths there (the same relative place under
the home there as under the home here, as the cluster's own files), its Python (the
login node's interpreter, ``--remote-python``), the files sent there and the commands
as the user types them here (``ssh login sbatch ...``).

Example::

    # not run: needs an SSH host
    side = cluster_side(cluster)                  # None: the cluster runs here
    side.path("job.sbatch")                       # '/home/me/job.sbatch' (the login's)
    side.command("sbatch", side.path("job.sbatch"))   # 'ssh login sbatch /home/me/...'
"""

from __future__ import annotations

import posixpath
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusterkernel.client.launch._ssh import Login


class ClusterSide:
    """The login node ``login`` as an exported job's home: its paths, its Python, the
    files sent there and the commands that reach it from here.

    Example::

        # not run: needs an SSH host
        side = ClusterSide(login_for("login"))
        side.send(Path("job.py"), "print('hi')")  # ~/<same place>/job.py on login
    """

    def __init__(self, login: Login) -> None:
        self.login = login
        self._home: str | None = None  # the login node's home, asked once

    @property
    def python(self) -> str:
        """The login node's interpreter (the one that has clusterkernel there)."""
        return self.login.python

    def path(self, local: str | Path) -> str:
        """``local`` (a path here) as the same place under the login node's home,
        absolute there (a job's cwd need not be that home)."""
        if self._home is None:
            self._home = self.login.run("pwd", timeout=30).stdout.strip()
        return posixpath.join(self._home, self._relative(local))

    def send(self, local: str | Path, text: str) -> None:
        """Write ``text`` to :meth:`path` of ``local`` on the login node."""
        self.login.write(self._relative(local), text)

    def mpiexec(self) -> str:
        """The login node's ``mpiexec`` (the one beside its Python, else on its PATH)."""
        return self.login.mpi_runtime(None, False)[0]

    def command(self, *argv: str) -> str:
        """``argv`` run on the login node, as the user types it here: ``ssh login
        sbatch /home/me/job.sbatch`` (quoted once more where the shell there would
        split a word)."""
        there = shlex.join(argv)
        if there != " ".join(argv):
            there = shlex.quote(there)
        return f"ssh {shlex.quote(self.login.host)} {there}"

    def _relative(self, local: str | Path) -> str:
        return self.login.home_path(str(Path(local).resolve()))


def cluster_side(cluster: Any) -> ClusterSide | None:
    """The :class:`ClusterSide` of ``cluster`` when it runs from outside (started with
    ``ssh=``); None when it runs here, or for no cluster.

    Example::

        from clusterkernel.client.export import cluster_side
        cluster_side(None)       # None: an export without a cluster writes files here only
    """
    login = getattr(getattr(cluster, "launcher", None), "login", None)
    return ClusterSide(login) if login is not None else None
