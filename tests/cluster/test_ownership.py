"""Cluster owns its state (issue 28 item 1), read from the source: outside
``client/cluster/_cluster.py`` no module writes a Cluster's fields or reaches for its private
names, but for the dashboard's port; and the cluster's helpers do not change it.

What the cluster package's docstring says about who calls whom, checked where a
test can: it parses the code (no cluster is started).
"""

from __future__ import annotations

import ast
from pathlib import Path

import clusterkernel

PACKAGE = Path(clusterkernel.__file__).resolve().parent
OWNER = PACKAGE / "client" / "cluster" / "_cluster.py"
# what a Dashboard tells its cluster (its streams start, it closes): documented in
# Cluster and the cluster package's docstring
DASHBOARD_PORT = {"_dashboard_streaming", "_dashboard_closed"}
# public settings a caller may set (``%mpi timeout`` sets the watchdog)
SETTINGS = {"timeout"}
# what Cluster's own reports and actions are; its helpers must not call them
CHANGES = {"mark_lost", "mark_dead", "restart", "start", "stop", "detach"}


def _is_cluster(node: ast.AST) -> bool:
    """``cluster``, ``self.cluster``, ``self._cluster``: a name for a Cluster."""
    if isinstance(node, ast.Name):
        return node.id == "cluster"
    return isinstance(node, ast.Attribute) and node.attr in ("cluster", "_cluster")


def _reaches() -> dict[str, set[str]]:
    """``{module: {"write x", "private _x", "calls y"}}`` for every module but the owner."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == OWNER:
            continue
        tree = ast.parse(path.read_text(), str(path))
        here = found.setdefault(str(path.relative_to(PACKAGE)), set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_cluster(node.value):
                if isinstance(node.ctx, (ast.Store, ast.Del)):
                    here.add(f"write {node.attr}")
                elif node.attr.startswith("_") and not node.attr.startswith("__"):
                    here.add(f"private {node.attr}")
                if node.attr in CHANGES:
                    here.add(f"calls {node.attr}")
            # cluster.dead[r] = ..., cluster.rank_info.update(...): editing what it holds
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Attribute) and _is_cluster(node.value.value):
                    here.add(f"write {node.value.attr}[]")
    return {m: r for m, r in found.items() if r}


def test_only_the_cluster_changes_its_state():
    reaches = _reaches()
    writes = {m: {r for r in rs if r.startswith("write")} for m, rs in reaches.items()}
    assert {m: w for m, w in writes.items() if w} == {
        "client/magics/_subcommands.py": {f"write {s}" for s in SETTINGS}
    }


def test_private_names_only_through_the_dashboard_port():
    reaches = _reaches()
    private = {m: {r for r in rs if r.startswith("private")} for m, rs in reaches.items()}
    assert {m: p for m, p in private.items() if p} == {
        "client/dashboard/_dashboard.py": {f"private {name}" for name in DASHBOARD_PORT}
    }


def test_helpers_report_and_the_cluster_acts():
    """The cell run, the fault reports and the debugger never restart or mark the cluster:
    the run reports through ``CellFaults``; only the user's commands (the magics) do."""
    calls = {m: {r for r in rs if r.startswith("calls")} for m, rs in _reaches().items()}
    assert {m: c for m, c in calls.items() if c and not m.startswith("client/magics/")} == {}


def test_the_cluster_tells_its_dashboard_only_through_its_callback():
    tree = ast.parse(OWNER.read_text())
    names = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("dash", "old")
    }
    assert names <= {"closed", "attach", "show", "cell_finished"}, names


def test_rank_health_keeps_first_causes_and_only_its_owner_clears_it():
    from clusterkernel.client.cluster._health import RankHealth

    health = RankHealth()
    health.ranks_died([2], "its process exited")
    health.ranks_died([2, 3], "its process exited between cells")
    assert health.dead == {2: "its process exited", 3: "its process exited between cells"}
    health.dead[4] = "edited from outside"  # a copy: the bookkeeping is not changed
    assert not health.is_dead(4)
    health.job_ended("The MPI job ended: rank 1 died.")
    health.forgotten()  # stopped: no dead ranks, the reason the set went stays
    assert (health.lost, health.dead) == ("The MPI job ended: rank 1 died.", {})
    health.ranks_died([1], "x")
    health.started()
    assert (health.lost, health.dead) == (None, {1: "x"})
    health.restarted()
    assert (health.lost, health.dead) == (None, {})


def _imports(path: Path, annotations: bool = True) -> list[str]:
    """Every module ``path`` imports, lazy imports inside functions included (``from a
    import b`` counts as ``a`` and ``a.b``); ``annotations=False`` leaves out the
    ``if TYPE_CHECKING:`` blocks (no import when the code runs)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = set()
    if not annotations:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                skip |= {id(sub) for stmt in node.body for sub in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            out += [f"{node.module}.{alias.name}" for alias in node.names]
    return out


def test_the_dashboard_and_the_debugger_never_import_the_cluster():
    """Issue 37 item 5: one way, cluster -> dashboard and debug. They are handed the cluster
    (their own protocols type it) and what they call (the debugger's ``ask``). An import
    for annotations only (``TYPE_CHECKING``) makes no cycle; better a protocol."""
    found = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for folder in ("dashboard", "debug")
        for path in sorted((PACKAGE / "client" / folder).rglob("*.py"))
        for name in _imports(path, annotations=False)
        if name == "clusterkernel.client.cluster"
        or name.startswith("clusterkernel.client.cluster.")
    }
    assert found == set()


def test_loading_the_dashboard_and_the_debugger_loads_no_cluster_module():
    """The same, as run: nothing they load, themselves or through another package
    (``client.profile``...), loads ``clusterkernel.client.cluster``."""
    import subprocess
    import sys

    code = (
        "import sys, clusterkernel.client.dashboard, clusterkernel.client.debug._breakpoints\n"
        "import clusterkernel.client.debug._prompt\n"
        "print(sorted(m for m in sys.modules if m.startswith('clusterkernel.client.cluster')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_magics_use_the_cluster_package_s_public_names_only():
    """The magics import from ``clusterkernel.client.cluster`` what its ``__all__`` exports,
    never a private module (``_keep``) or name of it."""
    from clusterkernel.client import cluster

    found = set()
    for path in sorted((PACKAGE / "client" / "magics").rglob("*.py")):
        for name in _imports(path):
            if not name.startswith("clusterkernel.client.cluster"):
                continue
            tail = name.removeprefix("clusterkernel.client.cluster").lstrip(".")
            if tail and (tail.startswith("_") or tail.split(".")[0] not in cluster.__all__):
                found.add(f"{path.relative_to(PACKAGE)}: {name}")
    assert found == set()
