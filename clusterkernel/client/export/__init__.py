"""A notebook's ``%%mpi`` cells as a batch job: one Python script and a scheduler's file.

The rank cells (``%%mpi`` cells, and every cell run while ``%mpi on`` was in
effect), in order, become one plain script that every rank runs, under
``python -m clusterkernel run -n N job.py`` (``mpiexec`` with what this machine needs;
the script's first lines give it with absolute paths, runnable as printed), plain
``mpiexec``, ``srun --mpi=pmix python job.py`` (``--sbatch``) or ``qsub`` of a Grid
Engine script (``--qsub``): the scheduler's class writes it
(:meth:`~clusterkernel.client.scheduler.BatchSystem.export_script`). Client-only
cells are left out with a comment. ``%mpi push`` values come along: embedded from
the live namespace (``%mpi export`` in the notebook), or, exporting a file,
``push x=expr`` becomes ``x = expr`` and ``push x`` replays the notebook's own
top-level statements that make ``x``. ``--profile`` (``profile="python"``) samples
every rank over the job and writes speedscope and Perfetto files at its end
(:mod:`~clusterkernel.client.export._profilecode`). Client side: never imports mpi4py.

Example::

    from clusterkernel.client.export import export_cells, sbatch_script
    script = export_cells(["x = 3\\n%mpi push x", "%%mpi\\nprint(x)"])
    Path("job.py").write_text(script)                 # clusterkernel run -n 4 job.py
    Path("job.sbatch").write_text(sbatch_script("job.py", nodes=2, ntasks_per_node=4))
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import shlex
import sys
from collections.abc import Callable, Collection, Iterator
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from clusterkernel.client import scheduler
from clusterkernel.client.export._cellcode import ExportError, ipy_call, python_of, rank_cell
from clusterkernel.client.export._profilecode import PROFILE_KINDS, profile_block
from clusterkernel.client.export._pushcode import push_block, push_items
from clusterkernel.client.export._run import add_run_arguments, run_lines, run_main
from clusterkernel.client.mpiexec import QUIET_OSC, MPINotFoundError, find_mpiexec
from clusterkernel.client.scheduler import DEFAULT_TIME

__all__ = [
    "ExportError",
    "export_cells",
    "sbatch_script",
    "job_script",
    "write_job",
    "live_pushes",
    "add_run_arguments",
    "run_main",
]

_PRELUDE_FILE = Path(__file__).parents[2] / "rank" / "_job_prelude.py"


def _prelude() -> str:
    text = _PRELUDE_FILE.read_text()
    return text[text.index("\nimport ") + 1 :].strip("\n")


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


def _torch_block(made: bool, backend: str | None) -> str:
    """The script's lines that give every rank what %mpi start gave it."""
    lines = [
        "# torchrun's environment on every rank (RANK, LOCAL_RANK, MASTER_ADDR, ...), as",
        "# %mpi start gives it: torch.distributed.init_process_group() finds it there.",
        "from clusterkernel import torchdist as _torchdist  # noqa: E402",
        "",
        "_torchdist.torchrun_env()",
    ]
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
    profile: str | None = None,
) -> str:
    """The rank cells of ``cells`` (cell sources in notebook order) as one MPI script.

    ``pushed`` maps each ``%mpi push`` name to its value (the live notebook's); without
    it, pushes are rebuilt from the cells. ``names`` label cells in comments and errors;
    ``ranks`` (else the notebook's ``%mpi start -n``) goes in the header. ``auto``: every
    cell but ``%%local`` and ``%mpi`` ones runs on the ranks, as in the MPI kernel.
    ``failed``: indices of cells that raised or were interrupted in the notebook: left
    out with a comment (a job would stop at the first of them).
    ``script_name``: the job's path as its run line names it (:func:`write_job` gives
    the absolute one, so the line runs from any folder).
    ``torch``: (the ranks had a default group made for them, its backend), as the live
    cluster knows it; default: read from the cells' ``%mpi start``. A notebook that
    uses torch.distributed gets torchrun's environment on every rank, as in the
    notebook. ``profile`` (``"python"`` or ``"torch"``, ``--profile``): every rank is
    sampled over the job and the profile written at its end (:func:`profile_block`).
    Raises :class:`ExportError` for what a plain script cannot run.
    """
    n = ranks or notebook_ranks(cells) or 4
    stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    header = [
        f"# Batch job exported by clusterkernel from {source} on {stamp}.".replace("\n", " "),
        *run_lines(n, script_name),
        "# Each rank runs the whole file; its lines are labelled [rank N] as in the notebook.",
    ]
    out = ["\n".join(header), _prelude()]
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


