"""The ``%mpi`` subcommands (``%mpi start``, ``stop``, ``status``, ``push``, ...) (client side).

Each is a method ``_sub_NAME(rest)`` of :class:`Subcommands`, a thin parser over one
:class:`~clusterkernel.Cluster` call; :class:`~clusterkernel.client.magics.MPIMagics`
mixes them in and dispatches ``%mpi NAME rest`` to them. :func:`auto_mpi` is the
input transformer behind ``%mpi on``.

Example::

    %mpi start -n 4        # Subcommands._sub_start("-n 4")
    %mpi push x            # Subcommands._sub_push("x")
"""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING, Any, cast

from IPython.core.error import UsageError

from clusterkernel.client.cluster import (
    Cluster,
    LaunchSettings,
    busy_ranks,
    describe_keep,
    kept_report,
    snapshot_summary,
    subgroups_note,
)
from clusterkernel.client.errors import format_ranks, rank_label
from clusterkernel.client.launch._ssh import Login, login_for
from clusterkernel.client.magics._args import (
    attach_args,
    debug_args,
    export_args,
    list_args,
    profile_args,
    pull_args,
    ranks_arg,
    respawn_args,
    restore_args,
    snapshot_args,
    start_args,
    timeout_seconds,
    torch_reinit_args,
    where_args,
)
from clusterkernel.client.magics._parse import parse
from clusterkernel.client.magics._progress import LiveLine
from clusterkernel.protocol._errors import ClusterkernelError

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


def auto_mpi(lines: list[str]) -> list[str]:
    """Input transformer for ``%mpi on``: run every cell on the ranks.

    Example::

        auto_mpi(["x = 1\\n"])   # ["%%mpi\\n", "x = 1\\n"]
    """
    if not lines or not "".join(lines).strip():
        return lines
    first = lines[0].lstrip()
    if first.startswith(("%mpi", "%%mpi", "%%local")):
        return lines  # %mpi off (and explicit %%mpi, %%local) run as written
    return ["%%mpi\n", *lines]


cast(Any, auto_mpi).sends_to_ranks = True  # %%local runs its cell without it


def cluster_for(line: str) -> Cluster:
    """The cluster ``%mpi start LINE`` starts, made but not started: every option read by
    ``start_args`` and checked as a start checks it before anything runs (a
    :class:`UsageError` says what to write). The MPI kernel's install checks its options
    with it.

    Example::

        cluster_for("-n 2 --timeout 60").n         # 2
        cluster_for("-n 2 --nodes 2")              # UsageError: --nodes: they go with --slurm ...
    """
    args = parse(start_args, line)
    if args.no_gpu_binding and args.gpus_per_rank:
        raise UsageError("--no-gpu-binding and --gpus-per-rank contradict each other.")
    try:
        return Cluster(
            # every launch option, -n to --respawn, on the one settings object
            launcher=LaunchSettings.from_args(args),
            timeout=args.timeout,
            torch=args.torch,
            backend=args.backend,
            gpus_per_rank=0 if args.no_gpu_binding else args.gpus_per_rank,
            gpu_share=args.gpu_share,
            keep=args.keep,
        )
    except (ClusterkernelError, ValueError, FileNotFoundError) as e:  # the base; settings' own
        raise UsageError(str(e)) from None


