"""Kept clusters: ranks that outlive the session that started them, and the way back in.

``Cluster(..., keep="2h")`` (``%mpi start --keep 2h``) writes a record, ``kept.json``,
into the cluster's private run directory (0600 in a 0700 directory, as the
connection files): its id, shape, settings, rank map, and the client attached now.
The guard process reads it once the starting process has died or detached
(``clusterkernel.client.launch._guard``): it leaves the controller, the engines and any
scheduler's job (Slurm, Grid Engine) running, and stops them once no client has been attached for the keep
time. :func:`kept` lists the records of this user; ``Cluster.attach`` claims one.

One client drives a cluster at a time: :func:`claim` refuses while another live
client holds it, unless ``force`` (a takeover: the old client finds out at its next
call, :func:`holder`). A client is "live" while its process runs: attach works
from the host that started the cluster (where its guard runs and can see the pid).

Example::

    parse_keep("2h")          # 7200.0
    parse_keep(True)          # inf: until stopped
    [r["id"] for r in kept()] # ['482913'] (the user's kept clusters)
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import socket
import time
from collections.abc import Callable
from contextlib import contextmanager

from clusterkernel.client._pids import pid_alive
from clusterkernel.client.cluster._jobreport import death_cause
from clusterkernel.client.errors import ClusterError

RECORD = "kept.json"
SUCCESSOR = "guard.pid"  # in a run directory: the guard that watches the cluster now
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_keep(value: bool | str | float | int | None) -> float | None:
    """Seconds a cluster stays without a client: ``None`` (not kept), ``inf`` (``True``:
    until stopped), or a duration (``"90s"``, ``"30m"``, ``"2h"``, ``"1h30m"``, ``"1d"``,
    or seconds as a number). Anything else is a ValueError that says what to write."""
    if value is None or value is False:
        return None
    if value is True:
        return math.inf
    text = str(value).strip().lower()
    if text in ("forever", "true", "yes", "inf"):
        return math.inf
    seconds: float | None = None
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if parts and "".join(a + u for a, u in parts) == text.replace(" ", ""):
            seconds = sum(float(a) * _UNITS[u] for a, u in parts)
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"keep takes a duration such as 90s, 30m, 2h or 1d (or True / 'forever': "
            f"until stopped), got {value!r}."
        )
    return seconds


def describe_keep(seconds: float | None) -> str:
    """``"2h"``, ``"until stopped"``: a keep time as a user wrote it (``cluster.keep``).

    Example::

        from clusterkernel.client.cluster import describe_keep
        describe_keep(7200.0)          # '2h'
        describe_keep(float("inf"))    # 'until stopped'
    """
    if seconds is None:
        return "not kept"
    if math.isinf(seconds):
        return "until stopped"
    return _short(seconds)


def _short(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            whole, rest = divmod(int(seconds), size)
            below = _short(rest) if rest >= 60 else ""
            return f"{whole}{unit}{below}"
    return f"{seconds:.0f}s"


def run_root() -> str:
    """Where run directories (and so kept clusters) live (``launch._run_dir.make_run_dir``)."""
    from clusterkernel.client.launch._run_dir import RUN_ROOT_ENV

    return os.environ.get(RUN_ROOT_ENV) or os.path.join(
        os.path.expanduser("~"), ".clusterkernel", "clusters"
    )


def cluster_id(run_dir: str) -> str:
    """The short id users type: the run directory's random part (``cluster-482913`` -> ``482913``)."""
    return os.path.basename(run_dir.rstrip("/")).removeprefix("cluster-")


def record_path(run_dir: str) -> str:
    return os.path.join(run_dir, RECORD)


def me() -> dict:
    """This process as a record's client."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}


def client_alive(client: dict | None) -> bool:
    """Whether a record's client still runs (it is on this host: see the module)."""
    return bool(
        client and client.get("host") == socket.gethostname() and pid_alive(client.get("pid"))
    )


# ---------------------------------------------------------------- the record
def write(run_dir: str, record: dict) -> None:
    """Write a new record, readable by the user alone."""
    path = record_path(run_dir)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)


def read(run_dir: str) -> dict | None:
    """The record of ``run_dir``; None where there is none (not kept, or gone)."""
    try:
        with open(record_path(run_dir)) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            return json.load(f)
    except (OSError, ValueError):
        return None


@contextmanager
def _locked(run_dir: str):
    fd = os.open(record_path(run_dir), os.O_RDWR)
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        record = json.load(f)
        yield record
        f.seek(0)
        f.truncate()
        json.dump(record, f)


def update(run_dir: str, change: Callable[[dict], object] | dict) -> dict | None:
    """Apply ``change`` (a function of the record, or fields to set) to the record under
    its lock; the new record (None: there is none)."""
    try:
        with _locked(run_dir) as record:
            if isinstance(change, dict):
                record.update(change)
            else:
                change(record)
        return record
    except (OSError, ValueError):
        return None