def job_script(
    launcher: str,
    script: str | Path,
    n: int,
    *,
    job_name: str | None = None,
    python: str | None = None,
    **options,
) -> str:
    """The job file of scheduler ``launcher`` (``"slurm"``, ``"sge"``) that runs ``script``
    on ``n`` ranks; ``options`` are that scheduler's (others are ignored).

    Uses this Python (``sys.executable``) and the script's absolute path; the job's
    output goes to ``<script stem>-<jobid>.out`` beside the script. A bad value is an
    :class:`ExportError` saying what to give, as ``%mpi start`` says it.

    Example::

        from pathlib import Path
        from clusterkernel.client.export import job_script
        Path("job.qsub").write_text(job_script("sge", "job.py", 4, queue="all.q"))
    """
    path = Path(script).resolve()
    system = scheduler.get(launcher)
    mine = {o.name for o in system.options}
    try:
        job = system(n, {k: v for k, v in options.items() if k in mine})
        mpiexec = "mpiexec"
        if system.launch == "mpiexec":
            try:
                mpiexec = find_mpiexec()  # the one beside this Python: the same MPI
            except MPINotFoundError:
                pass
        return job.export_script(
            f"{shlex.quote(python or sys.executable)} {shlex.quote(str(path))}",
            job_name=job_name or path.stem,
            output=job.export_output(str(path)),
            mpiexec=mpiexec,
            preamble=[
                "",
                "# Written by clusterkernel export: one MPI rank per task, run by the Python that",
                "# exported the notebook, so the job has the same packages.",
                "set -e",
                "# Quiets a false Open MPI error per shared-memory window (open-mpi/ompi#14086).",
                *(f'export {k}="${{{k}:-{v}}}"' for k, v in QUIET_OSC.items()),
            ],
        )
    except ValueError as e:
        raise ExportError(str(e)) from None


def sbatch_script(
    script: str | Path,
    nodes: int = 1,
    ntasks_per_node: int = 4,
    time: str | None = DEFAULT_TIME,
    partition: str | None = None,
    account: str | None = None,
    job_name: str | None = None,
    python: str | None = None,
    gpus_per_node: int | None = None,
    gres: str | None = None,
) -> str:
    """An sbatch file that runs ``script`` with ``srun --mpi=pmix`` on nodes x tasks ranks
    (:func:`job_script` for Slurm).

    ``gpus_per_node`` / ``gres`` ask Slurm for GPUs (``--gpus-per-node``, ``--gres``).
    The ``#SBATCH`` lines, their defaults (``time`` 01:00:00) and their checks are
    :class:`~clusterkernel.client.scheduler._slurm.SbatchOptions`, the same as
    ``%mpi start --slurm``'s; a bad value is an :class:`ExportError` saying what to give.

    Example::

        Path("job.sbatch").write_text(sbatch_script("job.py", nodes=2, ntasks_per_node=4))
    """
    n = nodes * ntasks_per_node if _counts(nodes, ntasks_per_node) else 1
    return job_script(
        "slurm", script, n, job_name=job_name, python=python, nodes=nodes,
        ntasks_per_node=ntasks_per_node, time=time, partition=partition, account=account,
        gpus_per_node=gpus_per_node, gres=gres,
    )  # fmt: skip


def _counts(*values: object) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def write_job(
    cells: list[str],
    path: str | Path,
    *,
    pushed: dict | None = None,
    names: list[str] | None = None,
    source: str = "a notebook",
    ranks: int | None = None,
    auto: bool = False,
    torch: tuple[bool, str | None] | None = None,
    failed: Collection[int] = (),
    nodes: int = 1,
    ntasks_per_node: int | None = None,
    profile: str | None = None,
    **job,
) -> list[Path]:
    """Write the script (and each scheduler's job file asked for); the paths written.

    ``job``: a file per scheduler by its export flag (``sbatch="job.sbatch"``,
    ``qsub="job.qsub"``) and the schedulers' options (:func:`job_args`). A Slurm job has
    ``ntasks_per_node`` (default: the notebook's ranks, ``ranks``, else its ``%mpi start
    -n``, else 4, spread over ``nodes``) per node; another scheduler's, the ranks.
    ``profile``: as :func:`export_cells` (``--profile``).
    """
    path = Path(path)
    ranks = ranks or notebook_ranks(cells) or 4
    text = export_cells(
        cells,
        pushed,
        names=names,
        source=source,
        script_name=str(path.resolve()),
        ranks=ranks,
        auto=auto,
        torch=torch,
        failed=failed,
        profile=profile,
    )
    files = {name: job.pop(_file_dest(system), None) for name, system in _exporters()}
    written: list[tuple[Path, str]] = []
    for name, target in files.items():
        if target is None:
            continue
        if name == "slurm":
            per_node = ntasks_per_node or math.ceil(ranks / max(nodes, 1))
            options = {**job, "nodes": nodes, "ntasks_per_node": per_node}
            n = nodes * per_node if _counts(nodes, per_node) else 1
        else:
            options, n = job, ranks
        written.append((Path(target), job_script(name, path, n, **options)))
    path.write_text(text)
    for target, body in written:
        target.write_text(body)
    return [path, *(target for target, _ in written)]


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


