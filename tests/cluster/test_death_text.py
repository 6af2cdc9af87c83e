"""How a death reads, without ranks: the launcher's log parsed, the survivors' errors folded."""

from __future__ import annotations

from clusterkernel.client.cluster._deathnews import caused_by_death, fold
from clusterkernel.client.cluster._jobreport import (
    LostDaemon,
    dead_ranks,
    death_cause,
    exits,
    job_report,
    launcher_abort,
    launcher_signal,
    lost_daemon,
)

_ODLS = """\
[vm:1] [prterun-vm-1@0,0] odls:wait_local_proc child process [prterun-vm-1@1,2] pid 4321 terminated
[vm:1] [prterun-vm-1@0,0] odls:waitpid_fired child process [prterun-vm-1@1,2] terminated with signal Killed
[vm:1] [prterun-vm-1@0,0] odls:wait_local_proc child process [prterun-vm-1@1,1] pid 4320 terminated
[vm:1] [prterun-vm-1@0,0] odls:waitpid_fired child [prterun-vm-1@1,1] exit code 3
[vm:1] [prterun-vm-1@0,0] odls:waitpid_fired child process [prterun-vm-1@1,1] terminated normally
"""


def test_the_launchers_log_says_how_each_process_ended():
    assert exits(_ODLS) == {4321: "killed by SIGKILL", 4320: "exit code 3"}
    assert death_cause("process rank 2 with PID 7 exited on signal 9 (Killed)") == (
        "killed by SIGKILL"
    )
    assert death_cause("exited on signal 11 (Segmentation fault)") == "killed by SIGSEGV"


# Open MPI's launcher log when node2's daemon (srun's task 0 of the daemons' step) crashed,
# as the Slurm job's output file holds it: srun's line after a NUL where writers raced
_LOST = """\
[IPEngine.2.2] WARNING | debugpy_stream undefined, debugging will not be enabled
--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-node1-30590@0,0] on node node1
  Remote daemon: [prterun-node1-30590@0,1] on node node2.cluster

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
--------------------------------------------------------------------------
\0srun: error: node2.cluster: task 0: Segmentation fault
"""


def test_a_lost_daemon_is_named_with_its_node_and_srun_task_0_is_not_rank_0():
    report = job_report(_LOST)
    lost = lost_daemon(report)
    assert lost == LostDaemon("node2.cluster", "killed by SIGSEGV")
    assert str(lost) == "Open MPI's daemon on node2.cluster died (killed by SIGSEGV)"
    assert lost.ranks({0: "node1", 1: "node1", 2: "node2", 3: "node2.cluster"}) == [2, 3]
    assert dead_ranks(report, 4) == []  # srun's task 0 there was the daemon
    plain = "srun: error: node2: task 3: Exited with exit code 3"  # srun started the ranks
    assert lost_daemon(plain) is None and dead_ranks(plain, 4) == [3]


# prterun's own abort during a spawn, as a fault-tolerant Slurm job's log holds it
_ABORT = """\
[node2:6037] [prterun-node1-6016@0,1] odls:launch spawning child [prterun-node1-6016@2,0]
[node1:06016] PMIX ERROR: PMIX_ERROR in file /src/prted/pmix/pmix_server_dyn.c at line 1113
[err] event.c:3392: Assertion evcb->evcb_pri < base->nactivequeues failed in event_queue_insert_active
Aborted
srun: error: node2: task 0: Exited with exit code 1
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
"""


def test_a_launcher_that_aborts_itself_is_told_as_open_mpis_fault():
    report = job_report(_ABORT)
    said = "PMIX ERROR: PMIX_ERROR in file /src/prted/pmix/pmix_server_dyn.c at line 1113"
    assert launcher_abort(report) == said and launcher_abort(_ABORT) == said
    assert dead_ranks(report, 4) == []  # srun's task 0 there was node2's daemon
    assert launcher_abort("[node1:1] PMIX ERROR: NOT-FOUND in file x.c\nall went on") is None


def test_a_batch_jobs_launcher_ended_by_a_signal_is_read_from_its_shells_line():
    # sh (the job script of a fault-tolerant Slurm job, as the test bed's log held it)
    sh = "[node2:28958] odls:launch spawning child\nSegmentation fault\nslurmstepd-node2: error: *** STEP 3.0 ON node2 FAILED ***\n"
    assert launcher_signal(sh) == 11
    bash = "/var/spool/slurmd/job00017/slurm_script: line 9:  3843 Aborted (core dumped)  /v/bin/mpiexec -n 4 python"
    assert launcher_signal(bash) == 6
    # neither a signal's words inside a line nor another command that bash saw end
    assert launcher_signal("rank 2: Segmentation fault in my code") is None
    assert launcher_signal("job.sh: line 3: 21866 Segmentation fault      python -m x") is None


def test_survivors_errors_a_death_caused_fold_into_one_line_per_group():
    raw = "\x1b[31mException\x1b[0m: MPI_ERR_PROC_FAILED: Process Failure"
    tb = 'File <dynamic-code>:21\nFile ".../comm/_reductions.py:90, in all_reduce(tensor)'
    items = [
        (0, "error", "PeerDiedError: all_reduce failed: rank 2 died", "Traceback ..."),
        (1, "error", raw, tb),
        (3, "error", "Exception: MPI_ERR_OTHER: known error not in list", ""),
        (3, "error", "ZeroDivisionError: division by zero", "tb"),  # its own error stays
    ]
    assert fold(items, [2]) == [
        (0, "", "all_reduce failed: rank 2 died", ""),
        (1, "", "all_reduce failed: rank 2 died", ""),
        (3, "", "a collective failed: rank 2 died", ""),
        (3, "error", "ZeroDivisionError: division by zero", "tb"),
    ]
    assert fold(items, []) == items  # nobody died: nothing is folded
    assert caused_by_death("ValueError: bad", "") is None
