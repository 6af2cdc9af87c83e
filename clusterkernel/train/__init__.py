"""Distributed training (engine side): data parallel, pipeline parallel, Trainer.

- :func:`sync_parameters`, :func:`average_gradients` the tutorial's building blocks;
- :class:`DataParallel` bucketed, overlapped gradient averaging (synchronous SGD),
  with torch-style communication hooks (:mod:`~clusterkernel.train.comm_hooks`);
- :class:`PipelineParallel` an ``nn.Sequential`` split into stages, GPipe schedule;
- :class:`Trainer` ``fit`` / ``evaluate`` / hooks / checkpoints, with a pluggable
  ``mode`` (:class:`TrainingMode`, :func:`register_mode`);
- asynchronous modes: :class:`ParameterServerMode` (``"ps"``), :class:`AsyncMode`
  (``"async"``) in :mod:`~clusterkernel.train.ps` with the server/worker machinery,
  and beside it :class:`EASGDMode` (``"easgd"``), :class:`GossipMode` (``"gossip"``);
- :func:`steps` a plain loop whose steps are redone after a rank's death in the cell
  (auto-respawn).

Example (on every rank)::

    from clusterkernel.train import DataParallel
    model = DataParallel(net, optimizer=opt)
    loss_fn(model(x), y).backward()
    opt.step()
"""

from clusterkernel.train import comm_hooks
from clusterkernel.train._ddp import DataParallel

# importing a mode's module registers it ("ps", "async", "easgd", "gossip")
from clusterkernel.train._easgd import EASGDMode
from clusterkernel.train._gossip import GossipMode
from clusterkernel.train._modes import (
    AllReduceMode,
    LocalMode,
    PipelineMode,
    TrainingMode,
    available_modes,
    register_mode,
)
from clusterkernel.train._pipeline import PipelineError, PipelineParallel
from clusterkernel.train._prefetch import Prefetcher, spare_core
from clusterkernel.train._steps import Step, steps
from clusterkernel.train._sync import (
    ReplicaMismatchError,
    average_gradients,
    broadcast_tensors,
    check_replicas,
    sync_parameters,
)
from clusterkernel.train._trainer import Trainer
from clusterkernel.train.ps import AsyncMode, ParameterServerMode, PeerFailedError

__all__ = [
    "AllReduceMode",
    "AsyncMode",
    "DataParallel",
    "EASGDMode",
    "GossipMode",
    "LocalMode",
    "ParameterServerMode",
    "PeerFailedError",
    "PipelineError",
    "PipelineMode",
    "PipelineParallel",
    "Prefetcher",
    "ReplicaMismatchError",
    "Step",
    "Trainer",
    "TrainingMode",
    "available_modes",
    "average_gradients",
    "broadcast_tensors",
    "check_replicas",
    "comm_hooks",
    "register_mode",
    "spare_core",
    "steps",
    "sync_parameters",
]