def claim(run_dir: str, force: bool) -> dict | None:
    """Make this process the record's client; the live client it replaced (a takeover
    with ``force``), or None. Without ``force`` a live client is a ValueError."""
    replaced: dict | None = None
    with _locked(run_dir) as record:  # a refusal raises before the record is written
        old = record.get("client")
        if client_alive(old) and old["pid"] != os.getpid():
            if not force:
                since = time.strftime("%H:%M", time.localtime(old.get("since", 0)))
                raise ValueError(
                    f"Cluster {record['id']} is attached to another session (pid {old['pid']} "
                    f"on {old['host']}, since {since}). %mpi attach --force "
                    "(Cluster.attach(..., force=True)) takes it over; that session is told "
                    "at its next call."
                )
            replaced = old
        record["client"] = me()
        record["idle_since"] = None
    return replaced


def release(run_dir: str) -> None:
    """Let go of the record if this process holds it (detach)."""

    def drop(record: dict) -> None:
        if (record.get("client") or {}).get("pid") == os.getpid():
            record["client"] = None
            record["idle_since"] = time.time()

    update(run_dir, drop)


def holder(run_dir: str) -> dict | None:
    """The record's client now (a takeover replaces it)."""
    record = read(run_dir)
    return record.get("client") if record else None


# ---------------------------------------------------------------- listing
def _owned_dirs(root: str) -> list[str]:
    """Run directories under ``root`` that this user alone owns and can read."""
    try:
        names = sorted(os.listdir(root))
    except OSError:  # no root, or another user's
        return []
    out = []
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == os.getuid() and not st.st_mode & 0o077 and os.path.isdir(path):
            out.append(path)
    return out


def kept(root: str | None = None) -> list[dict]:
    """This user's kept clusters, newest first, each its record plus ``attached`` (a live
    client holds it), ``idle_left`` (seconds until it stops; inf: never) and ``age``.

    Clusters whose ranks died while no one was attached keep only their record, with
    ``ended`` saying why: listing reports them once and removes what is left.

    Example::

        from clusterkernel.client.cluster import kept
        [(r["id"], r["attached"]) for r in kept()]   # say [('482913', False)]
    """
    out = []
    now = time.time()
    for run_dir in _owned_dirs(root or run_root()):
        record = read(run_dir)
        if record is None or record.get("uid") != os.getuid():
            continue
        if not record.get("ended") and _guard_gone(run_dir, record):
            ended = _ended_without_guard(record)
            if ended is not None:  # as its guard would have said, had it lived
                record = update(run_dir, {"ended": ended, "client": None}) or record
        record["attached"] = client_alive(record.get("client"))
        keep = record.get("keep_s")
        keep = math.inf if keep is None else keep
        idle_since = record.get("idle_since")
        if record["attached"] or idle_since is None:
            record["idle_left"] = keep
        else:
            record["idle_left"] = max(0.0, keep - (now - idle_since))
        record["age"] = now - record.get("created", now)
        out.append(record)
    return sorted(out, key=lambda r: -r.get("created", 0))


def why_ended(cluster_file: str) -> str | None:
    """Why a kept cluster can no longer run cells (None: it still can)."""
    with open(cluster_file) as f:
        info = json.load(f)
    controller = info.get("controller", {}).get("state", {}).get("pid")
    if controller and not pid_alive(controller):
        return "the controller exited"
    for engine_set in info.get("engines", {}).get("sets", {}).values():
        job = engine_set.get("job_id")
        if job:
            from clusterkernel.client import scheduler

            ended = scheduler.get(engine_set.get("scheduler") or "slurm").why_ended(job)
            if ended:
                return ended
        elif engine_set.get("pid") and not pid_alive(engine_set["pid"]):
            cause = death_cause(_tail_of(engine_set.get("output_file")))
            return "the MPI job ended" + (f" ({cause})" if cause else "")
    return None


def _tail_of(path: str | None) -> str:
    try:
        with open(path or "", errors="replace") as f:
            return f.read()[-20000:]
    except OSError:
        return ""


def _guard_gone(run_dir: str, record: dict) -> bool:
    """Whether the guard that keeps the cluster of ``record`` (on this host) is known and
    has gone (SIGKILLed, or its machine restarted): then nothing tells its end."""
    if record.get("guard_host") != socket.gethostname():
        return False
    pids = [record.get("guard_pid")]
    try:
        with open(os.path.join(run_dir, SUCCESSOR)) as f:
            pids.append(int(f.read().strip() or 0))
    except (OSError, ValueError):
        pass
    known = [pid for pid in pids if pid]
    return bool(known) and not any(pid_alive(pid) for pid in known)


def _ended_without_guard(record: dict) -> str | None:
    """Why the cluster of a record whose guard has gone can no longer run cells (the
    guard's own test, :func:`why_ended`), or None."""
    # from outside, the login node's record names its files from its home
    path = os.path.join(os.path.expanduser("~"), record.get("cluster_file") or "")
    try:
        ended = why_ended(path)
    except (OSError, ValueError):
        return "its guard and its cluster file are gone"
    return None if ended is None else f"{ended}, and its guard had gone"


