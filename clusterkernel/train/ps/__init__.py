"""The parameter-server family: server ranks serve worker ranks with point-to-point MPI.

- :class:`ParameterServerMode` (``"ps"``) and :class:`AsyncMode` (``"async"``):
  sharded parameter servers, bounded staleness, Downpour schedules, compression
  (``_modes``; a server's shard and update rule in ``_shard``, a worker's
  push/fetch schedule in ``_worker``, gradient codecs in ``_codec``, asynchronous
  SGD's implicit momentum in ``_momentum``);
- the server/worker machinery, which EASGD (``train/_easgd.py``) builds on too:
  ``_served`` (:class:`ServedMode`: roles, fit, one checkpoint file per server),
  ``_serverloop`` (the loop a server rank runs), ``_client`` (a worker's side of
  the protocol), ``_link`` (a private communicator, the message layout, polling,
  peer failures), ``_flat`` (a model as one flat vector; gossip uses it too).

Importing it registers the modes ``"ps"`` and ``"async"``; the public names are
also in :mod:`clusterkernel.train`.

Example (on every rank; ranks 0 and 1 serve, the others train)::

    from clusterkernel.train import Trainer
    Trainer(net, opt, F.cross_entropy, digits(), mode="ps",
            mode_options={"servers": 2, "staleness": 1}).fit(3)
"""

from clusterkernel.train.ps._link import PeerFailedError
from clusterkernel.train.ps._modes import AsyncMode, ParameterServerMode
from clusterkernel.train.ps._served import ServedMode

__all__ = ["AsyncMode", "ParameterServerMode", "PeerFailedError", "ServedMode"]
