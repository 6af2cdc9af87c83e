"""A helper process on the login node driven through its ssh's pipes (client side): the
next line it writes, and its end (stdin closed: it exits on that).

The dashboard's relay (:mod:`clusterkernel.client.launch._relay`) and a session's hold
on a kept record (:mod:`clusterkernel.client.cluster._kept_login`) are such processes.

Example::

    proc = subprocess.Popen(argv, stdin=PIPE, stdout=PIPE, stderr=PIPE, text=True)
    address = next_line(proc, 30)     # "" if none came in 30 s
    err = end(proc, 10)               # what it wrote to stderr
"""

from __future__ import annotations

import selectors
import subprocess


def next_line(proc: subprocess.Popen, timeout: float) -> str:
    """The next line ``proc`` writes to stdout, stripped ("" if none comes within
    ``timeout``, or it ended)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline().strip()


def end(proc: subprocess.Popen, timeout: float) -> str:
    """Close ``proc``'s stdin (it exits on that), wait ``timeout`` seconds for it (then
    kill it) and return what it wrote to stderr, stripped."""
    if proc.stdin is not None and not proc.stdin.closed:
        try:
            proc.stdin.close()
        except OSError:  # it has ended: nothing to tell it
            pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    return (err or "").strip()
