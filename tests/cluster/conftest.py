"""Fixtures of the cluster tests that more than one module uses."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clusterkernel import Cluster
from tests._netns import NoSecondHost, second_host
from tests._procs import wait_no_cluster_processes


@pytest.fixture(scope="module")
def netns_host():
    """A second "machine": a network namespace at .2 of a free subnet (tests/_netns.py)."""
    try:
        with second_host() as host:
            yield host
    except NoSecondHost as exc:
        pytest.skip(str(exc))


# What a module leaves on the ranks of the fault-tolerant cluster, taken away before the
# next module gets it (underscored names: the user's variables are the others): its
# variables and the cell results IPython caches (a model the last line showed, the frames
# of a cell's error), so an FSDP2 or DDP model no longer holds its groups; every
# torch.distributed group with them (the default group made again by the client);
# comm's groups a respawned rank kept for its copied variables; the in-cell recoveries
# not yet read (test_respawn reads them).
_AS_NEW = """
import gc as _gc, sys as _sys
from IPython import get_ipython as _get_ipython
from clusterkernel import torchdist as _torchdist
from clusterkernel.comm import _groups as _comm_groups
from clusterkernel.rank import _recovery
from clusterkernel.rank._variables import variables as _variables
for _name in _variables():
    del globals()[_name]
if _get_ipython().displayhook.do_full_cache:
    _get_ipython().displayhook.flush()
for _name in ("last_type", "last_value", "last_traceback"):
    setattr(_sys, _name, None)
_comm_groups._KEPT.clear()
_recovery.recoveries()
_gc.collect()
_torchdist.destroy()
"""

# each rank's leftovers: user variables, comm groups a respawn would make again (the node
# group is comm's own cache), torch.distributed groups (the default one alone), world size
_LEFT = """
from torch.distributed import distributed_c10d as _c10d
_left = (_variables(), [k for k in _comm_groups.group_keys() if k[0] != "node"],
         len(_c10d._world.pg_map), _torchdist.describe().get("world_size"))
del _gc, _sys, _get_ipython, _torchdist, _comm_groups, _recovery, _variables, _c10d, _name
"""


def _as_new(c: Cluster) -> None:
    """Give ``c`` to the next module as a new one would be, in its live processes."""
    c.auto_respawn = False
    if c.dead:  # the last module left a rank dead: four new processes
        c.restart()
    c.run(_AS_NEW, timeout=60)
    c.torch_reinit()
    c.run(_LEFT, timeout=60)
    assert c.pull("_left") == dict.fromkeys(range(4), ([], [], 1, 4)), "the ranks kept state"
    shutil.rmtree(Path(c.run_dir) / "snapshots", ignore_errors=True)
    c.rank_names.forget()


def _later_module_uses(request: pytest.FixtureRequest, fixture: str) -> bool:
    module = request.node.nodeid
    items = request.session.items
    last = max(i for i, item in enumerate(items) if item.nodeid.split("::")[0] == module)
    return any(fixture in item.fixturenames for item in items[last + 1 :])


@pytest.fixture(scope="module")
def ft(request, _shared_holder) -> Cluster:
    """A 4-rank fault-tolerant cluster with torch's default group, shared by the modules
    that take it (test_respawn, test_respawn_fsdp, test_respawn_groups; run one after
    another, ``shared_cluster_first`` in tests/conftest.py).

    It is the session's shared cluster while they run (``_shared_holder``: whatever
    stops that one for a cluster of its own stops it too): started by the first, given
    to each next module as new (:func:`_as_new`: every rank's variables, groups and
    snapshots gone, a new default group), stopped after the last: one start and one stop
    for the three modules.
    """
    c = _shared_holder.cluster
    if c is None or not c.fault_tolerant or not c.running or c.lost:
        if c is not None:  # one cluster at a time on a small machine
            c.stop()
            _shared_holder.cluster = None
        assert not wait_no_cluster_processes(20)
        c = Cluster(n=4, fault_tolerant=True, torch=True, env={"OMP_NUM_THREADS": "1"}).start()
        _shared_holder.cluster = c
    else:
        _as_new(c)
    yield c
    if not _later_module_uses(request, "ft") and _shared_holder.cluster is c:
        c.stop()
        _shared_holder.cluster = None
        assert not wait_no_cluster_processes(20)
