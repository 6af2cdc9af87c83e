"""The controller on the cluster's login node, started from outside (client side).

ipyparallel's :class:`~ipyparallel.cluster.launcher.SSHControllerLauncher`, with a start
that waits less: the checks of the login node and its profile directory are
:class:`~clusterkernel.client.launch._ssh.Login`'s, made before (``check``,
``profile_dir``), so no ``python --version`` and no ``ipython profile create`` there;
and the controller's connection files are waited for on the login node by one ssh
command that looks every 50 ms, where ipyparallel looks once a second with a Python
started for each look (BENCHMARKS.md, "Start and cells", "From outside the cluster").
Everything else (the command, the environment, the remote pid, the stop) is
ipyparallel's.

Example::

    # not run: needs an SSH host (BatchLauncher.controller names this class)
    ipp.Cluster(controller=LOGIN_CONTROLLER, config=launcher.config(env, run_dir))
"""

from __future__ import annotations

import shlex
import subprocess
import time

from ipyparallel.cluster.launcher import SSHControllerLauncher

from clusterkernel.client.errors import ClusterError

_FILES_WITHIN = 30.0  # seconds the controller may take to write its connection files
_LOOK_EVERY = 0.05  # seconds between looks for them on the login node
_LOOK_AGAIN = 5.0  # seconds before the controller is looked at again after a lost connection


class LoginControllerLauncher(SSHControllerLauncher):
    """The controller on the login node (see the module); configured as ipyparallel's
    ``SSHControllerLauncher`` is (its config section applies)."""

    # the cluster file names the class by this (ipyparallel imports it back on attach)
    entrypoint_name = "clusterkernel.client.launch._login_controller.LoginControllerLauncher"

    def start(self, hostname=None, user=None, port=None):
        self.ssh_sender.get_shell_info()  # which shell the login node runs: its commands
        self.send_files()
        self.pid = self.ssh_sender.cmd_start(
            self.program + self.program_args,
            env=self.get_env(),
            output_file=self.remote_output_file,
        )
        self.notify_start({"host": self.location, "pid": self.pid})
        self._start_waiting()
        self.fetch_files()

    def wait_one(self, timeout):
        """ipyparallel's look at the controller (an ssh over the master connection), which
        a lost connection ends: looked at again, once the guard made it again (an error
        would end ipyparallel's watch, with a traceback in the notebook)."""
        try:
            return super().wait_one(timeout)
        except (subprocess.CalledProcessError, RuntimeError):
            time.sleep(_LOOK_AGAIN)
            raise TimeoutError("the connection to the login node was lost") from None

    def fetch_files(self):
        """The connection files, once the controller wrote them all, by scp."""
        remote = [r for r, _ in self.to_fetch]
        looks = int(_FILES_WITHIN / _LOOK_EVERY)
        wait = (
            'have() { for f in "$@"; do [ -e "$f" ] || return 1; done; }; i=0; '
            f'until have "$@"; do i=$((i+1)); [ $i -ge {looks} ] && exit 3; '
            f"sleep {_LOOK_EVERY}; done"
        )
        done = subprocess.run(
            [*self.ssh_cmd, *self.ssh_args, self.location, shlex.join(["sh", "-c", wait, "sh", *remote])],
            capture_output=True, text=True, timeout=_FILES_WITHIN + 30,
        )  # fmt: skip
        if done.returncode != 0:
            raise ClusterError(
                f"The controller on {self.location} wrote no connection files within "
                f"{_FILES_WITHIN:.0f} s ({(done.stderr or done.stdout).strip() or 'none'}); "
                f"its log is {self.remote_output_file} there."
            )
        for remote_file, local_file in self.to_fetch:
            self._fetch_file(remote_file, local_file, wait=False)