def _exporters():
    """The schedulers a job file can be exported for, with their flag (``--sbatch``)."""
    return [(n, s) for n, s in scheduler.schedulers().items() if s.export_flag]


def _file_dest(system) -> str:
    return system.export_flag[2:].replace("-", "_")


def _export_options() -> tuple[tuple[str, dict], ...]:
    """Each scheduler option that shapes an exported job file, once (flag, argparse
    keywords), its help naming the schedulers that take it."""
    return tuple(scheduler.arguments("export"))


# The options of %mpi export and of clusterkernel export that shape the job files,
# declared once for both parsers (flag, argparse keywords): the job files (one flag per
# scheduler), then the schedulers' options, then --profile; EXPORT_ARGS: their names
JOB_FILES: tuple[tuple[str, dict], ...] = tuple(
    (system.export_flag, {"help": f"also write a {system.title} job file here"})
    for _, system in _exporters()
)
SBATCH_OPTIONS: tuple[tuple[str, dict], ...] = _export_options()
# --profile: the job profiles every rank (the job's own option, not a scheduler's)
PROFILE_OPTION: tuple[tuple[str, dict], ...] = (
    (
        "--profile",
        {
            "nargs": "?",
            "const": "python",
            "choices": PROFILE_KINDS,
            "help": "sample every rank's Python stacks over the job; at its end rank 0 writes "
            "<job>.speedscope.json and <job>.trace.json (Perfetto) beside it; torch: "
            "torch.profiler's CPU ops too",
        },
    ),
)
EXPORT_ARGS = (
    tuple(kw["dest"] for _, kw in SBATCH_OPTIONS)
    + tuple(flag[2:].replace("-", "_") for flag, _ in JOB_FILES)
    + ("profile",)
)


def job_args(args: argparse.Namespace) -> dict:
    """The job-file options (and ``--profile``) of ``%mpi export``'s or ``clusterkernel
    export``'s parsed options, as :func:`write_job` takes them: picked once, by name, for both.

    Example::

        write_job(cells, "job.py", **job_args(args))   # sbatch=..., qsub=..., nodes=...
    """
    return {name: getattr(args, name) for name in EXPORT_ARGS}


sbatch_args = job_args  # its name before Grid Engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``clusterkernel export``."""
    parser.add_argument("notebook", help="the .ipynb file")
    parser.add_argument("-o", "--output", help="script to write (default: notebook name, .py)")
    for flag, options in JOB_FILES + SBATCH_OPTIONS + PROFILE_OPTION:
        parser.add_argument(flag, **options)
    parser.add_argument(
        "--include-failed",
        action="store_true",
        help="keep cells whose stored outputs hold an error (default: left out, with a comment)",
    )


class NotebookCells(NamedTuple):
    """What an exported notebook file holds: its code cells, the MPI kernel's ranks and
    group (None/False for other kernels), and the cells whose stored outputs hold an error."""

    cells: list[str]
    ranks: int | None
    torch: bool
    failed: set[int]


def read_notebook(path: str | Path) -> NotebookCells:
    """An nbformat-4 notebook's code cells, its ranks if it is the MPI kernel's, whether
    that kernel starts its ranks with torch.distributed's default group, and which cells
    failed when it last ran.

    A notebook of the MPI kernel ("Python 3 (MPI, 4 ranks)") runs every cell on the ranks.
    """
    try:
        data = json.loads(Path(path).read_text())
        code = [c for c in data["cells"] if c.get("cell_type") == "code"]
        sources = [c["source"] for c in code]
        failed = {
            i
            for i, c in enumerate(code)
            if any(o.get("output_type") == "error" for o in c.get("outputs") or [])
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ExportError(f"cannot read {path} as an nbformat 4 notebook: {e}") from None
    spec = str(data.get("metadata", {}).get("kernelspec"))
    kernel = re.search(r"\(MPI, (\d+) ranks?(, torch\.distributed)?\)", spec)
    cells = ["".join(src) if isinstance(src, list) else src for src in sources]
    if not kernel:
        return NotebookCells(cells, None, False, failed)
    return NotebookCells(cells, int(kernel.group(1)), bool(kernel.group(2)), failed)


def main(args: argparse.Namespace) -> int:
    """``clusterkernel export notebook.ipynb -o job.py [--sbatch job.sbatch | --qsub job.qsub]``."""
    nb = Path(args.notebook)
    try:
        cells, kernel_ranks, kernel_torch, failed = read_notebook(nb)
        names = [f"code cell {i}" for i in range(1, len(cells) + 1)]
        written = write_job(
            cells,
            Path(args.output or nb.with_suffix(".py")),
            names=names,
            source=nb.name,
            ranks=kernel_ranks,
            auto=kernel_ranks is not None,
            torch=(True, None) if kernel_torch else None,
            failed=set() if args.include_failed else failed,
            **job_args(args),
        )
    except ExportError as e:
        print(f"clusterkernel export: {e}", file=sys.stderr)
        return 2
    print("Wrote " + ", ".join(map(str, written)))
    return 0
