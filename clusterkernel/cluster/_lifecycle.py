"""Start, restart and stop a cluster's processes: the bodies of ``Cluster.start``,
``restart`` and ``stop`` (client side).

ipyparallel starts the controller and the engines through the cluster's launcher;
here they are waited for until every MPI rank answered (fast, clear errors when the
job fails to start), mapped rank -> engine, guarded against a dying notebook, and
stopped until no process of theirs is left.

Example::

    _lifecycle.start(cluster)       # what Cluster.start() does
    _lifecycle.teardown(cluster)    # what Cluster.stop() does
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import ipyparallel as ipp
import psutil

from clusterkernel.cluster._launch import (
    Guard,
    make_run_dir,
    private_cluster_file,
    remove_run_dir,
    wait_for_engines,
)
from clusterkernel.engine import _engine_setup
from clusterkernel.errors import ClusterError

if TYPE_CHECKING:
    from clusterkernel.cluster import Cluster


def _ipp_log(level: int) -> logging.Logger:
    """ipyparallel's logger for our clusters, kept out of the notebook.

    In a kernel ipyparallel logs to the cell's stdout, so ``%mpi stop`` would print
    every engine's start-up log and "exit_code 1" (mpiexec's normal exit when its
    ranks are stopped). What matters (failed starts, dead ranks) this module reports
    itself; the log is still there for ``logging`` configured by the user.
    """
    log = logging.getLogger("clusterkernel.ipyparallel")
    log.setLevel(level)
    if not log.handlers:  # no "last resort" printing to stderr either
        log.addHandler(logging.NullHandler())
    return log


def _live_line(text: str | None) -> None:
    """A status line rewritten in place (terminal and notebook both honour ``\\r``)."""
    if text is None:
        print(flush=True)
    else:
        print(f"\r{text}   ", end="", flush=True)


def start(cluster: Cluster) -> None:
    """Start the controller and the ranks of a stopped ``cluster`` (see ``Cluster.start``)."""
    if cluster.running:
        raise ClusterError(
            "This cluster is already running. Use restart() (%mpi restart) or stop() first."
        )
    cluster.lost = None
    kwargs: dict[str, Any] = {}
    ip = cluster.launcher.controller_ip()  # may ask Slurm: before anything is made
    if ip:
        kwargs["controller_ip"] = ip
    cluster._run_dir = make_run_dir()
    try:
        cluster._ipp = ipp.Cluster(
            engines=cluster.launcher.engines(),
            n=cluster.n,
            profile_dir=cluster._run_dir,
            config=cluster.launcher.config(_engine_env(cluster), cluster._run_dir),
            log_level=cluster.log_level,
            log=_ipp_log(cluster.log_level),
            **kwargs,
        )
        cluster._ipp.start_controller_sync()
        cluster._client = cluster._ipp.connect_client_sync()
        private_cluster_file(cluster._ipp)
        if cluster.guard:
            cluster._guard = Guard(cluster._ipp.cluster_file, cluster._run_dir)
        cluster._ipp.start_engines_sync(cluster.n)
        cluster._ipp.update_cluster_file()  # now with the job id, for the guard
        _wait_for_new_engines(cluster, old_pids=set())
    except BaseException:
        teardown(cluster)
        raise


def _engine_env(cluster: Cluster) -> dict[str, str]:
    env = dict(cluster.env)
    # Figures made on a rank are sent to the notebook when shown.
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return env


def restart(cluster: Cluster) -> None:
    """Replace every rank of a running ``cluster`` by a new one (see ``Cluster.restart``)."""
    if not cluster.running:
        raise ClusterError("The cluster is not running; use start() (%mpi start).")
    assert cluster._ipp is not None
    old_pids = {info["pid"] for info in cluster._rank_info.values()}
    engine_set = cluster._engine_set()
    cluster._ipp.stop_engines_sync()
    cluster.launcher.stopped(engine_set, timeout=30)
    cluster._ipp.start_engines_sync(cluster.n)
    cluster._ipp.update_cluster_file()
    _wait_for_new_engines(cluster, old_pids)
    cluster.lost = None
    cluster.dead = {}


def _wait_for_new_engines(cluster: Cluster, old_pids: set[int]) -> None:
    assert cluster._client is not None
    infos = wait_for_engines(
        cluster._client,
        cluster.n,
        old_pids=old_pids,
        timeout=cluster.start_timeout,
        query=lambda ids: _query_setup(cluster, ids),
        ended=lambda: cluster.launcher.ended(cluster._engine_set()),
        output=cluster._engine_output,
        waiting=lambda: cluster.launcher.waiting(cluster._engine_set()),
        progress=_live_line,
    )
    ranks = sorted(info["rank"] for info in infos.values())
    if ranks != list(range(cluster.n)):
        raise ClusterError(
            f"Expected MPI ranks 0..{cluster.n - 1}, engines reported {ranks}: the engines "
            "did not form one MPI job (for Slurm, srun's --mpi=pmix must work)."
        )
    cluster._rank_info = {info["rank"]: {**info, "engine": eid} for eid, info in infos.items()}
    cluster._engine_of = {r: info["engine"] for r, info in cluster._rank_info.items()}


def _query_setup(cluster: Cluster, ids: list[int]) -> dict[int, dict] | None:
    assert cluster._client is not None
    try:
        ar = cluster._client[ids].apply_async(_engine_setup.setup, cluster._run_dir)
        results = ar.get(timeout=10)
    except (ipp.error.EngineError, ipp.error.TimeoutError, ipp.error.CompositeError):
        return None
    return dict(zip(ids, results))


def teardown(cluster: Cluster) -> None:
    """Stop every process of ``cluster`` and return once they are gone; forget its ranks."""
    guard = cluster._guard.pid if cluster._guard is not None else None
    procs = [p for p in map(_process, processes(cluster)) if p is not None and p.pid != guard]
    engine_set = cluster._engine_set()
    if cluster._client is not None:
        try:
            cluster._client.close()
        except Exception:  # the controller may already be gone
            pass
        cluster._client = None
    if cluster._ipp is not None:
        try:
            cluster._ipp.stop_cluster_sync()
            cluster.launcher.stopped(engine_set, timeout=30)
        finally:
            cluster._ipp = None
    # ipyparallel returns before the engines' nannies have exited
    psutil.wait_procs(procs, timeout=10)
    if cluster._guard is not None:
        cluster._guard.release()
        cluster._guard = None
    remove_run_dir(cluster._run_dir)
    cluster._run_dir = None
    cluster._rank_info = {}
    cluster._engine_of = {}
    cluster.dead = {}


def processes(cluster: Cluster) -> list[int]:
    """Pids of every local process of ``cluster`` (controller, mpiexec, ranks, guard)."""
    pids: set[int] = set()
    if cluster._ipp is None:
        return []
    launchers = [cluster._ipp.controller, *cluster._ipp.engines.values()]
    for launcher in launchers:
        pid = getattr(launcher, "pid", None) if launcher is not None else None
        if not pid:
            continue
        try:
            proc = psutil.Process(pid)
            pids.add(pid)
            pids.update(c.pid for c in proc.children(recursive=True))
        except psutil.Error:
            pass
    if cluster._guard is not None:
        pids.add(cluster._guard.pid)
    return sorted(pids)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
