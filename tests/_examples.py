"""Collect the examples that users read: the ``Example`` blocks of public docstrings and
the ```python blocks of README.md and docs/*.md (``tests/test_examples.py`` runs them).

Public means reachable from the public modules' ``__all__`` (:data:`PUBLIC_MODULES`,
``clusterkernel.__all__`` first): a public module's own docstring, each public name's
docstring, and for a public class the docstrings of its public methods and properties
(and ``__init__``). A private module's docstring counts only through a public name
that it defines. Two forms of example are collected:

- a block: a paragraph that starts with ``Example`` and ends with ``::`` (``Example::``,
  ``Example (on every rank)::``), then the indented literal block under it;
- inline: ``Example: ``code````, the first double-backquoted span after ``Example:``.

Importing the rank side (``clusterkernel.comm``) initialises MPI, which a test process
must not do, so the collection runs in a child process: ``python -m tests._examples``
prints the examples as JSON and :func:`collect` reads them.

Example::

    examples, _ = collect()
    examples[0].name   # 'clusterkernel.Cluster': the first public name with an example
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import subprocess
import sys
import textwrap
import types
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the modules users import; each one's __all__ (or else its own public names) is walked
PUBLIC_MODULES = (
    "clusterkernel",
    "clusterkernel.client.cluster",
    "clusterkernel.comm",
    "clusterkernel.partition",
    "clusterkernel.data",
    "clusterkernel.train",
    "clusterkernel.train.comm_hooks",
    "clusterkernel.metrics",
    "clusterkernel.torchdist",
    "clusterkernel.client.export",
    "clusterkernel.client.dashboard",
    "clusterkernel.client.magics",
)

# the line inside an example that says it is compiled but not run, and why
NOT_RUN = re.compile(r"^[ \t]*# not run: (\S.*)$", re.M)
# a line of IPython input: a magic, which plain Python cannot compile
MAGIC = re.compile(r"^%", re.M)


@dataclass(frozen=True)
class Example:
    name: str  # the public name (``clusterkernel.comm.all_reduce``) or ``README.md:109``
    module: str  # the module that defines it (``README`` for the README's blocks)
    where: str  # the file, relative to the repository, that holds the text
    code: str

    @property
    def not_run(self) -> str | None:
        """Why the example is only compiled (its ``# not run: why`` line), else None."""
        m = NOT_RUN.search(self.code)
        return m.group(1) if m else None

    @property
    def ipython(self) -> bool:
        """The example is IPython input (``%mpi start``, ``%%mpi`` cells), not plain Python."""
        return bool(MAGIC.search(self.code))

    def cells(self) -> list[str]:
        """The example as cells: IPython examples separate notebook cells by blank lines."""
        if not self.ipython:
            return [self.code]
        return [c.strip("\n") + "\n" for c in re.split(r"\n[ \t]*\n", self.code) if c.strip()]

    def python(self) -> list[str]:
        """Each cell as the Python that IPython runs for it (magics become calls)."""
        if not self.ipython:
            return [self.code]
        from IPython.core.inputtransformer2 import TransformerManager

        return [TransformerManager().transform_cell(c) for c in self.cells()]


# ---------------------------------------------------------------- collecting


def _public_names(module: types.ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
    ]


def _members(cls: type) -> list[tuple[str, object]]:
    """A class's own public methods and properties, ``__init__`` included."""
    out = []
    for n, v in vars(cls).items():
        if n.startswith("_") and n != "__init__":
            continue
        if isinstance(v, (classmethod, staticmethod)):
            v = v.__func__
        if isinstance(v, property):
            v = v.fget
        if callable(v):
            out.append((n, v))
    return out


def public_objects() -> list[tuple[str, object]]:
    """``(public name, object)`` for every public module, name and class member, each
    object once (under the first name it is reached by)."""
    seen: set[int] = set()
    out: list[tuple[str, object]] = []

    def visit(name: str, obj: object) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        out.append((name, obj))
        if isinstance(obj, types.ModuleType):
            for n in _public_names(obj):
                visit(f"{name}.{n}", getattr(obj, n))
        elif isinstance(obj, type):
            for n, member in _members(obj):
                visit(f"{name}.{n}", member)

    for modname in PUBLIC_MODULES:
        visit(modname, importlib.import_module(modname))
    return out


_BLOCK_HEAD = re.compile(r"^([ \t]*)Example\b[^\n]*?(?:\n\1\S[^\n]*?)*::\n", re.M)
_INLINE = re.compile(r"Example:\s+``(.+?)``", re.S)


def examples_in(doc: str) -> list[str]:
    """The examples of one docstring, as source text."""
    doc = inspect.cleandoc(doc)
    found = []
    for head in _BLOCK_HEAD.finditer(doc):
        indent = len(head.group(1))
        lines = []
        for line in doc[head.end() :].split("\n"):
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            lines.append(line)
        found.append(textwrap.dedent("\n".join(lines)).strip("\n") + "\n")
    found += [m.group(1).replace("\n", " ") + "\n" for m in _INLINE.finditer(doc)]
    return found


def docstring_examples() -> list[Example]:
    out = []
    for name, obj in public_objects():
        # the object's own text only: getdoc would also show a base class's examples,
        # and a constant (``comm.SUM``) carries its type's text
        doc = obj.__doc__
        if not doc or (not isinstance(obj, type) and doc == type(obj).__doc__):
            continue
        module = obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__
        where = str(Path(sys.modules[module].__file__).resolve().relative_to(ROOT))
        for i, code in enumerate(examples_in(doc)):
            out.append(Example(name if i == 0 else f"{name}#{i + 1}", module, where, code))
    return out


def readme_examples() -> list[Example]:
    """The ```python blocks of the README and of the user docs in ``docs/``, each named
    by its file and the line of its opening fence. A block marked not run in the doc
    (``<!-- not run: why -->`` before its fence) carries that as its ``# not run`` line."""
    docs = ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]
    out = []
    for block in doc_blocks(docs):
        if block.lang == "python":
            code = block.code + (f"# not run: {block.not_run}\n" if block.not_run else "")
            out.append(Example(block.name, "README", block.where, code))
    return out


