"""The package's layers, read from its source: who imports whom, and no circles.

The rank-side libraries users import in their cells (``comm``, ``torchdist``,
``metrics``, ``train``, ``partition``, ``data``) stand below ``rank/``, the engine's
glue: what they need of the engine is registered in ``protocol/_engine`` by ``rank/``,
never imported from it. ``metrics`` stands below ``torchdist`` (torchdist attaches its
DDP watcher to metrics, ``metrics/_attached``); each layer (:data:`RANK_LAYERS`) imports
only from itself and those below. And no module imports itself round a
circle: each import is read from the source with :mod:`ast`, those inside functions
too (they run when the function does), those under ``if TYPE_CHECKING:`` not (they
never run). A package's ``__init__`` importing its own children to re-export them is
not a circle; a child importing a name of its package's ``__init__`` is an edge to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import clusterkernel

PACKAGE = Path(clusterkernel.__file__).parent
RANK_LIBRARIES = ["comm", "torchdist", "metrics", "train", "partition", "data"]
# the rank side, bottom up: each imports only from its own layer and those below it
RANK_LAYERS = ["protocol", "metrics", "torchdist", "comm", "partition", "data", "train", "rank"]
# circles being taken apart by other work, by a name that work knows; delete an entry
# with that work. A circle found is allowed only if all its modules are in one entry.
# (none now: the launch code's settings/launchers/batch circle went with client/launch)
KNOWN_CIRCLES: dict[str, set[str]] = {}


def modules(root: Path) -> dict[str, Path]:
    """``{dotted name: file}`` of every module under the package folder ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(name: str, path: Path, known: dict[str, Path]) -> set[tuple[str, int]]:
    """``(module, line)`` for each of the package's modules ``name`` imports at run time."""
    top = name.split(".")[0]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[tuple[str, int]] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    walk(other)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == top:
                        found.add((resolve(alias.name), child.lineno))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                if base.split(".")[0] == top:
                    for alias in child.names:
                        sub = f"{base}.{alias.name}"
                        found.add((sub if sub in known else resolve(base), child.lineno))
            walk(child)

    walk(ast.parse(path.read_text(), filename=str(path)))
    return {(t, line) for t, line in found if t is not None and t != name}


def graph(root: Path) -> dict[str, dict[str, int]]:
    """``{module: {module it imports: first line}}``, a package's ``__init__`` importing
    its own children left out (a re-export)."""
    known = modules(root)
    out: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges: dict[str, int] = {}
        for target, line in sorted(imports(name, path, known), key=lambda e: e[1]):
            if path.name == "__init__.py" and target.startswith(name + "."):
                continue
            edges.setdefault(target, line)
        out[name] = edges
    return out


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges.get(target, {}))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


def _said(edges: dict[str, dict[str, int]], group: list[str]) -> str:
    inside = set(group)
    return "; ".join(
        f"{m} -> {t} (line {line})" for m in group for t, line in edges[m].items() if t in inside
    )


def _under(name: str, folders: list[str]) -> bool:
    return any(
        name == f"clusterkernel.{f}" or name.startswith(f"clusterkernel.{f}.") for f in folders
    )


def test_rank_libraries_never_import_the_engine_glue_or_the_notebook():
    edges = graph(PACKAGE)
    up = [
        f"{m}:{line} imports {t}"
        for m, targets in edges.items()
        if _under(m, RANK_LIBRARIES)
        for t, line in targets.items()
        if _under(t, ["rank", "client"])
    ]
    assert up == [], "\n".join(up)


def test_metrics_does_not_import_torchdist():
    edges = graph(PACKAGE)
    found = [
        f"{m}:{line} imports {t}"
        for m, targets in edges.items()
        if _under(m, ["metrics"])
        for t, line in targets.items()
        if _under(t, ["torchdist"])
    ]
    assert found == [], "\n".join(found)


def test_rank_side_layers_import_only_downwards():
    edges = graph(PACKAGE)
    layer = {f"clusterkernel.{name}": i for i, name in enumerate(RANK_LAYERS)}

    def of(module: str) -> int | None:
        return layer.get(".".join(module.split(".")[:2]))

    up = [
        f"{m}:{line} imports {t}"
        for m, targets in edges.items()
        if of(m) is not None
        for t, line in targets.items()
        if of(t) is not None and of(t) > of(m)
    ]
    assert up == [], "\n".join(up)


def test_no_import_circle():
    edges = graph(PACKAGE)
    assert len(edges) > 150 and sum(map(len, edges.values())) > 400  # it read the package
    stale = {
        k: sorted(set(ms) - set(edges)) for k, ms in KNOWN_CIRCLES.items() if set(ms) - set(edges)
    }
    assert stale == {}, f"modules gone: delete or update these KNOWN_CIRCLES entries: {stale}"
    new = [
        _said(edges, group)
        for group in circles(edges)
        if not any(set(group) <= known for known in KNOWN_CIRCLES.values())
    ]
    assert new == [], "\n".join(new)


def test_the_checks_find_a_circle_and_an_import_up(tmp_path):
    pkg = tmp_path / "clusterkernel"
    files = {
        "__init__.py": "from clusterkernel import comm\n",  # a re-export: no circle
        "comm/__init__.py": "from clusterkernel.comm._groups import Group\n",
        "comm/_groups.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from clusterkernel.rank import _engine\n"
            "class Group:\n    pass\n"
        ),
        "metrics/__init__.py": "def recorder():\n    from clusterkernel.torchdist import _ddp\n",
        "torchdist/__init__.py": "",
        "torchdist/_ddp.py": "from clusterkernel import metrics\n",
        "rank/__init__.py": "",
        "rank/_engine.py": "from ..comm import _groups\n",
        "train/_fit.py": "from ..rank import _engine\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    edges = graph(pkg)
    assert circles(edges) == [["clusterkernel.metrics", "clusterkernel.torchdist._ddp"]]
    assert edges["clusterkernel.train._fit"] == {"clusterkernel.rank._engine": 1}
    assert edges["clusterkernel.comm._groups"] == {}  # TYPE_CHECKING never runs
    assert edges["clusterkernel.rank._engine"] == {"clusterkernel.comm._groups": 1}
