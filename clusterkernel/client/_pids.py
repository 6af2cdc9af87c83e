"""Whether a process id names a live process on this machine (client side).

Example::

    pid_alive(os.getpid())   # True
"""

from __future__ import annotations

import os


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` runs here: another user's process counts, a zombie (its parent
    has not reaped it) does not."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
