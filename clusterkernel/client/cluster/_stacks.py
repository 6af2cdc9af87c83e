"""Stacks of running ranks, on any host (client side).

Asks each engine's control thread for its main thread's frames (the handler is
installed by :mod:`clusterkernel.rank._engine_setup`); the request travels on
ipyparallel's signed control channel, so a rank on another node answers like a
local one, and answers while blocked inside an MPI call. Frames come back as
plain JSON (file, line, name, source, locals as short reprs); nothing is unpickled.

Example::

    frames = request_frames(client, {0: 0, 1: 1}, with_locals=True)
    print(format_stack(frames[1], code=cell_source))
"""

from __future__ import annotations

import os
import re
import time

from clusterkernel.client.cluster import _jobreport
from clusterkernel.client.cluster._ipp import control_request
from clusterkernel.protocol._names import (
    OURS,
    STACK_REQUEST,
    TORCH_ABORT_REQUEST,
    stack_path,
)

# A cell's frames on an engine: ipykernel names cell files per process and cell.
_CELL_FILE = re.compile(r"ipykernel_\d+[/\\]\d+\.py$|^<ipython-input-")


def request_frames(
    client, engines: dict[int, int], with_locals: bool = False, timeout: float = 3.0
) -> dict[int, list[dict]]:
    """``{rank: frames}`` for each rank in ``engines`` (rank -> engine id) that answered."""
    replies = request_state(client, engines, with_locals, timeout)
    return {rank: reply.get("frames", []) for rank, reply in replies.items()}


def request_state(
    client, engines: dict[int, int], with_locals: bool = False, timeout: float = 3.0
) -> dict[int, dict]:
    """Each answering rank's reply: ``frames`` and ``flight`` (its last comm calls)."""
    return _answered(
        control_request(client, engines, STACK_REQUEST, {"locals": with_locals}, timeout)
    )


def abort_torch_groups(client, engines: dict[int, int], timeout: float = 3.0) -> list[int]:
    """Abort the torch.distributed groups of each rank; the ranks that had one.

    Through the control channel, so ranks blocked in a collective answer too.
    """
    replies = _answered(control_request(client, engines, TORCH_ABORT_REQUEST, {}, timeout))
    return sorted(r for r, reply in replies.items() if reply.get("aborted"))


def _answered(replies: dict[int, dict]) -> dict[int, dict]:
    return {rank: content for rank, content in replies.items() if content.get("status") == "ok"}


def faulthandler_frames(run_dir: str, ranks: list[int], send_signal, settle: float = 0.3):
    """``{rank: frames}`` from ``faulthandler`` dumps, for ranks whose dump file is here.

    The fallback for a rank whose control thread cannot answer: ``send_signal(ranks)``
    makes each write its stacks to its file (``_engine_setup``), a C-level handler
    that needs nothing from the rank's Python threads.
    """
    paths = {r: stack_path(run_dir, r) for r in ranks}
    paths = {r: p for r, p in paths.items() if os.path.exists(p)}
    if not paths:
        return {}
    offsets = {r: os.path.getsize(p) for r, p in paths.items()}
    try:
        send_signal(list(paths))
    except Exception:  # the rank may be gone with its nanny
        return {}
    time.sleep(settle)
    out = {}
    for r, path in paths.items():
        with open(path) as f:
            f.seek(offsets[r])
            frames = _jobreport.faulthandler_frames(f.read())
        if frames:
            out[r] = frames
    return out


def is_cell(frame: dict) -> bool:
    return bool(_CELL_FILE.search(frame.get("file", "")))


def is_ours(frame: dict) -> bool:
    # faulthandler frames (this machine, this install) carry no flag: ask the path
    return frame.get("ours", frame.get("file", "").startswith(OURS))


def cell_lines(frames: list[dict]) -> list[int]:
    """The cell's line numbers on a stack, outermost first."""
    return [f["line"] for f in frames if is_cell(f)]


def format_stack(
    frames: list[dict], code: str | None = None, all_frames: bool = False, with_locals: bool = False
) -> str:
    """A stack as the user wants to read it: the cell's lines first and by number.

    clusterkernel's own frames are folded into one line (``all_frames`` shows them).
    """
    src = code.splitlines() if code else []
    lines: list[str] = []
    hidden: list[str] = []
    for f in frames:
        if is_ours(f) and not all_frames:
            hidden.append(f["name"])
            continue
        if is_cell(f):
            lines.append(f"  Cell line {f['line']}, in {f['name']}")
            text = f.get("source") or (
                src[f["line"] - 1].strip() if 0 < f["line"] <= len(src) else ""
            )
        else:
            lines.append(f'  File "{f["file"]}", line {f["line"]}, in {f["name"]}')
            text = f.get("source", "")
        if text:
            lines.append(f"    {text}")
        if with_locals and f.get("locals"):
            width = max(len(k) for k in f["locals"])
            lines += [f"      {k:<{width}} = {v}" for k, v in sorted(f["locals"].items())]
    if hidden:
        lines.append(f"  (inside clusterkernel: {' > '.join(hidden)})")
    return "\n".join(lines)
