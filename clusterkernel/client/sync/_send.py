"""A sync's trip: the changed files to one rank per host, then a reload on every rank (client side).

Everything travels over the cluster's ipyparallel connection (the notebook's client to
the engines), so the notebook and the ranks need no shared file system. What each host
holds is kept here, per cluster and host (name -> sha256), and checked against what the
host's writing rank finds on its disk at every sync: a directory removed or a file
changed there is sent again; a host without a record here is asked what it lacks first.

Example (``cluster``: a running :class:`~clusterkernel.Cluster`)::

    report = sync(cluster, ["mypkg"])   # %mpi sync mypkg
    report.summary()   # 'Synced 3 files to 1 host (1 sent, 1.2 KB; 2 unchanged) in 0.04 s; ...'
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ipyparallel as ipp

from clusterkernel.client.errors import rank_error_lines, rank_label
from clusterkernel.client.sync._files import (
    MAX_FILE_BYTES,
    MAX_TOTAL_BYTES,
    Source,
    SyncError,
    check_syntax,
    collect,
)
from clusterkernel.protocol._rank_call import rank_call
from clusterkernel.protocol._targets import SYNC_LOAD, SYNC_WRITE

if TYPE_CHECKING:
    from clusterkernel.client.cluster import Cluster

_TIMEOUT = 60.0  # seconds a rank may take to write or reload (a running cell holds it)

# (cluster's run directory, host) -> {name in the sync directory: sha256} it holds
_held: dict[tuple[str, str], dict[str, str]] = {}


@dataclass
class Synced:
    """What one sync did: ``files`` named, ``sent`` (the names sent to at least one host),
    ``bytes`` sent over all hosts, ``unchanged`` (files every host held already),
    ``hosts`` (host -> its sync directory), ``reloaded`` (module -> ranks that reloaded
    it), ``seconds``.

    Example::

        report = sync(cluster)
        report.sent, report.reloaded      # ['model.py'], {'model': [0, 1, 2, 3]}
    """

    files: int
    sent: list[str]
    bytes: int
    unchanged: int
    hosts: dict[str, str]
    reloaded: dict[str, list[int]] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        """The one line ``%mpi sync`` prints."""
        hosts = f"{len(self.hosts)} host{'s' if len(self.hosts) != 1 else ''}"
        files = f"{self.files} file{'s' if self.files != 1 else ''}"
        if not self.sent:
            text = f"Nothing changed: {files} already on {hosts}"
        else:
            text = (
                f"Synced {files} to {hosts} ({len(self.sent)} sent, {_size(self.bytes)}; "
                f"{self.unchanged} unchanged) in {self.seconds:.2f} s"
            )
        if self.reloaded:
            by_ranks: dict[tuple[int, ...], list[str]] = {}
            for module, ranks in sorted(self.reloaded.items()):
                by_ranks.setdefault(tuple(ranks), []).append(module)
            text += "; reloaded " + "; ".join(
                f"{', '.join(mods)} on {rank_label(ranks)}" for ranks, mods in by_ranks.items()
            )
        return text + "."


def _size(n: int) -> str:
    for unit, scale in (("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _by_host(cluster: Cluster) -> dict[str, list[int]]:
    """Each host's live ranks, as the ranks reported their host at set-up."""
    info = cluster.rank_info
    hosts: dict[str, list[int]] = {}
    for rank in cluster.live_ranks:
        hosts.setdefault(info[rank]["host"], []).append(rank)
    return hosts


def _results(cluster: Cluster, what: str, calls: dict[Any, tuple[list[int], Any]]) -> dict:
    """``{key: result per rank}`` of async calls ``{key: (ranks, AsyncResult)}``; a rank's
    error or silence as a :class:`SyncError` naming the ranks."""
    out, errors = {}, []
    for key, (ranks, ar) in calls.items():
        try:
            out[key] = ar.get(timeout=_TIMEOUT)
        except ipp.error.TimeoutError:
            raise SyncError(
                f"{what}: {rank_label(ranks)} did not answer in {_TIMEOUT:.0f} s (a cell still "
                "running holds them: %mpi where shows it). Sync again when it ends."
            ) from None
        except ipp.error.CompositeError as e:
            for ename, evalue, _tb, meta in e.elist:
                engine = (meta or {}).get("engine_id")
                rank = cluster.rank_of(engine) if engine is not None else ranks[0]
                errors.append((rank, ename, evalue))
        except ipp.error.RemoteError as e:
            errors.extend((r, e.ename, e.evalue) for r in ranks)
    if errors:
        said = "\n".join(f"  {line}" for line in rank_error_lines(errors))
        raise SyncError(f"{what} failed:\n{said}")
    return out


