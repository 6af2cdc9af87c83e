"""comm's C fast path: built where a compiler was at install time (CI installs gcc, so
the path the suite tests is the C one), and its absence said once, with what to do."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from clusterkernel.comm import _fastpath

HEADERS = Path(sysconfig.get_paths()["include"], "Python.h").is_file()


@pytest.mark.skipif(not (shutil.which("gcc") and HEADERS), reason="no C compiler here")
def test_the_c_path_is_built_where_a_compiler_is():
    assert _fastpath.available(), _fastpath.missing_note()
    assert _fastpath.missing_note() is None


def test_a_missing_c_path_is_said_once_with_what_to_do():
    # the extension made unimportable, as where no compiler built it
    code = (
        "import sys, warnings; sys.modules['clusterkernel.comm._fast'] = None\n"
        "warnings.simplefilter('default')\n"
        "from clusterkernel import comm\n"
        "import torch; comm.all_reduce(torch.ones(4))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "C fast path" in line]
    assert len(said) == 1, done.stderr
    assert "not built" in said[0] and "apt install gcc python3-dev" in said[0], said
