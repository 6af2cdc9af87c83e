"""The ``%mpi`` subcommands' and ``%%mpi``'s argument parsers, and the help made from them.

Usage and options in ``%mpi?`` and in error messages come from these parsers, so a
new option shows up there by itself. ``_parse.parse`` is how every magic
reads its options: a typo gets "did you mean", a bad number says what to write; the
numeric options' types here refuse what cannot be meant. :func:`ranks_arg` reads
``--ranks``.

Example::

    from clusterkernel.client.magics._parse import parse
    parse(start_args, "-n 4 --timeout 60").n             # 4
    ranks_arg("0,2-3")                                   # [0, 2, 3]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from IPython.core.error import UsageError
from IPython.core.magic_arguments import (
    MagicHelpFormatter,
    argument,
    magic_arguments,
)

from clusterkernel.client import scheduler
from clusterkernel.client.export import JOB_FILES, PROFILE_OPTION, SBATCH_OPTIONS
from clusterkernel.client.magics._parse import duration_type, number_type, unknown_subcommand


def ranks_arg(text: str | None) -> list[int] | None:
    """``--ranks`` as a sorted list: ``"0,2"`` -> [0, 2], ``"0-3"`` -> [0, 1, 2, 3]; None stays None."""
    if text is None:
        return None
    ranks: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            first, _, last = part.partition("-")
            span = range(int(first), int(last or first) + 1)
            if not span:
                raise ValueError(part)
            ranks.update(span)
    except ValueError:
        raise UsageError(f"--ranks takes ranks like 0,2 or 0-3; got {text!r}.") from None
    return sorted(ranks)


_RANKS = number_type(int, "-n", "a number of ranks, 1 or more", "4", 1)
_NO_WATCHDOG = " (leave it out for no watchdog)"
_TIMEOUT = number_type(
    float, "--timeout", "seconds above 0", "60", 0, above=True, hint=_NO_WATCHDOG
)
_GPUS = number_type(int, "--gpus-per-rank", "a number of GPUs, 1 or more", "2", 1,
                hint=" (--no-gpu-binding for none)")  # fmt: skip
_FROM = number_type(int, "--from", "a rank number", "0", 0)
_RANK = number_type(int, "--rank", "a rank number", "0", 0)
_HZ = number_type(float, "--hz", "samples per second above 0", "100", 0, above=True)
# %mpi timeout S | off
timeout_seconds = number_type(
    float, "%mpi timeout", "seconds above 0", "60", 0, above=True, hint=" (or off for none)"
)


def _scheduler_arguments(func):
    """``@argument`` for each scheduler option ``%mpi start`` takes, declared once by the
    schedulers' classes (:mod:`clusterkernel.client.scheduler`); an option several
    schedulers take (``--time``) once, its help naming them."""
    for flag, keywords in reversed(scheduler.arguments("magic")):
        func = argument(flag, **keywords)(func)
    return func


@magic_arguments()
@argument(
    "-n",
    type=_RANKS,
    help="number of MPI ranks (default 4, or the Slurm allocation's tasks inside one)",
)
@argument(
    "--scheduler",
    choices=tuple(scheduler.schedulers()),
    help="start the ranks as a job of this batch scheduler (slurm, sge: Grid Engine)",
)
@argument("--slurm", action="store_true", help="the same as --scheduler slurm (sbatch + srun)")
@_scheduler_arguments
@argument(
    "--ssh",
    metavar="HOST",
    help="from outside the cluster: run the scheduler's commands and the controller on this "
    "login node by ssh (BatchMode: a key that works without a password), tunnel to it",
)
@argument(
    "--remote-python",
    metavar="PATH",
    help="with --ssh: the python on HOST that has clusterkernel (default: this one's path)",
)
@argument("--hosts", help='hosts and slots for several machines, e.g. "a:2,b:2"')
@argument("--hostfile", help="an MPI hostfile")
@argument("--mpiexec", help="path of mpiexec (default: next to python, then PATH)")
@argument("--timeout", type=_TIMEOUT, help="default watchdog for every %%%%mpi cell, seconds")
@argument(
    "--fault-tolerant",
    action="store_true",
    help="keep the job running when a rank dies (Open MPI ULFM); later cells use the others",
)
@argument(
    "--respawn",
    action="store_true",
    help="bring a dead rank back with a copy of the lowest live rank's variables: inside "
    "the cell for a train.steps or Trainer.fit loop, else after the cell that saw it die "
    "(implies --fault-tolerant)",
)
@argument(
    "--torch",
    action="store_true",
    help="make torch.distributed's default process group on every rank (after every restart too)",
)
@argument(
    "--gpus-per-rank",
    type=_GPUS,
    metavar="K",
    help="GPUs per rank, by LOCAL_RANK (default: 1 where a host has GPUs)",
)
@argument("--no-gpu-binding", action="store_true", help="leave torch's current GPU alone")
@argument("--gpu-share", action="store_true", help="allow more ranks on a node than GPUs")
@argument(
    "--backend",
    choices=("gloo", "nccl"),
    help="the process group's backend (implies --torch; default: torch's pick by device)",
)
@argument(
    "--keep",
    metavar="TIME",
    help="the ranks outlive this kernel (e.g. 2h, 30m, or forever) until no session has been "
    "attached for TIME; %%mpi attach comes back",
)
def start_args(line):
    """%mpi start: start MPI ranks as ipyparallel engines."""


def _login_arguments(func):
    """``--ssh HOST`` and ``--remote-python PATH`` of ``%mpi list`` and ``attach``: the kept
    clusters started from outside the cluster with ``%mpi start --ssh HOST``."""
    func = argument(
        "--remote-python",
        metavar="PATH",
        help="with --ssh: the python on HOST that has clusterkernel (default: this one's path)",
    )(func)
    return argument(
        "--ssh",
        metavar="HOST",
        help="the kept clusters started from outside the cluster with --ssh HOST (on HOST)",
    )(func)


@magic_arguments()
@_login_arguments
def list_args(line):
    """%mpi list: your kept clusters (--keep): id, ranks, where, age, idle time left."""


@magic_arguments()
@argument("id", nargs="?", help="the kept cluster's id (%%mpi list); not needed when there is one")
@argument(
    "--force",
    action="store_true",
    help="take over from a session that is attached now (it is told at its next call)",
)
@_login_arguments
def attach_args(line):
    """%mpi attach: connect to ranks kept with --keep; their variables as they were."""


@magic_arguments()
@argument(
    "--from",
    dest="source",
    type=_FROM,
    metavar="R",
    help="copy live rank R's variables into the new ranks (default: they start empty)",
)
@argument(
    "--from-snapshot",
    action="store_true",
    help="each new rank loads its own last %%mpi snapshot instead",
)
def respawn_args(line):
    """%mpi respawn: bring dead ranks back, same rank numbers, the survivors untouched.

    Needs ranks started with --fault-tolerant. Variables that cannot be pickled are
    named and left out of the copy.
    """


@magic_arguments()
@argument("names", nargs="*", help="the variables (default: every picklable one)")
def snapshot_args(line):
    """%mpi snapshot: each rank keeps its variables in a private file on its node.

    For %mpi restore (after %mpi restart) or %mpi respawn --from-snapshot; the files
    go when the ranks stop.
    """


@magic_arguments()
@argument("names", nargs="*", help="the variables (default: all the snapshot holds)")
def restore_args(line):
    """%mpi restore: every rank loads its last %mpi snapshot into its namespace."""


@magic_arguments()
@argument("--backend", choices=("gloo", "nccl"), help="default: the last group's backend")
def torch_reinit_args(line):
    """%mpi torch-reinit: a new torch.distributed default group in the live ranks, variables kept.

    After an aborted group (a hang freed) or to change backend. The subgroups made with
    dist.new_group are made again on it, your names rebound; DDP/FSDP models hold the
    old group: wrap them again.
    """


@magic_arguments()
@argument("--ranks", help="comma-separated ranks, e.g. 1,3 (default: the busy ones)")
@argument("--locals", action="store_true", help="show the values of each frame's locals")
@argument("--all-frames", action="store_true", help="show clusterkernel's own frames too")
def where_args(line):
    """%mpi where: each running rank's stack, the cell's lines first, even inside MPI."""


@magic_arguments()
@argument(
    "action",
    nargs="?",
    default="start",
    choices=("start", "stop", "snapshots"),
    help="start sampling (the default: %%mpi profile --every 60s), stop and show, or "
    "list the snapshots (--every)",
)
@argument("--torch", action="store_true", help="also torch.profiler's CPU ops (start)")
@argument("--hz", type=_HZ, help="samples per second (start; default 100)")
@argument(
    "--every",
    type=duration_type,
    metavar="DURATION",
    help="also keep a snapshot of each window of this length, e.g. 60s, 5m, 1h (start)",
)
def profile_args(line):
    """%mpi profile: profile every rank over the cells between start and stop.

    stop shows what the slowest rank does more, each rank's top lines and flame graph
    (cluster.profile_result; .save("x.speedscope.json") or .save("x.json") to export).
    With --every 60s a snapshot of each minute is kept: %mpi profile snapshots lists
    them (cluster.profile_result.snapshots[i], each exported with .save as well).
    """


@magic_arguments()
@argument(
    "--ranks",
    help="ranks, e.g. 1,3 or 0-3 (default: those at a breakpoint, else those whose cell raised)",
)
@argument("-c", dest="command", metavar="CMD", help='one pdb command, e.g. -c "p x"; no prompt')
def debug_args(line):
    """%mpi debug: pdb on ranks stopped at breakpoint(), or post-mortem after a cell raised.

    Each command goes to every rank; identical answers show once under their ranks.
    Without -c, a prompt (Pdb ranks 1,3) asks for commands until q (or EOF).
    """


@magic_arguments()
@argument("name", help="variable to pull from the ranks")
@argument("--rank", type=_RANK, help="pull from this rank only (returns the bare value)")
def pull_args(line):
    """%mpi pull: fetch a variable from the ranks as {rank: value}."""


@magic_arguments()
@argument(
    "paths",
    nargs="*",
    metavar="PATH",
    help="files and packages (folders with __init__.py) to send (default: this folder's *.py)",
)
def sync_args(line):
    """%mpi sync: send your modules to the ranks (what changed), reload what they imported.

    The files go to a private directory on each rank's host, first on every rank's import
    path, over the connection to the ranks (no shared file system needed). Changed modules
    a rank has imported are reloaded as IPython's %autoreload 2 does: the ranks' variables
    stay and use the new code. A file that does not compile is refused (the ranks keep the
    old code), and so are files above 10 MB (50 MB in all): data goes by scp/rsync.
    """


@magic_arguments()
@argument("--ranks", help="comma-separated ranks to run on, e.g. 0,2 (default: all)")
@argument("--timeout", type=_TIMEOUT, help="watchdog in seconds: report stacks, interrupt, free")
@argument("--noblock", action="store_true", help="return a CellRun at once; .wait() later")
@argument("--dashboard", action="store_true", help="show the live dashboard while the cell runs")
@argument(
    "--profile",
    nargs="?",
    const="python",
    choices=("python", "torch"),
    help="sample every rank's Python stacks; under the cell: what the slowest rank does "
    "more, each rank's top lines and flame graph (cluster.profile_result); --profile torch "
    "adds torch.profiler's CPU ops (profile_result.save('x.json'): Chrome/Perfetto trace)",
)
def cell_args(line):
    """%%mpi: run the cell on every rank (or --ranks), output streamed by rank."""


def _sbatch_arguments(func):
    """``@argument`` for each of export's job files and options (declared once, for both
    parsers: :data:`clusterkernel.client.export.SBATCH_OPTIONS`)."""
    for flag, options in reversed(JOB_FILES + SBATCH_OPTIONS + PROFILE_OPTION):
        func = argument(flag, **options)(func)
    return func


@magic_arguments()
@argument("path", help="the script to write, e.g. job.py")
@_sbatch_arguments
@argument(
    "--include-failed",
    action="store_true",
    help="keep cells that raised or were interrupted (default: left out, with a comment)",
)
def export_args(line):
    """%mpi export: this session's rank cells as one batch script (and a scheduler's file).

    The %%mpi cells, and cells run under %mpi on, in execution order (from the input
    history) become a script every rank runs: mpiexec -n 4 python job.py, sbatch
    job.sbatch (--sbatch) or qsub job.qsub (--qsub, Grid Engine). Client-only cells are left out, and so are cells that raised or
    were interrupted (--include-failed keeps them). %mpi push values are taken from this
    session's namespace now, at export time, and written into the script.
    """


class _HelpFormatter(MagicHelpFormatter):
    """Usage starts with the magic as typed (IPython's own prefix adds another "%")."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=92, max_help_position=28)

    def add_usage(self, usage, actions, groups, prefix=""):
        argparse.HelpFormatter.add_usage(self, usage, actions, groups, prefix)


# Every subcommand in %mpi? and in errors: its parser, or (usage, what it does) when it
# has no options. Usage and options come from the parsers, so new options show by themselves.
HELP_ROWS = [
    (start_args, "%mpi start"),
    ("%mpi stop", "stop every rank and the controller"),
    (list_args, "%mpi list"),
    (attach_args, "%mpi attach"),
    ("%mpi detach", "leave kept ranks running (for their --keep time) and let go"),
    (respawn_args, "%mpi respawn"),
    (snapshot_args, "%mpi snapshot"),
    (restore_args, "%mpi restore"),
    ("%mpi restart", "fresh ranks (frees stuck ones; state is lost)"),
    (torch_reinit_args, "%mpi torch-reinit"),
    ("%mpi status", "rank, host, pid, state, CPU, memory"),
    ("%mpi on | %mpi off", "run every following cell on the ranks, or stop"),
    ("%mpi push name [name ...] | %mpi push name=expr", "copy variables to every rank"),
    (pull_args, "%mpi pull"),
    (sync_args, "%mpi sync"),
    (where_args, "%mpi where"),
    (profile_args, "%mpi profile"),
    (debug_args, "%mpi debug"),
    ("%mpi timeout S | off", "default watchdog for %%mpi cells"),
    ("%mpi help [subcommand]", "this list, or one subcommand's options (%mpi? shows them all)"),
    ("%mpi dashboard", "live per-rank loss, comm, timeline, status"),
    (export_args, "%mpi export"),
    (cell_args, "%%mpi"),
]


def _summary() -> str:
    lines = ["Subcommands:"]
    for first, second in HELP_ROWS:
        if isinstance(first, str):
            lines += [f"  {first}", f"      {second}"]
            continue
        parser = first.parser
        parser.prog, parser.formatter_class = second, _HelpFormatter
        usage = parser.format_usage().rstrip("\n").replace("\n", "\n  ")
        what = (parser.description or "").strip().split("\n")[0].partition(": ")[2].rstrip(".")
        lines += [f"  {usage}", f"      {what}"]
    return "\n".join(lines) + "\n"


def help_text(name: str, known: Iterable[str]) -> str:
    """``%mpi help``: every subcommand; ``%mpi help start``: its usage and options.
    ``known``: the subcommands' names (a name not among them is an error)."""
    name = name.strip().removeprefix("%mpi").strip()
    if not name:
        return SUBCOMMANDS + "Each one's options: %mpi help <subcommand>; all of them: %mpi?\n"
    if name in ("%%mpi", "cell"):
        return cell_args.parser.format_help()
    if name not in known:
        raise UsageError(unknown_subcommand(name, known))
    for first, second in HELP_ROWS:
        words = (first if isinstance(first, str) else second).split()
        if name in (after for before, after in zip(words, words[1:]) if before == "%mpi"):
            if isinstance(first, str):
                return f"{first}\n    {second}\n"
            return first.parser.format_help()
    return f"%mpi {name}\n"


def _options(parser: argparse.ArgumentParser) -> str:
    """The parser's help without its usage (the summary shows it)."""
    return parser.format_help().split("\n\n", 1)[1].rstrip("\n")


SUBCOMMANDS = _summary()


# The end of %mpi?: a session as typed, in order (a %%mpi cell's body indented under
# it); tests/test_docs_run.py runs every line of it.
EXAMPLES = """\
Examples (a session, in this order):
  %mpi start -n 2 --timeout 120
  %%mpi --profile
      import torch
      from clusterkernel import comm
      t = torch.full((3,), float(comm.rank()))
      comm.all_reduce(t, op=comm.SUM)
  cluster.profile_result.save("cell.speedscope.json")
  %mpi push lr=0.01
  %mpi pull t --rank 1
  %mpi status
  %mpi snapshot t
  %mpi restart
  %mpi restore t
  %mpi export job.py --sbatch job.sbatch
  %mpi stop
"""


def mpi_help() -> str:
    """The text of ``%mpi?``: the summary, each parser's options, then examples."""
    parts = ["Run code on MPI ranks from IPython.", "", SUBCOMMANDS]
    for first, prog in HELP_ROWS:
        if not isinstance(first, str):
            parts += [f"Options of {prog}:", _options(first.parser), ""]
    return "\n".join([*parts, EXAMPLES])