def _write(
    cluster: Cluster, hosts: dict[str, list[int]], sources: list[Source]
) -> tuple[dict[str, list[str]], dict[str, str], int]:
    """The files each host lacks, written by its lowest live rank; returns the names
    written per host, each host's directory and the bytes sent."""
    expect = {s.rel: s.sha for s in sources}
    by_rel = {s.rel: s for s in sources}
    written: dict[str, set[str]] = {host: set() for host in hosts}
    dirs: dict[str, str] = {}
    sent_bytes = 0
    # a host this process has no record of (the first sync, a new host, a kept cluster
    # attached again) is only asked what it lacks: files it holds from before stay put
    todo = {}
    for host in hosts:
        held = _held.get((cluster.run_dir, host))
        todo[host] = [] if held is None else [s.rel for s in sources if held.get(s.rel) != s.sha]
    for _round in range(2):  # the second sends what a host's disk turned out to lack
        calls = {}
        for host, ranks in hosts.items():
            files = {rel: by_rel[rel].data for rel in todo[host]}
            sent_bytes += sum(len(d) for d in files.values())
            written[host].update(todo[host])
            ar = cluster.view(ranks[:1]).apply_async(rank_call, SYNC_WRITE, files, expect)
            calls[host] = (ranks[:1], ar)
        answers = _results(cluster, "Writing the files on each host", calls)
        todo = {}
        for host, [answer] in answers.items():
            dirs[host] = answer["dir"]
            if answer["missing"]:
                todo[host] = answer["missing"]
            else:
                _held[(cluster.run_dir, host)] = dict(expect)
        if not todo:
            return {host: sorted(rels) for host, rels in written.items()}, dirs, sent_bytes
        hosts = {host: hosts[host] for host in todo}
    lacking = "; ".join(f"{host}: {', '.join(rels)}" for host, rels in todo.items())
    raise SyncError(f"The files written were not found again on the hosts ({lacking}).")


def _reload(
    cluster: Cluster, hosts: dict[str, list[int]], written: dict[str, list[str]]
) -> dict[str, list[int]]:
    """Every rank: the sync directory first on its path, its changed modules reloaded."""
    calls = {
        host: (ranks, cluster.view(ranks).apply_async(rank_call, SYNC_LOAD, written[host]))
        for host, ranks in hosts.items()
    }
    reloaded: dict[str, list[int]] = {}
    failed = []
    for host, answers in _results(cluster, "Reloading the changed modules", calls).items():
        for rank, answer in zip(hosts[host], answers):
            for module in answer["reloaded"]:
                reloaded.setdefault(module, []).append(rank)
            failed += [(rank, module, error) for module, error in answer["failed"].items()]
    if failed:
        said = "\n".join(f"  {line}" for line in rank_error_lines(failed))
        raise SyncError(
            "Synced, but these modules raised while they were reloaded; those ranks keep "
            f"their old contents (fix the module and sync again):\n{said}"
        )
    return {module: sorted(ranks) for module, ranks in reloaded.items()}


def sync(
    cluster: Cluster,
    paths: Iterable[str | os.PathLike] | str | None = None,
    *,
    cwd: str | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
) -> Synced:
    """Send the notebook side's modules to every rank's host, first on the ranks'
    ``sys.path``, and reload on every rank the changed modules it has imported.

    ``paths``: files and package folders (with ``__init__.py``), relative to ``cwd``
    (default: the current directory); None: ``cwd``'s ``*.py`` files. Only files a host
    does not hold already travel, over the ipyparallel connection (no shared file system
    needed). Nothing is sent if a Python file does not compile (the error names file and
    line; the ranks keep the code they have) or a file is above ``max_file_bytes`` (10 MB)
    or all of them above ``max_total_bytes`` (50 MB). Reloading follows IPython's
    ``%autoreload 2``: functions and classes are updated in place, so the ranks'
    variables stay and use the new code.

    Example (``cluster.sync``, what ``%mpi sync`` calls)::

        import pathlib, tempfile
        folder = pathlib.Path(tempfile.mkdtemp())
        (folder / "widths.py").write_text("WIDTH = 64\\n")
        report = cluster.sync(cwd=str(folder))  # %mpi sync, run in that folder
        print(report.summary())                 # Synced 1 file to 1 host (1 sent, ...) ...
        cluster.run("import widths; print(widths.WIDTH)")   # [ranks 0-3] 64
    """
    began = time.perf_counter()
    cluster.require_running()
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    sources = collect(paths, cwd, max_file_bytes, max_total_bytes)
    check_syntax(sources, cwd)
    hosts = _by_host(cluster)
    written, dirs, sent_bytes = _write(cluster, hosts, sources)
    reloaded = _reload(cluster, hosts, written)
    sent = sorted({rel for rels in written.values() for rel in rels})
    return Synced(
        files=len(sources),
        sent=sent,
        bytes=sent_bytes,
        unchanged=len(sources) - len(sent),
        hosts=dirs,
        reloaded=reloaded,
        seconds=time.perf_counter() - began,
    )
