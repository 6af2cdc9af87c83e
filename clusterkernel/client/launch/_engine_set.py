"""What every launcher does with ipyparallel's engine set (client side): the base
configuration, the engine command, the launcher's output and whether its process ended.

Example::

    engine_cmd({})                      # ipyparallel's own ipengine command
    tail("a\nb\nc", 2)                 # 'b\nc'
"""

from __future__ import annotations

import sys
from typing import Any

import psutil
from ipyparallel.cluster.launcher import ipengine_cmd_argv
from traitlets.config import Config

from clusterkernel.protocol._names import PREIMPORT
from clusterkernel.protocol._procs import alive

# An engine counts as registered once the controller has seen its heartbeat; at
# ipyparallel's default period (3 s) that alone costs 1.5 s on average per start.
HEARTBEAT_MS = 500


def engine_cmd(env: dict[str, str]) -> list[str]:
    """ipyparallel's engine command for ranks started with ``env``: through
    :mod:`clusterkernel.rank._warm_start` where ``env`` names modules to import while
    the engine registers (``--torch``: torch.distributed), else ipyparallel's own."""
    if env.get(PREIMPORT):
        return [sys.executable, "-m", "clusterkernel.rank._warm_start"]
    return list(ipengine_cmd_argv)


def base_config() -> Config:
    cfg = Config()
    cfg.LocalControllerLauncher.controller_args = [
        "--log-level=WARN",
        f"--HeartMonitor.period={HEARTBEAT_MS}",
    ]
    return cfg


def current_output(engine_set: Any) -> str:
    """What a launcher has written so far: its file read now (ipyparallel's
    ``get_output`` keeps the first read, stale while a fault-tolerant job runs on)."""
    if engine_set is None:
        return ""
    path = getattr(engine_set, "output_file", None)
    if path:
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            pass
    return engine_set.get_output()


def tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of a launcher's output."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def process_ended(engine_set: Any) -> bool:
    """Whether a launcher's process (mpiexec, srun) has exited.

    Asks the OS rather than the launcher: the launcher learns of the exit only
    when ipyparallel's event loop next runs, which a blocked notebook never lets it.
    """
    proc = getattr(engine_set, "process", None)
    if proc is None:
        return False
    return not alive(proc)


def process_signal(engine_set: Any) -> int | None:
    """The signal that ended a launcher's process (mpiexec, srun), if one did.

    The exit status is psutil's, kept by whichever wait reaped the process (ours or
    ipyparallel's thread); None while it runs, for an exit, or where this process is
    not its parent (a kept job attached again).
    """
    proc = getattr(engine_set, "process", None)
    if proc is None or alive(proc):
        return None
    try:
        code = proc.wait(0)
    except psutil.Error:
        return None
    return -int(code) if isinstance(code, int) and code < 0 else None
