"""A profile watched while its cell runs (issue 36 item 4), on the real 4-rank cluster:
snapshots every ``every`` seconds, the dashboard's profile panel, ``--every`` parsing,
and a restart between ``%mpi profile start`` and ``stop``.

No timing is asserted: which functions the snapshots and the panel name, in order.
"""

from __future__ import annotations

import io
import json
import textwrap
import time

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from clusterkernel import Cluster
from clusterkernel.client.dashboard._profile_view import ProfilePanel
from clusterkernel.client.output import TerminalRenderer
from clusterkernel.client.profile import ProfileError, parse_every, snapshots

# The work changes half-way: the first function, then the second
HALVES = textwrap.dedent("""
    import time

    def first_half():
        time.sleep(1.6)

    def second_half():
        time.sleep(1.6)

    first_half()
    second_half()
""")


def _quiet(cluster: Cluster) -> TerminalRenderer:
    return TerminalRenderer(cluster.ranks, stream=io.StringIO())


def _top(profile, rank: int = 0) -> str | None:
    top = profile.top(rank, n=1) if rank in profile.ranks else []
    return top[0].function if top else None


def test_snapshots_name_the_first_function_early_and_the_second_late(cluster: Cluster):
    cluster.profile("start", every=0.5)
    try:
        run = cluster.run(HALVES, block=False, renderer=_quiet(cluster))
        during: list[str | None] = []
        while not run.ar.ready():  # pulled while the cell runs
            during = [_top(s) for s in snapshots(cluster)]
            if "first_half" in during:
                break
            time.sleep(0.2)
        run.wait(timeout=60)
    finally:
        p = cluster.profile("stop", show=False)
    assert "first_half" in during, during
    snaps = p.snapshots
    assert [s.index for s in snaps] == list(range(len(snaps))) and len(snaps) >= 5
    for s in snaps:
        assert sorted(s.ranks) == [0, 1, 2, 3] and s.start < s.end, s
    tops = {r: [_top(s, r) for s in snaps] for r in range(4)}
    for r, names in tops.items():
        assert names[0] == "first_half", (r, names)
        assert "second_half" in names, (r, names)
        last_first = max(i for i, n in enumerate(names) if n == "first_half")
        assert names.index("second_half") > last_first - 1, (r, names)  # one straddles
        assert all(n != "first_half" for n in names[names.index("second_half") + 1 :]), names
    assert all(a.end <= b.start + 0.05 for a, b in zip(snaps, snaps[1:]))  # in time order
    assert snaps[-1].partial and not snaps[0].partial
    # each snapshot exports like a profile: speedscope names the function, the trace times
    # it (the last window of the first half: the newest windows keep their timelines)
    early = snaps[max(i for i, n in enumerate(tops[0]) if n == "first_half")]
    doc = early.speedscope()
    names = {f["name"] for f in doc["shared"]["frames"]}
    assert "first_half" in names and len(doc["profiles"]) >= 4, names
    trace = json.loads(json.dumps(early.chrome_trace()))
    boxes = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "first_half"]
    assert {e["pid"] for e in boxes} == {0, 1, 2, 3}
    assert "first_half" in str(snaps) and "second_half" in str(snaps)  # the table per window
    # after the stop: the last profile's
    assert [(s.index, s.start) for s in snapshots(cluster)] == [(s.index, s.start) for s in snaps]


def test_the_panel_s_model_follows_a_running_profiled_cell(cluster: Cluster):
    panel = ProfilePanel()
    seen: list[tuple[str, tuple[str, ...]]] = []
    run = cluster.run(HALVES, profile=True, block=False, renderer=_quiet(cluster))
    try:
        while not run.ar.ready():  # as the dashboard's drawing thread does, every 2 s
            if panel.update(cluster):
                seen.append((panel.model.state, tuple(panel.model.functions(0))))
            time.sleep(0.3)
    finally:
        run.wait(timeout=60)
    panel.update(cluster)
    running = [fns for state, fns in seen if state == "running"]
    assert running and "first_half" in running[0], seen
    assert any("second_half" in fns for fns in running), seen
    assert len(set(running)) >= 2, seen  # it changed while the cell ran
    # the cell ended: its last window stays, every rank in it
    model = panel.model
    assert model.state == "ended" and [r.rank for r in model.ranks] == [0, 1, 2, 3], model
    assert all("second_half" in model.functions(r) for r in range(4)), model
    assert "second_half" in panel.widget.value
    assert not panel.update(cluster)  # unchanged: nothing redrawn


