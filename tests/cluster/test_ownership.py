"""Cluster owns its state (issue 28 item 1), through its parts (issue 37 item 5), read from
the source: outside ``client/cluster/_cluster.py`` no module writes a Cluster's fields or
reaches for its private names, but for the dashboard's port; each part of it (``PARTS``)
owns its own fields, which no other module, Cluster's included, writes or reads; and the
cluster's helpers do not change it.

What the cluster package's docstring says about who calls whom, checked where a
test can: it parses the code (no cluster is started).
"""

from __future__ import annotations

import ast
from pathlib import Path

import clusterkernel

PACKAGE = Path(clusterkernel.__file__).resolve().parent
OWNER = PACKAGE / "client" / "cluster" / "_cluster.py"
# what a Dashboard tells its cluster (its streams start, it closes) and asks of it (its
# receiver): documented in Cluster and the cluster package's docstring
DASHBOARD_PORT = {"_dashboard_streaming", "_dashboard_closed", "_dashboard_receiver"}
# public settings a caller may set (``%mpi timeout`` sets the watchdog)
SETTINGS = {"timeout"}
# the parts Cluster holds, each the owner of one piece of its state: {module: class}
PARTS = {
    "client/cluster/_rankmap.py": "RankMap",
    "client/cluster/_health.py": "RankHealth",
    "client/cluster/_keep_state.py": "Keeping",
    "client/cluster/_dashboard_port.py": "DashboardPort",
    "client/cluster/_cells.py": "Cells",
    "client/cluster/_status.py": "RankStatus",
}
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


def _fields(module: str, cls: str) -> set[str]:
    """The fields class ``cls`` of ``module`` sets on itself (``self.x = ...``)."""
    tree = ast.parse((PACKAGE / module).read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.ctx, ast.Store)
        and isinstance(sub.value, ast.Name)
        and sub.value.id == "self"
    }


def test_each_part_owns_its_fields():
    """A part's fields are private, and only its own methods touch them (``self.x``): no
    other module, not Cluster's nor another part's, writes or reads them; they change
    through the part's methods and are read through its properties. (By name: any
    ``obj._field`` of a part's field names in the client, ``self._x`` of other classes
    being their own.)"""
    public = {f"{m}: {f}" for m, c in PARTS.items() for f in _fields(m, c) if f[0] != "_"}
    assert public == set()
    found = set()
    for module, cls in PARTS.items():
        fields = _fields(module, cls)
        assert fields, f"{module}: {cls} holds nothing"
        for path in sorted((PACKAGE / "client").rglob("*.py")):
            where = str(path.relative_to(PACKAGE))
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and node.attr in fields):
                    continue
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    continue  # a class's own field (the part's, in its module)
                found.add(f"{where}:{node.lineno}: {ast.unparse(node)} ({cls}'s)")
    assert found == set()


def test_the_cluster_holds_its_parts():
    """Cluster makes each part once and keeps it (the façade's fields), and hands no part to
    anyone but the part that needs another (``Cells``: the rank map its faults go to)."""
    fields = _fields("client/cluster/_cluster.py", "Cluster")
    assert {"_ranks", "_keeping", "_port", "_cells", "_status"} <= fields
    assert not fields & {"_engines", "_health", "_dashboard", "_cell_label", "replaced"}


def test_the_cluster_tells_its_dashboard_only_through_its_callback():
    """The cluster's side of the dashboard: the port (and a cell, which shows it) call only
    a Dashboard's public methods; what ended is said through the callback it gave."""
    names = set()
    for module in ("_cluster.py", "_dashboard_port.py", "_cells.py"):
        tree = ast.parse((OWNER.parent / module).read_text())
        names |= {
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


def test_the_rank_map_answers_for_no_ranks_and_keeps_why_they_went():
    from clusterkernel.client.cluster._rankmap import RankMap

    ranks = RankMap()
    assert (ranks.running, ranks.ranks, ranks.engine_of, ranks.live_ranks(None)) == (
        False, [], {}, [],
    )  # fmt: skip
    ranks.mark_lost("The MPI job ended: rank 1 died.")
    ranks.mark_dead([1], "x")
    ranks.dead[2] = "edited from outside"  # a copy
    ranks.stop()  # nothing runs: stops nothing, forgets the dead, keeps why the set went
    assert (ranks.lost, ranks.dead, ranks.job_output(), ranks.processes()) == (
        "The MPI job ended: rank 1 died.", {}, "", [],
    )  # fmt: skip


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
    never a private module (``_kept_records``) or name of it."""
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
