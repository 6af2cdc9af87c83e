"""The renderers' grouping and the error texts, without MPI (no cluster, no lock needed)."""

from __future__ import annotations

import io
import time

import pytest

from clusterkernel.client.errors import (
    _ANSI,
    RankError,
    RankFailure,
    format_ranks,
    headline,
    rank_label,
    retitle_cell,
)
from clusterkernel.client.output import NotebookRenderer, RankOutput, TerminalRenderer, group_lines
from tests._labels import parse_ranks, per_rank_lines


def test_group_lines_keeps_rank_order_and_merges_identical_lines():
    assert group_lines({0: ["a", "x0"], 1: ["a", "x1"]}) == [
        ([0, 1], "a"),
        ([0], "x0"),
        ([1], "x1"),
    ]
    # different first lines, a shared last one: all the first lines, then the shared one
    batch = {r: [f"shard {r}", "done"] for r in (3, 1, 0, 2)}
    assert group_lines(batch) == [([r], f"shard {r}") for r in range(4)] + [([0, 1, 2, 3], "done")]
    # rank 0 printed one line more: it goes first, the rest still merges
    assert group_lines({0: ["config", "e1"], 1: ["e1"], 2: ["e1"]}) == [
        ([0], "config"),
        ([0, 1, 2], "e1"),
    ]
    # crossing lines: each rank's order holds
    assert group_lines({0: ["a", "b"], 1: ["b", "a"]}) == [([0], "a"), ([0, 1], "b"), ([1], "a")]
    assert group_lines({}) == []


@pytest.mark.parametrize("n", [1, 2, 5, 16, 32])
def test_group_lines_prints_every_rank_line_once_in_each_rank_order(n):
    batch = {r: ["same", f"own {r}", "same", *(["extra"] if r % 3 == 0 else [])] for r in range(n)}
    merged = group_lines(batch)
    for r in range(n):
        assert [line for ranks, line in merged if r in ranks] == batch[r]
    assert merged[0] == (list(range(n)), "same")  # the common first line, once


def test_terminal_orders_a_batch_by_rank_and_names_shared_lines():
    out = io.StringIO()
    term = TerminalRenderer(list(range(16)), stream=out, hold=60)
    for r in [*range(8, 16), *range(8)]:  # arrival order is not rank order
        text = f"hello {r}\nepoch 3 loss 0.41\n" + ("nan at step 7\n" if r == 5 else "")
        term.update(r, RankOutput(stdout=text, execute_result={"data": {"text/plain": "16"}}))
    assert out.getvalue() == ""  # held
    term.finish()
    assert out.getvalue().splitlines() == [
        *[f"[rank {r}] hello {r}" for r in range(16)],
        "[ranks 0-15] epoch 3 loss 0.41",
        "[rank 5] nan at step 7",
        "Out[ranks 0-15]: 16",
    ]


def test_terminal_prints_at_once_without_hold_and_keeps_partial_lines():
    out = io.StringIO()
    term = TerminalRenderer([0, 1], stream=out, hold=0)
    term.update(0, RankOutput(stdout="a\npart"))
    assert out.getvalue() == "[rank 0] a\n"
    term.update(0, RankOutput(stdout="a\npartial\n", stderr="warn\n"))
    term.update(1, RankOutput(stdout="tail"))
    assert per_rank_lines(out.getvalue()) == [(0, "a"), (0, "partial"), (0, "warn")]
    assert "[rank 0 stderr] warn" in out.getvalue()
    term.notice("a notice")
    term.finish()
    assert out.getvalue().splitlines()[-2:] == ["a notice", "[rank 1] tail"]


def _stream_rounds(term, arrivals: list[tuple[float, int, str]], until: float) -> None:
    """Drive ``term`` as the runner does: every rank updated in rank order each 50 ms;
    ``arrivals``: (seconds from now, rank, text it has printed by then)."""
    start = time.monotonic()
    texts = dict.fromkeys(term.ranks, "")
    while (now := time.monotonic() - start) < until:
        for at, rank, text in arrivals:
            if at <= now:
                texts[rank] = text
        for rank in term.ranks:
            term.update(rank, RankOutput(stdout=texts[rank]))
        time.sleep(0.05)


