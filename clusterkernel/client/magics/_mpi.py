"""The ``%mpi`` line magic and ``%%mpi`` cell magic (client side).

Each subcommand is a thin parser over one :class:`~clusterkernel.Cluster` call,
so everything here also works from a script without IPython:

=====================  ==========================================
magic                  plain Python
=====================  ==========================================
``%mpi start -n 4``    ``cluster = Cluster(n=4).start()``
``%%mpi``              ``cluster.run(code)``
``%mpi status``        ``cluster.status()``
``%mpi push x``        ``cluster.push({"x": x})``
``%mpi pull x``        ``cluster.pull("x")``
``%mpi sync mypkg``    ``sync(cluster, ["mypkg"])`` (``clusterkernel.client.sync``)
``%mpi debug``         ``cluster.debug().send("p x")``
``%mpi restart``       ``cluster.restart()``
``%mpi stop``          ``cluster.stop()``
``%mpi export job.py`` ``clusterkernel.client.export.write_job(cells, ...)``
=====================  ==========================================

The subcommands are in ``_subcommands``, the parsers and ``%mpi?`` in ``_args``;
this module is the magics themselves: dispatch, ``%%mpi`` and ``%%local``.
"""

from __future__ import annotations

import atexit
from typing import cast

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, magics_class

from clusterkernel.client.cluster import Cluster, kept_records, set_current_cluster
from clusterkernel.client.errors import ClusterError
from clusterkernel.client.launch._ssh import login_for
from clusterkernel.client.magics._args import (
    cell_args,
    help_text,
    mpi_help,
    ranks_arg,
    start_args,
    sync_args,
)
from clusterkernel.client.magics._parse import parse, unknown_subcommand, without_comment
from clusterkernel.client.magics._subcommands import Subcommands
from clusterkernel.client.sync import SyncError, sync


