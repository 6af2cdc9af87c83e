"""What ``%mpi list`` and ``clusterkernel list`` show: this user's kept clusters, on this
machine or (``ssh``) on a login node outside of which the notebook runs. A cluster that
ended while no one was attached is in the table once; what is left of it is then removed,
there."""

from __future__ import annotations

from clusterkernel.client.cluster import _kept_login, _kept_records
from clusterkernel.client.launch._ssh import Login, login_for


def kept_records(login: Login | None = None) -> list[dict]:
    """This user's kept clusters' records, newest first (:func:`_kept_records.kept`): on
    this machine, or (``login``) on that login node, where those that ended while no one
    was attached are removed as they are listed.

    Example::

        from clusterkernel.client.cluster import kept_records
        [r["id"] for r in kept_records() if not r["attached"]]   # say ['482913']
    """
    return _kept_login.listing(login) if login is not None else _kept_records.kept()


def kept_report(ssh: str | None = None, remote_python: str | None = None) -> str:
    """The table of this user's kept clusters (``%mpi list``, ``clusterkernel list``):
    one line per cluster: id, ranks, where, age, stops in, client. ``ssh``: those kept on
    that login node (``%mpi list --ssh HOST``; clusterkernel under ``remote_python``
    there, default this interpreter's path).

    Example::

        from clusterkernel.client.cluster import kept_report
        print(kept_report())    # a line per kept cluster: id, ranks, where, age, stops in, client
    """
    login = login_for(ssh, remote_python)
    records = kept_records(login)
    text = _kept_records.table(records)
    if login is None:  # the login node has removed its ended ones as it listed them
        for record in records:
            if record.get("ended"):
                _kept_records.remove_ended(record)
    return text


def add_arguments(parser) -> None:
    """``clusterkernel list`` takes no options (from outside: ``%mpi list --ssh HOST``)."""


def main(args) -> int:
    """``clusterkernel list``: the table ``%mpi list`` shows."""
    print(kept_report())
    return 0