def test_terminal_puts_a_line_every_rank_prints_in_rank_order_though_ranks_are_late():
    out = io.StringIO()
    term = TerminalRenderer([0, 1, 2, 3], stream=out)
    # a fresh engine set: each rank reaches its print at another time, in another order
    arrivals = [(0.0, 2, "hello from 2\n"), (0.15, 0, "hello from 0\n"),
                (0.3, 3, "hello from 3\n"), (0.45, 1, "hello from 1\n")]  # fmt: skip
    _stream_rounds(term, arrivals, until=0.9)
    printed_early = out.getvalue()
    term.finish()
    assert printed_early.splitlines() == [f"[rank {r}] hello from {r}" for r in range(4)]


def test_terminal_holds_a_rank_that_prints_alone_once_at_most():
    out = io.StringIO()
    term = TerminalRenderer([0, 1], stream=out)
    arrivals = [(0.0, 0, "step 0\n"), (1.5, 0, "step 0\nstep 1\n")]
    _stream_rounds(term, arrivals, until=1.3)
    assert out.getvalue() == "[rank 0] step 0\n"  # after waiting for rank 1 once
    _stream_rounds(term, [(0.0, 0, "step 0\nstep 1\n")], until=0.6)
    assert out.getvalue().endswith("[rank 0] step 1\n")  # not waited for again: the hold only
    term.finish()


def _notebook(ranks, outputs: dict[int, RankOutput]) -> NotebookRenderer:
    nb = NotebookRenderer(ranks, hold=0)
    nb.min_interval = 0
    for r, out in outputs.items():
        nb.update(r, out)
    nb.finish()
    return nb


def test_notebook_shares_identical_lines_and_keeps_the_rest_per_rank():
    ranks = list(range(16))
    outs = {
        r: RankOutput(stdout="epoch 3 loss 0.41\n" + ("only five\n" if r == 5 else f"r{r}\n"))
        for r in ranks
    }
    shown = _notebook(ranks, outs).shown()
    assert len(shown) == 17
    assert shown[0]["text/plain"] == "[ranks 0-15]\nepoch 3 loss 0.41"
    assert "[ranks 0-15]" in shown[0]["text/html"] and "epoch 3 loss 0.41" in shown[0]["text/html"]
    for r in ranks:
        assert shown[1 + r]["text/plain"] == f"[rank {r}]\n" + ("only five" if r == 5 else f"r{r}")


def test_notebook_groups_by_line_index_and_text():
    outs = {
        0: RankOutput(stdout="a\nb\n"),
        1: RankOutput(stdout="a\nc\n"),
        2: RankOutput(stdout="x\nc\n", execute_result={"data": {"text/plain": "7"}}),
        3: RankOutput(stdout="x\nb\n", execute_result={"data": {"text/plain": "7"}}),
    }
    shown = _notebook([0, 1, 2, 3], outs).shown()
    assert shown[0]["text/plain"].splitlines() == [
        "[ranks 0-1]", "a", "[ranks 2-3]", "x", "[ranks 0,3]", "b", "[ranks 1-2]", "c",
        "[ranks 2-3]", "Out[ranks 2-3]: 7",
    ]  # fmt: skip
    assert [s["text/plain"] for s in shown[1:]] == ["", "", "", ""]


