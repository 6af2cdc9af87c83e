"""The marker lists of tests/_markers.py name tests that exist, and mark what they say;
an unmarked test that starts ranks fails (tests/_spawn_check.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._markers import SLOW, STARTS_RANKS, markers_for
from tests._spawn_check import cluster_process_kind

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(STARTS_RANKS | SLOW.keys()))
def test_every_listed_test_exists(name: str):
    # a renamed test or module would otherwise silently lose its marker
    module, _, test = name.partition("::")
    path = REPO / module
    assert path.is_file(), f"tests/_markers.py names {module}, which is not there"
    if test:
        assert re.search(rf"^def {re.escape(test)}\(", path.read_text(), re.M), (
            f"tests/_markers.py names {name}: no such test in {module}"
        )


def test_markers_by_fixture_module_and_test():
    assert markers_for("tests/x.py::test_a", {"tmp_path"}, {"pytest"}) == set()
    # no_shared_cluster's closure
    assert markers_for("tests/x.py::test_a", {"no_shared_cluster", "_shared_holder"}, ()) == {
        "cluster"
    }
    assert markers_for("tests/x.py::test_a[2]", (), {"run_worker", "pytest"}) == {"cluster"}
    stream = "tests/dashboard/test_stream.py"
    assert (
        markers_for(f"{stream}::test_wire_round_trip_is_exact_for_every_record_shape", (), ())
        == set()
    )
    assert "cluster" in markers_for(sorted(STARTS_RANKS)[0], (), ())
    browser = "tests/dashboard/test_browser.py::test_lab_shows_every_rank_loss_growing_while_the_cell_runs"
    assert markers_for(browser, {"_shared_holder"}, ()) == {"cluster", "slow"}  # a whole module
    nb = "tests/notebooks/test_notebooks.py::test_notebook_executes_and_gives_the_stored_outputs"
    assert markers_for(f"{nb}[00_quickstart]", {"_shared_holder"}, ()) == {"cluster", "slow"}
    clean = "tests/notebooks/test_notebooks.py::test_notebook_is_stored_executed_and_self_contained"
    assert markers_for(f"{clean}[00_quickstart]", (), ()) == set()


def test_what_counts_as_starting_ranks_a_kernel_or_a_cluster():
    kind = cluster_process_kind
    assert kind(["/v/bin/mpiexec", "-n", "2", "python", "job.py"]) == "MPI ranks"
    assert kind(["prterun", "--np", "4", "x"]) == "MPI ranks"
    assert kind(["sbatch", "job.sbatch"]) == "MPI ranks"
    assert kind(["/v/bin/mpiexec", "--version"]) is None  # clusterkernel asks which MPI
    assert kind(["mpiexec"]) == "MPI ranks"  # not a query: it would start (or fail)
    assert kind(["/v/bin/python", "-m", "ipyparallel.engine", "--mpi"]) == "an ipyparallel cluster"
    assert kind(["/v/bin/python", "-m", "ipyparallel.controller"]) == "an ipyparallel cluster"
    assert kind(["/v/bin/ipcluster", "start"]) == "an ipyparallel cluster"
    assert kind(["python", "-m", "ipykernel_launcher", "-f", "k.json"]) == "a kernel"
    assert kind(["python", "-m", "clusterkernel.client.kernel", "-f", "k.json"]) == "a kernel"
    assert kind(["python", "-m", "ipykernel", "-f", "k.json"]) == "a kernel"
    assert kind(["python", "-m", "ipykernel_launcher", "--f=k.json"]) == "a kernel"
    # no connection file: only its argument check runs (tests/kernel/test_install.py)
    assert kind(["python", "-m", "clusterkernel.kernel", "--ranks", "0"]) is None
    for argv in (["python", "-c", "print(1)"], ["git", "status"], ["python", "-m", "pytest"], []):
        assert kind(argv) is None, argv


_UNMARKED = """
import os, subprocess, sys, textwrap

import pytest

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def test_direct():  # mpiexec from this process
    subprocess.run([MPIEXEC, "-n", "1", "true"], env=ENV, check=True)


def test_grandchild():  # a script that starts ranks: seen while they run
    code = f"import subprocess, sys; subprocess.run([{MPIEXEC!r}, '-n', '1', 'sleep', '1'])"
    subprocess.run([sys.executable, "-c", code], env=ENV, check=True)


@pytest.mark.cluster
def test_marked():
    subprocess.run([MPIEXEC, "-n", "1", "true"], env=ENV, check=True)


def test_starts_nothing_of_the_kind():
    subprocess.run([MPIEXEC, "--version"], env=ENV, check=True, capture_output=True)
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def test_an_unmarked_test_that_starts_ranks_fails_naming_the_marker(tmp_path):
    """The check itself, in a pytest of its own on real mpiexec runs."""
    (tmp_path / "test_inner.py").write_text(_UNMARKED)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    cluster: starts ranks\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests._spawn_check", "-p", "no:cacheprovider",
         "-rA", "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"),
         str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert "2 failed, 2 passed" in out, out
    for name in ("test_direct", "test_grandchild"):
        assert f"FAILED test_inner.py::{name}" in out, out
    assert "PASSED test_inner.py::test_marked" in out, out
    assert "PASSED test_inner.py::test_starts_nothing_of_the_kind" in out, out
    assert "test_direct started MPI ranks but carries no `cluster` marker" in out, out
    assert "STARTS_RANKS in tests/_markers.py" in out, out
    # the grandchild by its command line (Open MPI's mpiexec shows itself as prterun)
    assert re.search(r"MPI ranks: \S*/(mpiexec|prterun) -n 1 sleep 1", out), out
