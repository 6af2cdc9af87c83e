"""What each rank is doing, for ``%mpi status`` (client side).

Example::

    reader = RankStatus()
    reader.rows(client, rank_info, multi_node=False)
    # [{"rank": 0, "host": "node1", "pid": 4242, "state": "idle", "cpu": 0.0, ...}, ...]
"""

from __future__ import annotations

from typing import Any

import psutil

from clusterkernel.client.cluster import _torch


class RankStatus:
    """Reads rank rows; keeps each rank's process between calls for its CPU %.

    ``cpu_percent()`` measures since the previous call on the same object (a fresh
    one always says 0), hence the cache.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def status(self, cluster: Any) -> list[dict]:
        """One dict per rank: rank, host, pid, state, cpu %, memory (MiB), and ``gpu``
        (name, memory, utilisation) where the ranks are bound to GPUs.

        CPU and memory are read for ranks on this machine; on other hosts they are None.
        """
        cluster.require_running()
        rows = self.rows(cluster.client, cluster.rank_info, cluster.multi_node)
        if cluster.gpus:  # name, memory, utilisation of each rank's GPU
            gpu = _torch.gpu_status(cluster)
            for row in rows:
                row["gpu"] = gpu.get(row["rank"])
        return rows

    def rows(self, client, rank_info: dict[int, dict], multi_node: bool) -> list[dict]:
        """One dict per rank (rank, host, pid, state, cpu, memory_mib), in rank order."""
        queue = client.queue_status(verbose=True)
        busy = busy_engines(queue, client.session.session + "_", client.outstanding)
        rows = []
        for rank in sorted(rank_info):
            info = rank_info[rank]
            eid = info["engine"]
            state = "dead" if queue.get(eid) is None else ("busy" if eid in busy else "idle")
            cpu = mem = None
            try:
                proc = self._procs.get(info["pid"]) or psutil.Process(info["pid"])
                self._procs[info["pid"]] = proc
                with proc.oneshot():
                    mem = proc.memory_info().rss / 2**20
                    cpu = proc.cpu_percent(interval=None)
            except psutil.Error:
                if not multi_node:  # on another host the pid is not ours to see
                    state = "dead"
            rows.append(
                {
                    "rank": rank,
                    "host": info["host"],
                    "pid": info["pid"],
                    "state": state,
                    "cpu": cpu,
                    "memory_mib": mem,
                }
            )
        return rows


def unfinished(msg_ids, ours: str, outstanding: set[str]) -> list[str]:
    """The requests of ``msg_ids`` (from a verbose queue status) still running or queued.

    The controller books a task as done some time after its reply has reached
    the client (seconds, on a loaded machine), so for this client's own tasks
    (message ids starting with its session id, ``ours``) the client's own
    ``outstanding`` set decides; tasks of other clients count as the
    controller says.
    """
    return [m for m in msg_ids if m in outstanding or not m.startswith(ours)]


def busy_engines(queue: dict, ours: str, outstanding: set[str]) -> set[int]:
    """Engines with a task still running or queued (:func:`unfinished`), from a verbose
    queue status."""
    return {
        eid
        for eid, q in queue.items()
        if isinstance(q, dict)
        and unfinished((*q.get("queue", ()), *q.get("tasks", ())), ours, outstanding)
    }
