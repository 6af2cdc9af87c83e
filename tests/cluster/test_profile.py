"""``%%mpi --profile`` / ``cluster.run(code, profile=True)`` on a real 4-rank cluster.

No timing is asserted: only which lines the profile names, and that a sampler runs
only while a profiled cell does.
"""

from __future__ import annotations

import io
import json
import textwrap
import time
from pathlib import Path

import jsonschema
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from clusterkernel import Cluster, RankError
from clusterkernel.client.errors import CellInterrupted
from clusterkernel.client.output import TerminalRenderer
from clusterkernel.client.profile import CELL, Profile, ProfileError
from clusterkernel.protocol._rank_call import rank_call

# The shape of speedscope's file format (https://www.speedscope.app/file-format-schema.json,
# the sampled-profile part), written out here: the test machine may be offline.
SPEEDSCOPE_SHAPE = {
    "type": "object",
    "required": ["$schema", "profiles", "shared"],
    "properties": {
        "$schema": {"enum": ["https://www.speedscope.app/file-format-schema.json"]},
        "shared": {
            "type": "object",
            "required": ["frames"],
            "properties": {
                "frames": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string"},
                            "file": {"type": "string"},
                            "line": {"type": "number"},
                        },
                    },
                }
            },
        },
        "profiles": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "type",
                    "name",
                    "unit",
                    "startValue",
                    "endValue",
                    "samples",
                    "weights",
                ],
                "properties": {
                    "type": {"enum": ["sampled"]},
                    "name": {"type": "string"},
                    "unit": {
                        "enum": [
                            "bytes",
                            "microseconds",
                            "milliseconds",
                            "nanoseconds",
                            "none",
                            "seconds",
                        ]
                    },
                    "startValue": {"type": "number"},
                    "endValue": {"type": "number"},
                    "samples": {
                        "type": "array",
                        "items": {"type": "array", "items": {"type": "number"}},
                    },
                    "weights": {"type": "array", "items": {"type": "number"}},
                },
            },
        },
        "name": {"type": "string"},
        "activeProfileIndex": {"type": "number"},
        "exporter": {"type": "string"},
    },
}

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
    # imports first, unprofiled: a fresh rank's first import of comm can take as long
    # as the straggler's sleeps on a loaded 2-core machine, on any rank
    warm = f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport ck_profile_helper"
    cluster.run(warm + "\nfrom clusterkernel import comm", renderer=_quiet(cluster))
    code = textwrap.dedent("""
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
    # the barriers' time: the others wait for rank 2; rank 2 hardly waits
    split = p.collectives()
    assert sorted(split) == [0, 1, 2, 3] and {t.calls for t in split.values()} == {25}, split
    assert all(split[r].waiting > split[2].waiting for r in (0, 1, 3)), split
    assert all(t.unsplit == 0 for t in split.values()), split
    assert "waiting for other ranks" in shown
    # one icicle per rank, the helper's box with its file and line in the tooltip
    page = p._repr_html_()
    assert page.count("class='ck-flame'") == 4 and "<script" not in page
    assert "load_batch (" in page and f"ck_profile_helper.py:{sleep_line})" in page


def test_exports_load_as_speedscope_and_chrome_trace(cluster: Cluster, tmp_path: Path):
    code = textwrap.dedent("""
        import threading, time
        from clusterkernel import comm

        def background():
            time.sleep(0.2)

        def step():
            time.sleep(0.01)
            comm.barrier()

        t = threading.Thread(target=background, name="loader")
        t.start()
        for _ in range(10):
            step()
        t.join()
    """)
    cluster.run(code, profile=True, renderer=_quiet(cluster))
    p = cluster.profile_result
    doc = json.loads(p.save(tmp_path / "cell.speedscope.json").read_text())
    jsonschema.validate(doc, SPEEDSCOPE_SHAPE)
    names = [prof["name"] for prof in doc["profiles"]]
    assert {"rank 0", "rank 3", "rank 0 thread loader"} <= set(names), names
    frames = doc["shared"]["frames"]
    for prof in doc["profiles"]:
        assert len(prof["samples"]) == len(prof["weights"])
        assert all(0 <= i < len(frames) for s in prof["samples"] for i in s)
    rank0 = doc["profiles"][names.index("rank 0")]
    stepped = {frames[s[-1]]["name"] for s in rank0["samples"] if s}
    assert "step" in {frames[i]["name"] for s in rank0["samples"] for i in s}, stepped

    trace = json.loads(p.save(tmp_path / "cell.json").read_text())
    events = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {r: f"rank {r}" for r in range(4)}
    complete = [e for e in events if e["ph"] == "X"]
    for e in complete:
        assert {"name", "pid", "tid", "ts", "dur"} <= set(e) and e["dur"] >= 0, e
    # boxes of one track nest (a trace viewer refuses overlaps that do not)
    tracks: dict = {}
    for e in complete:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in tracks.values():
        open_ends: list[float] = []
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= e["ts"] + 1e-3:
                open_ends.pop()
            assert not open_ends or e["ts"] + e["dur"] <= open_ends[-1] + 1e-3, e
            open_ends.append(e["ts"] + e["dur"])
    comm_ops = [e for e in complete if e["cat"] == "comm" and e["pid"] == 0]
    assert len(comm_ops) == 10 and all(e["name"] == "barrier" for e in comm_ops)
    with pytest.raises(ValueError, match="speedscope.json"):
        p.save(tmp_path / "cell.txt")


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


def test_a_cell_that_hangs_under_timeout_still_shows_what_was_sampled(cluster: Cluster, capsys):
    code = textwrap.dedent("""
        from mpi4py import MPI

        def wait_for_peers():
            MPI.COMM_WORLD.Barrier()   # rank 1 never comes

        if MPI.COMM_WORLD.Get_rank() != 1:
            wait_for_peers()
    """)
    with pytest.raises(CellInterrupted):
        cluster.run(code, profile=True, timeout=2, renderer=_quiet(cluster))
    p = cluster.profile_result
    assert sorted(p.ranks) == [0, 1, 2, 3] and not p.missing, str(p)
    for r in (0, 2, 3):
        assert p.top(r)[0].function == "wait_for_peers", str(p)
    assert "wait_for_peers" in capsys.readouterr().out


def test_profile_start_stop_over_cells_and_its_misuse(cluster: Cluster, capsys):
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    magics = ck_magics._magics
    magics.cluster = cluster
    try:
        with pytest.raises(UsageError, match="no profile is running"):
            sh.run_line_magic("mpi", "profile stop")
        with pytest.raises(UsageError, match="'pause' is not one of start, stop, snapshots"):
            sh.run_line_magic("mpi", "profile pause")
        sh.run_line_magic("mpi", "profile start")
        assert _sampler_running(cluster) == {r: True for r in cluster.live_ranks}
        with pytest.raises(UsageError, match="already running"):
            sh.run_line_magic("mpi", "profile start")
        with pytest.raises(ProfileError, match="already running"):
            cluster.run("pass", profile=True, renderer=_quiet(cluster))
        for _ in range(2):
            cluster.run(
                "def first_cell_work():\n    import time; time.sleep(0.1)\nfirst_cell_work()",
                renderer=_quiet(cluster),
            )
        sh.run_line_magic("mpi", "profile stop")
    finally:
        magics.cluster = None
    p = cluster.profile_result
    assert sorted(p.ranks) == [0, 1, 2, 3]
    assert all(any(e.function == "first_cell_work" for e in p.top(r)) for r in p.ranks), str(p)
    assert _sampler_running(cluster) == {r: False for r in cluster.live_ranks}
    with pytest.raises(ProfileError, match="no profile is running"):
        cluster.profile("stop")
    assert "Profiling every rank" in capsys.readouterr().out


def test_profile_torch_ops_merge_into_the_dashboard_trace_on_one_clock(cluster: Cluster):
    code = textwrap.dedent("""
        import time, torch
        from clusterkernel import comm

        x = torch.randn(64, 64)
        time.sleep(0.3)
        for _ in range(5):
            comm.all_reduce(x @ x)
        time.sleep(0.3)
    """)
    cluster.run("import torch", timeout=120, renderer=_quiet(cluster))  # not profiled
    dash = cluster.dashboard()
    cluster.run(code, profile="torch", timeout=120, renderer=_quiet(cluster))
    p = cluster.profile_result
    assert sorted(p.ranks) == [0, 1, 2, 3]
    dash.sync()
    trace = p.chrome_trace(store=dash.store)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for rank in (0, 1):
        python = [e for e in complete if e["pid"] == rank and e["cat"] == "python"]
        lo, hi = min(e["ts"] for e in python), max(e["ts"] + e["dur"] for e in python)
        # a sample's time is the stretch up to it: a cell's edges are known to one interval.
        # The sleeps keep the ops well inside the sampled stretch, so a sample taken late
        # on a loaded machine cannot put an op outside it; a clock off by more would.
        tick = 1e6 / p.ranks[rank]["hz"]
        lo, hi = lo - tick, hi + tick
        mm = [e for e in complete if e["pid"] == rank and e["name"] == "aten::mm"]
        assert len(mm) == 5, [e["name"] for e in complete if e["pid"] == rank]
        # torch's clock and the sampler's agree: every op lies in the cell's samples
        assert all(lo <= e["ts"] <= hi for e in mm), (lo, hi, [e["ts"] for e in mm])
        # and the dashboard's: its records of the cell's all-reduces land in it too
        theirs = [e for e in complete if e["pid"] == rank and e["tid"] == 1 and lo <= e["ts"] <= hi]
        assert [e["name"] for e in theirs] == ["all_reduce"] * 5, theirs


# ---------------------------------------------------------------- as a user types it
# A helper defined in one cell and called from a later, profiled one (the sleep is on
# the body's line 5, the %%mpi line aside)
GET_BATCH = """%%mpi
import time


def get_batch():
    time.sleep(0.05)
    return 1"""
NOISE = ("<string>", "jupyter_client", "ipykernel", "ipyparallel", "(between cells)", "(engine)")


@pytest.fixture
def shell(cluster: Cluster):
    """IPython with the extension loaded, its %mpi on the shared cluster."""
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    magics = ck_magics._magics
    magics.cluster = cluster
    yield sh
    magics.cluster = None


def _cell(sh: InteractiveShell, text: str) -> int:
    """Run ``text`` as a notebook's cell (into In[]); its number."""
    result = sh.run_cell(text, store_history=True)
    result.raise_error()
    return result.execution_count


def _noise(p: Profile) -> list[str]:
    """The top lines of any rank that are the engine's, not the cells'."""
    return [
        f"rank {r}: {e.where} {e.function}"
        for r in p.ranks
        for e in p.top(r, n=50)
        if any(n in f"{e.where} {e.function} {e.inside}" for n in NOISE)
    ]


def test_a_helper_from_an_earlier_cell_is_named_after_its_cell_everywhere(
    shell, cluster: Cluster, capsys, tmp_path: Path
):
    helper = _cell(shell, GET_BATCH)
    profiled = _cell(shell, "%%mpi --profile\nfor _ in range(6):\n    get_batch()")
    assert profiled > helper
    p = cluster.profile_result
    assert sorted(p.ranks) == [0, 1, 2, 3], str(p)
    for r in p.ranks:
        top = p.top(r)[0]
        assert (top.where, top.function) == (f"Cell In[{helper}], line 5", "get_batch"), str(p)
    assert not _noise(p), _noise(p)
    shown = capsys.readouterr().out
    assert f"Cell In[{helper}], line 5" in shown
    assert "cell line" not in shown and "ipykernel_" not in shown
    # the flame graph's box of the helper names its cell, the loop's box the profiled one
    page = p._repr_html_()
    assert f"get_batch (Cell In[{helper}], line 5)" in page
    assert f"&lt;module&gt; (Cell In[{profiled}], line 2)" in page
    assert "ipykernel_" not in page
    # exported: speedscope's frames and the trace's boxes name the cells, with the line
    doc = json.loads(p.save(tmp_path / "cells.speedscope.json").read_text())
    jsonschema.validate(doc, SPEEDSCOPE_SHAPE)
    frames = doc["shared"]["frames"]
    assert {"name": "get_batch", "file": f"Cell In[{helper}]", "line": 5} in frames, frames
    assert not [f for f in frames if "ipykernel_" in f.get("file", "")], frames
    trace = json.loads(p.save(tmp_path / "cells.json").read_text())
    boxes = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "python"]
    assert {e["pid"] for e in boxes if e["name"] == "get_batch"} == {0, 1, 2, 3}
    assert {(e["args"]["file"], e["args"]["line"]) for e in boxes if e["name"] == "get_batch"} == {
        (f"Cell In[{helper}]", 5)
    }
    assert not [e for e in boxes if "ipykernel_" in e["args"]["file"]]