def test_notebook_live_updates_move_a_line_once_others_print_it():
    nb = NotebookRenderer([0, 1, 2], hold=0)
    nb.min_interval = 0
    nb.update(0, RankOutput(stdout="step 1\n"))
    assert nb.shown()[1]["text/plain"] == "[rank 0]\nstep 1"  # alone: its own area
    nb.update(1, RankOutput(stdout="step 1\n"))
    assert nb.shown()[0]["text/plain"] == "[ranks 0-1]\nstep 1"
    assert nb.shown()[1]["text/plain"] == ""  # moved to the shared area
    nb.update(2, RankOutput(stdout="step 1\nhalf"))  # a line without its newline yet
    assert nb.shown()[0]["text/plain"] == "[ranks 0-2]\nstep 1"
    assert nb.shown()[3]["text/plain"] == "[rank 2]\nhalf"
    nb.update(2, RankOutput(stdout="step 1\nhalf done\n", stderr="warning\n"))
    nb.finish()
    assert nb.shown()[3]["text/plain"] == "[rank 2]\nhalf done\nwarning"
    assert "class='ck-err'>warning" in nb.shown()[3]["text/html"]


def test_notebook_holds_a_lone_line_until_the_hold_passes():
    nb = NotebookRenderer([0, 1], hold=60)
    nb.min_interval = 0
    nb.update(0, RankOutput(stdout="soon shared\n"))
    assert nb.shown()[1]["text/plain"] == ""  # not yet: rank 1 may print it too
    nb.finish()  # the cell is over: nothing waits any more
    assert nb.shown()[1]["text/plain"] == "[rank 0]\nsoon shared"


WARNING = "{}:19: UserWarning: Converting a tensor to a Python number\n  log(loss=float(loss))\n"


def test_notebook_never_splits_a_multi_line_message_between_areas():
    # the header names each rank's own file; the continuation is the same on both
    outs = {r: RankOutput(stderr=WARNING.format(f"/tmp/ipykernel_{r}/a.py")) for r in (0, 1)}
    shown = _notebook([0, 1], outs).shown()
    assert shown[0]["text/plain"] == ""  # nothing shared: the messages differ as wholes
    for r in (0, 1):
        assert shown[1 + r]["text/plain"].splitlines()[1:] == [
            f"/tmp/ipykernel_{r}/a.py:19: UserWarning: Converting a tensor to a Python number",
            "  log(loss=float(loss))",
        ]
    same = {r: RankOutput(stderr=WARNING.format("Cell In[4], line 3")) for r in (0, 1)}
    assert _notebook([0, 1], same).shown()[0]["text/plain"].splitlines() == [
        "[ranks 0-1]", "Cell In[4], line 3:19: UserWarning: Converting a tensor to a Python number",
        "  log(loss=float(loss))",
    ]  # fmt: skip
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: no\n'
    outs = {0: RankOutput(stdout="a\n", stderr=tb), 1: RankOutput(stdout="a\n", stderr=tb[:-15])}
    shown = _notebook([0, 1], outs).shown()
    assert shown[0]["text/plain"] == "[ranks 0-1]\na"
    assert shown[1]["text/plain"].endswith("line 1\nValueError: no")  # the traceback whole


def test_notebook_keeps_the_order_messages_arrived_in_across_streams():
    nb = NotebookRenderer([0], hold=0)
    nb.min_interval = 0
    nb.update(0, RankOutput(stdout="epoch 0\n"))
    nb.update(0, RankOutput(stdout="epoch 0\n", stderr=WARNING.format("Cell In[2], line 5")))
    nb.update(
        0, RankOutput(stdout="epoch 0\nepoch 1\n", stderr=WARNING.format("Cell In[2], line 5"))
    )
    nb.finish()
    lines = nb.shown()[1]["text/plain"].splitlines()
    assert lines[1] == "epoch 0" and lines[2].startswith("Cell In[2], line 5:19: UserWarning")
    assert lines[-1] == "epoch 1"


def test_notebook_shares_only_what_opens_each_ranks_output():
    # ranks 2 and 3 agree on epoch 2 but not on epochs 0-1: epoch 2 stays below those
    outs = {
        r: RankOutput(stdout=f"start\nepoch 0 loss {r}\nepoch 1 loss {r}\nepoch 2 loss 0.001\n")
        for r in (2, 3)
    }
    shown = _notebook([2, 3], outs).shown()
    assert shown[0]["text/plain"] == "[ranks 2-3]\nstart"
    for r in (2, 3):
        assert shown[1 + [2, 3].index(r)]["text/plain"].splitlines() == [
            f"[rank {r}]", f"epoch 0 loss {r}", f"epoch 1 loss {r}", "epoch 2 loss 0.001",
        ]  # fmt: skip


