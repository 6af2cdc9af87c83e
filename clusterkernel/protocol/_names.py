"""The names both sides use to reach a rank whose main thread is busy (the standard library only).

A request travels on ipyparallel's signed control channel, so ipykernel's control
thread on the rank answers it while a cell runs or waits in MPI: the rank installs a
handler for each request name (:mod:`clusterkernel.rank._engine_setup`,
:mod:`clusterkernel.rank._debugger`) and answers with the matching reply; the notebook
sends the request (:mod:`clusterkernel.client.cluster._ipp`'s ``control_request``) and
never imports the rank's handlers. Beside the requests: the signal that makes a rank
write its stacks to a file (``faulthandler``, the fallback when the control thread
cannot run), the ``publish_data`` key of a rank stopped at ``breakpoint()``, and the
environment variable naming modules a fresh engine imports while it registers.

Example::

    control_request(client, {0: 0}, STACK_REQUEST, {"locals": False}, timeout=3.0)
    stack_path(run_dir, 2)    # <run_dir>/stack-rank2.txt: rank 2's faulthandler file
"""

from __future__ import annotations

import os
import signal

# Every engine's environment names its cluster's run directory (the launcher sets it for
# every engine and what they start, so a rank on another node finds the same name; a
# cluster started over SSH gives its own side's directory here, never the notebook's)
RUN_DIR_ENV = "CLUSTERKERNEL_CLUSTER"
# a rank's Python stack (and, asked, its locals); the signal writes it to stack_path
STACK_SIGNAL = signal.SIGUSR1
STACK_REQUEST = "clusterkernel_stack_request"
STACK_REPLY = "clusterkernel_stack_reply"
# aborts the rank's torch.distributed groups: frees a rank blocked in gloo or NCCL
TORCH_ABORT_REQUEST = "clusterkernel_torch_abort_request"
TORCH_ABORT_REPLY = "clusterkernel_torch_abort_reply"
# the rank's GPU: name, memory, utilisation (answered while the rank is busy)
GPU_REQUEST = "clusterkernel_gpu_request"
GPU_REPLY = "clusterkernel_gpu_reply"
# Tab and Shift-Tab answered from the rank's namespace
COMPLETE_REQUEST = "clusterkernel_complete_request"
COMPLETE_REPLY = "clusterkernel_complete_reply"
INSPECT_REQUEST = "clusterkernel_inspect_request"
INSPECT_REPLY = "clusterkernel_inspect_reply"
# the debugger: a pdb command for a post-mortem or a breakpoint() on the rank
DEBUG_REQUEST = "clusterkernel_debug_request"
DEBUG_REPLY = "clusterkernel_debug_reply"
PAUSE_KEY = "clusterkernel_paused"  # publish_data key: {"seq": n, "text": where it stopped}
# the sampler (rank._profile_control): stop it and reply with the profile, even while a
# cell hangs; or peek at the rolling window and new snapshots, the sampler left running
PROFILE_REQUEST = "clusterkernel_profile_request"
PROFILE_REPLY = "clusterkernel_profile_reply"
PROFILE_PEEK = "clusterkernel_profile_peek"
PEEK_REPLY = "clusterkernel_profile_peek_reply"

# modules a fresh engine imports beside its start (comma-separated; rank._warm_start)
PREIMPORT = "CLUSTERKERNEL_PREIMPORT"

# clusterkernel's own files: their frames show only when asked (the user's cell first).
# (this file is in clusterkernel/protocol/, so two levels up)
OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def stack_path(stack_dir: str, rank: int) -> str:
    """The file a rank's faulthandler writes its stacks to on :data:`STACK_SIGNAL`."""
    return os.path.join(stack_dir, f"stack-rank{rank}.txt")
