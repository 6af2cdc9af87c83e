"""The marker lists of tests/_markers.py name tests that exist, and mark what they say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._markers import SLOW, STARTS_RANKS, markers_for

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
