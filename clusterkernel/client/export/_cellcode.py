"""One notebook cell as plain Python for a batch job (client side; see ``export``).

IPython's own input transformer turns the cell into Python; what it made of IPython
syntax is then kept (``!cmd`` runs in a shell), dropped (magics that mean nothing
in a batch job), or refused with an error naming the cell and line.

Example::

    rank_cell("cell 3", "--ranks 0", "!hostname\\nprint(1)")
    # -> "# %% cell 3: ranks 0\\nif RANK in (0,):\\n    _system('hostname')  # was: ..."
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shlex
import tokenize
from typing import cast

from clusterkernel.protocol._errors import ClusterkernelError

# %mpi subcommands that mean nothing in a batch job (push is carried over instead).
_CLIENT_ONLY = {"start", "stop", "restart", "status", "dashboard", "timeout", "on", "off"}
_CLIENT_ONLY |= {"pull", "export", "torch-reinit"}


class ExportError(ClusterkernelError, ValueError):
    """The notebook cannot become a batch job as it is; the message says what to change."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ExportError(f"{self.prog}: {message}")


_cell_parser = _Parser(prog="%%mpi", add_help=False)
_cell_parser.add_argument("--ranks")
_cell_parser.add_argument("--timeout")
_cell_parser.add_argument("--noblock", action="store_true")
_cell_parser.add_argument("--dashboard", action="store_true")
_cell_parser.add_argument("--profile", nargs="?", const="python")


def python_of(src: str) -> tuple[str, int]:
    """IPython's own translation of a cell to Python, and the blank lines it dropped on top."""
    from IPython.core.inputtransformer2 import TransformerManager

    lines = src.split("\n")
    top = next((i for i, line in enumerate(lines) if line.strip()), 0)
    return TransformerManager().transform_cell(src), top


def ipy_call(node: ast.AST) -> tuple[str, list, ast.AST] | None:
    """``get_ipython().method(args)`` -> (method, constant args, the get_ipython() call)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    inner = node.func.value
    if isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "get_ipython":
        return node.func.attr, [getattr(a, "value", None) for a in node.args], inner
    return None


def _as_typed(method: str, args: list) -> str:
    """The IPython syntax a user typed, rebuilt from its translation."""
    if method == "run_line_magic":
        return f"%{args[0]} {args[1]}".strip()
    if method == "run_cell_magic":
        return f"%%{args[0]} {args[1]}".strip()
    return f"!{args[0]}" if method in ("system", "getoutput") else f"get_ipython().{method}"


def _batch_noop(method: str, args: list) -> bool:
    """Magics that mean nothing in a batch job: dropped, not left to fail."""
    if method != "run_line_magic" or not all(isinstance(a, str) for a in args[:2]):
        return False
    name, line = args[0], args[1].strip()
    sub = (line.split() or [""])[0]
    if name == "load_ext":
        return line == "clusterkernel"
    return name == "matplotlib" or (name == "mpi" and sub in _CLIENT_ONLY)


def _plain(where: str, body: str, first_line: int) -> str:
    """A rank cell's code as plain Python: ``!cmd`` runs in a shell, other magics are errors."""
    code, top = python_of(body)
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise ExportError(f"{where}, line {first_line + top + (e.lineno or 1)}: {e.msg}") from None
    calls = {id(c[2]): c for c in map(ipy_call, ast.walk(tree)) if c}
    lines, edits, done = code.split("\n"), [], set()
    for node in ast.walk(tree):
        call = ipy_call(node.value) if isinstance(node, ast.Expr) else None
        if call and call[0] == "system" and isinstance(call[1][0], str):
            if re.search(r"\{[^}\s]+\}", call[1][0]):
                raise ExportError(
                    f"{where}: !{call[1][0]}: IPython fills in {{expression}} from Python; a "
                    'script cannot. Write subprocess.run(f"...", shell=True) in the notebook.'
                )
            new = f"_system({call[1][0]!r})  # was: !{call[1][0]}"
        elif call and _batch_noop(call[0], call[1]):
            new = f"pass  # dropped (nothing to do in a batch job): {_as_typed(*call[:2])}"
        else:
            continue
        stmt = cast(ast.Expr, node)  # ipy_call matched its value
        edits.append((stmt.lineno, stmt.end_lineno, " " * stmt.col_offset + new))
        done.add(id(call[2]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "get_ipython":
            if id(node) not in done:
                typed = _as_typed(*calls[id(node)][:2]) if id(node) in calls else "get_ipython()"
                raise ExportError(
                    f"{where}, line {first_line + top + node.lineno}: {typed!r} is IPython syntax "
                    "that a plain Python script cannot run. Rewrite it as Python (or remove it) "
                    "in the notebook and export again."
                )
    for start, end, new in sorted(edits, reverse=True):
        lines[start - 1 : end] = [new]
    return "\n".join(lines).strip("\n")


def _indent(code: str) -> str:
    """Indent a block, except lines inside a multi-line string (that would change the string)."""
    keep: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(code + "\n").readline):
        keep.update(range(tok.start[0] + 1, tok.end[0] + 1))
    rows = code.split("\n")
    return "\n".join(r if i in keep or not r.strip() else "    " + r for i, r in enumerate(rows, 1))


def rank_cell(where: str, options: str | None, body: str) -> str:
    """A rank cell (``%%mpi options`` + body; options None for a ``%mpi on`` cell) as code.

    ``--ranks`` becomes ``if RANK in (...):``; ``--timeout``/``--noblock``/``--dashboard``
    are dropped with a comment, and so is ``--profile`` (``export --profile`` profiles
    the whole job). Raises :class:`ExportError` naming ``where``.
    """
    try:
        opts = _cell_parser.parse_args(shlex.split(options or ""))
    except ValueError as e:  # ExportError from the parser, or shlex
        raise ExportError(f"{where}: {e}") from None
    head = f"# %% {where}: all ranks"
    ranks = None
    if opts.ranks is not None:
        try:
            ranks = tuple(sorted({int(r) for r in opts.ranks.split(",") if r.strip()}))
            if not ranks or min(ranks) < 0:
                raise ValueError
        except ValueError:
            raise ExportError(
                f"{where}: --ranks takes ranks like 0,2; got {opts.ranks!r}"
            ) from None
        head = f"# %% {where}: ranks {', '.join(map(str, ranks))}"
    dropped = [f"--{k}" for k in ("timeout", "noblock", "dashboard") if getattr(opts, k)]
    if dropped:
        head += f"\n# ({' '.join(dropped)} dropped: no watchdog or dashboard in a batch job)"
    if opts.profile:
        head += "\n# (--profile dropped: export with --profile to profile the whole job)"
    code = _plain(where, body, 1 if options is not None else 0) or "pass"
    if ranks:
        code = f"if RANK in {ranks!r}:\n{_indent(code)}"
    return f"{head}\n{code}"
