"""One cell running on the ranks: stream output, watch for faults, report (client side).

:class:`CellRun` is what :meth:`Cluster.run` (and so ``%%mpi``) creates. Its
:meth:`~CellRun.wait` loop forwards each rank's output to a renderer as it arrives
and watches for the three ways a cell goes wrong that plain ``%%px`` handles
badly:

- a kernel interrupt: ranks stopped at ``breakpoint()`` quit their pdb, SIGINT
  goes to every busy rank; ranks that do not stop (blocked in MPI, where SIGINT
  cannot reach Python) are named with their stacks and the engines are restarted
  so the next cell works;
- a watchdog ``timeout``: stacks of the busy ranks first (this is how a user finds
  the rank that skipped a collective), then the same as an interrupt;
- a rank dying: mpiexec ends the whole job; the cell ends naming the rank and how
  it died, and the cluster is marked lost until ``%mpi restart``.

It also notices ranks that stop at ``breakpoint()`` and prompts for their pdb
commands (:mod:`clusterkernel.client.debug._breakpoints`).

A run reads its cluster (client, views, stacks, the job's state) and acts on the
ranks (interrupt, abort their torch groups), but never changes the cluster itself:
what it found that the cluster must know (the job ended, ranks died, ranks stuck
for good) it reports through the :class:`CellFaults` the cluster gave it, and the
cluster acts (marks itself lost, records the dead ranks, restarts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ipyparallel as ipp

from clusterkernel.client.cluster import (
    _deathnews,
    _hangreport,
    _incell,
    _ipp,
    _rank_faults,
    _stacks,
    _torch,
)
from clusterkernel.client.cluster._jobreport import (
    OUT_OF_MEMORY,
    death_cause,
    job_report,
    launcher_abort,
)
from clusterkernel.client.debug._breakpoints import Stops
from clusterkernel.client.errors import (
    CellInterrupted,
    RankError,
    format_ranks,
    group_failures,
    notebook_execution_count,
    retitle_cell,
)
from clusterkernel.client.output import RankOutput, Renderer, default_renderer
from clusterkernel.client.profile import CellProfile, Profile
from clusterkernel.client.profile._kinds import ProfileKind, profile_kind
from clusterkernel.protocol._names import DEBUG_REQUEST

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster

_POLL = 0.05  # seconds; waiting returns early as soon as the cell completes
_GRACE = 2.0  # seconds for interrupted ranks to stop before they count as stuck
_OUTPUT_GRACE = 30.0  # seconds a finished cell's output may trail its reply


@dataclass(frozen=True)
class CellFaults:
    """What a cell run tells its cluster; :meth:`Cluster.run` gives one to each run.

    ``job_ended(why)``: the MPI job ended, every rank is gone (until a restart);
    ``ranks_died(ranks, why)``: ranks of a fault-tolerant job died, the job carries
    on; ``ranks_stuck(ranks)``: ranks could not be interrupted, a restart must free
    them (it returns once the new ranks are up).
    """

    job_ended: Callable[[str], None]
    ranks_died: Callable[[list[int], str], None]
    ranks_stuck: Callable[[list[int]], None]
    # auto-respawn in the cell: new processes of ranks registered, then the cell ended
    ranks_rejoined: Callable[[list[int]], None] = lambda ranks: None
    ranks_back: Callable[[list[int]], None] = lambda ranks: None
    recipe: dict | None = None  # what the ranks were armed with (a new rank gets it too)


class CellRun:
    """A cell submitted to some ranks. ``wait()`` streams it and raises on failure.

    Example::

        run = cluster.run("import time; time.sleep(5)", block=False)
        ...            # the notebook is free meanwhile
        run.wait()     # streams remaining output, raises RankError on failure
    """

    def __init__(
        self,
        cluster: Cluster,
        code: str,
        ranks: list[int],
        renderer: Renderer | None = None,
        *,
        faults: CellFaults,
        profile: bool | ProfileKind | None = False,
    ) -> None:
        self.cluster = cluster
        self.faults = faults
        self.code = code
        self.ranks = list(ranks)
        self.renderer = renderer if renderer is not None else default_renderer(self.ranks)
        client = cluster.client
        self._client = client
        # --profile: each rank's sampler starts right before the cell (queued ahead of it);
        # --profile torch (profile="torch") adds torch.profiler's CPU ops
        kind = profile_kind(profile)
        self._profiling = CellProfile(cluster, self.ranks, torch=kind == "torch") if kind else None
        self.profile: Profile | None = None
        self.ar = cluster.view(self.ranks).execute(code, silent=False, block=False)
        # The result's own metadata, not client.metadata[msg_id]: the client drops
        # its entry once a cell's output is complete, which a quick cell can reach
        # before this line runs (the lookup would then make a new, empty one).
        mds = self.ar.metadata
        self._mds = mds if isinstance(mds, list) else [mds]
        ask = _ipp.asker(cluster, DEBUG_REQUEST)  # the debugger's way to the ranks
        self._stops = Stops(cluster, self.ranks, self._mds, self.renderer, ask)
        self._pages: dict[int, list[dict]] | None = None  # obj? in the cell: its page
        self._lost_seen = False  # a rank of a fault-tolerant job died during the cell
        self._died: list[int] = []  # those ranks
        # each live rank's engine identity (fault-tolerant jobs): a change is its death
        ids = _ipp.engine_identities(client) if cluster.fault_tolerant else {}
        self._engine = {r: ids.get(cluster.engine_of[r]) for r in self.ranks if ids}
        self._back: set[tuple[int, int]] = set()  # (replacement, rank) watched again
        self._replacing: list[_incell.Replacing] = []  # auto-respawn: replaced in the cell
        self.started = time.monotonic()
        self.done = False
        # the notebook's cell this run belongs to (a --noblock run is waited on later)
        self.execution_count = notebook_execution_count()

    def __repr__(self) -> str:
        state = "done" if self.done else ("ready" if self.ar.ready() else "running")
        return f"<CellRun ranks={format_ranks(self.ranks)} {state}>"

    def ready(self) -> bool:
        return self.ar.ready()

    def busy_ranks(self) -> list[int]:
        """The ranks still running the cell (a dead one's task counts as done)."""
        outstanding = self._client.outstanding
        dead = self.cluster.dead
        return [
            r for r, mid in zip(self.ranks, self.ar.msg_ids) if mid in outstanding and r not in dead
        ]

    def _alive(self) -> list[int]:
        """The cell's ranks but those that died (fault-tolerant jobs), who cannot answer."""
        dead = self.cluster.dead
        return [r for r in self.ranks if r not in dead]

    def _check_lost(self) -> bool:
        """A fault-tolerant job whose rank died mid-cell: record it, and close the
        torch.distributed connections of the others, whom gloo would keep waiting on the
        dead peer until the group's timeout (MPI's own calls raise by themselves). A death
        is an engine identity that changed: several ranks dying at once are told one by one,
        and a new process can register under a dead rank's id before its death is told.
        True when it found one."""
        if not self.cluster.fault_tolerant:
            return False
        try:
            now = _ipp.engine_identities(self._client)
        except Exception:  # the controller is gone: the job's end is read elsewhere
            return False
        engine_of = self.cluster.engine_of
        for i, rep in enumerate(self._replacing):  # a new process registered: its own
            for r in rep.registered():  # death is news (in the recovery, or later)
                if (i, r) not in self._back:
                    self._back.add((i, r))
                    self._engine[r] = rep.identity[r]
        # gone: its engine left, or one registered under its id before that word came
        gone = [r for r, was in self._engine.items() if now.get(engine_of[r]) != was]
        if not gone:
            return False
        for r in gone:
            del self._engine[r]
        causes = _rank_faults.death_causes(self.cluster, gone)
        for rank, why in causes.items():
            self.faults.ranks_died([rank], why)
        self._died += gone
        if self.cluster.auto_respawn:  # a guarded loop's survivors bring them back
            for rep in self._replacing:  # a new process that died: told with its first death
                for r in gone:
                    if (first := rep.hand_over(r)) is not None:  # said once
                        new = "; its new process: "
                        causes[r] = first if new in first else f"{first}{new}{causes[r]}"
            waiting = [rep for rep in self._replacing if rep.dead and not rep.registered()]
            if waiting:  # no new process yet: the survivors respawn every dead rank at once
                waiting[0].dead = sorted(waiting[0].dead + gone)
                waiting[0].causes.update(causes)
            else:
                self._replacing.append(_incell.Replacing(self, gone, causes))
        if self.busy_ranks() and not self._lost_seen:  # a recovery in the cell goes on:
            self._abort_torch_groups(grace=not self.cluster.auto_respawn)  # nothing to wait for
        self._lost_seen = True
        return True

    def output(self, rank: int) -> RankOutput:
        # a rank replaced in the cell: its old process's output, then each new one's
        mds = [self._mds[self.ranks.index(rank)]]
        mds += [md for rep in self._replacing if (md := rep.metadata(rank)) is not None]
        return RankOutput(
            stdout="".join(md.get("stdout") or "" for md in mds),
            # warnings name the engine's cell number: the notebook's, as in tracebacks
            stderr=retitle_cell(
                "".join(md.get("stderr") or "" for md in mds), self.execution_count
            ),
            outputs=[o for md in mds for o in md.get("outputs") or []]
            + (self._pages or {}).get(rank, []),
            execute_result=mds[-1].get("execute_result") or None,
        )

    def _pump(self) -> None:
        if self._pages is None and self.ar.ready():  # pages come with the replies
            results = self.ar.get(return_exceptions=True)
            # obj? answered once, by the first of the cell's ranks (as Shift-Tab does)
            self._pages = {self.ranks[0]: _ipp.pager_outputs(results[0])}
        for rank in self.ranks:
            self.renderer.update(rank, self.output(rank))

    def wait(self, timeout: float | None = None) -> CellRun:
        """Stream output until the cell ends; raise :class:`RankError` on failure."""
        try:
            failure = self._wait_loop(timeout)
        except KeyboardInterrupt:
            failure = self._free_stuck("interrupted", stacks_first=False)
        self._pump()
        if failure is None:
            failure = self._collect_errors()
        for rep in self._replacing:
            if rep.registered():
                self.renderer.notice(rep.told(went_on=failure is None))
        self.renderer.finish()
        self.done = True
        # the new processes are in the ranks' world: with none left dead, every rank gets
        # a fresh set's torch group now (all idle); else the respawn after the cell does
        back = sorted({r for rep in self._replacing for r in rep.registered()})
        if back and not self.cluster.dead and not isinstance(failure, CellInterrupted):
            self.faults.ranks_back(back)
        if self._profiling is not None:  # shown whether the cell ended, raised or was stopped
            self.profile, self._profiling = self._profiling.finish(), None
        if failure is not None:
            failure.execution_count = self.execution_count
            raise failure
        return self

    def _wait_loop(self, timeout: float | None) -> RankError | None:
        while True:
            finished = self.ar.wait(_POLL) and all(rep.ready() for rep in self._replacing)
            if finished:
                # Replies and output travel on different channels: a reply can
                # land before the last of its rank's output, by seconds when the
                # controller is loaded. Keep streaming until every rank's output
                # is complete (its "idle" has come), within a grace period.
                deadline = time.monotonic() + _OUTPUT_GRACE
                while not (
                    self.ar.wait_for_output(timeout=_POLL)
                    and all(rep.output_ready() for rep in self._replacing)
                ):
                    self._pump()
                    if time.monotonic() > deadline:
                        break
                self._pump()
                return None
            self._pump()
            # time at a breakpoint prompt does not count towards the watchdog
            self.started += self._stops.check()
            dead = self.cluster.dead_ranks()
            if dead is not None:
                return self._job_ended(*dead)
            while self._check_lost():  # again: a death told while it looked (seconds)
                pass  # joins its peers' replacement before any new process has its copy
            for rep in self._replacing:
                rep.poll()
            if timeout is not None and time.monotonic() - self.started > timeout:
                return self._free_stuck("timeout", stacks_first=True, timeout=timeout)

    # ------------------------------------------------------------------ faults
    def _job_ended(self, dead: list[int], report: str) -> RankError:
        daemon = _rank_faults.lost_daemon(self.cluster, report)
        if daemon is not None:
            lost, there = daemon
            return self._open_mpi_failed(
                str(lost),
                there,
                f"Open MPI's launcher lost {lost.node} (its daemon, prted): the node or "
                "its network failed, or the daemon crashed.",
            )
        abort = launcher_abort(report)
        if abort is not None:
            return self._open_mpi_failed(
                f"Open MPI's launcher aborted ({abort})",
                [],
                "The launcher (prterun) failed inside itself: a fault in Open MPI, not in "
                "the cell.",
            )
        died = _rank_faults.launcher_died(self.cluster)
        if died is not None:
            # the ranks outlive it, each without its runtime: restart and stop end them
            self.faults.job_ended(f"The MPI job ended: {died}.")
            items = [
                (r, "stopped", "cut off: its launcher is gone", "") for r in self.cluster.ranks
            ]
            note = (
                "No rank can reach MPI any more; %mpi restart (cluster.restart()) ends "
                "them and starts a fresh set.\nThe launcher's own process ended, not a "
                "rank's: a crash there is a fault in the MPI runtime, not in the cell."
            )
            return RankError(group_failures(items), note=note)
        why = death_cause(report)
        oom = self.cluster.out_of_memory(dead) if "SIGKILL" in why else []
        if oom and len(oom) == len(dead):
            why = OUT_OF_MEMORY
        others = [r for r in self.cluster.ranks if r not in dead]
        head = f"rank {format_ranks(dead)} died" if dead else "the MPI job ended"
        self.faults.job_ended(f"The MPI job ended: {head}{f' ({why})' if why else ''}.")
        # the launcher's own words only where they say more than the summary does
        detail = "" if why else report
        items = [
            (r, "died", OUT_OF_MEMORY if r in oom else (why or "process exited"), detail)
            for r in dead
        ]
        items += [(r, "stopped", "stopped by mpiexec when the job ended", "") for r in others]
        note = "All ranks are gone; run %mpi restart (cluster.restart()) for a fresh set."
        if oom:
            note = (
                f"Rank {format_ranks(oom)} ran out of memory: use less per rank (smaller "
                "batches or model shards), or fewer ranks per node.\n" + note
            )
        if why:
            note += "\nThe launcher's own report: cluster.job_output()."
        return RankError(group_failures(items), note=note)

    def _open_mpi_failed(self, what: str, there: list[int], why: str) -> RankError:
        """Open MPI's runtime failed (``what``): the ranks ``there`` went with it, the
        launcher ended the rest. ``why``: what that means, for the note."""
        went = f", and {_ranks_word(there).lower()} {format_ranks(there)} with it" if there else ""
        self.faults.job_ended(f"The MPI job ended: {what}{went}.")
        items = [(r, "died", f"lost with its node: {what}", "") for r in there]
        items += [
            (r, "stopped", "stopped by mpiexec when the job ended", "")
            for r in self.cluster.ranks
            if r not in there
        ]
        note = (
            "All ranks are gone; run %mpi restart (cluster.restart()) for a fresh set.\n"
            f"{why} The launcher's own report: cluster.job_output()."
        )
        return RankError(group_failures(items), note=note)

    def _free_stuck(
        self, kind: str, stacks_first: bool, timeout: float | None = None
    ) -> CellInterrupted:
        """Interrupt busy ranks; stacks and a restart for the ones that stay stuck."""
        if self._profiling is not None:  # what was sampled, before a restart loses it
            self._profiling.collect_now()
        busy = self.busy_ranks()
        # A rank whose control thread cannot answer runs C code that holds the GIL: found
        # first, so that the requests below go to the others only (each would wait out
        # its timeout on it); its stack comes from faulthandler.
        silent = self._silent(busy, timeout=2.0)
        talking = [r for r in self._alive() if r not in silent]
        stacks = (
            _rank_faults.stacks(self.cluster, busy, code=self.code, silent=silent)
            if (stacks_first and busy)
            else {}
        )
        # Read before the interrupt unwinds anything: who waits in which call.
        flights, positions = _hangreport.collect(self.cluster, talking, busy) if busy else ({}, {})
        flight = _hangreport.compare(flights, positions) if busy else ""
        answering = [r for r in busy if r not in silent]
        released = self._release_breakpoints(answering) if answering else []
        busy = self.busy_ranks()
        if busy:
            try:
                self.cluster.interrupt(busy)
            except Exception:  # the control channel may be gone with the rank
                pass
            self.ar.wait(_GRACE)
        stuck = self.busy_ranks()
        # asked again: a rank silent for a while (a long C call) may answer now and be
        # freed below, one that answered before may have gone into such a call since
        silent = self._silent(stuck, timeout=1.0)
        aborted: list[int] = []
        in_torch = _hangreport.has_torch_calls(flights)
        if stuck and in_torch:
            # a rank blocked in gloo/NCCL: closing every rank's group frees it
            aborted = self._abort_torch_groups(skip=silent)
            stuck = self.busy_ranks()
        wedged = [r for r in stuck if r in silent]
        if stuck and not stacks_first:
            stacks = _rank_faults.stacks(self.cluster, stuck, code=self.code, silent=wedged)
        # the heading already says "interrupted"; a timeout says how long it ran
        ran = f"still running after {timeout:g}s" if kind == "timeout" else ""
        what = f"{ran}; " if ran else ""
        items = []
        for r in self.ranks:
            if r in stuck:
                summary = f"{what}{_stuck_summary(r in wedged, in_torch, r in aborted)}"
                items.append((r, kind, summary, stacks.get(r, "")))
            elif r in busy:
                detail = stacks.get(r, "")
                how = (
                    "aborting its torch.distributed group freed it"
                    if r in aborted
                    else "SIGINT stopped it"
                )
                items.append((r, kind, f"{what}{how}", detail))
            elif r in released:
                items.append((r, kind, f"{what}stopped at breakpoint(); its pdb quit", ""))
        notes = []
        finished = [r for r in self._alive() if r not in busy and r not in released]
        if flight:
            notes.append(f"Communication (each rank's last calls, compared):\n{flight}")
        elif finished and busy:
            notes.append(
                f"Rank {format_ranks(finished)} had finished the cell while "
                f"{format_ranks(busy)} were still running: a rank that skipped a "
                "collective (or sent to nobody) looks like this."
            )
        if aborted:
            notes.append(_torch.aborted_note(self.cluster, aborted, stuck))
        if stuck:
            self.faults.ranks_stuck(stuck)
            notes.append(
                f"{_ranks_word(stuck)} {format_ranks(stuck)} could not be interrupted, so all "
                "ranks were restarted (their variables are gone; re-run your setup cells)."
            )
        note = "\n".join(notes)
        if not items:
            items = [(r, kind, ran or "the kernel was interrupted", "") for r in self.ranks]
        return CellInterrupted(group_failures(items), note=note)

    def _abort_torch_groups(self, grace: bool = True, skip: list[int] | None = None) -> list[int]:
        """Abort the torch.distributed groups of every rank of the cell but ``skip`` (that
        cannot answer); the ranks that had one. Waits a moment for the freed ranks to end
        their cell (``grace``)."""
        try:
            alive = [r for r in self._registered(self._alive()) if r not in (skip or ())]
            aborted = self.cluster.abort_torch_groups(alive)
        except Exception:  # the control channel may be gone with a rank
            return []
        if aborted and grace:
            self.ar.wait(_GRACE)
        return aborted

    def _registered(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` whose engine is still registered: one that has left
        meanwhile never answers a request."""
        ids, engine_of = self._client.ids, self.cluster.engine_of
        return [r for r in ranks if engine_of.get(r) in ids]

    def _silent(self, ranks: list[int], timeout: float) -> list[int]:
        """Those of ``ranks`` whose control thread (which needs Python's GIL) does not
        answer within ``timeout``; none where the asking itself failed."""
        engines = {r: self.cluster.engine_of[r] for r in self._registered(ranks)}
        if not engines:
            return []
        try:
            answered = _stacks.request_frames(self.cluster.client, engines, timeout=timeout)
        except Exception:  # the control channel may be gone with a rank: unknown, so
            return []  # every request goes to every rank, as it would to one that answers
        return [r for r in engines if r not in answered]

    def _release_breakpoints(self, ranks: list[int]) -> list[int]:
        """Quit the pdb of ranks stopped at ``breakpoint()``, give them a moment to end;
        the ranks released."""
        try:
            released = self._stops.release(ranks)
        except Exception:  # the control channel may be gone with the rank
            return []
        deadline = time.monotonic() + _GRACE
        while released and time.monotonic() < deadline:
            if not set(released) & set(self.busy_ranks()):
                break
            self.ar.wait(_POLL)
        return released

    def _collect_errors(self) -> RankError | None:
        results = self.ar.get(return_exceptions=True)
        for rep in self._replacing:  # a replaced rank's result is its new process's
            for rank, res in rep.results().items():
                results[self.ranks.index(rank)] = res
                self._died = [r for r in self._died if r != rank]
        items = []
        lost = False
        for rank, res in zip(self.ranks, results):
            if isinstance(res, ipp.error.EngineError) or getattr(res, "ename", "") == "EngineError":
                lost = True
            elif rank in self._died:  # its reply (if any) says less than its death
                continue
            elif isinstance(res, ipp.error.RemoteError):
                kind = "interrupted" if res.ename == "KeyboardInterrupt" else "error"
                tb = res.traceback or ""
                items.append((rank, kind, f"{res.ename}: {res.evalue}", tb))
            elif isinstance(res, BaseException):
                items.append((rank, "error", f"{type(res).__name__}: {res}", ""))
        if lost and not self.cluster.fault_tolerant:
            # The engine vanished; mpiexec's report, once it has exited, says why.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                dead = self.cluster.dead_ranks()
                if dead is not None:
                    return self._job_ended(*dead)
                time.sleep(_POLL)
        gone = [
            r
            for r, res in zip(self.ranks, results)
            if getattr(res, "ename", "") == "EngineError" or isinstance(res, ipp.error.EngineError)
        ]
        if self.cluster.fault_tolerant and (gone or self._died):
            # a death that Open MPI's runtime did not survive ends the job: that is the
            # news, not the survivors' failed recovery (its notice tells the death)
            report = job_report(self.cluster.job_output(lines=200))
            if _rank_faults.open_mpi_failed(self.cluster, report) is not None:
                return self._job_ended([], report)
            return _deathnews.report(self.cluster, self.faults, items, gone, self._died)
        items += [(r, "died", "engine lost", "") for r in gone]
        if not items:
            return None
        hint = _torch.error_hint([summary for _, _, summary, _ in items], self.cluster.torch)
        return RankError(group_failures(items), note=hint)


def _ranks_word(ranks: list[int]) -> str:
    return "Rank" if len(set(ranks)) == 1 else "Ranks"


def _stuck_summary(wedged: bool, in_torch: bool, aborted: bool) -> str:
    """Why a rank stayed busy after SIGINT (and, in torch, after its groups were closed)."""
    if wedged:
        return (
            "did not respond to SIGINT and its control thread did not answer either: it "
            "runs C code that holds Python's GIL (a C extension's loop, a deadlock)"
        )
    if in_torch and aborted:
        return (
            "did not respond to SIGINT, and closing its torch.distributed connections did "
            "not free it"
        )
    if in_torch:
        return "did not respond to SIGINT (blocked in a torch.distributed collective)"
    return "did not respond to SIGINT (blocked in an MPI call?)"
