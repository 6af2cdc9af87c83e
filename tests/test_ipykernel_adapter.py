"""ipykernel's internals are touched from one module, ``protocol/_ipykernel.py`` (issue 37).

As ipyparallel's are from ``client/cluster/_ipp.py``: an ipykernel release that moves
one is then fixed in one place. The rule, read from the source of every module under
``clusterkernel/`` but the adapter:

- no import of ``ipykernel``, but ``client/kernel.py``'s start of the kernel itself
  (``ipykernel.kernelapp.IPKernelApp``, and the kernelspec's logos from
  ``ipykernel.kernelspec.RESOURCES``): its documented entry points;
- no attribute of ipykernel's ``Kernel`` (or its control stream) that is not its
  documented API, named in :data:`INTERNALS`, whether read as ``kernel.name``, by
  ``getattr`` / ``hasattr`` / ``setattr``, or, for the session, ``x.session.send``.

``shell.kernel`` itself is not in it: ``ZMQInteractiveShell.kernel`` is how ipywidgets
and others tell a Jupyter kernel from a terminal, and reaching the object touches
nothing inside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import clusterkernel

ADAPTER = "protocol/_ipykernel.py"
# ipykernel's Kernel and its control stream: dispatch tables, message plumbing and the
# methods a wrapper kernel overrides (not for calling or replacing on a running kernel)
INTERNALS = {
    "control_handlers",
    "shell_handlers",
    "_publish_status",
    "_publish_status_and_flush",
    "get_parent",
    "set_parent",
    "do_execute",
    "do_complete",
    "do_inspect",
    "do_debug_request",
    "comm_manager",
    "iopub_socket",
    "iopub_thread",
    "io_loop",
    "control_stream",
    "control_thread",
    "shell_stream",
    "shell_channel_thread",
}
# what client/kernel.py may import from ipykernel: the kernel's own start
ENTRY_POINTS = {"ipykernel.kernelapp": {"IPKernelApp"}, "ipykernel.kernelspec": {"RESOURCES"}}
KERNEL_PY = "client/kernel.py"
# modules that still touch an internal themselves, each owned by another change in
# flight today (issue 37): they move to the adapter's functions, and leave this list
PENDING: dict[str, set[str]] = {}


def touches(source: str, where: str = "<source>") -> list[tuple[int, str]]:
    """``(line, what)`` for each touch of ipykernel's internals in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _is_ipykernel(a.name)]
        elif isinstance(node, ast.ImportFrom) and _is_ipykernel(node.module or ""):
            names = {a.name for a in node.names}
            if where != KERNEL_PY or not names <= ENTRY_POINTS.get(node.module, set()):
                found.append((node.lineno, f"{node.module}: {', '.join(sorted(names))}"))
        elif isinstance(node, ast.Attribute):
            if node.attr in INTERNALS:
                found.append((node.lineno, node.attr))
            elif (
                node.attr == "send"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "session"
            ):
                found.append((node.lineno, "session.send"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in INTERNALS
        ):
            found.append((node.lineno, node.args[1].value))
    return found


def _is_ipykernel(module: str) -> bool:
    return module == "ipykernel" or module.startswith("ipykernel.")


def test_the_rule_sees_each_kind_of_touch():
    source = (
        "from ipykernel.comm import Comm\n"
        "import ipykernel.iostream\n"
        "kernel.control_handlers['x'] = f\n"
        "kernel.session.send(stream, 'r', {}, parent, ident)\n"
        "hasattr(kernel, 'do_complete')\n"
        "stream.io_loop.add_callback(f)\n"
        "kernel.shell.events.register('post_run_cell', f)\n"  # IPython's API: allowed
        "client.session.session\n"  # ipyparallel's Client: not ipykernel's
    )
    assert sorted(line for line, _ in touches(source)) == [1, 2, 3, 4, 5, 6]
    entry = "from ipykernel.kernelapp import IPKernelApp\n"
    assert touches(entry, KERNEL_PY) == []
    assert touches(entry, "client/magics/_mpi.py") == [(1, "ipykernel.kernelapp: IPKernelApp")]


def test_only_the_adapter_touches_ipykernel_internals():
    package = Path(clusterkernel.__file__).parent
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where == ADAPTER:
            continue
        for line, what in touches(path.read_text(), where):
            if what not in PENDING.get(where, set()):
                found.setdefault(where, set()).add(f"{line}: {what}")
    assert not found, (
        f"ipykernel's internals touched outside {ADAPTER}: call (or add) a function "
        f"there instead: {found}"
    )
    # the adapter itself does touch them (the rule would see a rename of its internals)
    assert touches((package / ADAPTER).read_text(), ADAPTER)