# ------------------------------------------------------ the user docs' fenced blocks

# the user docs whose every fenced block runs (tests/test_docs_run.py; the python ones
# through tests/test_examples.py); docs/ARCHITECTURE.md's blocks are diagrams
RUN_DOCS = ("README.md", "docs/GUIDE.md")
# the comment on the line before a fence that says the block is not run here, and why
NOT_RUN_NOTE = re.compile(r"^<!-- not run: (\S.*?) -->$")
# ... or which other test runs it (the set-up commands, the quick start's last command)
CHECKED_NOTE = re.compile(r"^<!-- checked by (tests/\S+\.py)\b.*-->$")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One fenced block of a user doc, where it is and what it is."""

    where: str  # the doc, relative to the repository: ``README.md``
    line: int  # the line of its opening fence
    section: str  # the ``## `` title it is under ('' above the first)
    lang: str  # ``python``, ``bash``, or '' (an IPython session: ``In [1]: ...``)
    code: str
    note: str = ""  # the HTML comment on the line before the fence

    @property
    def name(self) -> str:
        return f"{self.where}:{self.line}"

    @property
    def not_run(self) -> str | None:
        """Why the block cannot run here (``<!-- not run: why -->``), else None."""
        m = NOT_RUN_NOTE.match(self.note)
        return m.group(1) if m else None

    @property
    def checked_by(self) -> str | None:
        """The test file that runs this block (``<!-- checked by tests/x.py -->``)."""
        m = CHECKED_NOTE.match(self.note)
        return m.group(1) if m else None


def doc_blocks(docs: tuple[str, ...] | list[str] = RUN_DOCS) -> list[Block]:
    """Every fenced block of ``docs``, in document order.

    Example::

        [b.name for b in doc_blocks(["README.md"]) if b.lang == ""][0]   # 'README.md:10'
    """
    out = []
    for where in docs:
        text = (ROOT / where).read_text()
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = text[: m.start()].rstrip("\n").rpartition("\n")[2].strip()
            titles = re.findall(r"^## (.+)$", text[: m.start()], re.M)
            note = before if before.startswith("<!--") else ""
            section = titles[-1] if titles else ""
            out.append(Block(where, line, section, m.group(1), m.group(2), note))
    return out


@dataclass(frozen=True)
class Typed:
    """One input of an IPython session as a user types it, and the output shown under it."""

    where: str  # ``README.md:12``: the doc and line of its prompt
    number: int  # the ``In [N]`` number (0 where the text shows none)
    code: str  # a line, a magic, or a cell (``%%mpi`` and its body)
    shown: tuple[str, ...] = ()  # the output lines the doc shows under it


_PROMPT = re.compile(r"^In \[(\d+)\]: ?(.*)$")
_MORE = re.compile(r"^\s*\.\.\.: ?(.*)$")


def session_inputs(block: Block) -> list[Typed]:
    """An IPython-session block's inputs: ``In [N]: ...`` and its ``   ...:`` lines; the
    other lines are the output shown under the input above them.

    Example::

        b = Block("x.md", 1, "", "", "In [1]: %mpi status\nrank ...\n")
        session_inputs(b)[0].code   # '%mpi status'
    """
    out: list[Typed] = []
    for i, text in enumerate(block.code.rstrip("\n").split("\n")):
        where = f"{block.where}:{block.line + 1 + i}"
        prompt, more = _PROMPT.match(text), _MORE.match(text)
        if prompt:
            out.append(Typed(where, int(prompt.group(1)), prompt.group(2)))
        elif more and out:
            last = out[-1]
            out[-1] = Typed(last.where, last.number, f"{last.code}\n{more.group(1)}", last.shown)
        elif out:
            last = out[-1]
            out[-1] = Typed(last.where, last.number, last.code, (*last.shown, text))
        else:
            raise ValueError(f"{where}: a session block must start with an In [N]: prompt")
    return out


def help_inputs(text: str) -> list[Typed]:
    """The example lines of ``%mpi?`` (its ``Examples`` part, to its end): each line
    indented by 2 is an input, lines indented by 6 the body of the ``%%`` cell above.

    Example::

        help_inputs("Examples:\n  %mpi start -n 2\n")[0].code   # '%mpi start -n 2'
    """
    head = re.search(r"^Examples\b.*:$", text, re.M)
    if head is None:
        return []
    first = text.count("\n", 0, head.start()) + 2
    out: list[Typed] = []
    for i, line in enumerate(text[head.end() :].strip("\n").split("\n")):
        where = f"%mpi help, line {first + i}"
        if line.startswith("      ") and out:
            last = out[-1]
            out[-1] = Typed(last.where, 0, f"{last.code}\n{line[6:]}")
        elif line.startswith("  ") and line.strip():
            out.append(Typed(where, 0, line.strip()))
        elif line.strip():
            break  # the examples end where the text goes on unindented
    return out


def help_problems() -> dict[str, str]:
    """Public classes whose ``help()`` would not show their own text: ``{name: why}``.

    A class needs its own docstring, and its ``__init__`` must not show another
    library's text (an ``nn.Module`` subclass whose ``__init__`` has no docstring shows
    "Initialize internal Module state"). Python's own base classes (exceptions)
    show a generic line, which is fine.
    """
    out = {}
    for name, obj in public_objects():
        if not isinstance(obj, type):
            continue
        if not (vars(obj).get("__doc__") or "").strip():
            out[name] = "the class has no docstring of its own"
            continue
        for base in obj.__mro__:
            init = vars(base).get("__init__")
            if init is not None and getattr(init, "__doc__", None):
                home = base.__module__
                if home.split(".")[0] not in ("clusterkernel", "builtins"):
                    out[name] = f"help() shows {home}.{base.__qualname__}.__init__'s text"
                break
    return out


def collect() -> tuple[list[Example], dict[str, str]]:
    """Every example, and :func:`help_problems`, found in a child process (see the
    module docstring)."""
    out = subprocess.run(
        [sys.executable, "-m", "tests._examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"collecting the examples failed:\n{out.stderr}")
    found = json.loads(out.stdout)
    return [Example(**e) for e in found["examples"]], found["help"]


# ------------------------------------------------------- expected-output comments


def with_checks(code: str, check: str = "_expect") -> str:
    """``code`` with its expected-output comments turned into checks, lines kept.

    An expression statement on one line whose comment (on that line, or alone on the
    next) is a complete Python literal, ``batch_shares(64, 3)   # [22, 21, 21]``,
    becomes ``_expect((batch_shares(64, 3)), [22, 21, 21])``; ``print(v)  # lit``
    checks ``v``. Comments that are prose, or literals with ``...`` in them, stay
    comments.
    """
    lines = code.split("\n")
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    for node in ast.walk(tree):
        if not isinstance(node, ast.Expr) or node.lineno != node.end_lineno:
            continue
        i = node.lineno - 1
        line = lines[i].encode()  # ast's columns count bytes
        comment = line[node.end_col_offset :].decode().strip()
        if not comment and i + 1 < len(lines) and lines[i + 1].strip().startswith("#"):
            comment = lines[i + 1].strip()
        if not comment.startswith("#"):
            continue
        expected = comment[1:].strip()
        try:
            value = ast.literal_eval(expected)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if "Ellipsis" in repr(value):
            continue
        expr = node.value
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Name)
            and expr.func.id == "print"
            and len(expr.args) == 1
            and not expr.keywords
        ):
            expr = expr.args[0]
        a, b = expr.col_offset, expr.end_col_offset
        checked = f"{check}(({line[a:b].decode()}), {expected})"
        lines[i] = (line[:a].decode() + checked + line[b : node.end_col_offset].decode()).rstrip()
    return "\n".join(lines)


if __name__ == "__main__":
    examples = [asdict(e) for e in docstring_examples() + readme_examples()]
    print(json.dumps({"examples": examples, "help": help_problems()}))
