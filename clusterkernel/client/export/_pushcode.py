"""``%mpi push`` as code that every rank of a batch job runs (client side; see ``export``).

Exported from the live notebook, a pushed value is written into the script: as a
literal when its ``repr`` reads back equal, else pickled (protocol 5) in base64.
Exported from a file, ``push x=expr`` becomes ``x = expr`` and ``push x`` replays
the notebook's own earlier top-level statements that assign ``x`` (and what those
need); with none, the export fails and says what to write instead.

Example::

    push_block("cell 2", "x", {"x": [1, 2]}, [])   # '# %% cell 2: %mpi push x\\nx = [1, 2]'
"""

from __future__ import annotations

import ast
import base64
import pickle
import shlex

from clusterkernel.client.export._cellcode import ExportError


def _names(stmt: ast.AST, ctx: type) -> set[str]:
    """Names a statement binds (ctx=ast.Store; also what it subscripts) or reads (ast.Load)."""
    found = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ctx):
            found.add(node.id)
        elif ctx is ast.Store and isinstance(node, (ast.Subscript, ast.Attribute)):
            base = node.value
            if isinstance(node.ctx, ast.Store) and isinstance(base, ast.Name):
                found.add(base.id)
        elif ctx is ast.Store and isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif ctx is ast.Store and isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.add(node.name)
    return found


def _replay(needed: set[str], history: list[tuple[str, ast.stmt]]) -> list[str]:
    """Earlier client statements that make ``needed``, and what those need, in order."""
    picked: list[str] = []
    for code, stmt in reversed(history):
        if _names(stmt, ast.Store) & needed:
            picked.append(ast.get_source_segment(code, stmt) or ast.unparse(stmt))
            needed |= _names(stmt, ast.Load)
    return picked[::-1]


def _expr_names(where: str, expr: str) -> set[str]:
    try:
        return _names(ast.parse(expr, mode="eval"), ast.Load)
    except SyntaxError as e:
        raise ExportError(
            f"{where}: %mpi push: {expr!r} is not a Python expression ({e.msg})"
        ) from None


def push_items(where: str, rest: str) -> list[tuple[str, str | None]]:
    """``%mpi push a b`` / ``%mpi push name=expr`` as [(name, expr or None)], as the magic reads it."""
    if "=" in rest:
        name, _, expr = rest.partition("=")
        items = [(name.strip(), expr.strip())]
    else:
        items = [(name, None) for name in shlex.split(rest)]
    if not items or not all(name.isidentifier() for name, _ in items):
        raise ExportError(f"{where}: %mpi push takes names or name=expression; got {rest!r}")
    return items


def _embed(name: str, value) -> str:
    """``name = <value>``: a literal when repr round-trips, else a pickle in base64."""
    text = repr(value)
    try:
        back = ast.literal_eval(text)
        if type(back) is type(value) and back == value:
            return f"{name} = {text}"
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        blob = base64.b64encode(pickle.dumps(value, protocol=5)).decode()
    except Exception as e:
        raise ExportError(
            f"%mpi push {name}: its value ({type(value).__name__}) cannot be pickled ({e}); "
            f"in the notebook use %mpi push {name}=<expression that makes it>."
        ) from None
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    chunks = "\n".join(f'    "{blob[i : i + 88]}"' for i in range(0, len(blob), 88))
    return (
        f"# {name}: a {kind}, pickled (protocol 5) from the notebook at export time\n"
        f"import base64\nimport pickle\n\n{name} = pickle.loads(base64.b64decode(\n{chunks}\n))"
    )


def push_block(where: str, rest: str, pushed: dict | None, history: list) -> str:
    """A ``%mpi push`` as code every rank runs: the given values, or the notebook's own code."""
    lines = [f"# %% {where}: %mpi push {rest}"]
    for name, expr in push_items(where, rest):
        if pushed is not None:
            if name not in pushed:
                raise ExportError(f"{where}: no value given for pushed {name!r}")
            lines.append(_embed(name, pushed[name]))
            continue
        made = _replay({name} if expr is None else _expr_names(where, expr), history)
        if expr is None and not made:
            raise ExportError(
                f"{where}: %mpi push {name}: no earlier cell assigns {name}, so the script "
                f"cannot make it. In the notebook write %mpi push {name}=<expression>, or "
                "export from the live notebook with %mpi export job.py."
            )
        if any("get_ipython" in m for m in made):
            raise ExportError(f"{where}: {name} is made with IPython syntax: {made}")
        lines += made + ([f"{name} = {expr}"] if expr is not None else [])
    return "\n".join(lines)
