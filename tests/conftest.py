"""Shared fixtures: one real 4-rank MPI cluster per test session, process counting,
the two-node Slurm test bed; the ``cluster`` and ``slow`` markers (``tests/_markers.py``),
and the check that a test which starts ranks, a kernel or a cluster carries ``cluster``
(``tests/_spawn_check.py``).

Only one cluster runs at a time on these 2-core machines: tests that start their own
(in a notebook kernel, say) take ``no_shared_cluster``, which stops the shared one;
the next test that needs it starts it again.
"""

from __future__ import annotations

import os
import signal

import pytest

from clusterkernel import Cluster
from tests import _shm_leaks, _spawn_check
from tests._markers import markers_for
from tests._procs import wait_no_cluster_processes
from tests.sge._testbed import PACKAGES as SGE_PACKAGES
from tests.sge._testbed import SgeTestbed
from tests.sge._testbed import missing as sge_missing
from tests.slurm._testbed import SlurmTestbed, missing_programs


def pytest_configure(config):
    # a test that starts ranks, a kernel or a cluster without the `cluster` marker fails
    if not config.pluginmanager.is_registered(_spawn_check):
        config.pluginmanager.register(_spawn_check, "clusterkernel-spawn-check")
    if not config.pluginmanager.is_registered(_shm_leaks):
        config.pluginmanager.register(_shm_leaks, "clusterkernel-shm-leaks")
    # A runner that starts the suite as a background job of a non-interactive shell
    # (job control off: CI runners, `cmd &` in a script) hands it SIGINT ignored, and
    # Python then leaves it ignored. The suite stands in for a kernel interrupt with
    # SIGINT in this process; a Jupyter kernel has Python's handler while a cell runs
    # (ipykernel installs it), so the tests get the same.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Mark each test ``cluster`` and ``slow`` as ``tests/_markers.py`` says, and run the
    modules that use the shared cluster first (see :func:`shared_cluster_first`)."""
    for item in items:
        module = getattr(item, "module", None)
        module_names = vars(module) if module is not None else ()
        for name in sorted(markers_for(item.nodeid, item.fixturenames, module_names)):
            item.add_marker(name)
    items[:] = shared_cluster_first(items)


def shared_cluster_first(items: list) -> list:
    """``items`` with the modules whose tests use the shared cluster first, those that
    also stop it (a test of their own takes ``no_shared_cluster``) last among them.

    The shared 4-rank cluster starts on first use and is stopped by every test that
    needs the machine to itself; in file order the two kinds alternate, and the suite
    paid a start and a stop (~10 s) at each of about ten changes. Whole modules move,
    each keeping its own order, so module-scoped fixtures are set up once as before.
    """
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def kind(tests: list) -> int:
        uses = any("cluster" in t.fixturenames for t in tests)
        stops = any("_shared_holder" in t.fixturenames and "cluster" not in t.fixturenames
                    for t in tests)  # fmt: skip
        return 0 if uses and not stops else 1 if uses else 2

    ordered = sorted(modules.values(), key=kind)  # stable: file order within each kind
    # the modules that share the fault-tolerant cluster (``ft``, tests/cluster/conftest.py)
    # run one after another where the first of them runs: it starts once for them all
    ft = [tests for tests in ordered if any("ft" in t.fixturenames for t in tests)]
    if ft:
        at = next(i for i, tests in enumerate(ordered) if tests is ft[0])
        rest = [tests for tests in ordered if all(tests is not f for f in ft)]
        ordered = rest[:at] + ft + rest[at:]
    return [item for tests in ordered for item in tests]


class _Shared:
    cluster: Cluster | None = None


@pytest.fixture(scope="session")
def _shared_holder():
    holder = _Shared()
    yield holder
    if holder.cluster is not None:
        holder.cluster.stop()
        holder.cluster = None


@pytest.fixture
def cluster(_shared_holder) -> Cluster:
    """The session's 4-rank cluster, started on first use, restarted if a test lost it."""
    c = _shared_holder.cluster
    if c is not None and c.fault_tolerant:  # the respawn modules' (``ft``) holds the place
        c.stop()
        c = _shared_holder.cluster = None
    if c is None or not c.running:
        c = _shared_holder.cluster = Cluster(n=4).start()
    elif c.lost:
        c.restart()
    return c


@pytest.fixture
def no_shared_cluster(_shared_holder):
    """Stop the shared cluster so a test can start its own (one cluster at a time)."""
    if _shared_holder.cluster is not None:
        _shared_holder.cluster.stop()
        _shared_holder.cluster = None
    # only this session's processes count: a cluster of a notebook open on the same
    # machine is not ours to wait for (see tests/_procs.py)
    left = wait_no_cluster_processes(20)
    assert not left, f"cluster processes this test session started still run: {left}"


def _testbed(name: str, needs_root_for: str, missing: list[str], packages: str, make, logs=None):
    """A scheduler's test bed for the whole test session: skipped, saying why, where the
    machine cannot host it (not root, the scheduler's packages missing; CI installs them
    with the README's test command and runs them all); started, its environment in
    ``os.environ`` while it runs (clusters and notebook kernels the tests start inherit
    it, as a login node's); stopped at the end, the environment as it was."""
    if os.geteuid() != 0:
        pytest.skip(f"the {name} test bed needs root ({needs_root_for})")
    if missing:
        pytest.skip(
            f"the {name} test bed needs {', '.join(missing)}: apt-get install {packages} "
            "(the README's test command does)"
        )
    bed = make()
    saved = dict(os.environ)
    try:
        try:
            bed.start()
        except Exception as e:
            said = f"\n{logs(bed)}" if logs else ""
            pytest.fail(f"the {name} test bed did not start: {e}{said}")
        os.environ.update(bed.env)
        yield bed
    finally:
        os.environ.clear()
        os.environ.update(saved)
        bed.stop()


def _slurm_logs(bed) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text()[-2000:]}" for p in (bed.base / "log").glob("*.log")
    )


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call" and outcome.get_result().failed:
        item.stash[_FAILED] = True


@pytest.fixture(autouse=True)
def _slurm_bed_cleared(request):
    """After a failed test on the Slurm bed, the jobs and processes it left are ended:
    one failure stays one (a job left would fail every later test's "nothing left")."""
    yield
    if "slurm_testbed" in request.fixturenames and request.node.stash.get(_FAILED, False):
        request.getfixturevalue("slurm_testbed").clear()


@pytest.fixture(scope="session")
def slurm_testbed():
    """The two-node Slurm test bed (``tests/slurm/_testbed.py``), once per test session.

    Defined here, not in tests/slurm, so that tests elsewhere (notebook 08) share the
    one instance.
    """
    yield from _testbed(
        "Slurm",
        "daemons, network namespaces",
        missing_programs(),
        "slurmctld slurmd slurm-client munge libpmix-dev",
        SlurmTestbed,
        _slurm_logs,
    )


@pytest.fixture(scope="session")
def sge_testbed():
    """The one-machine Grid Engine test bed (``tests/sge/_testbed.py``), once per session.

    The daemons it started are stopped at the end; ones that ran before are left running.
    """
    yield from _testbed(
        "Grid Engine", "its daemons, jobs as root", sge_missing(), SGE_PACKAGES, SgeTestbed
    )
