"""The notebook's ssh to a login node carries a keepalive unless the user's ssh config
gives one: read with the real OpenSSH client (``ssh -G``, which connects nowhere),
from a config file as the login test bed gives its laptop one (an ``ssh`` on PATH that
is OpenSSH with ``-F``)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from clusterkernel.client.launch._ssh import Login, sets_keepalive

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client")


@pytest.fixture
def ssh_config(tmp_path, monkeypatch):
    """Write the user's ssh config; ``ssh`` on PATH reads it."""
    config = tmp_path / "config"
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {config} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    return config


def test_without_a_keepalive_of_the_users_the_connection_gets_one(ssh_config):
    ssh_config.write_text("Host login\n    User someone\n")
    assert not sets_keepalive("login")
    argv = Login("login", "/usr/bin/python3").ssh()
    at = argv.index("ServerAliveInterval=10")
    assert argv[at - 1] == "-o" and "ServerAliveCountMax=3" in argv
    # what OpenSSH then makes of the command line
    got = subprocess.run([*argv[:-1], "-G", "login"], capture_output=True, text=True).stdout
    assert "serveraliveinterval 10" in got.splitlines(), got


def test_the_users_own_keepalive_is_left_as_it_is(ssh_config):
    ssh_config.write_text("Host login\n    ServerAliveInterval 5\n")
    assert sets_keepalive("login") and not sets_keepalive("elsewhere")
    argv = Login("login", "/usr/bin/python3").ssh()
    assert not any(a.startswith("ServerAlive") for a in argv), argv
