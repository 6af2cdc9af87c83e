"""The user docs run as a user types them: every fenced block of README.md and
docs/GUIDE.md, and every example line of ``%mpi?``.

- **IPython sessions** (```` ``` ```` blocks of ``In [1]: %mpi start -n 4`` inputs with
  ``   ...:`` continuation lines) run input by input in a real IPython shell
  (``InteractiveShell``, as a terminal IPython), against real ranks that their own
  ``%mpi start`` starts. The blocks of one doc section run in order, in one session:
  one namespace, one cluster. A block that starts again at ``In [1]`` is a new session,
  as after a kernel restart: the extension is unloaded (which stops the ranks, or lets
  kept ones go, as a kernel's exit does) and the namespace emptied. Where the doc shows
  output under an input, those lines must be in what it printed, in that order
  (``...`` in a shown line stands for any text; durations and ids are compared as
  such, not by value, and this machine's host name reads as the docs' ``login1``).
- **``%mpi?``'s examples** run the same way, one session, in the order the help lists
  them.
- **```bash blocks**: none runs here that another test does not already run; each says
  which in the doc (``<!-- checked by tests/x.py -->``): the two set-up commands
  (``tests/test_user_docs.py``: the second is CI's own command) and the quick start's
  last command (``tests/test_notebooks_command.py`` runs it as the quick start prints
  it; here it must be that command written with ``.venv/bin/``).
- **```python blocks** run in ``tests/test_examples.py`` (as written, with the names
  they assume).

A block that cannot run here (a GPU, a real cluster's partition) says so before its
fence: ``<!-- not run: why -->``; the run prints how many are marked. A failure names
the doc file and line of the input that failed.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
import time

import pytest

from tests._examples import ROOT, Block, Typed, doc_blocks, help_inputs, session_inputs
from tests._procs import wait_no_cluster_processes

BLOCKS = doc_blocks()
SESSIONS = [b for b in BLOCKS if b.lang == ""]


def _sections() -> list:
    """The doc sections with IPython sessions in them, then ``%mpi?``'s examples."""
    groups: dict[tuple[str, str], list[Block]] = {}
    for block in SESSIONS:
        groups.setdefault((block.where, block.section), []).append(block)
    params = [
        pytest.param(blocks, id=f"{where}#{section or 'top'}")
        for (where, section), blocks in groups.items()
    ]
    return [*params, pytest.param(None, id="%mpi help")]


# ---------------------------------------------------------------- output


def _printed(out: str) -> list[str]:
    """What a terminal shows of ``out``: each line as it stands after its ``\\r``s."""
    return [line.rpartition("\r")[2].rstrip() for line in out.split("\n")]


_VARIES = [  # what differs from run to run: compared by kind, not value
    (re.compile(r"\b\d+(\.\d+)?\s?(ms|s|m|h|d)\b|\b\d+h\d+m\b"), "<duration>"),
    (re.compile(r"\b(cluster|pid|job) \d+\b"), r"\1 <id>"),
    (re.compile(r"^\d{4,}\b"), "<id>"),  # %mpi list's first column
]


def _pattern(shown: str) -> re.Pattern:
    for varies, kind in _VARIES:
        shown = varies.sub(kind, shown)
    parts = [re.escape(" ".join(p.split())) for p in shown.split("...")]
    return re.compile(".*".join(parts).replace(r"\ ", r"\s+"))


# the host name the docs show for this machine (``%mpi list``, ``%mpi status``)
DOC_HOST = "login1"


def _same(shown: str, line: str) -> bool:
    line = re.sub(rf"\b{re.escape(socket.gethostname())}\b", DOC_HOST, line)
    for varies, kind in _VARIES:
        line = varies.sub(kind, line)
    return bool(_pattern(shown).fullmatch(" ".join(line.split())))


def _missing(shown: tuple[str, ...], out: str) -> str | None:
    """The first shown line not printed (in order), else None."""
    lines = iter(_printed(out))
    for want in shown:
        if not any(_same(want, line) for line in lines):
            return want
    return None


