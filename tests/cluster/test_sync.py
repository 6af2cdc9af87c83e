"""The user's code on every rank: ``%mpi sync`` / ``sync(cluster)`` on the session's real
4-rank cluster: the files land in the ranks' own sync directory, the ranks import that
copy (the notebook's folder off their path), an edit travels alone and is reloaded with
the ranks' variables kept, and what must not be sent is refused before anything is."""

from __future__ import annotations

import os
import secrets
import shutil
import textwrap

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import clusterkernel.client.magics as ck_magics
from clusterkernel.client.sync import SyncError, sync


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def _package(root):
    """A fresh package under ``root`` (a name no other test imported on the ranks)."""
    name = f"ckpkg_{secrets.token_hex(4)}"
    _write(root / name / "__init__.py", "from .ops import Scaler, twice\n")
    _write(
        root / name / "ops.py",
        """\
        def twice(x):
            return 2 * x


        class Scaler:
            def scale(self, x):
                return x * 2
        """,
    )
    return root / name


def _import_off_path(name: str, notebook_dir) -> str:
    """A cell that imports ``name`` with the notebook's folders off the ranks' path."""
    return textwrap.dedent(
        f"""\
        import os, sys
        _saved = list(sys.path)
        sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd(), {str(notebook_dir)!r})]
        try:
            import {name}
        finally:
            sys.path[:] = _saved
        where = {name}.ops.__file__
        """
    )


def test_a_package_is_imported_from_the_synced_copy_and_an_edit_reloads_it(cluster, tmp_path):
    pkg = _package(tmp_path)
    first = sync(cluster, [pkg.name], cwd=tmp_path)
    assert first.sent == [f"{pkg.name}/__init__.py", f"{pkg.name}/ops.py"]
    assert first.bytes == sum(len(p.read_bytes()) for p in pkg.iterdir() if p.is_file())
    [(host, directory)] = first.hosts.items()  # one machine: one host, one writer
    assert os.stat(directory).st_mode & 0o777 == 0o700
    assert first.reloaded == {}  # nothing imported yet

    cluster.run(
        _import_off_path(pkg.name, tmp_path)
        + f"held = {pkg.name}.Scaler()\ncounter = 41\nfrom {pkg.name} import twice\n"
    )
    where = cluster.pull("where")
    assert where == {r: os.path.join(directory, pkg.name, "ops.py") for r in range(4)}
    assert not any(w.startswith(str(tmp_path)) for w in where.values())

    # one function and one method edited: only that file travels, and is reloaded
    ops = pkg / "ops.py"
    ops.write_text(ops.read_text().replace("2 * x", "3 * x").replace("x * 2", "x * 10"))
    second = sync(cluster, [pkg.name], cwd=tmp_path)
    assert second.sent == [f"{pkg.name}/ops.py"] and second.unchanged == 1
    assert second.bytes == len(ops.read_bytes())
    assert second.reloaded == {f"{pkg.name}.ops": [0, 1, 2, 3]}
    assert "1 sent" in second.summary() and f"reloaded {pkg.name}.ops on ranks 0-3" in (
        second.summary()
    )

    # the next cell: the new code through every old reference, the variables kept
    cluster.run(f"got = ({pkg.name}.twice(3), twice(3), held.scale(3), counter)")
    assert cluster.pull("got") == {r: (9, 9, 30, 41) for r in range(4)}

    # nothing changed: nothing sent, nothing reloaded
    third = sync(cluster, [pkg.name], cwd=tmp_path)
    assert third.sent == [] and third.bytes == 0 and third.reloaded == {}
    assert third.summary().startswith("Nothing changed: 2 files already on 1 host")


