"""``%%mpi --profile`` / ``cluster.run(code, profile=True)`` on a real 4-rank cluster.

No timing is asserted: only which lines the profile names, and that a sampler runs
only while a profiled cell does.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from clusterkernel import Cluster, RankError
from clusterkernel.client.output import TerminalRenderer
from clusterkernel.client.profile import CELL, Profile
from clusterkernel.protocol._rank_call import rank_call

HELPER = """\
import time


def load_batch(rank):
    if rank == 2:
        time.sleep(0.04)  # the straggler's line
    return rank
"""


def _quiet(cluster: Cluster) -> TerminalRenderer:
    return TerminalRenderer(cluster.ranks, stream=io.StringIO())


def _sampler_running(cluster: Cluster) -> dict[int, bool]:
    results = cluster.view().apply_sync(rank_call, "clusterkernel.rank._profile:running")
    return dict(zip(cluster.live_ranks, results))


def test_the_straggler_s_helper_is_named_in_the_difference(
    cluster: Cluster, tmp_path: Path, capsys
):
    (tmp_path / "ck_profile_helper.py").write_text(HELPER)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import ck_profile_helper
        from clusterkernel import comm
        for step in range(25):
            ck_profile_helper.load_batch(comm.get_rank())
            comm.barrier()
    """)
    cluster.run(code, profile=True, renderer=_quiet(cluster))
    p = cluster.profile_result
    assert isinstance(p, Profile) and sorted(p.ranks) == [0, 1, 2, 3]
    assert p.slowest == 2, str(p)
    top = p.difference()[0]
    sleep_line = HELPER.splitlines().index("        time.sleep(0.04)  # the straggler's line") + 1
    assert (Path(top.file).name, top.line, top.function) == (
        "ck_profile_helper.py",
        sleep_line,
        "load_batch",
    ), str(p)
    shown = capsys.readouterr().out
    assert "What the slowest rank does more: rank 2" in shown
    assert f"ck_profile_helper.py:{sleep_line}" in shown
    assert _sampler_running(cluster) == {r: False for r in cluster.live_ranks}


def test_a_hot_loop_on_rank_0_is_its_top_entry(cluster: Cluster, capsys):
    code = textwrap.dedent("""
        from clusterkernel import comm

        def hot(n):
            total = 0
            for i in range(n):
                total += i % 7
            return total

        if comm.get_rank() == 0:
            hot(3_000_000)
    """)
    cluster.run(code, profile=True, renderer=_quiet(cluster))
    first = cluster.profile_result.top(0)[0]
    assert (first.file, first.function) == (CELL, "hot"), str(cluster.profile_result)
    assert "Profile of rank 0" in capsys.readouterr().out


def test_a_cell_that_raises_still_shows_its_profile(cluster: Cluster, capsys):
    code = textwrap.dedent("""
        import time

        def wait_then_fail():
            time.sleep(0.3)
            raise ValueError("boom")

        wait_then_fail()
    """)
    with pytest.raises(RankError):
        cluster.run(code, profile=True, renderer=_quiet(cluster))
    p = cluster.profile_result
    assert sorted(p.ranks) == [0, 1, 2, 3] and not p.missing
    assert all(p.top(r)[0].function == "wait_then_fail" for r in p.ranks), str(p)
    assert "wait_then_fail" in capsys.readouterr().out
    assert _sampler_running(cluster) == {r: False for r in cluster.live_ranks}


def test_without_profile_no_sampler_runs_and_nothing_is_shown(cluster: Cluster, capsys):
    before = cluster.profile_result
    run = cluster.run(
        "import time\ntime.sleep(0.2)\nimport threading\n"
        "names = [t.name for t in threading.enumerate()]",
        renderer=_quiet(cluster),
    )
    assert run.profile is None and cluster.profile_result is before
    names = cluster.pull("names")
    assert all("clusterkernel-profile" not in n for n in names.values()), names
    assert "Profile of rank" not in capsys.readouterr().out
