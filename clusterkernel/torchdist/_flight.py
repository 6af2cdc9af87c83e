"""torch's own flight recorder, read as the hang report reads ``comm.flight()`` (rank side).

torch.distributed keeps a ring of its last collectives when ``TORCH_FR_BUFFER_SIZE``
is set before a group is made (clusterkernel sets it for every rank). Its dump
(``torch._C._distributed_c10d._dump_fr_trace``, gloo and NCCL alike in torch 2.13)
names each call's group, sequence number, sizes, dtypes and Python stack. Here each
entry becomes one of ``comm``'s flight entries, so ``_hangreport.compare`` puts
torch's calls and comm's side by side::

    ranks 0 wait in all_reduce #3 (gloo, 3.91 KiB float32, cell line 4)

Readable from the control thread while the main thread is blocked in the call.

Example::

    from clusterkernel.torchdist import flight
    flight()[-1]   # {'seq': 3, 'op': 'all_reduce', 'group': 'gloo', 'nbytes': 4000, ...}
"""

from __future__ import annotations

import json
import os
import pickle
import sys

DEFAULT_BUFFER = "200"  # entries; set as TORCH_FR_BUFFER_SIZE where the user has not

# torch's ScalarType names (as the dump writes them) -> (torch name, bytes per element)
_DTYPES = {
    "Float": ("float32", 4),
    "Double": ("float64", 8),
    "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8),
    "Int": ("int32", 4),
    "Short": ("int16", 2),
    "Char": ("int8", 1),
    "Byte": ("uint8", 1),
    "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
}

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def dump() -> dict:
    """torch's flight-recorder dump (empty without torch.distributed or a group)."""
    c10d = sys.modules.get("torch._C._distributed_c10d")
    dist = sys.modules.get("torch.distributed")
    if c10d is None or dist is None or not hasattr(c10d, "_dump_fr_trace"):
        return {}
    try:
        # Without stack traces: in torch 2.13 a dump with them keeps the group alive,
        # and a gloo group closes its connections only when freed, so a later abort
        # would no longer free the peers blocked in it (measured).
        return pickle.loads(c10d._dump_fr_trace(True, False, False))
    except Exception:  # no recorder (buffer size 0) or a torch without one
        return {}


def in_torch(frames: list[dict]) -> bool:
    """Whether a main-thread stack (outermost first, as the stack request reads it)
    is inside torch now: its innermost frame is torch's."""
    return bool(frames) and frames[-1].get("file", "").startswith(_torch_dir())


def _caller(frames: list[dict], skip: tuple[str, ...]) -> tuple[str, int]:
    """The innermost frame outside torch and clusterkernel: the user's line."""
    for f in frames:  # the dump lists frames innermost first
        name = f.get("filename") or ""
        if not name.startswith(skip):
            return name, int(f.get("line") or 0)
    return "", 0


def _size(sizes: list, dtypes: list) -> tuple[int, str]:
    nbytes = 0
    names = []
    for shape, dt in zip(sizes or [], dtypes or []):
        name, width = _DTYPES.get(dt, (str(dt).lower(), 0))
        count = 1
        for d in shape:
            count *= int(d)
        nbytes += count * width
        names.append(name)
    return nbytes, (names[0] if len(set(names)) == 1 else ",".join(names))


def entries(
    in_call: bool, data: dict | None = None, where: tuple[str, int] = ("", 0)
) -> list[dict]:
    """torch's recorded calls as flight entries (``comm.flight()``'s keys), oldest first.

    ``in_call``: whether this rank's main thread is inside torch right now (its
    stack's innermost frames are torch's). A group's newest call counts as not done
    when torch has not retired it and the rank is still in torch: gloo retires a
    blocking call only when the next starts, so torch's own state cannot tell; older
    calls of a group are done (a rank is in one blocking call at a time). torch's
    ``pg_status`` is not used: a group made again keeps its entries' name ('0') while
    its status moves to another key, which made a new group's blocked call look done.
    ``where``: the (file, line) the main thread is at, given to calls not done (the
    dump carries no stacks, see :func:`dump`).
    """
    data = dump() if data is None else data
    if not data.get("entries"):
        return []
    skip = (_torch_dir(), _PACKAGE)
    config = data.get("pg_config", {})
    default = _backend()  # for entries that do not name their backend
    out = []
    for e in data["entries"]:
        pg_name, pg_desc = (str(x) for x in e["process_group"])
        lib, _, op = str(e.get("profiling_name", "")).rpartition(":")
        op = op or "collective"
        backend = lib or default
        nbytes, dtype = _size(e.get("input_sizes"), e.get("input_dtypes"))
        path, line = _caller(e.get("frames") or [], skip)
        ranks = _ranks(config, pg_name)
        if not ranks and pg_desc == "default_pg":
            # torch 2.13 keys its group configs by a name that every group after the
            # first shares, and leaves the later ones' ranks empty; the default group
            # is every rank's
            ranks = _world_ranks()
        done = bool(e.get("retired")) or e.get("state") == "completed"
        entry = {
            "seq": int(e["p2p_seq_id"] if e.get("is_p2p") else e["collective_seq_id"]),
            "op": op,
            "group": backend if pg_desc == "default_pg" else f"{backend} group {pg_name}",
            "group_ranks": ranks,
            "group_instance": f"torch-{pg_name}",
            "nbytes": nbytes,
            "dtype": dtype,
            "peer": -2 if e.get("is_p2p") else None,  # torch records no peer
            "file": path,
            "line": line,
            "done": done,
            "torch": True,
        }
        out.append(entry)
    out = _newest_incarnation(out)
    newest: dict[str, dict] = {}
    for e in out:
        if e["peer"] is None:
            newest[e["group_instance"]] = e
    for e in out:
        if not in_call or (e["peer"] is None and e is not newest[e["group_instance"]]):
            e["done"] = True
        elif not e["done"] and not e["file"]:
            e["file"], e["line"] = where
    return out


def _ranks(config: dict, pg_name: str) -> list[int]:
    """A group's ranks from the dump's config (keyed by the name it had when made)."""
    found = config.get(pg_name) or (next(iter(config.values())) if len(config) == 1 else {})
    try:
        return [int(r) for r in json.loads(found.get("ranks", "[]"))]
    except (ValueError, TypeError):
        return []


def _world_ranks() -> list[int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return list(range(dist.get_world_size()))
    return list(range(int(os.environ.get("WORLD_SIZE", "0"))))


def _newest_incarnation(out: list[dict]) -> list[dict]:
    """Drop a group's entries from before its numbers last started again."""
    keep: list[dict] = []
    last_seq: dict[str, int] = {}
    for e in out:
        if e["peer"] is None:
            key = e["group_instance"]
            if e["seq"] < last_seq.get(key, -1):
                keep = [k for k in keep if k["group_instance"] != key or k["peer"] is not None]
            last_seq[key] = e["seq"]
        keep.append(e)
    return keep


def _backend() -> str:
    from clusterkernel.torchdist._group import backend_name

    dist = sys.modules.get("torch.distributed")
    try:
        name = backend_name(dist) if dist is not None and dist.is_initialized() else ""
    except Exception:
        name = ""
    return "torch" if (not name or "," in name) else name


def flight() -> list[dict]:
    """This rank's torch.distributed calls, as :func:`entries` reads them from a cell."""
    return entries(in_call=False)
