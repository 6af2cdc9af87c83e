"""How a death reads, without ranks: the launcher's log parsed, the survivors' errors folded."""

from __future__ import annotations

from clusterkernel.client.cluster._deathnews import caused_by_death, fold
from clusterkernel.client.cluster._jobreport import death_cause, exits

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
