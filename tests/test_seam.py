"""The two sides stay apart: the notebook never loads mpi4py, a rank never loads widgets.

The folders name the sides: every module under a client folder is imported in one
process, every module under an engine folder in another, so a new module in
either folder is checked without being listed here.
"""

from __future__ import annotations

import json
import subprocess
import sys

# client side: runs in the notebook
CLIENT = [
    "cluster", "output", "export", "magics", "dashboard", "debug", "errors", "mpiexec", "kernel",
    "quickstart", "teaching_notebooks",
]  # fmt: skip
# engine side: runs on the ranks (engine/_job_prelude is a script an exported job runs, not imported)
ENGINE = ["comm", "metrics", "partition", "data", "train", "engine", "torchdist"]
SEAM = ["records", "_wire", "_shm_names", "_rank_call", "_net", "_oom"]
_NOT_IMPORTED = {"clusterkernel.rank._job_prelude"}


def _loaded(names: list[str], modules: list[str], imports: str = "") -> dict[str, bool]:
    code = (
        "import importlib, json, pkgutil, sys\n"
        f"{imports}\n"
        f"for name in {names!r}:\n"
        "    m = importlib.import_module('clusterkernel.' + name)\n"
        "    for sub in pkgutil.walk_packages(getattr(m, '__path__', []), m.__name__ + '.'):\n"
        f"        if sub.name not in {sorted(_NOT_IMPORTED)!r}:\n"
        "            importlib.import_module(sub.name)\n"
        "print(json.dumps([sum(n.startswith('clusterkernel.') for n in sys.modules),"
        f" [m in sys.modules for m in {modules!r}]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    count, flags = json.loads(out.stdout.strip().splitlines()[-1])
    assert count >= len(names)  # the walk imported the folders, not nothing
    return dict(zip(modules, flags))


def test_client_side_never_imports_mpi4py():
    loaded = _loaded(
        CLIENT,
        [
            "mpi4py",
            "ipyparallel",
            "clusterkernel.client.cluster.runner",
            "clusterkernel.client.output._rank_output",
        ],
        "import clusterkernel\nfrom clusterkernel import Cluster, Dashboard",
    )
    assert loaded == {
        "mpi4py": False,
        "ipyparallel": True,
        "clusterkernel.client.cluster.runner": True,
        "clusterkernel.client.output._rank_output": True,
    }


def test_engine_side_never_imports_display_machinery():
    loaded = _loaded(
        ENGINE,
        ["mpi4py", "ipywidgets", "IPython.display", "anywidget", "clusterkernel.metrics._stream"],
        "from clusterkernel import comm, metrics, partition, data, train, log",
    )
    assert loaded["mpi4py"] and loaded["clusterkernel.metrics._stream"]
    assert not loaded["ipywidgets"] and not loaded["IPython.display"] and not loaded["anywidget"]


def test_the_seam_belongs_to_neither_side():
    loaded = _loaded(SEAM, ["mpi4py", "ipyparallel", "ipywidgets", "torch"])
    assert not any(loaded.values()), loaded
