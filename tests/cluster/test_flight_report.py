"""The hang report compares the ranks' flight recorders (real 4-rank cluster)."""

from __future__ import annotations

import io
import re
import time

import pytest

from clusterkernel import Cluster, RankError
from clusterkernel.client.cluster._stacks import is_cell, request_state
from clusterkernel.client.errors import CellInterrupted
from clusterkernel.client.output import TerminalRenderer

# A fresh group in each cell: its sequence numbers start at 0 and it has agreed on
# no signature yet, whatever earlier tests ran on these ranks.
SETUP = "import torch\nfrom clusterkernel import comm\ng = comm.new_group()\n"


def _quiet(cluster: Cluster) -> TerminalRenderer:
    return TerminalRenderer(cluster.ranks, stream=io.StringIO())


def _in_a_call(state: dict) -> bool:
    """A rank's stack request answer says it waits in a comm call its running cell made:
    its newest flight entry is not done and was made from the cell it is in now."""
    cells = [f["file"] for f in state.get("frames", []) if is_cell(f)]
    flight = state.get("flight", [])
    return bool(cells and flight) and not flight[-1]["done"] and flight[-1]["file"] == cells[-1]


def _hang(cluster: Cluster, code: str, waiting: list[int], raises=CellInterrupted):
    """Run ``code``, which leaves ranks ``waiting`` hung in a comm call and the others
    done; once it has got there, let the watchdog fire; the error it raised.

    A watchdog racing the cell is no test of the report: right after the last test's
    restart, the fresh ranks' first cell (import torch, a group's set-up) can take
    longer than 4 s on a loaded machine, and a report made before any rank reached the
    hang rightly has nothing to compare. So wait for the hang itself (the ranks' own
    answers), then let the cell time out (the watchdog counts from the cell's start: a
    1 s one fires at once when the hang took longer to reach).
    """
    run = cluster.run(code, block=False, renderer=_quiet(cluster))
    engines = {r: cluster.engine_id(r) for r in waiting}
    deadline = time.monotonic() + 120
    while True:
        state = request_state(cluster.client, engines)
        hung = [r for r in waiting if _in_a_call(state.get(r, {}))]
        if hung == waiting and run.busy_ranks() == waiting:
            break
        assert time.monotonic() < deadline, (hung, run.busy_ranks(), state)
        time.sleep(0.1)
    with pytest.raises(raises) as info:
        run.wait(timeout=1)
    return info.value


def test_skipped_collective_names_who_waits_and_who_is_behind(cluster: Cluster):
    code = SETUP + (
        "t = torch.ones(1024)\n"
        "comm.all_reduce(t, group=g)\n"
        "if comm.rank() != 2:\n"
        "    comm.all_reduce(t, group=g)\n"
    )
    note = _hang(cluster, code, waiting=[0, 1, 3]).note
    name = "group[0, 1, 2, 3]"
    assert f"ranks 0-1,3 wait in all_reduce #1 ({name}, 4 KiB float32, cell line 7)" in note, note
    assert (
        f"rank 2's last collective in {name} was #0 (all_reduce, cell line 5), and it has finished the cell"
        in note
    )
    assert "skipped a collective" not in note  # the old guess gives way to the comparison


def test_size_mismatch_after_an_agreed_call_is_named_a_mismatch(cluster: Cluster):
    # The first call agrees on 1000 floats; then rank 1 passes 10. Ranks 0,2,3 skip
    # the check (agreed signature) and wait in the allreduce, rank 1 checks its new
    # signature and waits in the check: a hang, which the report calls a mismatch.
    code = SETUP + (
        "comm.all_reduce(torch.ones(1000), group=g)\n"
        "comm.all_reduce(torch.ones(10 if comm.rank() == 1 else 1000), group=g)\n"
    )
    note = _hang(cluster, code, waiting=[0, 1, 2, 3]).note
    want = (
        "mismatch at group[0, 1, 2, 3] #1: ranks 0,2-3 called all_reduce (float32, 3.91 KiB); "
        "rank 1 called all_reduce (float32, 40 B)"
    )
    assert want in note, note


def test_first_call_size_mismatch_raises_on_every_rank(cluster: Cluster):
    # The example: silent wrong sums on some ranks before; an error now.
    code = SETUP + (
        "t = torch.ones(1000 if comm.rank() != 1 else 10)\n"
        "comm.all_reduce(t, group=g)\n"
        "print('sum', t.sum().item())\n"
    )
    pids = [row["pid"] for row in cluster.status()]
    with pytest.raises(RankError) as info:
        cluster.run(code, timeout=60, renderer=_quiet(cluster))
    failures = info.value.failures
    assert sorted(r for f in failures for r in f.ranks) == [0, 1, 2, 3]
    text = str(info.value)
    assert "CollectiveMismatchError" in text
    assert re.search(r"rank 1: all_reduce\(float32, 10 elements \(40 B\)", text), text
    assert "1000 elements" in text
    # no restart was needed: the same processes run the next cell
    out = _quiet(cluster)
    cluster.run("print('still here')", renderer=out)
    assert "[ranks 0-3] still here" in out.stream.getvalue()
    assert [row["pid"] for row in cluster.status()] == pids


def test_ranks_waiting_in_autos_first_use_setup_are_named(cluster: Cluster):
    # A fresh group's first auto call sets its rules up collectively, before any
    # data moves: ranks left waiting there show under that call's number.
    code = SETUP + ("t = torch.ones(1024)\nif comm.rank() != 2:\n    comm.all_reduce(t, group=g)\n")
    note = _hang(cluster, code, waiting=[0, 1, 3]).note
    assert "ranks 0-1,3 wait in auto set-up for all_reduce #0 (group[0, 1, 2, 3], 4 KiB" in note, (
        note
    )
    assert "cell line 6" in note, note


def test_a_rank_that_fails_after_autos_setup_leaves_the_others_named(cluster: Cluster):
    # Rank 2's bad output list fails after the group's auto set-up, before the call's
    # own check: the others wait in that check, under the set-up's number.
    code = SETUP + (
        "t = torch.ones(4)\n"
        "outs = [torch.empty(4) for _ in range(3 if comm.rank() == 2 else 4)]\n"
        "comm.all_gather(outs, t, group=g)\n"
    )
    note = _hang(cluster, code, waiting=[0, 1, 3], raises=(CellInterrupted, RankError)).note
    assert "ranks 0-1,3 wait in all_gather #0 (group[0, 1, 2, 3]" in note, note
    assert "mismatch" not in note, note