@magics_class
# IPython types Magics.shell as optional; these magics are always made with a shell
class MPIMagics(Subcommands, Magics):  # type: ignore[misc]
    """``%mpi`` and ``%%mpi``. See ``%mpi?``."""

    def __init__(self, shell) -> None:
        """The magics of one IPython ``shell`` (``%load_ext clusterkernel`` makes them).

        Example::

            %load_ext clusterkernel
        """
        super().__init__(shell)
        self.cluster = None
        # execution counts of cells that raised or were interrupted: %mpi export leaves them out
        self.failed_cells: set[int] = set()
        shell.events.register("post_run_cell", self._note_outcome)
        atexit.register(self._stop_quietly)

    def _note_outcome(self, result) -> None:
        if not result.success and result.execution_count is not None:
            self.failed_cells.add(result.execution_count)

    @property
    def cluster(self) -> Cluster | None:
        """The cluster ``%mpi start`` started; also the session's (``Dashboard()``'s default)."""
        return self._cluster

    @cluster.setter
    def cluster(self, cluster: Cluster | None) -> None:
        self._cluster = cluster
        set_current_cluster(cluster)

    def _stop_quietly(self) -> None:
        """At exit (IPython's, or the MPI kernel's shutdown or restart): stop the ranks, or
        leave kept ones."""
        if self.cluster is None or not self.cluster.running:
            return
        try:
            if self.cluster.keep is not None:
                self.cluster.detach()
            else:
                self.cluster.stop()
        except ClusterError:  # another session took the kept cluster over: it is theirs
            pass

    def _require_cluster(self) -> Cluster:
        if self.autostart is not None and (self.cluster is None or not self.cluster.running):
            self._start_lazily(self.autostart)
        if self.cluster is not None and self.cluster.taken_over_by is not None:
            raise UsageError(self.cluster.taken_over_note())  # let go (e.g. after a cell)
        if self.cluster is None or not self.cluster.running:
            raise UsageError("No MPI ranks are running. Start them with: %mpi start -n 4")
        return self.cluster

    # ---------------------------------------------------------------- kernel mode
    # Set by the "Python 3 (MPI)" kernel (clusterkernel.client.kernel): the %mpi start
    # arguments used when a cell needs ranks and none run.
    autostart: str | None = None
    # with --keep: who started the kept ranks (a restarted kernel attaches to them again)
    origin: str | None = None

    def _start_lazily(self, autostart: str) -> None:
        args = parse(start_args, autostart)
        if self.origin is not None:
            # kept here, or (--ssh) on the login node, where this kernel's earlier self kept them
            where = login_for(args.ssh, args.remote_python)
            mine = [
                r
                for r in kept_records(where)
                if r.get("origin") == self.origin and not r["attached"] and not r.get("ended")
            ]
            if mine:
                self._attach(mine[0]["id"], False, where)
                return
        print(f"Starting {args.n or 'the'} MPI ranks...", flush=True)
        self._sub_start(autostart)
        cluster = cast(Cluster, self.cluster)  # _sub_start made it or raised
        if self.origin is not None and cluster.keep is not None:
            cluster.set_origin(self.origin)

    @cell_magic
    def local(self, line: str, cell: str):
        """%%local: run this cell in the notebook's own process, not on the ranks.

        For the MPI kernel and ``%mpi on``, where every other cell runs on the ranks::

            %%local
            import matplotlib.pyplot as plt
            plt.plot(losses)
        """
        transforms = self.shell.input_transformers_cleanup
        saved = list(transforms)
        # the cell's own transforms, minus the ones that send cells to the ranks
        transforms[:] = [t for t in saved if not getattr(t, "sends_to_ranks", False)]
        try:
            self.shell.run_cell(cell, store_history=False)
        finally:
            transforms[:] = saved

    @line_cell_magic
    def mpi(self, line: str = "", cell: str | None = None):
        line = without_comment(line)
        if cell is not None:
            return self._run_cell(line, cell)
        words = line.strip().split(None, 1)
        if not words:
            print(self.mpi.__doc__)  # type: ignore[misc]  # IPython's magic decorators type a union
            return None
        sub, rest = words[0], (words[1] if len(words) > 1 else "")
        handler = getattr(self, f"_sub_{sub.replace('-', '_')}", None)
        if handler is None:
            raise UsageError(unknown_subcommand(sub, self._subcommand_names()))
        if rest.strip() and sub in _NO_ARGUMENTS:
            raise UsageError(f"%mpi {sub} takes no arguments; got {rest.strip()!r}.")
        try:
            return handler(rest)
        except ClusterError as e:  # an expected state (stopped, lost ranks): no traceback
            raise UsageError(str(e)) from None

    def _subcommand_names(self) -> list[str]:
        """What ``%mpi NAME`` takes: the ``_sub_NAME`` methods, as typed (``torch-reinit``)."""
        return [n[5:].replace("_", "-") for n in dir(self) if n.startswith("_sub_")]

    def _sub_help(self, rest: str) -> None:
        """%mpi help [subcommand]: the subcommands, or one's usage and options."""
        print(help_text(rest, self._subcommand_names()), end="")

    def _sub_sync(self, rest: str) -> None:
        """%mpi sync [PATH ...]: see ``sync_args``; the work is clusterkernel.client.sync's."""
        paths = parse(sync_args, rest).paths or None
        try:
            print(sync(self._require_cluster(), paths).summary())
        except SyncError as e:
            raise UsageError(str(e)) from None

    # ---------------------------------------------------------------- cell
    def _run_cell(self, line: str, cell: str):
        args = parse(cell_args, line)
        cluster = self._require_cluster()
        ranks = ranks_arg(args.ranks)
        if ranks is not None:
            bad = [r for r in ranks if r not in cluster.ranks]
            if bad:
                raise UsageError(f"No rank {bad}; ranks are 0..{cluster.n - 1}.")
        try:
            result = cluster.run(
                cell,
                ranks=ranks,
                timeout=args.timeout,
                block=not args.noblock,
                dashboard=args.dashboard,
                profile=args.profile,
            )
        except ClusterError as e:
            raise UsageError(str(e)) from None
        return result if args.noblock else None


# subcommands that take nothing after their name: a word there is a mistake, not ignored
_NO_ARGUMENTS = frozenset({"stop", "detach", "restart", "status", "on", "off", "dashboard"})

MPIMagics.mpi.__doc__ = mpi_help()
