"""Kept clusters started from outside the cluster: their records on the login node (both sides).

A cluster started with ``ssh=HOST`` and ``keep`` (``%mpi start --ssh login --keep 2h``)
has its record (``_kept_records``) in its directory on the login node, beside its guard,
which keeps it there once the notebook is gone. The notebook outside reads and claims
records over ssh:

- :func:`listing`: the records there, as :func:`_kept_records.kept` lists them
  (``%mpi list --ssh HOST``);
- :class:`Claim`: a session's hold on one record. A process on the login node (this
  module run there, over a connection of its own) writes or claims the record as its
  own client and holds it while its ssh's stdin is open; a notebook that dies, or a
  laptop that loses its network, closes it, and the record has no client any more, as
  a dead notebook's inside the cluster: the keeper's idle time starts. The process
  tells its session, by a line, when another session took the cluster over.

Example::

    # not run: needs an SSH host and a kept cluster on it
    login_ = login("login", "/opt/venv/bin/python")
    print(_kept_records.table(listing(login_)))
    claim = Claim.attach(login_, "482913", force=False)
    claim.record["rank_info"]         # the ranks, as the record names them
    claim.close()                     # let go (detach)
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys

from clusterkernel.client.cluster import _kept_records
from clusterkernel.client.errors import ClusterError
from clusterkernel.client.launch._piped import end, next_line
from clusterkernel.client.launch._ssh import Login

_ANSWER_WITHIN = 30.0  # seconds for the login node's process to write or claim the record
_LOOK = 1.0  # seconds between the login node's looks for a takeover


def listing(login: Login) -> list[dict]:
    """The kept clusters of this user on ``login`` (:func:`_kept_records.kept` run there,
    in the place this machine's run directories have under its home); those that ended
    while no one was attached are in it once, and what is left of them is removed there."""
    root = login.home_path(_kept_records.run_root())
    out = login.run(login.python, "-m", __name__, "list", root, timeout=30).stdout
    return json.loads(out.strip().splitlines()[-1])


class Claim:
    """This session's hold on a kept cluster's record on the login node (see the module):
    :meth:`started` (a start writes the record) or :meth:`attach` (an attach claims it)."""

    def __init__(self, login: Login, *command: str, record: dict | None = None) -> None:
        self._proc = subprocess.Popen(
            login.argv(login.python, "-m", __name__, *command, shared=False),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        if record is not None:
            self._say(json.dumps(record))
        line = next_line(self._proc, _ANSWER_WITHIN)
        try:
            said = json.loads(line) if line else {}
        except ValueError:
            said = {"error": line}
        if "record" not in said:
            err = self.close()
            raise ClusterError(
                said.get("error")
                or f"The kept record on {login.host} could not be claimed: {err or 'no answer'}"
            )
        self.record: dict = said["record"]
        self.replaced: dict | None = said.get("replaced")
        self._taken_over_by: dict | None = None

    @classmethod
    def started(cls, login: Login, record: dict) -> Claim:
        """The record of a kept cluster this session started (``record``: as
        :func:`_kept_records.new_record` makes it here), written in its directory on the
        login node, with that node's paths and this session's process there as client."""
        return cls(login, "start", login.home_path(record["run_dir"]), record=record)

    @classmethod
    def attach(cls, login: Login, cluster_id: str | None, force: bool) -> Claim:
        """The record of the kept cluster ``cluster_id`` on ``login`` (the only one when
        None), claimed for this session (``force``: even from a live one; ``replaced``
        names it). A :class:`ClusterError` says why none can be."""
        root = login.home_path(_kept_records.run_root())
        return cls(login, "attach", root, cluster_id or "", "1" if force else "0")

    def update(self, change: dict) -> None:
        """Set ``change``'s fields in the record (new ranks after a restart or respawn)."""
        self._say(json.dumps(change))

    def taken_over(self) -> dict | None:
        """The session that took this cluster over (``attach --force``), or None; asked
        without waiting."""
        if self._taken_over_by is None:
            line = next_line(self._proc, 0)
            if line:
                self._taken_over_by = json.loads(line).get("taken_over_by")
        return self._taken_over_by

    def close(self) -> str:
        """Let go of the record (the cluster's keep time starts) and end the process
        there; what it wrote to stderr."""
        return end(self._proc, 15)

    def _say(self, line: str) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except OSError:
            raise ClusterError(
                "The kept record's process on the login node has ended: the SSH connection "
                "was lost. %mpi list --ssh HOST says what is left."
            ) from None


# ipyparallel's ssh commands of the starting session (its ControlPath): this one's instead
_SESSION_KEYS = ("ssh_cmd", "ssh_args", "scp_cmd", "scp_args")


def local_copy(login: Login, run_dir: str) -> tuple[str, str]:
    """``(run directory, cluster file)`` on this machine of the kept cluster whose
    directory on ``login`` is ``run_dir``: the directory is the place under this home
    that ``Login.home_path`` maps to it (private; the starting session's own, on its
    machine), the cluster file the one there, with this directory in place of the
    starting session's and this session's ssh commands and host name."""
    here = os.path.join(os.path.expanduser("~"), run_dir)
    os.makedirs(here, mode=0o700, exist_ok=True)
    os.chmod(here, 0o700)
    info = json.loads(login.run("cat", f"{run_dir}/cluster.json", timeout=30).stdout)
    old = info["cluster"]["profile_dir"]

    def moved(value):
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        if isinstance(value, list):
            return [moved(v) for v in value]
        if isinstance(value, str) and (value == old or value.startswith(old + "/")):
            return here + value[len(old) :]
        return value

    info = moved(info)
    controller = info["controller"]["state"]
    for key in _SESSION_KEYS:
        controller.pop(key, None)
    controller.update(hostname=login.host, user="", remote_python=login.python)
    for engine_set in info.get("engines", {}).get("sets", {}).values():
        engine_set.update(ssh=login.host, remote_python=login.python)
    cluster_file = info["cluster"].get("cluster_file") or os.path.join(here, "cluster.json")
    os.makedirs(os.path.dirname(cluster_file), mode=0o700, exist_ok=True)
    fd = os.open(cluster_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    return here, cluster_file


# ---------------------------------------------------------------- the login node's side
def _hold(run_dir: str) -> None:
    """Hold the record of ``run_dir`` (claimed by this process) until stdin closes, then
    let go; apply each line read (fields to set); say once when another session took it."""
    told = False
    with selectors.DefaultSelector() as sel:
        sel.register(sys.stdin, selectors.EVENT_READ)
        while True:
            if sel.select(_LOOK):
                line = sys.stdin.readline()
                if not line:
                    break
                _kept_records.update(run_dir, json.loads(line))
            holder = _kept_records.holder(run_dir)
            if not told and holder is not None and holder.get("pid") != os.getpid():
                print(json.dumps({"taken_over_by": holder}), flush=True)
                told = True
    _kept_records.release(run_dir)


def _answer(said: dict) -> None:
    print(json.dumps(said), flush=True)


def main(argv: list[str]) -> int:
    """The login node's side: ``list ROOT``, ``start RUN_DIR`` (the record on stdin's
    first line), ``attach ROOT ID FORCE``."""
    what, *args = argv
    if what == "list":
        records = _kept_records.kept(args[0])
        for record in records:
            if record.get("ended"):
                _kept_records.remove_ended(record)
        print(json.dumps(records), flush=True)
        return 0
    if what == "start":
        run_dir = args[0]
        record = json.loads(sys.stdin.readline())
        # this node's paths and processes: the guard keeps the cluster here
        record.update(
            run_dir=run_dir, cluster_file=os.path.join(run_dir, "cluster.json"),
            guard_pid=None, guard_host=socket.gethostname(), client=_kept_records.me(),
        )  # fmt: skip
        _kept_records.write(run_dir, record)
    else:
        root, cluster_id, force = args
        try:
            record = _kept_records.to_attach(cluster_id or None, root)
            replaced = _kept_records.claim(record["run_dir"], force == "1")
        except (ClusterError, ValueError) as e:
            _answer({"error": str(e)})
            return 0
        record = _kept_records.read(record["run_dir"]) or record  # as claimed
        _answer({"record": record, "replaced": replaced})
        _hold(record["run_dir"])
        return 0
    _answer({"record": record})
    _hold(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
