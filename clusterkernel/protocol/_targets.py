"""Every rank-side function the notebook calls: the client-to-rank API in one place.

The notebook sends :func:`~clusterkernel.protocol._rank_call.rank_call` with one of
these names (``"package.module:function"``); the rank imports the module and calls the
function, so the notebook never imports the rank side. Client code names a target
only through a constant here (``tests/test_protocol_targets.py`` checks that each
resolves to a function on the rank side and that no such string is spelled
elsewhere). Requests answered on the control channel while a cell runs are in
:mod:`clusterkernel.protocol._names`.

Each entry: the constant, what the rank does, and who calls it (``client/...``).

Engine set-up (``client/cluster/_lifecycle.py``, each new engine)
    ``ENGINE_SETUP``: the rank's identity, stack file, control handlers; ``(run_dir)``.

torch.distributed (``client/cluster/_torch.py``)
    ``TORCH_PREPARE_RANK``: torchrun's environment and the rank's GPU;
    ``TORCH_INIT``: the default process group; ``TORCH_REINIT``: a new one in the live
    ranks, the user's subgroups made again on it; ``TORCH_DESTROY``: its end before the ranks stop; ``TORCH_DESCRIBE``: the
    group as the rank sees it; ``TORCH_HELD_MODELS``: DDP/FSDP models that hold a
    closed group.

Snapshots (``client/cluster/_snapshot.py``)
    ``VARIABLES``: the rank's picklable variable names; ``SNAPSHOT_SAVE``,
    ``SNAPSHOT_HELD``, ``SNAPSHOT_LOAD``: write, list, read the rank's snapshot file.

Respawn (``client/cluster/_respawn.py``; ``REBUILD`` also ``_snapshot.py``)
    ``RESPAWN_GROW``: the survivors shrink, spawn and merge the communicator;
    ``RESPAWN_COPY``: a survivor's variables copied to the new ranks;
    ``REBUILD``: DataParallel models attached again (collective);
    ``REWRAP_NAMESPACE``: the user's torch.distributed subgroups made again and the
    names holding them rebound, then DDP models wrapped again (also after a respawn
    without ``--from``: the survivors' subgroups); ``KEEP_RESTORE``: Keepers restored.

Recovery inside a running cell (``client/cluster/_incell.py``)
    ``RECOVERY_ARM``: the ranks get the respawn recipe; ``RECOVERY_JOINED``: a new
    rank joins the survivors inside the cell.

Dashboard (``client/dashboard/_dashboard.py``)
    ``METRICS_STREAM``: the rank streams its records to the dashboard;
    ``METRICS_FLUSH``: everything recorded so far sent; ``METRICS_STOP``: the stream ends.

Profile (``client/profile/_collect.py``)
    ``PROFILE_START``, ``PROFILE_STOP``: the rank's sampler around a cell or by hand;
    ``PROFILE_RUNNING``: whether it runs.

The user's code (``client/sync/_send.py``)
    ``SYNC_WRITE``: one rank per host writes the changed files into its sync directory
    and names those it lacks; ``SYNC_LOAD``: every rank puts that directory first on
    ``sys.path`` and reloads the changed modules it imported.

Example::

    from clusterkernel.protocol._rank_call import rank_call
    from clusterkernel.protocol._targets import TORCH_DESCRIBE

    view.apply_sync(rank_call, TORCH_DESCRIBE)   # [{"backend": "gloo", ...}, ...]
"""

from __future__ import annotations

from typing import Final

# the rank's engine glue (clusterkernel.rank)
ENGINE_SETUP: Final = "clusterkernel.rank._engine_setup:setup"
VARIABLES: Final = "clusterkernel.rank._variables:variables"
SNAPSHOT_SAVE: Final = "clusterkernel.rank._snapshot:save"
SNAPSHOT_HELD: Final = "clusterkernel.rank._snapshot:held"
SNAPSHOT_LOAD: Final = "clusterkernel.rank._snapshot:load"
RESPAWN_GROW: Final = "clusterkernel.rank._respawn:grow"
RESPAWN_COPY: Final = "clusterkernel.rank._respawn:copy_namespace"
REBUILD: Final = "clusterkernel.rank._respawn:rebuild"
RECOVERY_ARM: Final = "clusterkernel.rank._recovery:arm"
RECOVERY_JOINED: Final = "clusterkernel.rank._recovery:joined"
PROFILE_START: Final = "clusterkernel.rank._profile:start"
PROFILE_STOP: Final = "clusterkernel.rank._profile:stop"
PROFILE_RUNNING: Final = "clusterkernel.rank._profile:running"
SYNC_WRITE: Final = "clusterkernel.rank._sync:write"
SYNC_LOAD: Final = "clusterkernel.rank._sync:load"

# torch.distributed (clusterkernel.torchdist)
TORCH_PREPARE_RANK: Final = "clusterkernel.torchdist._gpu:prepare_rank"
TORCH_INIT: Final = "clusterkernel.torchdist:init"
TORCH_REINIT: Final = "clusterkernel.torchdist:reinit"
TORCH_DESTROY: Final = "clusterkernel.torchdist:destroy"
TORCH_DESCRIBE: Final = "clusterkernel.torchdist:describe"
TORCH_HELD_MODELS: Final = "clusterkernel.torchdist._rewrap:held_models"
REWRAP_NAMESPACE: Final = "clusterkernel.torchdist._rewrap:rewrap_namespace"
KEEP_RESTORE: Final = "clusterkernel.torchdist._keep:restore_namespace"

# the metric stream (clusterkernel.metrics)
METRICS_STREAM: Final = "clusterkernel.metrics:stream"
METRICS_FLUSH: Final = "clusterkernel.metrics:flush_stream"
METRICS_STOP: Final = "clusterkernel.metrics:stop_stream"

ALL: Final[tuple[str, ...]] = tuple(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)
"""Every target above (the test resolves each on the rank side)."""
