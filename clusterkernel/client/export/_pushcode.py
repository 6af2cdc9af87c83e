"""``%mpi push`` as code that every rank of a batch job runs (client side; see ``export``).

Exported from the live notebook, a pushed value is written into the script: as a
literal when its ``repr`` reads back equal, else pickled (protocol 5) in base64. A
function or class the notebook defined (a pickle holds only its name) or a value that
cannot be pickled (a lambda) is written as its source (:func:`inspect.getsource`);
without one (a closure, a lock) it is left out with a comment saying why: a value
never stops the export.
Exported from a file, ``push x=expr`` becomes ``x = expr`` and ``push x`` replays
the notebook's own earlier top-level statements that assign ``x`` (and what those
need); with none, the export fails and says what to write instead.

Example::

    push_block("cell 2", "x", {"x": [1, 2]}, [])   # '# %% cell 2: %mpi push x\\nx = [1, 2]'
"""

from __future__ import annotations

import ast
import base64
import builtins
import inspect
import pickle
import pickletools
import shlex
import textwrap
import types
from typing import cast

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
    items: list[tuple[str, str | None]]
    if "=" in rest:
        name, _, expr = rest.partition("=")
        items = [(name.strip(), expr.strip())]
    else:
        items = [(name, None) for name in shlex.split(rest)]
    if not items or not all(name.isidentifier() for name, _ in items):
        raise ExportError(f"{where}: %mpi push takes names or name=expression; got {rest!r}")
    return items


def _main_refs(blob: bytes) -> bool:
    """Whether a pickle names something of ``__main__`` (the notebook's own functions and
    classes are pickled by name only: a job has no such names when it loads them)."""
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(blob):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                strings.append(cast(str, arg))  # these ops carry a str
            elif op.name == "STACK_GLOBAL" and strings[-2:-1] == ["__main__"]:
                return True
            elif op.name in ("GLOBAL", "INST") and str(arg).startswith("__main__ "):
                return True
    except Exception:
        return False
    return False


def _source_def(name: str, value) -> tuple[str | None, str]:
    """``value`` (a function or class) as source that makes ``name``, via
    :func:`inspect.getsource`: (code, a note on what it reads) or (None, why not)."""
    if not (inspect.isfunction(value) or inspect.isclass(value)):
        return None, "it has no source"
    if getattr(getattr(value, "__code__", None), "co_freevars", ()):
        return None, "it is a closure: its source cannot carry the values it closes over"
    try:
        text = textwrap.dedent(inspect.getsource(value))
        tree = ast.parse(text)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None, "inspect.getsource finds no source for it"
    node: ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    if value.__name__ == "<lambda>":
        arity = cast(types.FunctionType, value).__code__.co_argcount
        found = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Lambda) and len(node.args.args) == arity
        ]
        if len(found) != 1:
            return None, "its line holds more than one lambda like it"
        node = found[0]
        code = f"{name} = {ast.get_source_segment(text, node)}"
    else:
        defs = [
            n
            for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.name == value.__name__
        ]
        if len(defs) != 1:
            return None, "inspect.getsource gives no definition of it"
        node = defs[0]
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        code = "\n".join(text.splitlines()[start - 1 : node.end_lineno])
        if value.__name__ != name:
            code += f"\n{name} = {value.__name__}"
    params = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    reads = _names(node, ast.Load) - _names(node, ast.Store) - params - set(dir(builtins))
    note = (
        f"; it reads {', '.join(sorted(reads))}, which the ranks must have when it runs"
        if reads
        else ""
    )
    return code, note


def _embed(name: str, value) -> str:
    """``name = <value>``: a literal when repr round-trips, else a pickle in base64; a
    function or class of the notebook (or one that cannot be pickled) as its source;
    anything else that cannot be pickled left out, with a comment saying so."""
    text = repr(value)
    try:
        back = ast.literal_eval(text)
        if type(back) is type(value) and back == value:
            return f"{name} = {text}"
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    module = type(value).__module__
    kind = (
        type(value).__qualname__ if module == "builtins" else f"{module}.{type(value).__qualname__}"
    )
    try:
        blob = pickle.dumps(value, protocol=5)
        why = "a pickle of it holds only names the notebook defined" if _main_refs(blob) else ""
    except Exception as e:
        blob, why = b"", f"it cannot be pickled: {e}"
    if why:
        code, note = _source_def(name, value)
        if code is not None:
            return _comment(f"{name}: a {kind}, written as its source ({why}){note}.") + code
        return _comment(
            f"{name}: left out, a {kind}: {why}, and {note}. Cells of the job that use {name} "
            f"fail; in the notebook, %mpi push {name}=<expression that makes it>."
        ).rstrip("\n")
    chunks = "\n".join(f'    "{c}"' for c in _chunks(base64.b64encode(blob).decode()))
    return (
        f"# {name}: a {kind}, pickled (protocol 5) from the notebook at export time\n"
        f"import base64\nimport pickle\n\n{name} = pickle.loads(base64.b64decode(\n{chunks}\n))"
    )


def _comment(text: str) -> str:
    """``text`` as comment lines of at most 88 characters, each ending in a newline."""
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, 86, break_long_words=False))


def _chunks(text: str, size: int = 88) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


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
