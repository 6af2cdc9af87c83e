"""Tab and Shift-Tab in rank cells, answered by the ranks (client side).

In a cell that runs on the ranks (a ``%%mpi`` cell, or any cell of the MPI kernel
or under ``%mpi on`` except ``%%local`` and ``%mpi`` lines) completion and
inspection are asked of one rank, rank 0 or the first of the cell's ``--ranks``,
through :meth:`Cluster.complete` / :meth:`Cluster.inspect`: the rank's own IPython
completer and inspector on its namespace, answered by its control thread even while
it runs a cell. Everything else, and every cell while no ranks run, gets the
kernel's own answer. Completion never starts ranks and never runs what is typed.

ipykernel offers no hook for its ``complete_reply`` and ``inspect_reply``, so
:func:`install` wraps this kernel's ``do_complete`` and ``do_inspect`` (the
instance's, not the class's, through :mod:`clusterkernel.protocol._ipykernel`); anything that is not a rank cell goes to ipykernel's
own method unchanged, and :func:`uninstall` puts them back.

Example::

    rank_cell(get_ipython(), "%%mpi --ranks 2\\nmodel.")   # (2, 17): rank 2, code after line 1
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from IPython.core.magic_arguments import parse_argstring

from clusterkernel.client.errors import ClusterError
from clusterkernel.client.magics._args import cell_args, ranks_arg
from clusterkernel.protocol import _ipykernel

TIMEOUT = 1.0  # seconds a rank may take before Tab answers from its last listed names


def rank_cell(shell, code: str) -> tuple[int, int] | None:
    """``(rank, offset)`` when ``code`` runs on the ranks: the rank that answers for it,
    and where the rank-side code starts in ``code``; None for a client-side cell."""
    first, newline, _ = code.partition("\n")
    words = first.split()
    if words[:1] == ["%%mpi"]:
        try:
            ranks = ranks_arg(parse_argstring(cell_args, first.strip()[len("%%mpi") :]).ranks)
        except Exception:  # a half-typed option line: the default rank answers
            ranks = None
        return (ranks[0] if ranks else 0, len(first) + len(newline))
    every_cell = any(getattr(t, "sends_to_ranks", False) for t in shell.input_transformers_cleanup)
    if every_cell and not first.lstrip().startswith(("%mpi", "%%")):
        return (0, 0)
    return None


class RankCompletion:
    """The wrapped ``do_complete`` / ``do_inspect`` of one kernel (see the module)."""

    def __init__(self, shell, cluster_of: Callable[[], Any]) -> None:
        self.shell = shell
        self.kernel = _ipykernel.kernel_of(shell)
        self.cluster_of = cluster_of  # the session's cluster now (None: none started)
        self.own_complete, self.own_inspect = _ipykernel.completion_methods(self.kernel)

    def _target(self, code: str, cursor_pos: int | None):
        cluster = self.cluster_of()
        if cluster is None or not cluster.running:
            return None
        where = rank_cell(self.shell, code)
        cursor = len(code) if cursor_pos is None else cursor_pos
        if where is None or cursor < where[1]:  # on the %%mpi line itself: its options
            return None
        rank, offset = where
        try:
            cluster.engine_id(rank)
        except ClusterError:  # --ranks names a rank that does not exist
            return None
        return cluster, rank, offset, cursor

    def complete(self, code: str, cursor_pos: int | None):
        """The kernel's ``do_complete``: a rank's answer in a rank cell, else its own."""
        target = self._target(code, cursor_pos)
        if target is None:
            return self.own_complete(code, cursor_pos)
        cluster, rank, offset, cursor = target
        reply = cluster.complete(code[offset:], cursor - offset, rank, TIMEOUT)
        reply = _shifted(reply, offset)
        if reply["metadata"]["clusterkernel"]["from"] == "cache":
            # the rank did not answer: its last listed names, and the kernel's own matches
            own = self.own_complete(code, cursor_pos)
            if own.get("cursor_start") == reply["cursor_start"]:
                reply["matches"] = sorted(set(reply["matches"]) | set(own.get("matches", [])))
        return reply

    def inspect(self, code: str, cursor_pos: int, detail_level: int = 0, omit_sections=()):
        """The kernel's ``do_inspect``: a rank's answer in a rank cell, else its own."""
        target = self._target(code, cursor_pos)
        if target is None:
            return self.own_inspect(code, cursor_pos, detail_level, omit_sections)
        cluster, rank, offset, cursor = target
        return cluster.inspect(code[offset:], cursor - offset, detail_level, rank, TIMEOUT)

    def after_cell(self, result) -> None:
        """Re-list the names of ranks that completion has asked (the reply is not waited
        for); after a cell that started (or restarted, or attached) ranks, warm rank 0's
        completer instead, so that the first Tab is answered by the rank."""
        cluster = self.cluster_of()
        if cluster is None or not cluster.running:
            return
        if 0 in cluster.rank_names:
            cluster.rank_names.refresh(cluster)
        else:
            cluster.rank_names.warm(cluster, 0)


def _shifted(reply: dict, offset: int) -> dict:
    """A rank's ``complete_reply`` for the rank-side code, as positions in the whole cell."""
    reply = dict(reply)
    reply["cursor_start"] += offset
    reply["cursor_end"] += offset
    metadata = reply["metadata"] = dict(reply.get("metadata") or {})
    types = metadata.get("_jupyter_types_experimental")
    if types:
        metadata["_jupyter_types_experimental"] = [
            {**t, "start": t["start"] + offset, "end": t["end"] + offset} for t in types
        ]
    return reply


def install(shell, cluster_of: Callable[[], Any]) -> RankCompletion | None:
    """Answer Tab and Shift-Tab in rank cells from the ranks; None outside a Jupyter kernel
    (a terminal IPython has no kernel to answer for)."""
    kernel = _ipykernel.kernel_of(shell)
    if kernel is None:
        return None
    uninstall(shell)
    wrapper = RankCompletion(shell, cluster_of)
    _ipykernel.set_completion_methods(kernel, wrapper.complete, wrapper.inspect)
    shell.events.register("post_run_cell", wrapper.after_cell)
    kernel._clusterkernel_completion = wrapper
    return wrapper


def uninstall(shell) -> None:
    """Give the kernel its own ``do_complete`` and ``do_inspect`` back."""
    kernel = _ipykernel.kernel_of(shell)
    wrapper = getattr(kernel, "_clusterkernel_completion", None)
    if wrapper is None:
        return
    _ipykernel.set_completion_methods(kernel, wrapper.own_complete, wrapper.own_inspect)
    shell.events.unregister("post_run_cell", wrapper.after_cell)
    del kernel._clusterkernel_completion
