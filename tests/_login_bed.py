"""A laptop outside the cluster: the login test bed (``/work/shared/login/testbed.sh``).

:func:`laptop_bed` starts it with the environment every SSH session to the login node
gets (a scheduler bed's: Slurm's ``SLURM_CONF``, Grid Engine's ``SGE_ROOT``, ...),
yields ``run(code)``, which runs a Python script in the laptop's network namespace
(it reaches the cluster only by ``ssh login``), and stops the bed on leaving.

Example::

    with laptop_bed(slurm_testbed.env) as run:
        out, _ = run("import socket; print(socket.gethostname())").communicate()
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

LOGIN_BED = Path("/work/shared/login/testbed.sh")


@contextlib.contextmanager
def laptop_bed(env: dict[str, str]) -> Iterator:
    """``run(script)``: a Python script in the laptop namespace, ``ssh login`` to a login
    node whose sessions see ``env``; ``run.home`` (the laptop's HOME), ``run.netns`` (its
    namespace) and ``run.login_addr`` (the login node's address) say where it is."""
    base = Path(tempfile.mkdtemp(prefix="ck-login-"))
    env_sh = base / "login-env.sh"
    env_sh.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    bed = base / "bed"
    started = subprocess.run(
        ["bash", str(LOGIN_BED), "start", str(bed), str(env_sh)], capture_output=True, text=True
    )

    def stop() -> None:
        subprocess.run(["bash", str(LOGIN_BED), "stop", str(bed)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)

    if started.returncode != 0:
        stop()
        pytest.fail(f"the login bed did not start: {started.stdout}{started.stderr}")

    def run(code: str) -> subprocess.Popen:
        script = base / f"s{time.monotonic_ns()}.py"
        script.write_text(textwrap.dedent(code))
        return subprocess.Popen(
            ["bash", str(LOGIN_BED), "run", str(bed), sys.executable, "-u", str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=os.getcwd(),
        )  # fmt: skip

    run.home = bed / "home"  # type: ignore[attr-defined]  # the laptop's HOME
    named = dict(line.split("=", 1) for line in (bed / "env.sh").read_text().split()[1:])
    run.netns = named["CK_LOGIN_NS"]  # type: ignore[attr-defined]  # the laptop's
    run.login_addr = named["CK_LOGIN_ADDR"]  # type: ignore[attr-defined]
    try:
        yield run
    finally:
        stop()