# ---------------------------------------------------------------- sessions


def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


def _end_session(shell) -> None:
    """As a kernel's exit: the extension lets go of its ranks (stops them, or leaves
    kept ones), and the next session starts with an empty namespace and history."""
    if "clusterkernel" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "clusterkernel")
    shell.reset(new_session=True)


def _run_session(inputs: list[Typed], capsys) -> list[str]:
    """Run ``inputs`` in order in one IPython shell; failures named by doc and line."""
    shell = _shell()
    _end_session(shell)
    capsys.readouterr()
    failures: list[str] = []
    took: list[str] = []  # each input's time, told with a failure
    try:
        for i, typed in enumerate(inputs):
            if typed.number == 1 and i:
                _end_session(shell)
            start = time.monotonic()
            result = shell.run_cell(typed.code, store_history=True)
            out = capsys.readouterr().out
            took.append(f"{typed.where} {time.monotonic() - start:.1f} s")
            if not result.success:
                error = result.error_before_exec or result.error_in_exec
                failures.append(f"{typed.where}: {typed.code!r} failed: {error!r}\n{out}")
                break  # what follows in the session builds on it
            missing = _missing(typed.shown, out)
            if missing is not None:
                failures.append(
                    f"{typed.where}: the doc shows {missing!r} under {typed.code!r}; "
                    f"it printed:\n{out}"
                )
    finally:
        _end_session(shell)
    if failures:
        failures.append(f"(times: {', '.join(took)})")
    return failures


def _stop_kept() -> None:
    """Stop what a kept-cluster example left kept (a failed one, or by design)."""
    from clusterkernel import Cluster
    from clusterkernel.client.cluster import _kept_records
    from clusterkernel.client.errors import ClusterError

    for record in _kept_records.kept():
        if not record.get("ended"):
            try:
                Cluster.attach(record["id"], force=True).stop()
            except ClusterError:
                pass


