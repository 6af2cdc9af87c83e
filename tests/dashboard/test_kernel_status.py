"""The kernel stays Busy, as JupyterLab counts it, for the whole of a ``%%mpi --dashboard`` cell.

JupyterLab 4.6 sends widget comms over a kernel subshell: the first widget comm of a
kernel makes it send ``create_subshell_request`` on the control channel (and
``delete_subshell_request`` when the last one closes). ipykernel answers each with a
busy/idle pair, and JupyterLab shows any ``idle`` whose parent is not one of Jupyter
Server's untracked message types: the status bar said Idle while the cell ran.

Here a real kernel (jupyter_client) runs the cell while the test does what
JupyterLab does when the dashboard's comms open, and reads every iopub ``status``.
"""

from __future__ import annotations

import queue
import time

import pytest
from jupyter_client.manager import start_new_kernel
from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

UNTRACKED = set(MappingKernelManager.class_traits()["untracked_message_types"].default())

CELL = """%%mpi --dashboard
import os, time, clusterkernel
deadline = time.monotonic() + 120   # never hang if the test dies
i = 0
while not os.path.exists({flag!r}) and time.monotonic() < deadline:
    clusterkernel.log(step=i, loss=1 / (i + 1))
    i += 1
    time.sleep(0.05)
print("released", os.path.exists({flag!r}))
"""


def _iopub(kc, until: float):
    try:
        return kc.get_iopub_msg(timeout=max(0.1, until - time.monotonic()))
    except queue.Empty:
        return None


def _control(kc, msg_type: str, content: dict) -> dict:
    msg = kc.session.msg(msg_type, content)
    kc.control_channel.send(msg)
    reply = kc.control_channel.get_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg["header"]["msg_id"]
    return reply


def _run(kc, code: str, timeout: float = 120) -> str:
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=lambda m: None)
    return reply["content"]["status"]


def test_dashboard_cell_stays_busy_through_jupyterlabs_subshell_requests(
    no_shared_cluster, tmp_path
):
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        info = kc.kernel_info(reply=True)["content"]
        if "kernel subshells" not in info.get("supported_features", []):
            pytest.skip("this ipykernel has no subshells, so JupyterLab sends no such request")
        assert _run(kc, "%load_ext clusterkernel\n%mpi start -n 2") == "ok"

        flag = tmp_path / "release"
        cell_id = kc.execute(CELL.format(flag=str(flag)))
        statuses = []  # (state, parent msg_type, parent is the cell) in order
        subshell_requests = 0
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            msg = _iopub(kc, deadline)
            if msg is None:
                continue
            parent = msg["parent_header"]
            if msg["msg_type"] == "status":
                state = msg["content"]["execution_state"]
                statuses.append((state, parent.get("msg_type"), parent.get("msg_id") == cell_id))
                if state == "idle" and parent.get("msg_id") == cell_id:
                    break
            elif (
                msg["msg_type"] == "comm_open"
                and msg["content"].get("target_name") == "jupyter.widget"
                and not subshell_requests
            ):
                # what JupyterLab does for the first comm of the jupyter.widget target,
                # then what it does when the last one closes
                sub = _control(kc, "create_subshell_request", {})["content"]["subshell_id"]
                _control(kc, "delete_subshell_request", {"subshell_id": sub})
                subshell_requests = 2
                flag.write_text("go")
        else:
            raise AssertionError(f"the cell did not finish; statuses so far: {statuses}")
        reply = kc.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == cell_id
        assert reply["content"]["status"] == "ok", reply["content"]
        assert subshell_requests == 2, "the dashboard opened no widget comm"
        assert _run(kc, "%mpi stop") == "ok"
    finally:
        km.shutdown_kernel(now=True)
        kc.stop_channels()

    # the subshell requests did answer busy/idle while the cell ran ...
    control = [s for s, parent_type, _ in statuses if parent_type.endswith("subshell_request")]
    assert control.count("idle") == 2, statuses
    # ... the cell itself went idle exactly once, at its end ...
    assert [mine for s, _, mine in statuses if s == "idle"].count(True) == 1
    # ... and the state JupyterLab shows (the last status it tracks) was busy right
    # up to the cell's own idle
    tracked = [s for s, parent_type, _ in statuses[:-1] if parent_type not in UNTRACKED]
    assert tracked and tracked[-1] == "busy", f"JupyterLab would show Idle: {statuses}"
