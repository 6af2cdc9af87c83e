"""One more try for a test whose spawn onto another host Open MPI itself aborted.

Open MPI 5.0.11's runtime sometimes aborts inside itself during a spawn onto a second
host (a respawn): prterun aborts ("PMIX ERROR: ... pmix_server_dyn.c at line 1113",
then libevent's "Assertion ... failed in event_queue_insert_active"), or the other
host's prted crashes in prte_finalize (the kernel logs its segfault) and prterun
reports "lost communication with a remote daemon". Seen in 1 of 16 respawns onto the
Slurm test bed's node2. Twice, after a respawn onto a netns host, prterun itself died
of SIGSEGV (the kernel's log, 13:24:51 and 14:00:19 UTC 2026-11-29), which leaves no
report. All three are told to the user as the MPI runtime's failure
(``_rank_faults.open_mpi_failed``: the report, else the launcher's exit signal). A test
of our respawn runs once more in a fresh job then, and fails at once on anything else.

Example::

    once_more_on_open_mpi_abort(lambda: _job(testbed, holder), _respawned_by_hand)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager

from clusterkernel import Cluster
from clusterkernel.client.cluster._jobreport import job_report
from clusterkernel.client.cluster._rank_faults import open_mpi_failed


def once_more_on_open_mpi_abort(
    job: Callable[[], AbstractContextManager[Cluster]], body: Callable[[Cluster], None]
) -> None:
    """``body`` on the cluster of ``job()`` (which starts it, and stops it and checks
    that nothing is left at its end); once more in a fresh ``job()`` when it failed and
    the launcher's log or its exit signal shows one of Open MPI's own failures (a
    warning names it)."""
    for attempt in (1, 2):
        with job() as cluster:
            try:
                body(cluster)
                return
            except Exception:
                log = cluster.job_output(lines=400)
                fault = open_mpi_failed(cluster, job_report(log))
                if fault is None or attempt == 2:
                    raise
                print(f"attempt 1, the launcher's log, last lines:\n{log[-6000:]}")
                warnings.warn(f"Open MPI aborted a spawn ({fault}); once more", stacklevel=2)