def test_a_syntax_error_is_refused_with_file_and_line_and_the_ranks_keep_the_old_code(
    cluster, tmp_path
):
    pkg = _package(tmp_path)
    sync(cluster, [pkg], cwd=tmp_path)
    cluster.run(_import_off_path(pkg.name, tmp_path))
    ops = pkg / "ops.py"
    ops.write_text("def twice(x):\n    return 5 * x\n\ndef broken(:\n    pass\n")
    with pytest.raises(SyncError) as refused:
        sync(cluster, [pkg], cwd=tmp_path)
    message = str(refused.value)
    assert f"{pkg.name}/ops.py, line 4: invalid syntax" in message, message
    assert "the ranks keep the code they have" in message
    # the ranks run the old code, and their copy on disk is the old one
    cluster.run(f"got = ({pkg.name}.twice(3), open({pkg.name}.ops.__file__).read())")
    assert {r: g[0] for r, g in cluster.pull("got").items()} == {r: 6 for r in range(4)}
    assert all("2 * x" in g[1] for g in cluster.pull("got").values())
    # fixed: it goes, and is reloaded
    ops.write_text("def twice(x):\n    return 5 * x\n")
    assert sync(cluster, [pkg], cwd=tmp_path).reloaded == {f"{pkg.name}.ops": [0, 1, 2, 3]}
    cluster.run(f"got = {pkg.name}.ops.twice(3)")
    assert cluster.pull("got") == {r: 15 for r in range(4)}


def test_too_large_a_file_or_sync_is_refused_saying_how_to_move_data(cluster, tmp_path):
    pkg = _package(tmp_path)
    (pkg / "weights.bin").write_bytes(b"\0" * (11 * 2**20))
    with pytest.raises(SyncError) as refused:
        sync(cluster, [pkg], cwd=tmp_path)
    message = str(refused.value)
    assert f"{pkg.name}/weights.bin (11.0 MB) above the 10.0 MB a sync sends per file" in message
    assert "rsync" in message and "scp" in message and "path the ranks share" in message
    (pkg / "weights.bin").unlink()
    for i in range(3):
        (pkg / f"table{i}.csv").write_bytes(b"1," * 2**19)  # 1 MB each
    with pytest.raises(SyncError, match=r"5 files of 3\.0 MB, above the 2\.0 MB one sync sends"):
        sync(cluster, [pkg], cwd=tmp_path, max_total_bytes=2 * 2**20)


def test_what_a_host_lost_is_sent_again_and_a_restarted_rank_imports_the_copy(cluster, tmp_path):
    pkg = _package(tmp_path)
    [directory] = sync(cluster, [pkg], cwd=tmp_path).hosts.values()
    shutil.rmtree(os.path.join(directory, pkg.name))  # as a new host, or a wiped node
    again = sync(cluster, [pkg], cwd=tmp_path)
    assert again.sent == [f"{pkg.name}/__init__.py", f"{pkg.name}/ops.py"]
    cluster.restart()  # new processes: the set-up puts the synced copy first on their path
    cluster.run("import os, sys\nseen = (sys.path[:3], os.getcwd())")
    seen = cluster.pull("seen")
    assert all(path[:1] == [directory] for path, _ in seen.values()), (
        f"{directory} is not first on every restarted rank's path ((path, cwd) by rank): {seen}"
    )
    cluster.run(_import_off_path(pkg.name, tmp_path))
    assert set(cluster.pull("where").values()) == {os.path.join(directory, pkg.name, "ops.py")}


