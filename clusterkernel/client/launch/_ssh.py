"""The cluster's login node, reached by OpenSSH from a notebook outside it (client side).

With ``ssh=HOST`` (``%mpi start --ssh HOST``) every command that must run on the cluster
(the controller, the scheduler's ``sbatch``/``squeue``/``scancel``, the guard) runs as
``ssh HOST ...``: the user's own OpenSSH, its config and keys, ``BatchMode`` (a key
that is refused is an error, never a password prompt). One master connection per
cluster (``ControlMaster``, its socket in a private directory of this machine) makes
the repeated commands cheap. Nothing listens on this machine but its loopback: the
notebook reaches the controller through forwards of that connection (``ssh -O forward``,
the controller's ports on 127.0.0.1 here, as ipyparallel's own SSH tunnels would make
them one by one), and ipyparallel's client connects to those. A master connection that
was lost is made again with the same forwards (:meth:`Login.reconnect`, by the guard),
and the client's sockets keep their routing ids across it (:func:`stable_context`).

Example::

    # not run: needs an SSH host
    login = Login("login", python="/opt/venv/bin/python")
    login.check("sbatch")                         # a clear error if it cannot work
    login.run("squeue", "-h", "-j", "12")         # squeue's stdout
    login.close()
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile

import zmq

from clusterkernel.client.errors import ClusterError

_CONNECT_TIMEOUT = 10  # seconds: an unknown or silent host fails in this time, not TCP's
# Where the user's ssh config sets no keepalive: a connection that answers none of 3
# probes 10 s apart is taken as dead, within the login node's own bound for a silent
# notebook (``_guard``: 30 s, then its grace), so the notebook makes it again in time.
_ALIVE = ("-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3")
# what `ipython profile create` makes (its config files all comments: empty is the same)
_PROFILE_DIRS = ("log", "pid", "security", "startup")
_PROFILE_FILES = ("ipython_config.py", "ipython_kernel_config.py")


class LoginError(ClusterError):
    """The login node cannot be reached by SSH, or lacks what the start needs."""


class Login:
    """The login node ``host`` (an OpenSSH destination: a ``Host`` of ``~/.ssh/config``,
    ``user@host``); ``python``: the interpreter there that has clusterkernel.

    Example::

        # not run: needs an SSH host
        Login("login").run("hostname")
    """

    def __init__(self, host: str, python: str) -> None:
        if not host or host.startswith("-") or any(c.isspace() for c in host):
            raise ValueError(f"ssh= {host!r}: give an SSH host, e.g. 'login' or 'me@cluster'.")
        self.host, self.python = host, python
        self._control_dir: str | None = None
        self._forwards: list[str] = []  # the master connection's -L forwards, made again
        self._forwarded_by: int | None = None  # the pid of the master that holds them
        self._alive: tuple[str, ...] | None = None  # _ALIVE, or () where the user set theirs
        # set while a lost connection is being made again (Guard): commands fail meanwhile
        self.lost = False

    def ssh(self, *options: str, shared: bool = True) -> list[str]:
        """The ``ssh`` command line up to the host (its options first); ``shared``: over
        the master connection (else a connection of its own)."""
        if shutil.which("ssh") is None:
            raise LoginError("`ssh` is not on PATH: --ssh needs OpenSSH's client.")
        if self._control_dir is None:  # short: a socket path has ~100 characters at most
            self._control_dir = _control_dir()
        control = (
            ["-o", "ControlMaster=auto", "-o", "ControlPersist=60",
             "-o", f"ControlPath={self._control_dir}/%C"]
            if shared else ["-o", "ControlPath=none"]
        )  # fmt: skip
        if self._alive is None:
            self._alive = () if sets_keepalive(self.host) else _ALIVE
        return [
            "ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={_CONNECT_TIMEOUT}",
            *self._alive, *control, *options, self.host,
        ]  # fmt: skip

    def argv(self, *command: str, shared: bool = True) -> list[str]:
        """``command`` run on the login node (quoted for its shell)."""
        return [*self.ssh(shared=shared), "--", shlex.join(command)]

    def forwarded(self, info: dict) -> dict:
        """An ipyparallel client's connection ``info`` (the controller's ports on the
        login node's address) with each port forwarded from this machine's loopback
        through the master connection, all in one ``ssh -O forward``: a client given it
        connects as to a local controller.

        Not ipyparallel's ``sshserver=``: pyzmq makes its tunnels one by one, two ssh
        runs each through pexpect, ~1.5 s for a client's seven (BENCHMARKS.md, "Start
        and cells", "From outside the cluster"); a new ssh of its own per tunnel must
        moreover log in within pyzmq's one second."""
        proto, addr = info["interface"].split("://", 1)
        ports = _free_ports(len(_CLIENT_PORTS))
        forwards = []
        for key, port in zip(_CLIENT_PORTS, ports):
            forwards += ["-L", f"127.0.0.1:{port}:{addr}:{info[key]}"]
        self.run("true", timeout=30)  # the master connection, made now
        done = subprocess.run(
            self.ssh("-O", "forward", *forwards), capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise LoginError(
                f"ssh {self.host}: the controller's ports could not be forwarded "
                f"({done.stderr.strip() or 'no answer'}); the server must allow TCP "
                "forwarding (AllowTcpForwarding)."
            )
        self._forwards += forwards
        self._forwarded_by = self._master_pid()
        # no location, no ssh: ipyparallel then connects where it is told, here
        return {
            **info, **dict(zip(_CLIENT_PORTS, ports)),
            "interface": f"{proto}://127.0.0.1", "location": None, "ssh": "",
        }  # fmt: skip

    def write(self, path: str, text: str) -> None:
        """A file of the login node (``path`` under its home unless absolute), private."""
        folder = os.path.dirname(path) or "."
        self.run(
            "sh", "-c", f"umask 077 && mkdir -p {shlex.quote(folder)} && cat > {shlex.quote(path)}",
            input=text,
        )  # fmt: skip

    def profile_dir(self, path: str) -> None:
        """The cluster's IPython profile directory on the login node (``path`` as
        :meth:`write` takes it), private: what ``ipython profile create`` makes (its
        folders, its config files empty), where ipyparallel's controller launcher would
        run that (a Python start, and a line per file into the notebook's output)."""
        dirs = " ".join(shlex.quote(f"{path}/{d}") for d in _PROFILE_DIRS)
        files = " ".join(shlex.quote(f"{path}/{n}") for n in _PROFILE_FILES)
        self.run("sh", "-c", f"umask 077 && mkdir -p {dirs} && touch {files}")

    def remove(self, path: str) -> None:
        """Remove a directory of the login node (what a cluster left there)."""
        self.run("rm", "-rf", "--", path, check=False, timeout=30)

    def run(
        self, *command: str, input: str | None = None, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess:
        """``command`` on the login node; a :class:`LoginError` where ssh itself failed
        (exit 255) or, with ``check``, where the command did."""
        try:
            done = subprocess.run(
                self.argv(*command), input=input, capture_output=True, text=True,
                timeout=timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise LoginError(
                f"`ssh {self.host} {shlex.join(command)}` did not answer within {timeout:.0f} s."
            ) from None
        if done.returncode == 255:
            raise LoginError(self._why(done.stderr))
        if check and done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            raise LoginError(f"`{shlex.join(command)}` on {self.host} failed: {said}")
        return done

    def _why(self, stderr: str) -> str:
        said = stderr.strip().splitlines()[-1] if stderr.strip() else "no answer"
        if "Permission denied" in stderr:
            return (
                f"ssh {self.host}: the key was refused ({said}). --ssh needs a login that "
                f"works without a password: check `ssh {self.host} true` in a terminal "
                "(ssh-add your key, or add it to the login node's authorized_keys)."
            )
        if "Could not resolve" in stderr or "Name or service not known" in stderr:
            return (
                f"ssh {self.host}: unknown host ({said}). Give a host of your ~/.ssh/config "
                "or a name this machine resolves."
            )
        return f"ssh {self.host} failed: {said}"

    def check(self, *programs: str) -> None:
        """Refuse, in seconds, a login node that cannot be reached or lacks ``programs``
        (whether this package is there under :attr:`python` is told by the first Python
        run there, :meth:`controller_address`: a Python start costs ~0.3 s)."""
        probe = " && ".join(
            f"command -v {shlex.quote(p)} >/dev/null || {{ echo missing:{p}; exit 3; }}"
            for p in programs
        )
        done = self.run("sh", "-c", probe, check=False, timeout=30)
        out = done.stdout.strip()
        if out.startswith("missing:"):
            program = out.split(":", 1)[1]
            raise LoginError(
                f"`{program}` is not on PATH on {self.host}: the scheduler's commands must "
                f"work in `ssh {self.host}` (a login node of the cluster, with its module "
                "loaded in your shell's profile)."
            )

    def controller_address(self, nodes: list[str], title: str) -> str:
        """The login node's one address on its routes to ``nodes`` (where the controller
        listens, so that the ranks reach it); a :class:`LoginError` where :attr:`python`
        there cannot import this package."""
        code = (
            "import sys\n"
            "try: from clusterkernel.protocol._net import route_source\n"
            "except ImportError: print('missing-python'); sys.exit()\n"
            "for a in sys.argv[1:]:\n"
            "    try: print(route_source(a))\n"
            "    except OSError: pass\n"
        )
        done = self.run(self.python, "-c", code, *nodes, check=False, timeout=30)
        out = done.stdout.split()
        if out == ["missing-python"] or done.returncode in (126, 127):  # no such python
            raise LoginError(
                f"{self.python} on {self.host} cannot import clusterkernel: install it there "
                "and give its interpreter as remote_python= (--remote-python)."
            )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            raise LoginError(f"{self.python} on {self.host} failed: {said}")
        if len(set(out)) != 1:
            raise LoginError(
                f"{self.host} reaches the {title} nodes ({', '.join(nodes) or 'none'}) through "
                f"{', '.join(sorted(set(out))) or 'no address'}; pass controller_ip= with the "
                "login node's address the nodes reach."
            )
        return out[0]

    def mpi_runtime(self, mpiexec: str | None, fault_tolerant: bool) -> tuple[str, str, dict]:
        """``(mpiexec, flavour, environment)`` of the login node's Open MPI for a job whose
        ranks start with ``mpiexec`` (``fault_tolerant``): found, and its environment
        made, there (its paths, its user: root needs Open MPI's consent), as the job
        runs them; a :class:`LoginError` saying what to give where there is none."""
        code = (
            "import json, sys\n"
            "from clusterkernel.client.mpiexec import MPIRuntime, MPINotFoundError\n"
            "try: r = MPIRuntime.detect(sys.argv[1] or None)\n"
            "except MPINotFoundError as e: print(json.dumps({'error': str(e)})); sys.exit()\n"
            "env = r.env({}, fault_tolerant=sys.argv[2] == '1', scheduler_hosts=True)\n"
            "print(json.dumps({'mpiexec': r.mpiexec, 'flavor': r.flavor, 'env': env}))\n"
        )
        out = self.run(
            self.python, "-c", code, mpiexec or "", "1" if fault_tolerant else "0", timeout=60
        ).stdout
        found = json.loads(out.strip().splitlines()[-1])
        if "error" in found:
            raise LoginError(f"On {self.host}: {found['error']}")
        return found["mpiexec"], found["flavor"], found["env"]

    def home_path(self, path: str) -> str:
        """``path`` (this machine's, under its home) as the same place under the login
        node's home: a relative path, which ssh's commands read from the home there."""
        home = os.path.expanduser("~").rstrip("/") + "/"
        return path[len(home) :] if path.startswith(home) else path.lstrip("/")

    def reconnect(self) -> None:
        """Make the master connection again if it was lost, with the controller's forwards
        on the same ports here (the client's sockets connect to them again by
        themselves); a :class:`LoginError` while the host cannot be reached. Any ssh
        command may have made the new master meanwhile (``ControlMaster=auto``): the
        forwards go to whichever master runs now, unless it already holds them."""
        self.run("true", timeout=30)
        master = self._master_pid()
        if not self._forwards or master == self._forwarded_by:
            return
        done = subprocess.run(
            self.ssh("-O", "forward", *self._forwards),
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            raise LoginError(
                f"ssh {self.host}: the controller's ports could not be forwarded again "
                f"({done.stderr.strip() or 'no answer'})."
            )
        self._forwarded_by = master

    def _master_pid(self) -> int | None:
        """The pid of the master connection running now (None: none)."""
        done = subprocess.run(
            self.ssh("-O", "check"), capture_output=True, text=True, timeout=10
        )  # fmt: skip
        found = re.search(r"pid=(\d+)", done.stderr)
        return int(found.group(1)) if done.returncode == 0 and found else None

    def close(self) -> None:
        """End the master connection (its socket goes with it)."""
        self._forwards, self._forwarded_by = [], None
        if self._control_dir is None:
            return
        subprocess.run(
            [*self.ssh("-O", "exit")], capture_output=True, timeout=10
        )  # fmt: skip
        self._control_dir = None


class StableContext(zmq.Context):
    """A zmq context whose DEALER sockets have a routing id of their own, kept when their
    connection is made again: a client of a controller reached through forwards that a
    lost connection ended gets the replies to what it sent before (the controller's
    ROUTER routes them by that id; a reconnected socket would otherwise get a new one).
    The controller must hand an id over to its newest connection
    (:mod:`~clusterkernel.client.launch._handover`). One per process: :func:`stable_context`.

    Example::

        # not run: needs a controller
        ipp.Client(info, context=stable_context())
    """

    def socket(self, socket_type, **kwargs):
        sock = super().socket(socket_type, **kwargs)
        if socket_type == zmq.DEALER:
            sock.setsockopt(zmq.ROUTING_ID, b"ck-" + secrets.token_bytes(12))
        return sock


_STABLE: list[StableContext] = []


def stable_context() -> StableContext:
    """This process's one :class:`StableContext` (its IO thread shared by every client).

    Example::

        stable_context() is stable_context()      # True
    """
    if not _STABLE:
        _STABLE.append(StableContext())
    return _STABLE[0]


# the controller's ports an ipyparallel client connects to (its connection file's keys)
_CLIENT_PORTS = ("registration", "control", "mux", "task", "iopub", "notification", "broadcast")


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on this machine's loopback now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _control_dir() -> str:
    """This user's one directory for master connections' sockets (one per host, by
    ssh's %C), private: every process and cluster reuses it, none leaves one behind."""
    path = os.path.join(tempfile.gettempdir(), f"ck-ssh-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not os.path.isdir(path):
        raise LoginError(f"{path} is not a private directory of yours: remove it and retry.")
    return path


_LOGINS: dict[tuple[str, str], Login] = {}


def login(host: str, python: str) -> Login:
    """The one :class:`Login` of ``host`` in this process (its master connection shared)."""
    key = (host, python)
    if key not in _LOGINS:
        _LOGINS[key] = Login(host, python)
    return _LOGINS[key]


def sets_keepalive(host: str) -> bool:
    """Whether the user's ssh configuration gives ``host`` a keepalive of its own
    (``ServerAliveInterval``, read with ``ssh -G``, which connects nowhere). Without
    one, a laptop that slept or changed network learns that its connection is dead
    only from TCP, many minutes on, when the login node has given its job up: so
    :meth:`Login.ssh` adds one, and leaves the user's where there is one.

    Example::

        sets_keepalive("login")   # False: no ServerAliveInterval in ~/.ssh/config
    """
    try:
        out = subprocess.run(
            ["ssh", "-G", host], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False  # the connection itself then says what is wrong with the host
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key == "serveraliveinterval":
            return value.strip() != "0"
    return False


def login_for(ssh: str | Login | None, remote_python: str | None = None) -> Login | None:
    """The login node ``ssh`` names (a host, or a :class:`Login` already), with
    clusterkernel under ``remote_python`` there (default: this interpreter's path, as
    ``LaunchSettings`` takes it); None: no ``ssh``, this machine is inside the cluster.

    Example::

        login_for("login").host       # 'login'
        login_for(None)               # None
    """
    if ssh is None or isinstance(ssh, Login):
        return ssh
    return login(ssh, remote_python or sys.executable)
