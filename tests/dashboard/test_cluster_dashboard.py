"""The dashboard belongs to its cluster: ``cluster.dashboard()``, one per cluster, on real ranks.

The ranks stream to one place, so a newer ``Dashboard(cluster)`` takes over and the
older goes quiet; ``run(..., dashboard=True)`` (``%%mpi --dashboard``) collects the
cell's records into it; stopping the cluster stops its dashboard's threads and socket.
"""

from __future__ import annotations

import io

from clusterkernel import Cluster, Dashboard
from clusterkernel.client.output import TerminalRenderer

LOG = "import clusterkernel\nclusterkernel.log(step={step}, loss=1.0 / ({step} + 1))"


def _steps(dash: Dashboard) -> list[tuple[int, int]]:
    return sorted((r["rank"], r["step"]) for r in dash.records("scalar"))


def test_one_dashboard_per_cluster_taken_over_by_a_newer_one_and_stopped_with_it(
    no_shared_cluster, capsys
):
    cluster = Cluster(n=2).start()
    try:
        quiet = TerminalRenderer(cluster.ranks, stream=io.StringIO())
        dash = cluster.dashboard()
        assert cluster.dashboard() is dash
        cluster.run(LOG.format(step=1), renderer=quiet)
        dash.sync()
        assert _steps(dash) == [(0, 1), (1, 1)]

        newer = Dashboard(cluster)  # the ranks now stream here; the older goes quiet
        assert dash.closed and not dash.receiver.running
        assert not newer.closed and cluster.dashboard() is newer

        # dashboard=True: shown (a progress line in a terminal), the cell's records
        # collected when it ends, without a sync() of our own
        cluster.run(LOG.format(step=2), renderer=quiet, dashboard=True)
        assert _steps(newer) == [(0, 1), (0, 2), (1, 1), (1, 2)]
        assert newer.error is None
        assert _steps(dash) == [(0, 1), (1, 1)]  # the quiet one got nothing more

        newer.close()
        last = cluster.dashboard()  # a closed one is replaced on the next call
        assert last is not newer and last.receiver.running
    finally:
        cluster.stop()
    assert last.closed and not last.receiver.running
    # the terminal summary printed after the dashboard=True cell: both steps of each rank
    out = capsys.readouterr().out
    for rank in (0, 1):
        assert f"{rank:>4} {2:>7} {'0.5':>11} {'0.3333':>10} {'-':>10}" in out, out
