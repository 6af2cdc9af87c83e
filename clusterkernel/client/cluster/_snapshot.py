"""Snapshots of the ranks' variables: ``Cluster.snapshot`` and ``restore`` (client side).

Each rank writes its own picklable variables to a private file in the cluster's run
directory (``clusterkernel.rank._snapshot``) and loads them back later, into the same
processes, fresh ones after a restart, or a rank respawned from its own snapshot.
Nothing travels through the notebook; the files go when the cluster stops. A name
that no rank has (``snapshot``) or no rank's snapshot holds (``restore``) fails the
call before any file is written or variable loaded: a typo must not quietly replace the
last snapshot or leave the cell to run on without the variable.

Example::

    snapshot(cluster, ["model", "opt"])   # {0: {"saved": [...], "bytes": ...}, ...}
    restore(cluster)                      # {0: {"restored": [...]}, ...}
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

import ipyparallel as ipp

from clusterkernel.client.errors import ClusterError, format_ranks, rank_label
from clusterkernel.protocol import _targets
from clusterkernel.protocol._rank_call import rank_call

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster


def _on_ranks(cluster: Cluster, ranks: list[int], what: str, *args) -> dict[int, dict]:
    ar = cluster.view(ranks).apply_async(rank_call, *args)
    try:
        return dict(zip(ranks, ar.get(timeout=600)))
    except ipp.error.CompositeError as e:
        lines: dict[str, list[int]] = {}
        for ename, evalue, _tb, info in e.elist:
            try:
                rank = cluster.rank_of((info or {}).get("engine_id"))
            except KeyError:
                rank = -1
            lines.setdefault(f"{ename}: {evalue}", []).append(rank)
        said = "; ".join(f"rank {format_ranks(rs)}: {msg}" for msg, rs in lines.items())
        raise ClusterError(f"{what} failed: {said}") from None


def _nowhere(cluster: Cluster, names: list[str], what: str, *call) -> tuple[list[str], set]:
    """``(missing, known)``: the ``names`` that no live rank's ``call`` (a rank-side
    function listing names) returns, and all those it returns."""
    found = _on_ranks(cluster, cluster.live_ranks, what, *call)
    known = set().union(*map(set, found.values()))
    return [n for n in dict.fromkeys(names) if n not in known], known


def _close(missing: list[str], known: set) -> str:
    near = [n for m in missing for n in difflib.get_close_matches(m, known, n=1)]
    return f" Did you mean {', '.join(near)}?" if near else ""


def _listed(names: set, most: int = 30) -> str:
    shown = sorted(names)
    more = f" and {len(shown) - most} more" if len(shown) > most else ""
    return ", ".join(shown[:most]) + more if shown else "nothing"


def snapshot(cluster: Cluster, names: list[str] | None = None) -> dict[int, dict]:
    """Each live rank keeps ``names`` (default: every picklable variable) in a private
    file on its node, for :meth:`restore` or ``respawn(from_snapshot=True)``; the
    files go when the cluster stops. ``{rank: {"saved", "skipped", "missing", "bytes"}}``
    (``missing``: names this rank lacks that another has). A name no rank has is a
    ``ClusterError``, and nothing is written.

    Example::

        cluster.run("step = 7")
        cluster.snapshot(["step"])[0]["saved"]     # ['step']
    """
    cluster.require_running()
    if names:
        missing, known = _nowhere(cluster, names, "Snapshot", _targets.VARIABLES)
        if missing:
            raise ClusterError(
                f"Snapshot: no rank has a variable {', '.join(missing)}; nothing was "
                f"saved (the last snapshot is kept).{_close(missing, known)}"
            )
    return _on_ranks(
        cluster, cluster.live_ranks, "Snapshot", _targets.SNAPSHOT_SAVE,
        cluster.run_dir, names,
    )  # fmt: skip


def restore(cluster: Cluster, names: list[str] | None = None) -> dict[int, dict]:
    """Every live rank loads its last :meth:`snapshot` (``names`` of it, or all) into
    its namespace, e.g. after :meth:`restart`; DataParallel models are attached to the
    ranks again, and functions defined in cells keep the ranks' ``globals()`` as theirs.
    ``{rank: {"restored", "missing"}}`` (``missing``: names of another rank's snapshot).
    A name no rank's snapshot holds is a ``ClusterError``, and nothing is loaded.

    Example::

        cluster.run("step = 7")
        cluster.snapshot(["step"])
        cluster.run("step = 0")                   # or a restart: every variable gone
        cluster.restore(["step"])[0]["restored"]  # ['step']
        cluster.pull("step")[0]                   # 7
    """
    cluster.require_running()
    if names:
        missing, known = _nowhere(
            cluster, names, "Restoring the snapshot", _targets.SNAPSHOT_HELD,
            cluster.run_dir,
        )  # fmt: skip
        if missing:
            raise ClusterError(
                f"Restore: no rank's snapshot holds {', '.join(missing)}; nothing was "
                f"restored. The snapshot holds: {_listed(known)}.{_close(missing, known)}"
            )
    return restore_on(cluster, names, cluster.live_ranks)


def restore_on(cluster: Cluster, names: list[str] | None, ranks: list[int]) -> dict[int, dict]:
    """``ranks`` load their own snapshot (``names`` of it, or all); then DataParallel
    models are attached on every rank (collective)."""
    out = _on_ranks(
        cluster, ranks, "Restoring the snapshot", _targets.SNAPSHOT_LOAD,
        cluster.run_dir, names,
    )  # fmt: skip
    _on_ranks(cluster, cluster.ranks, "Re-attaching models", _targets.REBUILD)
    return out


def summary(what: str, results: dict[int, dict]) -> str:
    """One line per distinct outcome of :meth:`Cluster.snapshot <clusterkernel.Cluster.snapshot>`
    (``what="snapshot"``) or ``restore`` (``"restore"``), ranks grouped.

    Example::

        from clusterkernel.client.cluster import snapshot_summary
        cluster.run("step = 7")
        print(snapshot_summary("snapshot", cluster.snapshot(["step"])))  # [ranks 0-3] 1 variables saved
    """
    key = "saved" if what == "snapshot" else "restored"
    lines: dict[str, list[int]] = {}
    for rank, res in results.items():
        text = f"{len(res[key])} variables {key}"
        if res.get("bytes"):
            text += f" ({res['bytes'] / 2**20:.1f} MiB)"
        if res.get("skipped"):
            text += "; not picklable: " + ", ".join(sorted(res["skipped"]))
        if res.get("missing"):
            text += "; not found: " + ", ".join(res["missing"])
        lines.setdefault(text, []).append(rank)
    return "\n".join(f"[{rank_label(rs)}] {t}" for t, rs in lines.items())
