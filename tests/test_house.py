"""House rules the code keeps: no project history in the package, and every pointer
into BENCHMARKS.md names a section that exists. No ranks started."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clusterkernel"
SOURCES = (".py", ".c", ".h", ".js", ".css", ".md", ".txt", ".toml", ".json")

# "issue 45", "Issue #12", "issues 3 and 4", "PR 7", "pull request #9"; an upstream bug
# named with its repository ("open-mpi/ompi#14086") says why and stays.
ISSUE_NUMBER = re.compile(r"\b(?:issues?|pr|pull request)\s*#?\d+", re.IGNORECASE)
# `BENCHMARKS.md, "Topic"`, `BENCHMARKS.md ("Topic")`, `BENCHMARKS.md, "Topic": ...`
BENCH_REF = re.compile(r"BENCHMARKS\.md,?\s*\(?\s*\"([^\"]{1,120})\"", re.DOTALL)


def _files(top: Path, suffixes=SOURCES):
    for p in sorted(top.rglob("*")):
        if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts:
            yield p


def _headings() -> list[str]:
    text = (ROOT / "BENCHMARKS.md").read_text()
    heads = [m.group(1) for m in re.finditer(r"^#{2,6} (.+)$", text, re.MULTILINE)]
    leads = [m.group(1) for m in re.finditer(r"^\*\*([^*]+)\*\*", text, re.MULTILINE)]
    return [_norm(h) for h in heads + leads]


def _norm(s: str) -> str:
    # a reference may run over comment lines: drop the comment markers and fold spaces
    s = re.sub(r"\s*\n\s*(?:#|//|\*)?\s*", " ", s)
    return re.sub(r"[`*]", "", s).strip().lower()


def test_no_issue_numbers_in_the_package():
    found = [
        f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for p in _files(PACKAGE)
        for text in [p.read_text(errors="replace")]
        for m in ISSUE_NUMBER.finditer(text)
    ]
    assert not found, "say why, not which issue it came from:\n" + "\n".join(found)


def test_the_check_sees_an_issue_number():
    # the pattern itself: what it must catch and what it must leave alone
    for bad in ("see issue 45", "(Issue #12)", "issues 3", "PR 7"):
        assert ISSUE_NUMBER.search(bad), bad
    for fine in ("open-mpi/ompi#14086", "all_reduce #57", "color:#335", "an issue with it"):
        assert not ISSUE_NUMBER.search(fine), fine


def test_benchmarks_sections_are_by_topic():
    text = (ROOT / "BENCHMARKS.md").read_text()
    tops = re.findall(r"^## (.+)$", text, re.MULTILINE)
    for topic in ("Start and cells", "Collectives", "Training", "Dashboard", "Profile"):
        assert topic in tops, topic
    for topic in ("Faults", "Scale", "GPU"):
        assert topic in tops, topic
    numbered = [h for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE) if ISSUE_NUMBER.search(h)]
    assert not numbered, numbered


def test_references_to_benchmarks_sections_resolve():
    heads = _headings()
    tops = [ROOT / "clusterkernel", ROOT / "docs", ROOT / "tests", ROOT / "benchmarks"]
    files = [ROOT / "README.md", *(f for t in tops for f in _files(t, SOURCES + (".sh",)))]
    files = [f for f in files if f != Path(__file__).resolve()]  # its own examples
    missing = []
    for p in files:
        text = p.read_text(errors="replace")
        for m in BENCH_REF.finditer(text):
            name = _norm(m.group(1))
            if not any(h.startswith(name) for h in heads):
                line = text.count("\n", 0, m.start()) + 1
                missing.append(f"{p.relative_to(ROOT)}:{line}: {m.group(1)!r}")
    assert not missing, "no BENCHMARKS.md section of that name:\n" + "\n".join(missing)


def _made_classes_and_dels(source: str) -> list[str]:
    """``type(name, bases, namespace)`` calls and ``__del__`` methods in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "type" and len(node.args) == 3
        ):  # fmt: skip
            found.append(f"{node.lineno}: a class made at run time")
        if isinstance(node, ast.FunctionDef) and node.name == "__del__":
            found.append(f"{node.lineno}: cleanup in __del__")
    return found


def test_no_classes_made_at_run_time_nor_cleanup_in_del():
    # a class's behaviour is written in its module (a setting travels on an instance);
    # cleanup belongs to a context manager or an explicit stop, not the garbage collector
    found = [
        f"{p.relative_to(ROOT)}:{f}"
        for p in _files(PACKAGE, (".py",))
        for f in _made_classes_and_dels(p.read_text())
    ]
    assert not found, "\n".join(found)


def test_the_check_sees_a_class_made_at_run_time():
    bad = "K = type('K', (object,), {'on': 1})\nclass A:\n    def __del__(self): ...\n"
    assert _made_classes_and_dels(bad) == ["1: a class made at run time", "3: cleanup in __del__"]
    assert _made_classes_and_dels("t = type(3)\n") == []
