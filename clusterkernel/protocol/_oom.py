"""Did the kernel's out-of-memory killer end a process? Its memory cgroup's counter says.

A rank the OOM killer ends dies of SIGKILL, which is all mpiexec sees ("exited on
signal 9"). The kernel counts those kills in the memory cgroup of the victim:
``oom_kill N`` in ``memory.events`` (cgroup v2) or ``memory.oom_control`` (v1). Each
rank notes its cgroup's counter file and value when it starts (engine side); when a
rank has died of SIGKILL, the client reads the file again (client side, ranks on its
own host): a larger count means the OOM killer struck. ``dmesg`` would say more but
is root-only on most systems; Slurm reports its own OOM kills in ``slurmstepd``'s
message, read by ``cluster._jobreport``.

Example::

    mark = counter()          # {"file": ".../memory.events", "count": 0} or None
    ...
    read_count(mark["file"]) > mark["count"]    # True after an OOM kill in that cgroup
"""

from __future__ import annotations

import os
import re

CGROUP_ROOT = "/sys/fs/cgroup"
_COUNT = re.compile(r"^oom_kill\s+(\d+)$", re.M)


def _candidates(cgroup_lines: str) -> list[str]:
    """Counter files for one process's ``/proc/PID/cgroup`` text, most specific first."""
    out = []
    for line in cgroup_lines.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.lstrip("/")
        if "memory" in controllers.split(","):  # v1: the memory hierarchy
            out.append(os.path.join(CGROUP_ROOT, "memory", path, "memory.oom_control"))
        elif hierarchy == "0" and not controllers:  # v2, alone or beside v1 ("unified")
            out.append(os.path.join(CGROUP_ROOT, path, "memory.events"))
            out.append(os.path.join(CGROUP_ROOT, "unified", path, "memory.events"))
    return out


def read_count(path: str) -> int | None:
    """The ``oom_kill`` count in a cgroup counter file; None if unreadable."""
    try:
        with open(path) as f:
            m = _COUNT.search(f.read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def counter(pid: int | str = "self") -> dict | None:
    """``{"file": path, "count": n}`` for ``pid``'s memory cgroup, or None where no counter
    can be read (no memory cgroup, or a kernel that does not count)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read()
    except OSError:
        return None
    for path in _candidates(lines):
        count = read_count(path)
        if count is not None:
            return {"file": path, "count": count}
    return None


def killed_since(mark: dict | None) -> bool:
    """Whether the OOM killer struck in the cgroup of ``mark`` (from :func:`counter`) since."""
    if not mark:
        return False
    now = read_count(mark["file"])
    return now is not None and now > mark["count"]