class Subcommands:
    """The ``%mpi`` subcommands, mixed into :class:`~clusterkernel.client.magics.MPIMagics`.

    That class provides ``shell``, the ``cluster`` ``%mpi start`` made, and
    ``_require_cluster()`` (which starts ranks in kernel mode).
    """

    shell: InteractiveShell
    cluster: Cluster | None

    if TYPE_CHECKING:

        def _require_cluster(self) -> Cluster: ...

    def _sub_start(self, rest: str) -> None:
        parse(start_args, rest)  # a mistake in the line is told first, also while ranks run
        if self.cluster is not None and self.cluster.running:
            raise UsageError(
                f"MPI ranks are already running ({self.cluster.n} ranks). "
                "Use %mpi restart, or %mpi stop first."
            )
        cluster = cluster_for(rest)
        try:
            cluster.start(progress=LiveLine(self.shell))  # shown in place, gone at the end
        except ClusterkernelError as e:
            raise UsageError(str(e)) from None
        except KeyboardInterrupt:  # start() has stopped what it had started: say so, briefly
            raise UsageError(_interrupted(cluster)) from None
        self.cluster = cluster
        self._bind_cluster_name(cluster)
        where = sorted({row["host"] for row in cluster.status()})
        on = f" on {len(where)} nodes ({', '.join(where)})" if len(where) > 1 else ""
        group = ""
        if cluster.torch:
            group = f"; torch.distributed group: {_group_text(cluster.torch_group())}"
        kept = ""
        if cluster.keep is not None:
            kept = (
                f"; kept {describe_keep(cluster.keep)} without a session as cluster "
                f"{cluster.id} (%mpi detach, %mpi attach)"
            )
        print(f"Started {cluster.n} MPI ranks ({cluster.launcher.describe()}){on}{group}{kept}.")

    def _bind_cluster_name(self, cluster: Cluster) -> None:
        """``cluster`` in the user's namespace, as the docs write it (``cluster.profile_result``,
        ``cluster.respawn(...)``). A ``cluster`` of the user's own stays: a note says so."""
        ns = self.shell.user_ns
        held = ns.get("cluster")
        # a Cluster no longer running is an earlier start's (or one the user stopped)
        if held is None or (isinstance(held, Cluster) and not held.running):
            ns["cluster"] = cluster
        elif held is not cluster:
            print(
                f"Note: your own `cluster` ({type(held).__name__}) is left as it is; "
                "these ranks' Cluster is clusterkernel.current_cluster()."
            )

    def _sub_list(self, rest: str) -> None:
        args = parse(list_args, rest)
        # as `clusterkernel list`: ended ones are told once, then removed
        print(kept_report(args.ssh, args.remote_python))

    def _sub_attach(self, rest: str) -> None:
        args = parse(attach_args, rest)
        # the one login node, from here on
        self._attach(args.id, args.force, login_for(args.ssh, args.remote_python))

    def _attach(self, cluster_id: str | None, force: bool, where: Login | None) -> None:
        """``%mpi attach``'s work: ``where``, the login node of a cluster started from outside."""
        if self.cluster is not None and self.cluster.running:
            raise UsageError(
                f"This session already drives {self.cluster.n} ranks: %mpi detach (or stop) "
                "them first."
            )
        cluster = Cluster.attach(cluster_id, force=force, ssh=where)  # ClusterError: a message
        self.cluster = cluster
        self._bind_cluster_name(cluster)
        if cluster.replaced:
            print(
                f"Took cluster {cluster.id} over from pid {cluster.replaced['pid']} on "
                f"{cluster.replaced['host']}; that session is told at its next call."
            )
        print(f"Attached to {cluster.n} MPI ranks (cluster {cluster.id}).", flush=True)
        busy = busy_ranks(cluster)
        if busy:
            print(
                f"Rank{'s' if len(busy) > 1 else ''} {format_ranks(busy)} still running a cell "
                "sent before this session attached; its output follows until it ends (the "
                "stop button interrupts it).",
                flush=True,
            )
            cluster.follow()

    def _sub_detach(self, rest: str) -> None:
        cluster = self._require_cluster()
        cluster.detach()  # ClusterError for a cluster not kept: a message
        self.cluster = None
        self._sub_off("")
        print(
            f"Detached; the ranks stay for {describe_keep(cluster.keep)} without a "
            "session. %mpi attach comes back."
        )

    def _sub_stop(self, rest: str) -> None:
        if self.cluster is None or not self.cluster.running:
            print("No MPI ranks are running.")
            return
        cluster = self.cluster
        cluster.stop()
        self.cluster = None
        self._sub_off("")
        if cluster.taken_over_by is not None:
            print(
                f"Another session (pid {cluster.taken_over_by['pid']}) drives these ranks now; "
                "this one has let go of them and stopped nothing."
            )
        else:
            print("Stopped all MPI ranks.")

    def _sub_restart(self, rest: str) -> None:
        cluster = self._require_cluster()
        cluster.restart()
        group = (
            f"; torch.distributed group: {_group_text(cluster.torch_group())}"
            if cluster.torch
            else ""
        )
        print(f"Restarted {cluster.n} MPI ranks{group}.")

    def _sub_respawn(self, rest: str) -> None:
        """%mpi respawn [--from R]: see ``respawn_args``."""
        args = parse(respawn_args, rest)
        cluster = self._require_cluster()
        try:
            report = cluster.respawn(source=args.source, from_snapshot=args.from_snapshot)
        except (ClusterkernelError, ValueError) as e:
            raise UsageError(str(e)) from None
        print(report.summary())

    def _sub_snapshot(self, rest: str) -> None:
        """%mpi snapshot [NAMES]: see ``snapshot_args``."""
        names = parse(snapshot_args, rest).names or None
        self._snapshots("snapshot", lambda cluster: cluster.snapshot(names))

    def _sub_restore(self, rest: str) -> None:
        """%mpi restore [NAMES]: see ``restore_args``."""
        names = parse(restore_args, rest).names or None
        self._snapshots("restore", lambda cluster: cluster.restore(names))

    def _snapshots(self, what: str, call) -> None:
        try:
            results = call(self._require_cluster())
        except ClusterkernelError as e:
            raise UsageError(str(e)) from None
        print(snapshot_summary(what, results))

    def _sub_torch_reinit(self, rest: str) -> None:
        """%mpi torch-reinit [--backend B]: see ``torch_reinit_args``."""
        args = parse(torch_reinit_args, rest)
        cluster = self._require_cluster()
        try:
            groups = cluster.torch_reinit(args.backend)
        except ClusterkernelError as e:
            raise UsageError(str(e)) from None
        made = subgroups_note(n for g in groups.values() for n in g.get("subgroups", ()))
        print(f"New torch.distributed default group: {_group_text(groups)}{made}.")

    def _sub_status(self, rest: str) -> None:
        rows = self._require_cluster().status()
        print(f"{'rank':>4}  {'host':<16} {'pid':>8}  {'state':<6} {'cpu %':>6} {'mem MiB':>8}")
        for r in rows:
            cpu = "-" if r["cpu"] is None else f"{r['cpu']:.0f}"
            mem = "-" if r["memory_mib"] is None else f"{r['memory_mib']:.0f}"
            gpu = _gpu_text(r["gpu"]) if "gpu" in r else ""
            print(
                f"{r['rank']:>4}  {r['host']:<16} {r['pid']:>8}  {r['state']:<6} {cpu:>6} {mem:>8}"
                + gpu
            )
        return None

    def _sub_on(self, rest: str) -> None:
        self._require_cluster()
        transforms = self.shell.input_transformers_cleanup
        if auto_mpi not in transforms:
            transforms.append(auto_mpi)
        print("Every cell now runs on the MPI ranks; %mpi off to stop.")

    def _sub_off(self, rest: str) -> None:
        transforms = self.shell.input_transformers_cleanup
        if auto_mpi in transforms:
            transforms.remove(auto_mpi)
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
        try:
            cluster.push(ns)
        except (TypeError, ClusterkernelError) as e:
            raise UsageError(f"%mpi push: {e}") from None

    def _sub_where(self, rest: str) -> None:
        args = parse(where_args, rest)
        cluster = self._require_cluster()
        ranks = ranks_arg(args.ranks)
        if ranks is None:
            ranks = [row["rank"] for row in cluster.status() if row["state"] == "busy"]
        if not ranks:
            print("No rank is running a cell (--ranks asks idle ones too).")
            return
        try:
            stacks = cluster.stacks(ranks, with_locals=args.locals, all_frames=args.all_frames)
        except (ValueError, ClusterkernelError) as e:
            raise UsageError(str(e)) from None
        by_text: dict[str, list[int]] = {}
        for rank, text in stacks.items():
            by_text.setdefault(text or "  (idle: no cell running)", []).append(rank)
        for text, same in sorted(by_text.items(), key=lambda kv: kv[1]):
            print(f"[{rank_label(same)}]\n{text}")

    def _sub_profile(self, rest: str):
        """%mpi profile start|stop|snapshots: see ``profile_args``; stop shows the profile."""
        from clusterkernel.client.profile import parse_every, snapshots

        args = parse(profile_args, rest)
        if args.action != "start" and (args.torch or args.hz is not None or args.every):
            raise UsageError("--torch, --hz and --every go with %mpi profile start.")
        try:
            every = None if args.every is None else parse_every(args.every)
        except ValueError as e:
            raise UsageError(f"{e}, e.g. %mpi profile start --every 60s") from None
        cluster = self._require_cluster()
        try:
            if args.action == "snapshots":
                from IPython.display import display

                from clusterkernel.client.output import in_notebook

                snaps = snapshots(cluster)
                display(snaps) if in_notebook() else print(snaps)
                return None
            if args.action == "start":
                cluster.profile("start", torch=args.torch, hz=args.hz, every=every)
                print(
                    "Profiling every rank; %mpi profile stop shows where the time went."
                    + (
                        f" A snapshot every {args.every.strip()}: %mpi profile snapshots."
                        if every
                        else ""
                    )
                )
                return None
            cluster.profile("stop")
        except ClusterkernelError as e:
            raise UsageError(str(e)) from None
        return None

    def _sub_debug(self, rest: str) -> None:
        from clusterkernel.client.debug._prompt import run_debug

        args = parse(debug_args, rest)
        cluster = self._require_cluster()
        try:
            session = cluster.debug(ranks_arg(args.ranks))
        except (ValueError, ClusterkernelError) as e:
            raise UsageError(str(e)) from None
        command = args.command
        if command and len(command) > 1 and command[0] == command[-1] and command[0] in "'\"":
            command = command[1:-1]  # IPython's argument split keeps the quotes
        run_debug(session, command)

    def _sub_pull(self, rest: str):
        args = parse(pull_args, rest)
        cluster = self._require_cluster()
        if args.rank is not None:
            try:
                cluster.engine_id(args.rank)
            except (ValueError, ClusterkernelError) as e:
                raise UsageError(str(e)) from None
            return cluster.pull(args.name, ranks=[args.rank])[args.rank]
        return cluster.pull(args.name)

    def _sub_timeout(self, rest: str) -> None:
        value = rest.strip()
        off = value in ("", "off", "none", "None")
        try:
            seconds = None if off else timeout_seconds(value)
        except argparse.ArgumentTypeError as e:  # says what to write
            raise UsageError(str(e)) from None
        cluster = self._require_cluster()
        cluster.timeout = seconds
        if off:
            print("No default watchdog for %%mpi cells.")
            return
        print(f"%%mpi cells running longer than {cluster.timeout:g}s will be reported and freed.")

    def _sub_export(self, rest: str) -> None:
        """%mpi export job.py: see ``export_args``; the work is clusterkernel.client.export's."""
        from clusterkernel.client import export

        args = parse(export_args, rest)
        history = self.shell.history_manager
        if history is None:
            raise UsageError("This IPython shell keeps no history: there are no cells to export.")
        cells = list(history.input_hist_raw)
        live = self.cluster if self.cluster is not None and self.cluster.running else None
        running = live.n if live is not None else None
        auto = getattr(self, "autostart", None) is not None  # the MPI kernel: cells on the ranks
        # cells that raised or were interrupted (history index = execution count)
        failed = set() if args.include_failed else set(getattr(self, "failed_cells", ()))
        job = export.job_args(args)  # --sbatch, --qsub, --nodes, --time, ...: by name
        side = export.cluster_side(live)  # from outside: the job is the login node's too
        try:
            written = export.write_job(
                cells,
                args.path,
                pushed=export.live_pushes(cells, self.shell.user_ns, self.shell.ev, auto, failed),
                names=[f"In [{i}]" for i in range(len(cells))],
                source=str(self.shell.user_ns.get("__session__") or "an IPython session"),
                ranks=running,
                auto=auto,
                failed=failed,
                torch=(live.torch, live.backend) if live is not None else None,
                gpus=(live.gpus_per_rank, live.gpu_share) if live is not None else None,
                side=side,
                **job,
            )
            print(export.written_text(written, export.job_ranks(cells, running), job, side))
        except ClusterkernelError as e:
            raise UsageError(str(e)) from None

    def _sub_dashboard(self, rest: str) -> None:
        self._require_cluster().dashboard().show()


def _interrupted(cluster: Cluster) -> str:
    """One line for a start the user interrupted, true to what is left."""
    if cluster.running:  # interrupted again while start() stopped its processes
        cluster.stop()
    return (
        "Start interrupted: no rank left running (the ranks and controller it had started "
        "are stopped). %mpi start starts them again."
    )


def _group_text(groups: dict[int, dict]) -> str:
    """``gloo, 4 ranks, rendezvous 127.0.0.1:41901`` from each rank's group description."""
    first = next(iter(groups.values()), {})
    if not first:
        return "none"
    return f"{first['backend']}, {first['world_size']} ranks, rendezvous {first['master']}"


def _gpu_text(gpu: dict | None) -> str:
    """``  GPU 1 NVIDIA H100: 1.2/79.6 GiB, 37 %`` for a status row."""
    if not gpu:
        return "  GPU -"
    util = "" if gpu.get("util") is None else f", {gpu['util']:.0f} %"
    used, total = gpu["mem_used_mib"] / 1024, gpu["mem_total_mib"] / 1024
    return f"  GPU {gpu['gpu']} {gpu['name']}: {used:.1f}/{total:.1f} GiB{util}"
