"""The client-to-rank API is written down once, in ``protocol/``, and every name in it is real.

The notebook calls rank-side functions by a ``"package.module:function"`` name
(``protocol/_targets.py``) and reaches a busy rank by a request name
(``protocol/_names.py``). A name that no longer resolves fails only when a user's
cluster runs that path; here each is imported on the rank side's terms (a fresh
process, as an engine would) and a copy spelled outside ``protocol/`` is found.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import clusterkernel
from clusterkernel.protocol import _names, _targets

PACKAGE = Path(clusterkernel.__file__).parent
TARGET = re.compile(r"clusterkernel(\.\w+)*:\w+")
REQUEST = re.compile(r"^clusterkernel_\w+$")


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module (docstrings and f-string parts included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _outside_protocol() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    return [p for p in files if p.relative_to(PACKAGE).parts[0] != "protocol"]


def test_every_target_resolves_to_a_rank_side_function():
    assert len(_targets.ALL) == len(set(_targets.ALL)) >= 20
    code = (
        "import importlib, json, sys\n"
        f"out = {{}}\nfor target in {list(_targets.ALL)!r}:\n"
        "    module, _, name = target.partition(':')\n"
        "    try:\n"
        "        fn = getattr(importlib.import_module(module), name)\n"
        "        out[target] = callable(fn) and fn.__name__ == name\n"
        "    except Exception as e:\n"
        "        out[target] = f'{type(e).__name__}: {e}'\n"
        "print(json.dumps(out))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    resolved = json.loads(run.stdout.strip().splitlines()[-1])
    assert {t: r for t, r in resolved.items() if r is not True} == {}
    assert set(resolved) == set(_targets.ALL)


def test_the_targets_module_lists_each_target():
    doc = _targets.__doc__ or ""
    names = [n for n, v in vars(_targets).items() if n.isupper() and isinstance(v, str)]
    assert sorted(v for n, v in vars(_targets).items() if n in names) == sorted(_targets.ALL)
    assert [n for n in names if f"``{n}``" not in doc] == []


def _copies(root: Path, files: list[Path]) -> list[str]:
    """``file:line: text`` of each target or request name spelled in ``files``."""
    requests = {v for n, v in vars(_names).items() if n.isupper() and isinstance(v, str)}
    found = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        for line, text in _strings(path):
            if TARGET.search(text) or text in requests:
                found.append(f"{rel}:{line}: {text[:60]!r}")
            elif REQUEST.match(text) and text.endswith(("_request", "_reply", "_peek")):
                found.append(f"{rel}:{line}: {text!r} (a request name: put it in protocol/_names)")
    return found


def test_no_target_or_request_name_is_spelled_outside_protocol():
    files = _outside_protocol()
    found = _copies(PACKAGE, files)
    assert found == [], "\n".join(found)


def test_the_check_finds_copied_names(tmp_path):
    copied = tmp_path / "copied.py"
    copied.write_text(
        f'"""Call ``{_targets.TORCH_INIT}``."""\n'
        f'REQUEST = "{_names.STACK_REQUEST}"\n'
        'NEW = "clusterkernel_thing_request"\n'
        'FINE = "clusterkernel.torchdist"\n'
    )
    found = _copies(tmp_path, [copied])
    assert [f.split(":")[1] for f in found] == ["1", "2", "3"], found
