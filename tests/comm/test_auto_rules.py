"""How comm.tune() turns measured times into auto's rules (pure functions, one process)."""

from __future__ import annotations

from clusterkernel.comm._auto.tune import _rule, merge_rows

SIZES = (4096, 65536, 1 << 20, 1 << 24)


def test_crossovers_sit_midway_in_log_size():
    times = {"mpi": [1.0, 2.0, 9.0, 90.0], "shm": [3.0, 2.5, 5.0, 60.0], "ring": [9, 9, 9, 40.0]}
    limits, algs = _rule(SIZES, times)
    assert algs == ["mpi", "shm", "ring"]
    assert limits == [int((65536 * (1 << 20)) ** 0.5), int(((1 << 20) * (1 << 24)) ** 0.5)]


def test_a_simpler_algorithm_keeps_a_size_unless_clearly_beaten():
    # shm is 3% faster at every size: within the margin, so MPI keeps them all.
    times = {"mpi": [1.0, 2.0, 4.0, 8.0], "shm": [0.97, 1.94, 3.88, 7.76]}
    assert _rule(SIZES, times) == ([], ["mpi"])


def test_merge_replaces_rows_of_the_same_layout_only():
    old = [
        {"op": "all_reduce", "nodes": 1, "ranks": 2, "algs": ["mpi"]},
        {"op": "all_reduce", "nodes": 1, "ranks": 4, "algs": ["mpi"]},
    ]
    new = [{"op": "all_reduce", "nodes": 1, "ranks": 2, "algs": ["shm"]}]
    merged = merge_rows(old, new)
    assert [(r["ranks"], r["algs"]) for r in merged] == [(2, ["shm"]), (4, ["mpi"])]
