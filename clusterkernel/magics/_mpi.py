"""The ``%mpi`` line magic and ``%%mpi`` cell magic (client side).

Each subcommand is a thin parser over one :class:`~clusterkernel.Cluster` call,
so everything here also works from a script without IPython:

=====================  ==========================================
magic                  plain Python
=====================  ==========================================
``%mpi start -n 4``    ``cluster = Cluster(n=4).start()``
``%%mpi``              ``cluster.run(code)``
``%mpi status``        ``cluster.status()``
``%mpi push x``        ``cluster.push({"x": x})``
``%mpi pull x``        ``cluster.pull("x")``
``%mpi debug``         ``cluster.debug().send("p x")``
``%mpi restart``       ``cluster.restart()``
``%mpi stop``          ``cluster.stop()``
``%mpi export job.py`` ``clusterkernel.export.write_job(cells, ...)``
=====================  ==========================================
"""

from __future__ import annotations

import argparse
import atexit
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, magics_class
from IPython.core.magic_arguments import (
    MagicHelpFormatter,
    argument,
    magic_arguments,
    parse_argstring,
)

from clusterkernel import _session
from clusterkernel.cluster import Cluster
from clusterkernel.errors import ClusterError, rank_label
from clusterkernel.mpiexec import HostError, MPINotFoundError


def _ranks_arg(text: str | None) -> list[int] | None:
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


def _auto_mpi(lines: list[str]) -> list[str]:
    """Input transformer for ``%mpi on``: run every cell on the ranks."""
    if not lines or not "".join(lines).strip():
        return lines
    first = lines[0].lstrip()
    if first.startswith(("%mpi", "%%mpi", "%%local")):
        return lines  # %mpi off (and explicit %%mpi, %%local) run as written
    return ["%%mpi\n", *lines]


_auto_mpi.sends_to_ranks = True  # %%local runs its cell without it


@magic_arguments()
@argument(
    "-n",
    type=int,
    help="number of MPI ranks (default 4, or the Slurm allocation's tasks inside one)",
)
@argument("--slurm", action="store_true", help="start the ranks as a Slurm job (sbatch + srun)")
@argument("--nodes", type=int, help="Slurm: spread the ranks over this many nodes")
@argument("--partition", help="Slurm: the partition (queue) to submit to")
@argument("--time", default="0:30:00", help="Slurm: the job's time limit (default 0:30:00)")
@argument("--account", help="Slurm: the account to charge")
@argument("--hosts", help='hosts and slots for several machines, e.g. "a:2,b:2"')
@argument("--hostfile", help="an MPI hostfile")
@argument("--mpiexec", help="path of mpiexec (default: next to python, then PATH)")
@argument("--timeout", type=float, help="default watchdog for every %%%%mpi cell, seconds")
@argument(
    "--fault-tolerant",
    action="store_true",
    help="keep the job running when a rank dies (Open MPI ULFM); later cells use the others",
)
def _start_args(line):
    """%mpi start: start MPI ranks as ipyparallel engines."""


@magic_arguments()
@argument("--ranks", help="comma-separated ranks, e.g. 1,3 (default: the busy ones)")
@argument("--locals", action="store_true", help="show the values of each frame's locals")
@argument("--all-frames", action="store_true", help="show clusterkernel's own frames too")
def _where_args(line):
    """%mpi where: each running rank's stack, the cell's lines first, even inside MPI."""


@magic_arguments()
@argument(
    "--ranks",
    help="ranks, e.g. 1,3 or 0-3 (default: those at a breakpoint, else those whose cell raised)",
)
@argument("-c", dest="command", metavar="CMD", help='one pdb command, e.g. -c "p x"; no prompt')
def _debug_args(line):
    """%mpi debug: pdb on ranks stopped at breakpoint(), or post-mortem after a cell raised.

    Each command goes to every rank; identical answers show once under their ranks.
    Without -c, a prompt (Pdb ranks 1,3) asks for commands until q (or EOF).
    """


@magic_arguments()
@argument("name", help="variable to pull from the ranks")
@argument("--rank", type=int, help="pull from this rank only (returns the bare value)")
def _pull_args(line):
    """%mpi pull: fetch a variable from the ranks as {rank: value}."""


@magic_arguments()
@argument("--ranks", help="comma-separated ranks to run on, e.g. 0,2 (default: all)")
@argument("--timeout", type=float, help="watchdog in seconds: report stacks, interrupt, free")
@argument("--noblock", action="store_true", help="return a CellRun at once; .wait() later")
@argument("--dashboard", action="store_true", help="show the live dashboard while the cell runs")
def _cell_args(line):
    """%%mpi: run the cell on every rank (or --ranks), output streamed by rank."""