def test_profile_start_stop_shows_the_cells_lines_not_the_engine_s(shell, cluster: Cluster, capsys):
    helper = _cell(shell, GET_BATCH)
    _cell(shell, "%mpi profile start")
    _cell(shell, "%%mpi\nget_batch()")
    shell.run_line_magic("mpi", "status")  # the notebook asks the ranks between cells
    time.sleep(1.0)  # and the ranks wait for the next cell
    last = _cell(shell, "%%mpi\nfor _ in range(3):\n    get_batch()")
    _cell(shell, "%mpi profile stop")
    p = cluster.profile_result
    assert sorted(p.ranks) == [0, 1, 2, 3], str(p)
    assert not _noise(p), _noise(p)
    for r in p.ranks:
        assert p.top(r)[0].where == f"Cell In[{helper}], line 5", str(p)
        assert p.between(r) > 0 and p.in_cells(r) < p.seconds(r), str(p)
    shown = capsys.readouterr().out
    assert "s between them" in shown
    assert f"&lt;module&gt; (Cell In[{last}], line 2)" in p._repr_html_()  # the caller's box


def test_the_control_thread_never_shows_other_threads_keep_their_names(
    shell, cluster: Cluster, capsys
):
    # --every: the notebook pulls snapshots on each rank's control thread while cells run
    _cell(shell, "%mpi profile start --every 200ms")
    _cell(
        shell,
        "%%mpi\nimport threading, time\n\ndef load():\n    time.sleep(0.8)\n\n"
        "t = threading.Thread(target=load, name='loader')\nt.start()\n"
        "for _ in range(8):\n    time.sleep(0.1)\nt.join()",
    )
    _cell(shell, "%mpi profile stop")
    p = cluster.profile_result
    assert sorted(p.ranks) == [0, 1, 2, 3] and len(p.snapshots) >= 2, str(p)
    for profile in [p, *p.snapshots]:
        for r, data in profile.ranks.items():
            threads = {t for t, _stack, _secs in data["stacks"]}
            assert threads <= {"main", "loader"}, (r, threads)
            files = {f[0] for _t, stack, _s in data["stacks"] for f in stack}
            assert not [f for f in files if "ipykernel" in f or "jupyter_client" in f], files
    for r, data in p.ranks.items():
        assert {t for t, _stack, _secs in data["stacks"]} == {"main", "loader"}, r
        assert any(f[2] == "load" for t, s, _x in data["stacks"] if t == "loader" for f in s)
        assert not any(f[2] == "load" for t, s, _x in data["stacks"] if t == "main" for f in s)
    page = p._repr_html_()
    assert "<title>thread loader\n" in page and "thread main" not in page
    assert "thread Control" not in page


