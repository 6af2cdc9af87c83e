"""A rank's death as the user reads it: told once, the survivors' errors it caused folded
(client side).

When a rank of a fault-tolerant job dies in a cell, every survivor that was in (or
entered) a collective with it fails too: ``comm.PeerDiedError``, or where a path raises
MPI's own error, ``MPI_ERR_PROC_FAILED`` (``MPI_ERR_OTHER`` from a call made after it),
or gloo's closed connection once its torch.distributed group was aborted. Each of those
tracebacks runs through autograd, the reducer and comm and says nothing the death does
not: :func:`fold` turns them into one line per group of ranks, ``all_reduce failed:
rank 2 died``.

Example::

    fold([(0, "error", "PeerDiedError: all_reduce failed: rank 2 died", tb)], [2])
    # [(0, "", "all_reduce failed: rank 2 died", "")]
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from clusterkernel.client.cluster import _rank_faults
from clusterkernel.client.errors import RankError, format_ranks, group_failures

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster

# what a survivor's error says when a peer's death caused it
_MARKS = (
    "MPI_ERR_PROC_FAILED",
    "MPI_ERR_REVOKED",
    "known error not in list",  # MPI_ERR_OTHER: a call made after the failure
    "Connection closed by peer",  # gloo, its group aborted or the peer gone
    "Connection reset by peer",
    "Broken pipe",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# the calls a traceback may show the survivor in (comm's names, torch.distributed's)
_OP = re.compile(
    r"\bin (all_reduce(?:_coalesced)?|allreduce|broadcast(?:_object)?|barrier|all_gather"
    r"(?:_into_tensor|_object)?|reduce_scatter(?:_tensor)?|all_to_all(?:_single)?|reduce"
    r"|gather(?:_object)?|scatter|send|recv|isend|irecv)\b"
)
_PEER_DIED = re.compile(r"^(\S+) failed: ")


def caused_by_death(summary: str, detail: str) -> str | None:
    """The call a survivor's error failed in, if a peer's death caused it (``""``: some
    collective); None for any other error. ``summary``: ``"Name: message"``."""
    text = _ANSI.sub("", f"{summary}\n{detail}")
    if summary.startswith("PeerDiedError: "):
        m = _PEER_DIED.match(summary.removeprefix("PeerDiedError: "))
        return m.group(1) if m and m.group(1) != "a" else _op(text)
    if not any(mark in text for mark in _MARKS):
        return None
    return _op(text)


def _op(text: str) -> str:
    m = _OP.search(text)  # the outermost: the call the user's code made
    return m.group(1).replace("allreduce", "all_reduce") if m else ""


def fold(
    items: list[tuple[int, str, str, str]], dead: list[int]
) -> list[tuple[int, str, str, str]]:
    """``(rank, kind, summary, detail)`` items with the errors ``dead``'s death caused made
    one short line each (grouped later by rank); the rest as they were."""
    if not dead:
        return items
    who = f"rank {format_ranks(dead)} died"
    out = []
    for rank, kind, summary, detail in items:
        op = caused_by_death(summary, detail) if kind == "error" and rank not in dead else None
        if op is None:
            out.append((rank, kind, summary, detail))
        else:
            out.append((rank, "", f"{op or 'a collective'} failed: {who}", ""))
    return out


def report(
    cluster: Cluster, faults: Any, items: list, gone: list[int], died: list[int]
) -> RankError:
    """A fault-tolerant job's ranks died in a cell (``gone``: no reply; ``died``: seen dead
    while it ran): each told once with how it died, then the survivors' errors that
    death caused (:func:`fold`), and what brings the ranks back (with auto-respawn the
    cluster does it after the cell and says so). ``faults``: the run's ``CellFaults``."""
    new = [r for r in gone if r not in cluster.dead]
    for rank, why in _rank_faults.death_causes(cluster, new).items():
        faults.ranks_died([rank], why)
    died = sorted({*died, *gone})
    causes = cluster.dead
    deaths = [(r, "died", causes.get(r, "its process exited"), "") for r in died]
    note = ""
    if not cluster.auto_respawn:
        live = cluster.live_ranks
        note = (
            f"The fault-tolerant job carries on: later cells run on ranks "
            f"{format_ranks(live)}; %mpi respawn --from {live[0]} "
            f"(cluster.respawn(source={live[0]})) brings rank {format_ranks(died)} back "
            f"with rank {live[0]}'s variables; %mpi restart starts a full set."
        )
    # the deaths first, then what they caused
    return RankError(group_failures(deaths) + group_failures(fold(items, died)), note=note)
