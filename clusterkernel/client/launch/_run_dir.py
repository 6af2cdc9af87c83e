"""A cluster's private run directory: made, its cluster file kept private, removed (client side).

Example::

    path = make_run_dir()      # ~/.clusterkernel/clusters/cluster-482913, mode 0700
    remove_run_dir(path)
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile

import ipyparallel as ipp

# Where clusters keep their files: the user's home, which compute nodes of a
# cluster usually share (engines there read their connection file), and never the
# default IPython profile, whose clusters Jupyter's ipyparallel extension adopts.
RUN_ROOT_ENV = "CLUSTERKERNEL_RUN_DIR"


def make_run_dir() -> str:
    """A new directory for one cluster's files, readable by the user alone.

    Named ``cluster-<6 digits>``: the digits are the id a kept cluster is attached by
    (``%mpi attach 482913``), short enough to type."""
    root = os.environ.get(RUN_ROOT_ENV) or os.path.join(
        os.path.expanduser("~"), ".clusterkernel", "clusters"
    )
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        while True:  # mkdir is atomic: a name another start took is simply tried again
            path = os.path.join(root, f"cluster-{secrets.randbelow(900_000) + 100_000}")
            try:
                os.mkdir(path, 0o700)
                break
            except FileExistsError:
                continue
    except OSError:  # a read-only home: the machine's temp directory
        path = tempfile.mkdtemp(prefix="clusterkernel-")
    os.chmod(path, 0o700)
    return path


def remove_run_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def private_cluster_file(ipp_cluster: ipp.Cluster) -> None:
    """Write the cluster file now, readable by the user alone.

    ipyparallel writes it with the umask's mode; it names every process and the
    connection files (rewrites keep the mode).
    """
    ipp_cluster.update_cluster_file()
    os.chmod(ipp_cluster.cluster_file, 0o600)