def test_a_cell_s_label_carries_its_number_and_a_cell_file_unnamed_reads_as_a_cell():
    """No ranks: the label's round trip, the rank's map, and the notebook's fallback for
    a cell file no rank named (a rank started before its hook was armed)."""
    from clusterkernel.client.profile._flame import cell_file, where
    from clusterkernel.protocol.records import cell_label, label_count
    from clusterkernel.rank import _profile_cells

    assert label_count(cell_label("3f2a", 7)) == 7
    assert [label_count(x) for x in (cell_label("3f2a", None), None, "In[7]")] == [None] * 3
    _profile_cells.note("/tmp/ipykernel_1/11.py", 7)
    _profile_cells.note("/tmp/ipykernel_1/12.py", None)
    assert _profile_cells.cell_name("/tmp/ipykernel_1/11.py") == "Cell In[7]"
    assert _profile_cells.cell_name("/tmp/ipykernel_1/12.py") == CELL == "%%mpi cell"
    assert _profile_cells.cell_name("/tmp/loader.py") is None
    assert cell_file("/tmp/ipykernel_4242/3855724513.py") == CELL
    assert where("Cell In[7]", 3) == "Cell In[7], line 3"
    assert where("/tmp/ipykernel_4242/3855724513.py", 3) == "%%mpi cell, line 3"
