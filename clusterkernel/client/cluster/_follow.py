"""Follow a cell that another session sent, from a session that attached later (client side).

A kept cluster can be attached while its ranks still run a cell the previous session
sent (``Cluster.attach``). That cell's replies and live output travel to the client
that sent it; what any client can read is the controller's record of every request:
ipyparallel's hub stores each request's stdout and stderr as the engine writes them
(``Client.db_query``) and says which requests an engine still has queued
(``Client.queue_status``). :func:`running` finds the cell; :func:`stream` polls its
record and shows each rank's output through the usual renderer until it ends;
:func:`follow` is ``Cluster.follow``, both.

Example::

    cells = running(cluster)          # {rank: msg_id} of the cell still running
    stream(cluster, cells)            # its output, by rank, until it ends
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from clusterkernel.client.cluster._status import unfinished
from clusterkernel.client.output import RankOutput, Renderer, default_renderer

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster

POLL = 0.25  # seconds between looks at the controller's record


def busy_ranks(cluster: Cluster) -> list[int]:
    """The ranks still running a cell sent before (by a session that detached or was
    taken over): what :meth:`Cluster.follow <clusterkernel.Cluster.follow>` shows.

    Example::

        from clusterkernel.client.cluster import busy_ranks
        busy_ranks(cluster)     # []
    """
    return sorted(running(cluster))


def running(cluster: Cluster) -> dict[int, str]:
    """``{rank: msg_id}`` of the request each rank has been sent and not finished."""
    client = cluster.client
    status = client.queue_status(verbose=True)
    ours = client.session.session + "_"
    out = {}
    for rank, engine in cluster.engine_of.items():
        queue = unfinished((status.get(engine) or {}).get("queue") or [], ours, client.outstanding)
        if queue:
            out[rank] = queue[0]  # the oldest: the one running now
    return out


def follow(cluster: Cluster) -> list[int]:
    """Show, by rank and live, the output of a cell that a previous session sent and
    the ranks still run (after :meth:`attach`), until it ends; the ranks that ran it
    (``[]``: none did). A kernel interrupt interrupts that cell on the ranks.

    Example::

        # not run: needs a cluster another process started with keep=, busy in a cell
        cluster = Cluster.attach()
        cluster.follow()      # the training loop's prints, as they come, until it ends
    """
    cluster.require_running()
    cells = running(cluster)
    if cells:
        stream(cluster, cells)
    return sorted(cells)


def stream(cluster: Cluster, cells: dict[int, str], renderer: Renderer | None = None) -> None:
    """Show the output of ``cells`` (from :func:`running`) by rank until they have ended.

    A kernel interrupt interrupts them on the ranks, as it would the session's own cell.
    """
    ranks = sorted(cells)
    renderer = renderer if renderer is not None else default_renderer(ranks)
    ids = [cells[r] for r in ranks]
    rank_of = {msg_id: rank for rank, msg_id in cells.items()}
    interrupted = False
    try:
        while True:
            try:
                records = cluster.client.db_query(
                    {"msg_id": {"$in": ids}}, keys=["msg_id", "stdout", "stderr", "completed"]
                )
                for record in records:
                    out = RankOutput(
                        stdout=record.get("stdout") or "", stderr=record.get("stderr") or ""
                    )
                    renderer.update(rank_of[record["msg_id"]], out)
                if len(records) == len(ids) and all(r.get("completed") for r in records):
                    return
                if cluster.job_ended():
                    renderer.notice("The MPI job ended while the cell ran (%mpi status).")
                    return
                time.sleep(POLL)
            except KeyboardInterrupt:
                if interrupted:
                    raise
                interrupted = True
                cluster.interrupt(ranks)
    finally:
        renderer.finish()
