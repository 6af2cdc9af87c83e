"""Live dashboard of an MPI job in the notebook (client side).

Model and views are apart: :class:`MetricsStore` holds every record the ranks
streamed (filled by :class:`Receiver` from its own thread); the panels in
``_views`` (ipywidgets and canvas plots, ``_plot``) draw from it; :class:`Dashboard` ties them to a
cluster and redraws from a thread of its own, so it stays live while ``%%mpi``
blocks the notebook. Exports write CSV, JSON, a Chrome trace and a PNG.

Example (two notebook cells, once ``%mpi start -n 4`` has started the ranks)::

    %load_ext clusterkernel
    # or, in Python: dash = clusterkernel.Dashboard(); dash
    %mpi dashboard

    %%mpi --dashboard
    import clusterkernel
    for step in range(200):
        clusterkernel.log(step=step, loss=1 / (step + 1))
"""

from __future__ import annotations

from clusterkernel.client.dashboard._dashboard import Dashboard
from clusterkernel.client.dashboard._export import (
    chrome_trace,
    export,
    to_chrome_trace,
    to_csv,
    to_json,
    to_png,
)
from clusterkernel.client.dashboard._receiver import Receiver
from clusterkernel.client.dashboard._store import MetricsStore
from clusterkernel.client.dashboard._terminal import TerminalProgress, summary
from clusterkernel.client.dashboard._thin import thin

__all__ = [
    "Dashboard",
    "MetricsStore",
    "Receiver",
    "TerminalProgress",
    "chrome_trace",
    "export",
    "summary",
    "thin",
    "to_chrome_trace",
    "to_csv",
    "to_json",
    "to_png",
]
