"""Where each rank's time went in a cell, and what the slowest rank does more (client side).

``%%mpi --profile`` (``cluster.run(code, profile=True)``) starts a sampler on every
rank just before the cell (``clusterkernel.rank._profile``, called by name) and
collects it when the cell has ended, raised, or been interrupted; a
:class:`Profile` is then shown under the cell and kept as ``cluster.profile_result``.

Time is counted at **your line**: each sample goes to the innermost frame of the
stack that is not in a library (the standard library, site-packages,
clusterkernel), so the seconds a rank spent inside ``torch`` or ``time.sleep`` land
on the line that called them; the ``in`` column names the library function where
the time went. The **slowest rank** is the one with the most busy time (its
profiled seconds less its time inside collectives of ``clusterkernel.comm`` and
``torch.distributed``, where a fast rank waits for a slow one); the **median rank**
is the lower median of busy time. Their difference names the lines where the
slowest rank spends more.

Under the cell: the difference view, each rank's top lines (and its seconds in comm
calls, split into moving data and waiting for other ranks), and a flame graph
(icicle) per rank, plain SVG that needs no network. ``%mpi profile start|stop``
(``cluster.profile("start"|"stop")``) profiles every cell in between;
``profile.save("x.speedscope.json")`` / ``profile.save("x.trace.json")`` export it.

**While it runs**: the dashboard's profile panel shows each rank's top lines over the
last 10 s and the straggler's difference, and ``every=`` (``%mpi profile start --every
60s``) keeps a :class:`Snapshot` of each window, for a cell that runs for hours:
:func:`snapshots` (``profile.snapshots`` at stop), each exported like a profile
(``_live`` says how they travel).

Example::

    run = cluster.run(code, profile=True)
    p = cluster.profile_result
    p.top(0)[0]            # ProfileEntry(file=..., line=12, function='hot', seconds=1.9, ...)
    cluster.profile("start", every="60s")    # then snapshots(cluster)[-1].save("m.json")
    p.difference()[0]      # the line the slowest rank spends the most extra time on
    print(p)               # the tables as text
"""

from clusterkernel.client.profile._collect import CellProfile, ProfileError, control, running
from clusterkernel.client.profile._collectives import CollectiveTime
from clusterkernel.client.profile._live import (
    LiveProfile,
    Snapshot,
    Snapshots,
    current,
    parse_every,
    snapshots,
)
from clusterkernel.client.profile._model import CELL, DifferenceEntry, Profile, ProfileEntry

__all__ = [
    "CELL",
    "CellProfile",
    "CollectiveTime",
    "DifferenceEntry",
    "LiveProfile",
    "Profile",
    "ProfileEntry",
    "ProfileError",
    "Snapshot",
    "Snapshots",
    "control",
    "current",
    "parse_every",
    "running",
    "snapshots",
]
