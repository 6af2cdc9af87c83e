"""comm's C parts (the fast path of all_reduce, the shared-memory pipeline's chunk loop):
built where a compiler was at install time (CI installs gcc, so the paths the suite
tests are the C ones), and their absence said once, with what to do."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from clusterkernel.comm import _fastpath
from clusterkernel.comm._shm import pipe

HEADERS = Path(sysconfig.get_paths()["include"], "Python.h").is_file()


@pytest.mark.skipif(not (shutil.which("gcc") and HEADERS), reason="no C compiler here")
def test_the_c_path_is_built_where_a_compiler_is():
    assert _fastpath.available(), _fastpath.missing_note()
    assert pipe.c_built(), _fastpath.missing_note()
    assert _fastpath.missing_note() is None


def test_a_missing_c_path_is_said_once_with_what_to_do():
    # the extensions made unimportable, as where no compiler built them
    code = (
        "import sys, warnings; sys.modules['clusterkernel.comm._fast'] = None\n"
        "sys.modules['clusterkernel.comm._shm._cpipe'] = None\n"
        "warnings.simplefilter('default')\n"
        "from clusterkernel import comm\n"
        "import torch; comm.all_reduce(torch.ones(4))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "C fast path" in line]
    assert len(said) == 1, done.stderr
    assert "not built" in said[0] and "apt install gcc python3-dev" in said[0], said
    assert "comm._fast" in said[0] and "comm._shm._cpipe" in said[0], said


def test_a_missing_chunk_loop_alone_is_named(monkeypatch):
    monkeypatch.setattr(pipe, "_cpipe", None)  # as where no compiler built it
    note = _fastpath.missing_note() or ""
    assert "comm._shm._cpipe" in note and "comm._fast" not in note, note
    assert "not built" in note and "apt install gcc python3-dev" in note, note