@magic_arguments()
@argument("path", help="the script to write, e.g. job.py")
@argument("--sbatch", help="also write a Slurm batch file, e.g. job.sbatch")
@argument("--nodes", type=int, default=1, help="Slurm nodes (default 1)")
@argument("--ntasks-per-node", type=int, help="ranks per node (default: the ranks / nodes)")
@argument("--time", default="01:00:00", help="Slurm time limit (default 01:00:00)")
@argument("--partition", help="Slurm partition")
@argument("--account", help="Slurm account")
def _export_args(line):
    """%mpi export: this session's rank cells as one batch script (and an sbatch file).

    The %%mpi cells, and cells run under %mpi on, in execution order (from the input
    history) become a script every rank runs: mpiexec -n 4 python job.py, or
    sbatch job.sbatch. Client-only cells are left out. %mpi push values are taken
    from this session's namespace now, at export time, and written into the script.
    """


@magics_class
class MPIMagics(Magics):
    """``%mpi`` and ``%%mpi``. See ``%mpi?``."""

    def __init__(self, shell) -> None:
        super().__init__(shell)
        self.cluster = None
        atexit.register(self._stop_quietly)

    @property
    def cluster(self) -> Cluster | None:
        """The cluster ``%mpi start`` started; also the session's (``Dashboard()``'s default)."""
        return self._cluster

    @cluster.setter
    def cluster(self, cluster: Cluster | None) -> None:
        self._cluster = cluster
        _session.set_cluster(cluster)

    def _stop_quietly(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()

    def _require_cluster(self) -> Cluster:
        if self.autostart is not None and (self.cluster is None or not self.cluster.running):
            self._start_lazily()
        if self.cluster is None or not self.cluster.running:
            raise UsageError("No MPI ranks are running. Start them with: %mpi start -n 4")
        return self.cluster

    # ---------------------------------------------------------------- kernel mode
    # Set by the "Python 3 (MPI)" kernel (clusterkernel.kernel): the %mpi start
    # arguments used when a cell needs ranks and none run.
    autostart: str | None = None

    def _start_lazily(self) -> None:
        n = parse_argstring(_start_args, self.autostart).n
        print(f"Starting {n or 'the'} MPI ranks...", flush=True)
        self._sub_start(self.autostart)

    @cell_magic
    def local(self, line: str, cell: str):
        """%%local: run this cell in the notebook's own process, not on the ranks.

        For the MPI kernel and ``%mpi on``, where every other cell runs on the ranks::

            %%local
            import matplotlib.pyplot as plt
            plt.plot(losses)
        """
        transforms = self.shell.input_transformers_cleanup
        saved = list(transforms)
        # the cell's own transforms, minus the ones that send cells to the ranks
        transforms[:] = [t for t in saved if not getattr(t, "sends_to_ranks", False)]
        try:
            self.shell.run_cell(cell, store_history=False)
        finally:
            transforms[:] = saved

    @line_cell_magic
    def mpi(self, line: str = "", cell: str | None = None):
        if cell is not None:
            return self._run_cell(line, cell)
        words = line.strip().split(None, 1)
        if not words:
            print(self.mpi.__doc__)
            return None
        sub, rest = words[0], (words[1] if len(words) > 1 else "")
        handler = getattr(self, f"_sub_{sub}", None)
        if handler is None:
            raise UsageError(f"Unknown subcommand %mpi {sub}.\n{_SUBCOMMANDS}")
        return handler(rest)

    # ---------------------------------------------------------------- subcommands
    def _sub_start(self, rest: str) -> None:
        args = parse_argstring(_start_args, rest)
        if self.cluster is not None and self.cluster.running:
            raise UsageError(
                f"MPI ranks are already running ({self.cluster.n} ranks). "
                "Use %mpi restart, or %mpi stop first."
            )
        slurm = {"nodes": args.nodes, "partition": args.partition, "account": args.account}
        if not args.slurm and any(slurm.values()):
            raise UsageError("--nodes, --partition and --account go with --slurm.")
        try:
            cluster = Cluster(
                n=args.n,
                hosts=args.hosts,
                hostfile=args.hostfile,
                mpiexec=args.mpiexec,
                launcher="slurm" if args.slurm else None,
                time=args.time,
                timeout=args.timeout,
                fault_tolerant=args.fault_tolerant,
                **{k: v for k, v in slurm.items() if v is not None},
            )
        except (ValueError, FileNotFoundError, HostError, MPINotFoundError, ClusterError) as e:
            raise UsageError(str(e)) from None
        cluster.start()
        self.cluster = cluster
        where = sorted({row["host"] for row in cluster.status()})
        on = f" on {len(where)} nodes ({', '.join(where)})" if len(where) > 1 else ""
        print(f"Started {cluster.n} MPI ranks ({cluster.launcher.describe()}){on}.")

    def _sub_stop(self, rest: str) -> None:
        if self.cluster is None or not self.cluster.running:
            print("No MPI ranks are running.")
            return
        self.cluster.stop()
        self.cluster = None
        self._sub_off("")
        print("Stopped all MPI ranks.")

    def _sub_restart(self, rest: str) -> None:
        cluster = self._require_cluster()
        cluster.restart()
        print(f"Restarted {cluster.n} MPI ranks.")

    def _sub_status(self, rest: str) -> list[dict]:
        rows = self._require_cluster().status()
        print(f"{'rank':>4}  {'host':<16} {'pid':>8}  {'state':<6} {'cpu %':>6} {'mem MiB':>8}")
        for r in rows:
            cpu = "-" if r["cpu"] is None else f"{r['cpu']:.0f}"
            mem = "-" if r["memory_mib"] is None else f"{r['memory_mib']:.0f}"
            print(
                f"{r['rank']:>4}  {r['host']:<16} {r['pid']:>8}  {r['state']:<6} {cpu:>6} {mem:>8}"
            )
        return None

    def _sub_on(self, rest: str) -> None:
        self._require_cluster()
        transforms = self.shell.input_transformers_cleanup
        if _auto_mpi not in transforms:
            transforms.append(_auto_mpi)
        print("Every cell now runs on the MPI ranks; %mpi off to stop.")

    def _sub_off(self, rest: str) -> None:
        transforms = self.shell.input_transformers_cleanup
        if _auto_mpi in transforms:
            transforms.remove(_auto_mpi)
            print("Cells run locally again.")

    def _sub_push(self, rest: str) -> None:
        cluster = self._require_cluster()
        if not rest.strip():
            raise UsageError("Usage: %mpi push name [name ...]  or  %mpi push name=expression")
        ns = {}
        if "=" in rest:
            name, _, expr = rest.partition("=")
            name = name.strip()
            if not name.isidentifier():
                raise UsageError(f"{name!r} is not a variable name.")
            # The expression is the user's own code in their own namespace, as
            # typed into a cell; IPython's shell.ev is the documented way to run it.
            ns[name] = self.shell.ev(expr)
        else:
            for name in shlex.split(rest):
                if name not in self.shell.user_ns:
                    raise UsageError(f"No variable named {name!r} in this notebook.")
                ns[name] = self.shell.user_ns[name]
        cluster.push(ns)

    def _sub_where(self, rest: str) -> None:
        args = parse_argstring(_where_args, rest)
        cluster = self._require_cluster()
        ranks = _ranks_arg(args.ranks)
        if ranks is None:
            ranks = [row["rank"] for row in cluster.status() if row["state"] == "busy"]
        if not ranks:
            print("No rank is running a cell (--ranks asks idle ones too).")
            return
        try:
            stacks = cluster.stacks(ranks, with_locals=args.locals, all_frames=args.all_frames)
        except (ValueError, ClusterError) as e:
            raise UsageError(str(e)) from None
        by_text: dict[str, list[int]] = {}
        for rank, text in stacks.items():
            by_text.setdefault(text or "  (idle: no cell running)", []).append(rank)
        for text, same in sorted(by_text.items(), key=lambda kv: kv[1]):
            print(f"[{rank_label(same)}]\n{text}")

    def _sub_debug(self, rest: str) -> None:
        from clusterkernel.magics._debug import run_debug

        args = parse_argstring(_debug_args, rest)
        cluster = self._require_cluster()
        try:
            session = cluster.debug(_ranks_arg(args.ranks))
        except (ValueError, ClusterError) as e:
            raise UsageError(str(e)) from None
        command = args.command
        if command and len(command) > 1 and command[0] == command[-1] and command[0] in "'\"":
            command = command[1:-1]  # IPython's argument split keeps the quotes
        run_debug(session, command)

    def _sub_pull(self, rest: str):
        args = parse_argstring(_pull_args, rest)
        cluster = self._require_cluster()
        if args.rank is not None:
            try:
                cluster.engine_id(args.rank)
            except (ValueError, ClusterError) as e:
                raise UsageError(str(e)) from None
            return cluster.pull(args.name, ranks=[args.rank])[args.rank]
        return cluster.pull(args.name)

    def _sub_timeout(self, rest: str) -> None:
        cluster = self._require_cluster()
        value = rest.strip()
        if value in ("", "off", "none", "None"):
            cluster.timeout = None
            print("No default watchdog for %%mpi cells.")
            return
        try:
            cluster.timeout = float(value)
        except ValueError:
            raise UsageError(f"%mpi timeout takes seconds or 'off', got {value!r}.") from None
        print(f"%%mpi cells running longer than {cluster.timeout:g}s will be reported and freed.")

    def _sub_export(self, rest: str) -> None:
        """%mpi export job.py: see ``_export_args``; the work is clusterkernel.export's."""
        from clusterkernel import export

        args = parse_argstring(_export_args, rest)
        cells = list(self.shell.history_manager.input_hist_raw)
        running = self.cluster.n if self.cluster is not None and self.cluster.running else None
        auto = getattr(self, "autostart", None) is not None  # the MPI kernel: cells on the ranks
        try:
            written = export.write_job(
                cells,
                args.path,
                pushed=export.live_pushes(cells, self.shell.user_ns, self.shell.ev, auto),
                names=[f"In [{i}]" for i in range(len(cells))],
                source=str(self.shell.user_ns.get("__session__") or "an IPython session"),
                sbatch=args.sbatch,
                ranks=running,
                auto=auto,
                nodes=args.nodes,
                ntasks_per_node=args.ntasks_per_node,
                time=args.time,
                partition=args.partition,
                account=args.account,
            )
        except export.ExportError as e:
            raise UsageError(str(e)) from None
        print("Wrote " + ", ".join(map(str, written)))

    def _sub_dashboard(self, rest: str) -> None:
        self._require_cluster().dashboard().show()

    # ---------------------------------------------------------------- cell
    def _run_cell(self, line: str, cell: str):
        args = parse_argstring(_cell_args, line)
        cluster = self._require_cluster()
        ranks = _ranks_arg(args.ranks)
        if ranks is not None:
            bad = [r for r in ranks if r not in cluster.ranks]
            if bad:
                raise UsageError(f"No rank {bad}; ranks are 0..{cluster.n - 1}.")
        try:
            result = cluster.run(
                cell,
                ranks=ranks,
                timeout=args.timeout,
                block=not args.noblock,
                dashboard=args.dashboard,
            )
        except ClusterError as e:
            raise UsageError(str(e)) from None
        return result if args.noblock else None


class _HelpFormatter(MagicHelpFormatter):
    """Usage starts with the magic as typed (IPython's own prefix adds another "%")."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=92, max_help_position=28)

    def add_usage(self, usage, actions, groups, prefix=""):
        argparse.HelpFormatter.add_usage(self, usage, actions, groups, prefix)


# Every subcommand in %mpi? and in errors: its parser, or (usage, what it does) when it
# has no options. Usage and options come from the parsers, so new options show by themselves.
_HELP_ROWS = [
    (_start_args, "%mpi start"),
    ("%mpi stop", "stop every rank and the controller"),
    ("%mpi restart", "fresh ranks (frees stuck ones; state is lost)"),
    ("%mpi status", "rank, host, pid, state, CPU, memory"),
    ("%mpi on | %mpi off", "run every following cell on the ranks, or stop"),
    ("%mpi push name [name ...] | %mpi push name=expr", "copy variables to every rank"),
    (_pull_args, "%mpi pull"),
    (_where_args, "%mpi where"),
    (_debug_args, "%mpi debug"),
    ("%mpi timeout S | off", "default watchdog for %%mpi cells"),
    ("%mpi dashboard", "live per-rank loss, comm, timeline, status"),
    (_export_args, "%mpi export"),
    (_cell_args, "%%mpi"),
]


def _summary() -> str:
    lines = ["Subcommands:"]
    for first, second in _HELP_ROWS:
        if isinstance(first, str):
            lines += [f"  {first}", f"      {second}"]
            continue
        parser = first.parser
        parser.prog, parser.formatter_class = second, _HelpFormatter
        usage = parser.format_usage().rstrip("\n").replace("\n", "\n  ")
        what = (parser.description or "").strip().split("\n")[0].partition(": ")[2].rstrip(".")
        lines += [f"  {usage}", f"      {what}"]
    return "\n".join(lines) + "\n"


def _options(parser: argparse.ArgumentParser) -> str:
    """The parser's help without its usage (the summary shows it)."""
    return parser.format_help().split("\n\n", 1)[1].rstrip("\n")


_SUBCOMMANDS = _summary()


def _help() -> str:
    parts = ["Run code on MPI ranks from IPython.", "", _SUBCOMMANDS]
    for first, prog in _HELP_ROWS:
        if not isinstance(first, str):
            parts += [f"Options of {prog}:", _options(first.parser), ""]
    return "\n".join(parts)


MPIMagics.mpi.__doc__ = _help()