def test_rank_labels():
    assert rank_label([1]) == "rank 1"
    assert rank_label([3, 1]) == "ranks 1,3"
    assert rank_label(range(16)) == "ranks 0-15"
    assert parse_ranks(format_ranks([0, 1, 2, 5, 7, 8])) == [0, 1, 2, 5, 7, 8]


def test_error_heading_names_one_rank_as_rank():
    err = RankError(
        [RankFailure("error", "ValueError: no", [1], "tb"), RankFailure("error", "E: x", [1, 3])]
    )
    text = err.render(color=False)
    assert text[0] == "[rank 1] error: ValueError: no"
    assert "[ranks 1,3] error: E: x" in text
    assert str(err).splitlines() == ["[rank 1] ValueError: no", "[ranks 1,3] E: x"]


def test_kind_is_not_repeated_when_the_summary_starts_with_it():
    assert headline("interrupted", "interrupted; stopped by SIGINT") == (
        "interrupted; stopped by SIGINT"
    )
    assert headline("error", "ValueError: no") == "error: ValueError: no"
    assert headline("timeout", "still running after 3s") == "timeout: still running after 3s"
    err = RankError([RankFailure("interrupted", "interrupted; stopped by SIGINT", [0, 1])])
    assert err.render(color=False) == ["[ranks 0-1] interrupted; stopped by SIGINT"]


def test_engine_cell_number_is_replaced():
    tb = "\x1b[0;31mCell In[4], line 2\x1b[0m\n      1 x = 1\n----> 2 1/0"
    assert retitle_cell(tb, 12).startswith("\x1b[0;31mCell In[12], line 2")
    assert "Cell In[4]" not in retitle_cell(tb, None)
    assert retitle_cell(tb, None).startswith("\x1b[0;31m%%mpi cell, line 2")
    assert retitle_cell("Input In [9], in <cell line: 1>", 3) == "Input In [3], in <cell line: 1>"
    # IPython 8.12 colours the words apart
    coloured = "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[5]\x1b[39m\x1b[32m, line 2"
    assert _ANSI.sub("", retitle_cell(coloured, 41)) == "Cell In[41], line 2"
    assert _ANSI.sub("", retitle_cell(coloured, None)) == "%%mpi cell, line 2"
    err = RankError([RankFailure("error", "ZeroDivisionError", [0], tb)], execution_count=7)
    assert "Cell In[7], line 2" in err.render(color=False)
    # a SyntaxError's message names the engine's file for the cell: the summary says the cell
    syntax = "SyntaxError: invalid syntax (3855724513.py, line 1)"
    assert retitle_cell(syntax, 14) == "SyntaxError: invalid syntax (Cell In[14], line 1)"
    assert retitle_cell(syntax, None) == "SyntaxError: invalid syntax (%%mpi cell, line 1)"
    err = RankError([RankFailure("error", syntax, [0, 1])], execution_count=14)
    assert err.render(color=False)[0] == f"[ranks 0-1] error: {retitle_cell(syntax, 14)}"
    assert str(err) == f"[ranks 0-1] {retitle_cell(syntax, 14)}"


def test_a_ranks_coloured_page_shows_as_plain_text_in_the_notebook():
    # obj? on the ranks: IPython's page is text/plain with ANSI colours, which HTML
    # would show as "[31mType:[39m"
    page = {"data": {"text/plain": "\x1b[31mType:\x1b[39m        int"}, "metadata": {}}
    nb = NotebookRenderer([0], hold=0)
    nb.update(0, RankOutput(outputs=[page]))
    nb.finish()
    shown = nb.shown()[1]["text/html"]
    assert "Type:        int" in shown and "\x1b" not in shown and "[31m" not in shown