def test_every_input_parsed_or_told_what_to_write(cluster: Cluster, capsys):
    assert [parse_every(x) for x in ("60s", "5m", "1h", "90", "500ms", 2)] == [
        60.0,
        300.0,
        3600.0,
        90.0,
        0.5,
        2.0,
    ]
    for bad in ("soon", "-5s", "0", "5 parsecs", "nan"):
        with pytest.raises(ValueError, match="60s"):
            parse_every(bad)
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    magics = ck_magics._magics
    magics.cluster = cluster
    try:
        with pytest.raises(UsageError, match=r"such as 60s, 5m or 1h.*--every 60s"):
            sh.run_line_magic("mpi", "profile start --every soon")
        with pytest.raises(UsageError, match="go with %mpi profile start"):
            sh.run_line_magic("mpi", "profile stop --every 60s")
        with pytest.raises(ProfileError, match="every goes with start"):
            cluster.profile("stop", every=60)
        with pytest.raises(ProfileError, match="60s"):
            cluster.profile("start", every="1 fortnight")
        assert not _running_sampler(cluster)  # nothing was started by the bad input
        # the last profile (the panel test's cell) had no every: none to list, and how
        sh.run_line_magic("mpi", "profile snapshots")
        assert "No snapshots (profile with every=" in capsys.readouterr().out
        # as the issue writes it: start is the default action
        sh.run_line_magic("mpi", "profile --every 1m")
        assert _running_sampler(cluster)
        assert "A snapshot every 1m" in capsys.readouterr().out
        p = cluster.profile("stop", show=False)
        assert p.snapshots[-1].partial and sorted(p.snapshots[-1].ranks) == [0, 1, 2, 3]
    finally:
        magics.cluster = None


def _running_sampler(cluster: Cluster) -> bool:
    from clusterkernel.protocol._rank_call import rank_call

    return any(cluster.view().apply_sync(rank_call, "clusterkernel.rank._profile:running"))


def test_a_restart_between_start_and_stop_is_told_and_snapshots_kept(cluster: Cluster, capsys):
    cluster.profile("start", every=0.5)
    cluster.run(
        "import time\ndef before_restart():\n    time.sleep(1.2)\nbefore_restart()",
        renderer=_quiet(cluster),
    )
    time.sleep(0.7)  # a pull of the snapshots holding it
    cluster.restart()
    p = cluster.profile("stop")
    assert sorted(p.notes) == [0, 1, 2, 3] and not p.missing, p.notes
    for r, why in p.notes.items():
        assert "restarted or respawned since the profile started" in why, why
        assert "kept what its snapshots hold" in why, why
        assert any(e.function == "before_restart" for e in p.top(r)), str(p)
    out = capsys.readouterr().out
    assert "Rank 2: restarted or respawned" in out
    assert not _running_sampler(cluster)


def test_the_rank_sampler_s_window_and_bounded_snapshots(monkeypatch):
    """The rank side alone (no ranks): the rolling window holds only its last seconds,
    and snapshots nobody takes are bounded, the dropped ones counted."""
    from clusterkernel.rank import _profile, _profile_window

    # the window's own constants, where its code reads them
    monkeypatch.setattr(_profile_window, "ROLLING_SLICE", 0.1)
    monkeypatch.setattr(_profile_window, "MAX_SNAPSHOTS", 3)

    def early_work():
        time.sleep(0.6)

    def late_work():
        time.sleep(0.6)

    s = _profile.Sampler(hz=200, every=0.1).start()
    try:
        early_work()
        late_work()
        peek = s.peek(window=0.2)
    finally:
        data = s.stop()
    funcs = {stack[-1][2] for _t, stack, _secs in peek["window"]["stacks"] if stack}
    assert "late_work" in funcs and "early_work" not in funcs, funcs
    assert peek["running"] and len(peek["snapshots"]) == 3 and peek["dropped"] >= 5, peek
    seqs = [snap["seq"] for snap in peek["snapshots"]]
    assert seqs == sorted(seqs) and seqs[-1] >= 8, seqs  # the newest kept
    # taken up to seqs[1]: the rank drops those, keeps the rest
    assert [x["seq"] for x in s.peek(since=seqs[1])["snapshots"]][:1] == [seqs[2]]
    # the whole profile is untouched by the windows: both functions, all the time
    whole = {stack[-1][2] for _t, stack, _secs in data["stacks"] if stack}
    assert {"early_work", "late_work"} <= whole, whole
    assert data["snapshots"][-1]["partial"]