@pytest.mark.parametrize("blocks", _sections())
def test_doc_sessions_run_as_typed(blocks, no_shared_cluster, tmp_path, monkeypatch, capsys):
    """Each doc section's IPython sessions (or ``%mpi?``'s examples), input by input."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    monkeypatch.setenv("CLUSTERKERNEL_RUN_DIR", str(runs))  # kept clusters: this test's own
    monkeypatch.chdir(tmp_path)  # exported jobs and saved profiles land here
    if blocks is None:
        from clusterkernel.client.magics._args import mpi_help

        inputs = help_inputs(mpi_help())
        assert len(inputs) >= 8, "%mpi? lost its examples"
        # the help is there once the extension is loaded
        inputs.insert(0, Typed("%mpi help", 0, "%load_ext clusterkernel"))
    else:
        with capsys.disabled():  # in the run's output, passed or not
            for b in (b for b in blocks if b.not_run):
                print(f"\n{b.name}: not run: {b.not_run}")
        inputs = [t for b in blocks if not b.not_run for t in session_inputs(b)]
    try:
        failures = _run_session(inputs, capsys)
    finally:
        _stop_kept()
    left = wait_no_cluster_processes(20)
    assert not left, f"the examples left cluster processes running: {left}"
    assert not failures, "\n\n".join(failures)


# ---------------------------------------------------------------- the rest


def test_every_bash_block_is_run_by_the_test_it_names():
    for block in (b for b in BLOCKS if b.lang in ("bash", "sh", "shell")):
        assert block.checked_by or block.not_run, (
            f"{block.name}: a shell command no test runs; run it in tests/test_docs_run.py "
            "or name the test that does (<!-- checked by tests/x.py -->)"
        )
        if block.checked_by:
            test = (ROOT / block.checked_by).read_text()
            assert re.search(r"^def test_", test, re.M), f"{block.name}: no tests in it"


def test_the_readmes_notebooks_command_is_the_one_the_quick_start_prints():
    """tests/test_notebooks_command.py runs the quick start's printed command; the
    README shows it with the venv's ``.venv/bin/`` (and root's ``--allow-root`` left to
    the Troubleshooting line)."""
    from clusterkernel.client.quickstart import next_step

    [block] = [b for b in BLOCKS if b.lang == "bash" and "clusterkernel notebooks" in b.code]
    printed = next_step().replace(os.path.dirname(sys.executable) + "/", ".venv/bin/")
    printed = printed.replace(" --allow-root", "")
    assert shlex.split(block.code.strip()) == shlex.split(printed), (block.name, printed)


def test_the_docs_blocks_are_all_of_a_kind_that_runs(capsys):
    """Every block is a session, python (tests/test_examples.py), or a shell command
    (above); a section never mixes sessions and python blocks, which would then run in
    two namespaces."""
    marked = [b.name for b in BLOCKS if b.not_run]
    with capsys.disabled():  # in the run's output, passed or not
        print(f"\n{len(marked)} doc examples marked not run: {marked}")
    for block in BLOCKS:
        assert block.lang in ("", "python", "bash"), f"{block.name}: ```{block.lang} runs nowhere"
        if block.lang == "":
            session_inputs(block)  # a session block parses (starts at a prompt)
    kinds: dict[tuple[str, str], set[str]] = {}
    for block in BLOCKS:
        kinds.setdefault((block.where, block.section), set()).add(block.lang)
    for (where, section), langs in kinds.items():
        assert not {"", "python"} <= langs, f"{where} '{section}' mixes sessions and python"


def test_help_examples_are_parsed_with_their_cells():
    text = "Examples:\n  %mpi start -n 2\n  %%mpi\n      x = 1\n      print(x)\n  %mpi stop\n"
    got = [t.code for t in help_inputs(text)]
    assert got == ["%mpi start -n 2", "%%mpi\nx = 1\nprint(x)", "%mpi stop"]


def test_start_names_the_cluster_but_leaves_a_users_own(no_shared_cluster, capsys):
    """The docs write ``cluster.profile_result``: ``%mpi start`` binds ``cluster``
    (the help's examples use it); a ``cluster`` the user made is not overwritten."""
    import clusterkernel

    shell = _shell()
    _end_session(shell)
    try:
        shell.run_line_magic("load_ext", "clusterkernel")
        shell.user_ns["cluster"] = "mine"
        assert shell.run_cell("%mpi start -n 2").success
        out = capsys.readouterr().out
        assert "Note: your own `cluster` (str) is left as it is" in out, out
        assert shell.user_ns["cluster"] == "mine"
        assert clusterkernel.current_cluster().n == 2
        assert shell.run_cell("%mpi stop").success
        assert clusterkernel.current_cluster() is None
    finally:
        _end_session(shell)
    assert not wait_no_cluster_processes(20)


def test_shown_output_is_matched_in_order_by_kind_of_value():
    printed = "\rStarting  \rStarted 2 MPI ranks (openmpi).\n[ranks 0-1] 3 0.5\n"
    assert _missing(("Started 2 MPI ranks (openmpi).", "[ranks 0-1] 3 0.5"), printed) is None
    assert _missing(("[rank 0] 3 0.5",), printed) == "[rank 0] 3 0.5"  # one label per rank
    assert _missing(("[ranks 0-1] 3 0.5", "Started ..."), printed) == "Started ..."  # order
    table = "482913    2  login1   1m   1h59m  none"
    assert _missing((table,), "182136    2  login1   2s   2h  none\n") is None
    assert _missing((table,), "182136    3  login1   2s   2h  none\n") == table


def test_a_block_marked_not_run_says_why():
    block = Block("x.md", 3, "", "", "In [1]: %mpi start --gpus-per-rank 1\n", "")
    assert block.not_run is None and block.checked_by is None
    marked = Block(block.where, 3, "", "", block.code, "<!-- not run: needs a GPU -->")
    assert marked.not_run == "needs a GPU"
    checked = Block(block.where, 3, "", "bash", "ls\n", "<!-- checked by tests/x.py -->")
    assert checked.checked_by == "tests/x.py"
