"""The two sides stay apart: the notebook never loads mpi4py, a rank never loads widgets.

The folders name the sides: ``clusterkernel/client/`` runs in the notebook,
``clusterkernel/rank/`` and the rank-side packages users import in their cells
(``comm``, ``metrics``, ...) run on the ranks, and ``clusterkernel/protocol/`` is what
both know. Every module under a client folder is imported in one process, every
module under a rank folder in another, so a new module in either folder is checked
without being listed here; neither side loads a module of the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import clusterkernel

# client side: runs in the notebook (kernel.py, the MPI kernel, included)
CLIENT = ["client"]
# rank side: runs on the ranks. rank/ is the engine's own runtime; the others keep
# their top-level paths because users import them in %%mpi cells.
# (rank/_job_prelude is a script an exported job runs, not imported)
ENGINE = ["rank", "comm", "metrics", "partition", "data", "train", "torchdist"]
SEAM = ["protocol"]
# the package's entry points (lazy public names, the command line) and the notebooks
ENTRY = ["__init__", "__main__", "notebooks", "kernel"]  # kernel: old kernelspecs' module
# the old paths of client modules, kept for one release so users' imports keep working:
# each forwards to its client/ module with a DeprecationWarning (tests/cluster/test_old_paths.py)
SHIMS = ["magics", "mpiexec", "export", "dashboard", "cluster"]
_NOT_IMPORTED = {"clusterkernel.rank._job_prelude"}


def _prefixes(names: list[str]) -> list[str]:
    return ["clusterkernel." + name for name in names]


def _loaded(names: list[str], modules: list[str], imports: str = "") -> dict[str, object]:
    """Import every module under ``names`` in a fresh process.

    Returns which of ``modules`` were loaded (True/False) and, under ``"_modules"``,
    the names of every clusterkernel module that process loaded.
    """
    code = (
        "import importlib, json, pkgutil, sys\n"
        f"{imports}\n"
        f"for name in {names!r}:\n"
        "    m = importlib.import_module('clusterkernel.' + name)\n"
        "    for sub in pkgutil.walk_packages(getattr(m, '__path__', []), m.__name__ + '.'):\n"
        f"        if sub.name not in {sorted(_NOT_IMPORTED)!r}:\n"
        "            importlib.import_module(sub.name)\n"
        "ours = sorted(n for n in sys.modules if n.startswith('clusterkernel.'))\n"
        f"print(json.dumps([ours, [m in sys.modules for m in {modules!r}]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ours, flags = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(ours) >= 2 * len(names)  # the walk imported the folders, not nothing
    return {**dict(zip(modules, flags)), "_modules": ours}


def _of(modules: list[str], names: list[str]) -> list[str]:
    """The modules among ``modules`` that live under one of the folders ``names``."""
    prefixes = _prefixes(names)
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_every_module_is_on_a_side():
    """A new top-level module or folder must say which side it runs on."""
    package = Path(clusterkernel.__file__).parent
    top = {p.stem for p in package.iterdir() if p.name != "__pycache__" and p.suffix in ("", ".py")}
    sides = {*CLIENT, *ENGINE, *SEAM, *ENTRY, *SHIMS}
    assert top == sides, top ^ sides


def test_client_side_never_imports_mpi4py():
    loaded = _loaded(
        CLIENT,
        [
            "mpi4py",
            "ipyparallel",
            "clusterkernel.client.kernel",
            "clusterkernel.client.cluster.runner",
            "clusterkernel.client.debug._prompt",
            "clusterkernel.client.output._rank_output",
        ],
        "import clusterkernel\nfrom clusterkernel import Cluster, Dashboard",
    )
    modules = loaded.pop("_modules")
    assert loaded == {
        "mpi4py": False,
        "ipyparallel": True,
        "clusterkernel.client.kernel": True,
        "clusterkernel.client.cluster.runner": True,
        "clusterkernel.client.debug._prompt": True,
        "clusterkernel.client.output._rank_output": True,
    }
    # not even a module of the rank side: the notebook names rank-side functions
    # (protocol._rank_call) and requests (protocol._names), it never imports them
    assert _of(modules, ENGINE) == []


def test_engine_side_never_imports_display_machinery():
    loaded = _loaded(
        ENGINE,
        ["mpi4py", "ipywidgets", "IPython.display", "anywidget", "clusterkernel.metrics._stream"],
        "from clusterkernel import comm, metrics, partition, data, train, log",
    )
    modules = loaded.pop("_modules")
    assert loaded["mpi4py"] and loaded["clusterkernel.metrics._stream"]
    assert not loaded["ipywidgets"] and not loaded["IPython.display"] and not loaded["anywidget"]
    assert _of(modules, CLIENT) == []


def test_the_seam_belongs_to_neither_side():
    loaded = _loaded(SEAM, ["mpi4py", "ipyparallel", "ipywidgets", "torch"])
    modules = loaded.pop("_modules")
    assert not any(loaded.values()), loaded
    assert _of(modules, CLIENT + ENGINE) == []


# Issue 37 item 3: a call's records have one constructor, its plan (comm/_plan.py).
# Who may build each record, read from the source (a new module that builds one fails).
_RECORD_BUILDERS = {
    "Call": {"comm/_plan.py"},  # a call's timing record fields and flight entry (_handle.Call)
    "Sig": {"comm/_plan.py"},  # a call's check signature
    "record": {"comm/_begin.py"},  # FLIGHT.record: a flight entry (enter, step_entry)
    "_write": {"comm/_ledger.py"},  # the recorder ring's write: timing records (ledger.close)
    "_write_codes": {"comm/_ledger.py"},  # the same with the plan's codes (ledger.close_plan)
    "_c_write": {"comm/_ledger.py"},  # the same rows written by the C extension's writer
    "timing": set(),  # Recorder.timing: a user's own records, never comm's
}


def test_records_are_built_only_by_the_plan():
    import ast

    package = Path(clusterkernel.__file__).parent
    found: dict[str, set[str]] = {name: set() for name in _RECORD_BUILDERS}
    for path in sorted((package / "comm").rglob("*.py")):
        where = str(path.relative_to(package))
        for node in ast.walk(ast.parse(path.read_text(), where)):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
            if name in found:
                found[name].add(where)
            for arg in node.args:  # tuple.__new__(Call, ...): a Call made as a tuple
                if isinstance(arg, ast.Name) and arg.id in ("Call", "Sig"):
                    found[arg.id].add(where)
    assert found == _RECORD_BUILDERS


def test_the_c_path_reads_admission_from_the_plan():
    """_fast.c holds no admission rule (issue 37): it reads ``plan.fast`` and its stamp,
    never the check mode, forced staging or a group's agreed set, which comm/_plan.py
    turns into that answer."""
    source = (Path(clusterkernel.__file__).parent / "comm" / "_fast.c").read_text()
    rule_inputs = ('"force"', '"agreed"', '"_sig_gen"', '"new"', '"_sigs"', "is_conj")
    assert [word for word in rule_inputs if word in source] == []
    assert '"fast"' in source and '"stamp"' in source


# Issue 37 item 1: a scheduler is one class (clusterkernel/client/scheduler/_NAME.py).
def test_no_scheduler_command_outside_its_scheduler_class():
    """No module but a scheduler's own names one of its programs (``scancel``, ``qsub``)
    or writes one of its directives (``#SBATCH``, ``#$``) as a string: the guard, the job
    report, keep/attach, export and the magics ask the scheduler's class."""
    import ast

    from clusterkernel.client import scheduler

    package = Path(clusterkernel.__file__).parent
    owned = {}
    for system in scheduler.schedulers().values():
        assert system.commands, f"{system.__name__} lists no commands"
        owned.update(dict.fromkeys(system.commands, system))
        owned[system.prefix + " "] = system
    found = []
    for path in sorted(package.rglob("*.py")):
        where = str(path.relative_to(package))
        tree = ast.parse(path.read_text(), where)
        docs = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            if id(node) in docs:
                continue
            text = node.value.strip()
            for name, system in owned.items():
                module = system.__module__.rsplit(".", 1)[-1] + ".py"
                if where == f"client/scheduler/{module}":
                    continue
                said = (
                    text.startswith(name)
                    if name.endswith(" ")
                    else (text == name or text.startswith(name + " "))
                )
                if said:
                    found.append(f"{where}:{node.lineno}: {name.strip()!r}")
    assert not found, found