_TAB_DURING_SYNC = """\
import importlib.abc, sys, threading
from clusterkernel.protocol import _ipykernel
from clusterkernel.rank import _completion, _sync

class _Gate(importlib.abc.MetaPathFinder):
    # holds the Tab's thread where jedi looks NAME up, on the sys.path jedi swapped in
    def __init__(self):
        self.inside, self.go, self.swapped = threading.Event(), threading.Event(), None
    def find_spec(self, name, path, target=None):
        if name == NAME and threading.current_thread() is not threading.main_thread():
            self.swapped = sys.path is not _rank_path
            self.inside.set()
            self.go.wait(30)
        return None

_rank_path, _root = sys.path, _sync.directory()
while _root in sys.path:  # as on a rank started before the first sync
    sys.path.remove(_root)
_gate = _Gate()
sys.meta_path.insert(0, _gate)
_code = f"import {NAME}\\n{NAME}."
_tab = threading.Thread(target=_completion.complete, args=(_ipykernel.kernel_of(), {"code": _code}))
_tab.start()
_load = threading.Thread(target=_sync.load, args=([],))  # the sync's SYNC_LOAD, no module
try:
    reached = _gate.inside.wait(30)
    _load.start()
    _load.join(0.5)  # time to finish inside the Tab's lookup, if nothing holds it back
    loaded_during_tab = not _load.is_alive()
finally:
    _gate.go.set()
    _tab.join(30)
    if _load.ident is not None:  # started
        _load.join(30)
    sys.meta_path.remove(_gate)
got = dict(reached=reached, swapped=_gate.swapped, loaded_during_tab=loaded_during_tab,
           first=sys.path[:1] == [_root], path=sys.path[:3])
_sync.restore_path()  # the next tests' path, whatever happened here
"""


def test_a_sync_while_a_rank_answers_a_tab_keeps_the_copy_first_on_its_path(cluster):
    """jedi, answering a Tab beside the main thread (here ``_completion.complete``, what
    the control thread runs, held inside jedi's lookup of a module), swaps ``sys.path``
    for its own list and puts the old one back: the sync's edit of the path waits for it
    instead of landing in jedi's list. Rank 0's warm-up at a restart is the same race."""
    name = f"ckgate_{secrets.token_hex(4)}"
    cluster.run(f"NAME = {name!r}\n" + _TAB_DURING_SYNC, ranks=[0])
    got = cluster.pull("got", ranks=[0])[0]
    assert got["reached"], f"the Tab never looked {name} up: nothing was tested ({got})"
    assert got["first"], f"the sync directory is not first on rank 0's path after the Tab: {got}"
    assert not got["loaded_during_tab"], f"the sync's edit ran beside the Tab's lookup: {got}"


@pytest.fixture
def shell(cluster, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the notebook's folder
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "clusterkernel")
    ck_magics._magics.cluster = cluster  # the session's cluster, as if %mpi start had made it
    yield sh
    ck_magics._magics.cluster = None  # the fixture, not the test, owns the cluster's life


def test_the_magic_as_typed(shell, tmp_path, capsys):
    with pytest.raises(UsageError, match=r"No \.py files in .*: name the files or packages"):
        shell.run_line_magic("mpi", "sync")
    name = f"ckmod_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text("def f():\n    return 1\n")
    assert shell.run_cell("%mpi sync").success
    assert "Synced 1 file to 1 host (1 sent, 22 B; 0 unchanged) in " in capsys.readouterr().out
    assert shell.run_cell(f"%%mpi\nimport {name}\nprint('f', {name}.f())").success
    assert "[ranks 0-3] f 1" in capsys.readouterr().out
    (tmp_path / f"{name}.py").write_text("def f():\n    return 2\n")
    assert shell.run_cell(f"%mpi sync {name}.py  # the edit").success
    assert f"; reloaded {name} on ranks 0-3." in capsys.readouterr().out
    assert shell.run_cell(f"%%mpi\nprint('f', {name}.f())").success
    assert "[ranks 0-3] f 2" in capsys.readouterr().out
    with pytest.raises(UsageError, match=r"nosuch\.py: no such file or folder"):
        shell.run_line_magic("mpi", "sync nosuch.py")
    with pytest.raises(UsageError, match="unknown option --bogus. Usage: %mpi sync \\[PATH ...\\]"):
        shell.run_line_magic("mpi", "sync --bogus")
    (tmp_path / f"{name}.py").write_text("def f(:\n")
    with pytest.raises(UsageError, match=rf"{name}\.py, line 1: "):
        shell.run_line_magic("mpi", "sync")
    shell.run_line_magic("mpi", "help sync")
    assert "files and packages (folders with __init__.py)" in capsys.readouterr().out
