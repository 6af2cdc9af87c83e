"""The two sides stay apart: the notebook never loads mpi4py, a rank never loads widgets."""

from __future__ import annotations

import json
import subprocess
import sys


def _loaded(imports: str, modules: list[str]) -> dict[str, bool]:
    code = (
        f"{imports}\nimport json, sys\nprint(json.dumps([m in sys.modules for m in {modules!r}]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(zip(modules, json.loads(out.stdout.strip().splitlines()[-1])))


def test_client_side_never_imports_mpi4py():
    loaded = _loaded(
        "import clusterkernel\nfrom clusterkernel import Cluster, Dashboard\n"
        "import clusterkernel.magics, clusterkernel.runner, clusterkernel.output",
        ["mpi4py", "ipyparallel"],
    )
    assert loaded == {"mpi4py": False, "ipyparallel": True}


def test_engine_side_never_imports_display_machinery():
    loaded = _loaded(
        "from clusterkernel import comm, metrics, partition, data, train, log",
        ["mpi4py", "ipywidgets", "IPython.display", "anywidget", "ipyparallel"],
    )
    assert loaded["mpi4py"]
    assert not loaded["ipywidgets"] and not loaded["IPython.display"] and not loaded["anywidget"]
