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
    # the terminal summary printed after the dashboard=True cell: that cell's run (the
    # cell before it is a run of its own), step 2 of each rank
    out = capsys.readouterr().out
    for rank in (0, 1):
        assert f"{rank:>4} {1:>7} {'0.3333':>11} {'0.3333':>10} {'-':>10}" in out, out


def test_each_execution_of_a_cell_is_a_run_of_its_own_on_every_rank(cluster):
    """The same cell twice, a cell on rank 0 alone between them: three runs, and the
    second execution's run holds every rank (the ranks' cells are matched by the
    label each %%mpi cell carries, not by each engine's own execution count)."""
    quiet = TerminalRenderer(cluster.ranks, stream=io.StringIO())
    dash = cluster.dashboard()
    try:
        dash.sync()
        dash.clear()  # what earlier tests logged on these ranks
        cell = "import clusterkernel\nfor i in range(20):\n    clusterkernel.log(step=i, loss=1 / (i + 1))"
        cluster.run(cell, renderer=quiet)
        cluster.run("clusterkernel.log(step=0, loss=5.0)", ranks=[0], renderer=quiet)
        cluster.run(cell, renderer=quiet)
        dash.sync()
        # the last three: a record of an earlier test's cell may still reach the store
        # after the clear (a busy CI machine), as a run of its own before these
        every = dash.store.runs()
        runs = [(r["ranks"], r["cell"]) for r in every][-3:]
        assert [ranks for ranks, _ in runs] == [cluster.ranks, [0], cluster.ranks], every
        assert len({cell for _, cell in runs}) == 3, runs  # three executions, three runs
        series = dash.store.series("loss")  # the newest run's: one line per rank, 20 steps
        assert sorted(series) == cluster.ranks
        assert all(x.tolist() == list(range(20)) for x, _ in series.values())
    finally:
        dash.close()
