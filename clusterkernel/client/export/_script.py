"""A notebook's rank cells as one Python script that every rank runs (client side).

:func:`export_cells` walks the cells in order: a rank cell (``%%mpi``, or any cell
while ``%mpi on`` is in effect) becomes its code, a client cell a comment, a ``%mpi
push`` the value it sends (:mod:`~clusterkernel.client.export._pushcode`); the job's
prelude (torchrun's environment on every rank, as the notebook's ranks have it), the
default process group where ``%mpi start --torch`` made one, and ``--profile``'s
sampler go first. Re-exported by
:mod:`clusterkernel.client.export`.

Example::

    script = export_cells(["x = 3\\n%mpi push x", "%%mpi\\nprint(x)"])
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Collection, Iterator
from datetime import datetime
from pathlib import Path

from clusterkernel.client.export._cellcode import ExportError, ipy_call, python_of, rank_cell
from clusterkernel.client.export._profilecode import profile_block
from clusterkernel.client.export._pushcode import push_block, push_items
from clusterkernel.client.export._run_command import run_lines
from clusterkernel.client.profile._kinds import ProfileKind

_PRELUDE_FILE = Path(__file__).parents[2] / "rank" / "_job_prelude.py"


_BIND = "\nprepare_rank()\n"  # the prelude's call, given the notebook's GPU options here


def _prelude(gpus: tuple[int | None, bool] = (None, False)) -> str:
    """The prelude's text; ``gpus``: (``--gpus-per-rank``, 0 for ``--no-gpu-binding``;
    ``--gpu-share``) of the notebook's ranks, for the call that binds the job's."""
    text = _PRELUDE_FILE.read_text()
    text = text[text.index("\nimport ") + 1 :].strip("\n")
    if tuple(gpus) != (None, False):
        text = text.replace(_BIND, f"\nprepare_rank({gpus[0]!r}, {gpus[1]!r})\n")
    return text


def _walk(
    cells: list[str], names: list[str] | None, auto: bool, failed: Collection[int] = ()
) -> Iterator[tuple]:
    """Classify cells: ("rank", where, options, body), ("client", where, first line, items)
    or ("failed", where, first line, None) for the indices in ``failed``.

    A client cell's items, in order: ("stmt", code, stmt) or ("push", rest). ``auto``:
    cells run on the ranks from the start (the MPI kernel) unless ``%%local``.
    """
    for i, src in enumerate(cells):
        where = names[i] if names else f"cell {i + 1}"
        text = src.strip("\n")
        if not text.strip():
            continue
        first = text.lstrip().split("\n", 1)[0]
        if i in failed:
            yield "failed", where, first, None
            continue
        if re.match(r"%%mpi\b", first):
            yield "rank", where, first[5:], text.lstrip().partition("\n")[2]
            continue
        if auto and not first.startswith(("%mpi", "%%local")):
            yield "rank", where, None, text
            continue
        code, _ = python_of(text)
        try:
            body = ast.parse(code).body
        except SyntaxError:
            body = []
        items: list[tuple] = []
        for stmt in body:
            call = ipy_call(stmt.value) if isinstance(stmt, ast.Expr) else None
            if call and call[0] == "run_line_magic" and call[1][:1] == ["mpi"]:
                sub, _, rest = str(call[1][1]).strip().partition(" ")
                auto = {"on": True, "off": False}.get(sub, auto)
                if sub == "push":
                    items.append(("push", rest.strip()))
            else:
                items.append(("stmt", code, stmt))
        yield "client", where, first, items


_START_LINE = re.compile(r"^\s*%mpi\s+start\b.*$", re.M)
_BACKEND = re.compile(r"--backend[\s=]+(\w+)")
_USES_TORCH_DIST = re.compile(
    r"torch\.distributed|\bfrom torch import distributed\b|init_process_group"
)


def torch_use(cells: list[str]) -> tuple[bool, bool, str | None]:
    """Whether the cells use torch.distributed; whether ``%mpi start --torch`` (or
    ``--backend``) made the default group; its backend, if named."""
    made, backend = False, None
    for cell in cells:
        for line in _START_LINE.findall(cell):
            named = _BACKEND.search(line)
            made = made or "--torch" in line or named is not None
            backend = named.group(1) if named else backend
    uses = made or any(_USES_TORCH_DIST.search(cell) for cell in cells)
    return uses, made, backend


_GPUS_PER_RANK = re.compile(r"--gpus-per-rank[\s=]+(\d+)")


def gpu_options(cells: list[str]) -> tuple[int | None, bool]:
    """The GPU binding the cells' ``%mpi start`` asked for: (GPUs per rank, None for the
    default and 0 for ``--no-gpu-binding``; ``--gpu-share``)."""
    per_rank, share = None, False
    for cell in cells:
        for line in _START_LINE.findall(cell):
            named = _GPUS_PER_RANK.search(line)
            per_rank = 0 if "--no-gpu-binding" in line else int(named.group(1)) if named else None
            share = "--gpu-share" in line
    return per_rank, share


def _torch_block(made: bool, backend: str | None) -> str:
    """The script's lines that give every rank what %mpi start gave it."""
    # torchrun's environment is the prelude's, as every rank's: here the group and its end
    lines = ["from clusterkernel import torchdist as _torchdist  # noqa: E402", ""]
    if made:
        lines += [
            "# %mpi start --torch made the default process group",
            f"_torchdist.init({backend!r})",
        ]
    lines.append("atexit.register(_torchdist.shutdown)  # groups freed and destroyed before exit")
    return "\n".join(lines)


