"""Base of the modes where server ranks serve worker ranks (parameter server, EASGD).

Ranks ``0 .. servers-1`` of the group serve; the others train, each on its own
share of the data. Inside :meth:`Trainer.fit <clusterkernel.train.Trainer.fit>` a
server runs :class:`~clusterkernel.train.ps._serverloop.ServerLoop` until every
worker is done (or dead); a worker fetches parameters, runs the epoch loop, then
says done and receives the final parameters, so after ``fit`` every worker holds
the same model. With ``servers=0`` every rank is a worker and the subclass
communicates by collectives instead (synchronous EASGD).

Checkpoints: workers never meet the servers in a collective mid-run, so each
server writes its own file (``checkpoint.server<k>.pt``: its state and every
worker's progress) when a worker asks (at the Trainer's checkpoint points) and
when serving ends. Resuming restores the servers and gives each worker back its
epoch and step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clusterkernel import comm, metrics
from clusterkernel.train._checkpoint import CHECKPOINT_NAME, Progress
from clusterkernel.train._modes import TrainingMode
from clusterkernel.train._sync import all_objects, sync_parameters, world_rank
from clusterkernel.train.ps._flat import FlatParams
from clusterkernel.train.ps._link import Poller, check_same_model, free_comm, private_comm
from clusterkernel.train.ps._serverloop import ServerLoop, log

FORMAT = 1


class ServedMode(TrainingMode):
    """Common machinery of server/worker modes; subclasses supply the protocol.

    Subclass hooks: ``_make_handler()`` (server side, returns the loop's
    handler, which also has ``state()``/``load_state()`` for checkpoints),
    ``_message_bytes()`` (largest payloads to and from a server),
    ``_start_worker()``/``_finish_worker()`` around the epoch loop, and ``step``.
    """

    lockstep = False

    def __init__(self, servers: int = 1, poll_spin: float = 2e-4):
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 0:
            raise ValueError(f"servers must be a non-negative int, got {servers!r}")
        if not (isinstance(poll_spin, float | int) and poll_spin >= 0):
            raise ValueError(f"poll_spin must be seconds >= 0, got {poll_spin!r}")
        self.servers = servers
        self.poll_spin = float(poll_spin)
        self.is_server = False
        self.failed_workers: list[int] = []
        self.stats: dict[str, Any] = {}
        self.trainer: Progress | None = None
        self._serving = False

    @property
    def serves(self) -> bool:
        """This rank is one of the servers (it trains on no data)."""
        return self.is_server

    # -- roles ------------------------------------------------------------------
    def setup(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, group: comm.Group | None = None
    ) -> nn.Module:
        super().setup(model, optimizer, group)
        n, me = comm.size(group), comm.rank(group)
        if self.servers >= n:
            raise ValueError(
                f"mode {self.name!r} with servers={self.servers} on {n} ranks leaves no "
                f"worker; use servers <= {n - 1} or start more ranks"
            )
        self.server_ranks = list(range(self.servers))
        self.worker_ranks = list(range(self.servers, n))
        self.is_server = me < self.servers
        self.index = me if self.is_server else me - self.servers
        self.link = private_comm(group)
        self.poller = Poller(spin=self.poll_spin)
        self.flat = FlatParams(model)
        check_same_model(self.flat.numel, self.flat.dtype, group)
        # every rank starts from group rank 0's weights
        sync_parameters(model, src=world_rank(group, 0), group=group)
        if self.is_server:
            self.handler = self._make_handler()
        else:
            self._setup_worker()
        return model

    def shard(self) -> tuple[int, int]:
        # A server never iterates its loader (and predicts nothing); worker 0's
        # share makes the loader's checks (batch size, data size) run, and fail,
        # on every rank alike.
        return (0 if self.is_server else self.index), len(self.worker_ranks)

    def predict(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        return None if self.is_server else module(x)

    def progress(self, ahead: int = 1) -> tuple[int, int, int]:
        """``(epoch, step_in_epoch, global_step)`` once the current step is done."""
        t = self.trainer
        return t.epoch, t.step_in_epoch + ahead, t.global_step + ahead

    # -- fit ----------------------------------------------------------------------
    def run(self, trainer: Progress, train: Callable[[], None]) -> None:
        self.trainer = trainer
        self._serving = True
        try:
            if self.is_server:
                self._serve(trainer)
            else:
                self._start_worker()
                try:
                    train()
                finally:
                    self._finish_worker()
        finally:
            self._serving = False

    def _serve(self, trainer: Progress) -> None:
        recv_bytes, send_bytes = self._message_bytes()
        loop = ServerLoop(
            self.link, self.worker_ranks, recv_bytes, send_bytes, self.handler, self.poller
        )
        self.handler.send = loop.send
        self.handler.request_save = lambda: self._save_server(trainer)
        t0 = time.perf_counter()
        loop.serve()
        seconds = time.perf_counter() - t0
        self.failed_workers = list(loop.failed)
        self.stats = {
            "seconds": seconds,
            "messages": loop.messages,
            "failed_workers": self.failed_workers,
            **self.handler.summary(seconds),
        }
        metrics.log(**{k: v for k, v in self.stats.items() if isinstance(v, int | float)})
        self.handler.install(self.flat)
        if trainer.checkpoint_dir is not None:
            self._save_server(trainer)

    def teardown(self) -> None:
        free_comm(getattr(self, "link", None))
        self.link = None

    # -- checkpoints ----------------------------------------------------------
    def server_file(self, path: Path, k: int) -> Path:
        """Where server ``k`` keeps its checkpoint, next to the Trainer's ``path``."""
        return path.with_name(f"{path.stem}.server{k}{path.suffix}")

    def save_state(self, trainer: Progress, path: Path) -> None:
        """Servers write their own files; a worker asks them to (mid-run) or does nothing.

        With ``servers=0`` (every rank trains) one shared file, as the base class.
        """
        if not self.servers:
            super().save_state(trainer, path)
        elif self.is_server:
            self._save_server(trainer, path)
        elif self._serving:
            self._ask_save()  # the servers write; a worker's progress rides along

    def _save_server(self, trainer: Progress, path: Path | None = None) -> None:
        if path is None:
            if trainer.checkpoint_dir is None:
                log.warning("a worker asked for a checkpoint but Trainer has no checkpoint_dir")
                return
            path = Path(trainer.checkpoint_dir) / CHECKPOINT_NAME
        state = {
            "format": FORMAT,
            "mode": self.name,
            "server": self.index,
            "servers": self.servers,
            "numel": self.flat.numel,
            "state": self.handler.state(),
        }
        target = self.server_file(path, self.index)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        torch.save(state, tmp)
        tmp.replace(target)  # a crash mid-write leaves the previous file intact

    def load_state(self, trainer: Progress, path: Path) -> bool:
        """Collective: servers load their files, workers get their progress back."""
        if not self.servers:
            return super().load_state(trainer, path)
        found, error, progress = False, None, None
        if self.is_server:
            target = self.server_file(path, self.index)
            found = target.is_file()
            if found:
                try:
                    saved = torch.load(target, map_location="cpu", weights_only=True)
                    error = self._check_saved(saved, target)
                    if error is None:
                        self.handler.load_state(saved["state"])
                        progress = saved["state"]["progress"]
                except Exception as exc:  # a bad file must fail on every rank, not hang
                    error = f"could not read {target}: {type(exc).__name__}: {exc}"
        reports = all_objects((found, error, progress), self.group)[: self.servers]
        errors = [f"server {k}: {e}" for k, (_, e, _) in enumerate(reports) if e]
        missing = [k for k, (f, _, _) in enumerate(reports) if not f]
        if errors:
            raise RuntimeError("; ".join(errors))
        if len(missing) == self.servers:
            return False
        if missing:
            raise RuntimeError(
                f"checkpoint files of servers {missing} are missing next to {path}; resume "
                "needs every server's file (same number of servers as when saved)"
            )
        if not self.is_server:
            table = reports[0][2]
            me = comm.rank(self.group)
            if me not in table:
                raise RuntimeError(
                    f"{path}: no progress saved for worker rank {me}; resume with the same "
                    "ranks as when saved"
                )
            trainer.epoch, trainer.step_in_epoch, trainer.global_step = table[me]
        return True

    def _check_saved(self, saved: dict, target: Path) -> str | None:
        if saved.get("format") != FORMAT or saved.get("mode") != self.name:
            return f"{target} is not a {self.name!r} server checkpoint of format {FORMAT}"
        if saved["servers"] != self.servers or saved["numel"] != self.flat.numel:
            return (
                f"{target} holds shard {saved['server']} of {saved['servers']} servers for "
                f"{saved['numel']} parameters; this run has {self.servers} servers and "
                f"{self.flat.numel} parameters"
            )
        return None

    # -- subclass hooks -------------------------------------------------------
    def _make_handler(self) -> Any:
        raise NotImplementedError

    def _message_bytes(self) -> tuple[int, int]:
        raise NotImplementedError

    def _setup_worker(self) -> None:
        raise NotImplementedError

    def _start_worker(self) -> None:
        raise NotImplementedError

    def _finish_worker(self) -> None:
        raise NotImplementedError

    def _ask_save(self) -> None:
        raise NotImplementedError