def find(cluster_id_: str | None, root: str | None = None) -> dict:
    """The kept cluster to attach: by id, or the only one. ValueError says what to do."""
    records = kept(root)
    live = [r for r in records if not r.get("ended")]
    if cluster_id_ is None:
        if len(live) == 1:
            return live[0]
        if not live:
            raise ValueError(
                "No kept cluster to attach"
                + _ended_note(records)
                + ". Start one with %mpi start --keep 2h (Cluster(..., keep='2h'))."
            )
        ids = ", ".join(r["id"] for r in live)
        raise ValueError(f"{len(live)} kept clusters ({ids}): say which, %mpi attach ID.")
    for record in records:
        if record["id"] == cluster_id_:
            return record
    ids = ", ".join(r["id"] for r in live) or "none"
    raise ValueError(
        f"No kept cluster {cluster_id_!r} of yours (it may have expired or been stopped). "
        f"Kept now: {ids} (%mpi list; one started from outside the cluster with --ssh HOST "
        "is on HOST: %mpi list --ssh HOST, %mpi attach ID --ssh HOST)."
    )


def new_record(cluster, settings: dict, guard_pid: int | None) -> dict:
    """The record of ``cluster``, kept and just started (``settings``: what ``attach``
    needs to make it again; ``guard_pid``: its guard process, here)."""
    rank_info = cluster.rank_info
    hosts = ", ".join(sorted({info["host"] for info in rank_info.values()}))
    system = getattr(cluster.launcher, "system", None)
    title = system.title if system is not None else "batch"
    return {
        "id": cluster.id,
        "uid": os.getuid(),
        "created": time.time(),
        "keep_s": None if math.isinf(cluster.keep) else cluster.keep,
        "n": cluster.n,
        "where": f"{title} job {cluster.job_id} on {hosts}" if cluster.job_id else hosts,
        "job_id": cluster.job_id,
        "settings": settings,
        "run_dir": cluster.run_dir,
        "cluster_file": cluster.cluster_file,
        "rank_info": rank_info,
        "guard_pid": guard_pid,
        "guard_host": socket.gethostname(),
        "client": me(),
        "idle_since": None,
        "ended": None,
    }


def to_attach(cluster_id_: str | None, root: str | None = None) -> dict:
    """The record of the kept cluster ``Cluster.attach`` takes (see :func:`find`); a
    :class:`ClusterError` says why none can be (what is left of an ended one is removed)."""
    try:
        record = find(cluster_id_, root)
    except ValueError as e:
        raise ClusterError(str(e)) from None
    if record.get("ended"):
        remove_ended(record)
        raise ClusterError(
            f"Kept cluster {record['id']} ended while no one was attached: "
            f"{record['ended']}. What was left of it is removed; start a new one."
        )
    if record.get("guard_host") != socket.gethostname():
        raise ClusterError(
            f"Attach to cluster {record['id']} from {record['guard_host']}, where it was "
            "started: its guard runs there and watches who is attached."
        )
    return record


def taken_over_note(cluster) -> str:
    """What a session that was taken over says (``taken_over_by`` is set)."""
    taken = cluster.taken_over_by or {}
    return (
        f"Another session (pid {taken.get('pid')} on {taken.get('host')}) took this kept "
        "cluster over with attach --force; this one has let go of it. "
        "%mpi attach --force takes it back."
    )


def _ended_note(records: list[dict]) -> str:
    ended = [r for r in records if r.get("ended")]
    if not ended:
        return ""
    return " (" + "; ".join(f"{r['id']} ended: {r['ended']}" for r in ended) + ")"


def remove_ended(record: dict) -> None:
    """Remove what is left of a cluster that ended while no one was attached: its run
    directory, and the shared-memory files its ranks noted there (a rank killed with its
    guard removed none)."""
    import shutil

    from clusterkernel.protocol import _shm_names

    _shm_names.remove(record["run_dir"])
    shutil.rmtree(record["run_dir"], ignore_errors=True)


def table(records: list[dict]) -> str:
    """``%mpi list``'s text: one line per kept cluster."""
    if not records:
        return "No kept clusters (start one with %mpi start --keep 2h)."
    lines = [f"{'id':<10} {'ranks':>5}  {'where':<32} {'age':>7}  {'stops in':>13}  client"]
    for r in records:
        if r.get("ended"):
            lines.append(f"{r['id']:<10} {r['n']:>5}  ended: {r['ended']}")
            continue
        if r["attached"]:
            left, client = "when detached", f"attached (pid {r['client']['pid']})"
        else:
            left = "never" if math.isinf(r["idle_left"]) else _short(r["idle_left"])
            client = "none"
        lines.append(
            f"{r['id']:<10} {r['n']:>5}  {r['where'][:32]:<32} {_short(r['age']):>7}  "
            f"{left:>13}  {client}"
        )
    return "\n".join(lines)