def notebook_ranks(cells: list[str]) -> int | None:
    """The ``-n`` of the notebook's ``%mpi start``, if it has one."""
    for cell in cells:
        found = re.search(r"^\s*%mpi\s+start\b.*?-n\s*=?\s*(\d+)", cell, re.M)
        if found:
            return int(found.group(1))
    return None


def push_requests(
    cells: list[str], auto: bool = False, failed: Collection[int] = ()
) -> list[tuple[str, str | None]]:
    """Every ``%mpi push`` in the cells (but the ``failed`` ones), in order, as (name,
    expression or None)."""
    return [
        pair
        for kind, where, _, items in _walk(cells, None, auto, failed)
        if kind == "client"
        for item in items
        if item[0] == "push"
        for pair in push_items(where, item[1])
    ]


def export_cells(
    cells: list[str],
    pushed: dict | None = None,
    *,
    names: list[str] | None = None,
    source: str = "a notebook",
    script_name: str = "job.py",
    ranks: int | None = None,
    auto: bool = False,
    torch: tuple[bool, str | None] | None = None,
    failed: Collection[int] = (),
    profile: ProfileKind | None = None,
    gpus: tuple[int | None, bool] | None = None,
    python: str | None = None,
) -> str:
    """The rank cells of ``cells`` (cell sources in notebook order) as one MPI script.

    ``pushed`` maps each ``%mpi push`` name to its value (the live notebook's); without
    it, pushes are rebuilt from the cells. ``names`` label cells in comments and errors;
    ``ranks`` (else the notebook's ``%mpi start -n``) goes in the header. ``auto``: every
    cell but ``%%local`` and ``%mpi`` ones runs on the ranks, as in the MPI kernel.
    ``failed``: indices of cells that raised or were interrupted in the notebook: left
    out with a comment (a job would stop at the first of them).
    ``script_name``: the job's path as its run line names it (:func:`write_job` gives
    the absolute one, so the line runs from any folder); ``python``: the interpreter that
    line names (default this one; the login node's for a job exported there).
    ``torch``: (the ranks had a default group made for them, its backend), as the live
    cluster knows it; default: read from the cells' ``%mpi start``. Every rank gets
    torchrun's environment and its GPU, as in the notebook: ``gpus`` (GPUs per rank,
    ``--gpu-share``) as the live cluster has them, default: read from the cells' ``%mpi
    start``. ``profile`` (``"python"`` or ``"torch"``, ``--profile``): every rank is
    sampled over the job and the profile written at its end (:func:`profile_block`).
    Raises :class:`ExportError` for what a plain script cannot run.
    """
    n = ranks or notebook_ranks(cells) or 4
    stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    header = [
        f"# Batch job exported by clusterkernel from {source} on {stamp}.".replace("\n", " "),
        *run_lines(n, script_name, python),
        "# Each rank runs the whole file; its lines are labelled [rank N] as in the notebook.",
    ]
    out = ["\n".join(header), _prelude(gpu_options(cells) if gpus is None else gpus)]
    uses, made, backend = torch_use(cells)
    if torch is not None:
        made, backend = torch
    if uses or made:
        out.append(_torch_block(made, backend))
    if profile:
        out.append(profile_block(profile))  # after torch's: its atexit runs first
    history: list[tuple[str, ast.stmt]] = []
    seen = 0  # rank cells
    for kind, where, head, items in _walk(cells, names, auto, failed):
        if kind == "failed":
            out.append(f"# {where} (failed or interrupted in the notebook, left out): {head[:80]}")
            continue
        if kind == "rank":
            out.append(rank_cell(where, head, items))
            seen += 1
            continue
        if not any(item[0] == "push" for item in items):
            out.append(f"# {where} (client only, left out): {head[:80]}")
        for item in items:
            if item[0] == "stmt":
                history.append(item[1:])
            else:
                out.append(push_block(where, item[1], pushed, history))
    if not seen:
        raise ExportError(
            f"none of the {len(cells)} cells runs on the ranks (no %%mpi cell, none under "
            "%mpi on): the job would do nothing. Export a notebook that uses %%mpi."
        )
    script = "\n\n".join(out) + "\n"
    try:
        compile(script, script_name, "exec")
    except SyntaxError as e:
        raise ExportError(f"the exported script does not compile: line {e.lineno}: {e.msg}") from e
    return script


def live_pushes(
    cells: list[str],
    namespace: dict,
    evaluate: Callable,
    auto: bool = False,
    failed: Collection[int] = (),
) -> dict:
    """Values of the cells' ``%mpi push`` taken now: a name from ``namespace``, name=expr by
    ``evaluate(expr)`` (IPython's ``shell.ev``); the ``failed`` cells' are left out."""
    values = {}
    for name, expr in push_requests(cells, auto, failed):
        if expr is None and name not in namespace:
            raise ExportError(f"%mpi push {name}: there is no {name} in this session any more")
        try:
            values[name] = namespace[name] if expr is None else evaluate(expr)
        except Exception as e:
            raise ExportError(f"%mpi push {name}={expr}: evaluating it now failed: {e!r}") from e
    return values
