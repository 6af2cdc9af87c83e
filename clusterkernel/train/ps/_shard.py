"""One parameter-server shard: applies pushed gradients, answers reads, bounds staleness.

Versions and clocks:

- ``version``: how many gradients this shard has applied;
- ``pushes[w]``: how many gradients of worker ``w`` it has applied (``w``'s clock);
- ``clock()``: the slowest live, unfinished worker's clock.

A read is answered with the shard, its version and the clock. When the gradient
computed from it comes back, the server records

- ``staleness = clock() - clock at the read`` (in worker steps: the unit of the
  bound ``s``), and
- ``delay = version - version at the read`` (gradients applied in between, the
  usual asynchronous-SGD measure).

Bounded staleness ``s``: a read that follows a worker's ``c``-th push is held
back until ``clock() >= c - s``. The worker's next gradient is applied while its
own clock is still ``c``, so ``clock() <= c`` then, hence ``staleness <= s``;
``s = 0`` makes every round synchronous. Dead or finished workers leave the
minimum, so they never hold the others back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from clusterkernel import metrics
from clusterkernel.train.ps._codec import GradientCodec
from clusterkernel.train.ps._flat import FlatParams
from clusterkernel.train.ps._serverloop import (
    CLOCK,
    FLAGS,
    KIND,
    PULL,
    PUSH,
    REPLY,
    SAVE,
    VERSION,
    WANT_REPLY,
    header_progress,
)

UPDATES = ("sgd", "adam")
#: builds a server's update rule for its shard parameter
Rule = Callable[[torch.nn.Parameter], torch.optim.Optimizer]


def make_rule(optimizer: torch.optim.Optimizer, update: str | None, options: dict | None) -> Rule:
    """A function building the server's update rule for one shard parameter.

    ``update=None`` copies the workers' optimizer: same class, same
    hyperparameters (of its single parameter group); ``"sgd"``/``"adam"`` build
    ``torch.optim.SGD``/``Adam`` from ``options`` (``lr`` defaults to the
    workers' learning rate).
    """
    groups = optimizer.param_groups
    first = {k: v for k, v in groups[0].items() if k != "params"}
    if update is None:
        if any({k: v for k, v in g.items() if k != "params"} != first for g in groups[1:]):
            raise ValueError(
                "the optimizer has parameter groups with different settings; a server "
                "applies one rule to its whole shard: pass update='sgd' or 'adam' with "
                "update_options, or use one parameter group"
            )
        cls = type(optimizer)
        hyper = {k: v for k, v in first.items() if k in optimizer.defaults}
        if options:
            hyper.update(options)
    elif update in UPDATES:
        cls = torch.optim.SGD if update == "sgd" else torch.optim.Adam
        hyper = {"lr": first.get("lr", 0.01), **(options or {})}
    else:
        raise ValueError(
            f"update must be None (the workers' optimizer) or one of {UPDATES}, got {update!r}"
        )
    try:
        cls([torch.nn.Parameter(torch.zeros(1))], **hyper)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot build the server update rule {cls.__name__}: {exc}") from None
    return lambda param: cls([param], **hyper)


class ShardServer:
    """Handler of :class:`ServerLoop` for the shard ``[lo, hi)`` of the flat parameters.

    Example (what :class:`ParameterServerMode` does on a server rank)::

        server = ShardServer(flat.read()[lo:hi], lo, rule, codec, staleness=2, workers=[1, 2])
        loop = ServerLoop(comm, [1, 2], codec.max_bytes, (hi - lo) * 4, server)
        server.send = loop.send
        loop.serve()
    """

    def __init__(
        self,
        values: torch.Tensor,
        lo: int,
        rule: Rule,
        codec: GradientCodec,
        staleness: int | None,
        workers: list[int],
    ):
        self.lo = lo
        self.param = torch.nn.Parameter(values.detach().clone())
        self.rule = rule(self.param)
        self.codec = codec
        self.bound = staleness
        self.version = 0
        self.pushes = dict.fromkeys(workers, 0)
        self.progress = {w: (0, 0, 0) for w in workers}
        self.live = set(workers)
        self.waiting: dict[int, int | None] = {}  # worker -> clock its read needs
        self.max_staleness = 0
        self.max_delay = 0
        self.delay_sum = self.delay_n = 0  # this run's applied gradients (not a resumed one's)
        self._grad = torch.empty_like(self.param)
        self._rec = metrics.recorder()
        self.send = None  # set by the mode to the loop's send
        self.request_save = None

    def clock(self) -> int:
        if self.live:
            return min(self.pushes[w] for w in self.live)
        return max(self.pushes.values(), default=0)

    # -- loop handler ---------------------------------------------------------
    def on_message(self, w: int, header: np.ndarray, payload: np.ndarray) -> None:
        kind = header[KIND]
        if kind == PUSH:
            self._apply(w, header, payload)
            if header[FLAGS] & WANT_REPLY:
                self._want(w)
        elif kind == PULL:
            self._want(w)
        elif kind == SAVE:
            self.request_save()
        else:
            raise RuntimeError(f"parameter server: unexpected message kind {kind} from rank {w}")

    @torch.no_grad()
    def _apply(self, w: int, header: np.ndarray, payload: np.ndarray) -> None:
        staleness = self.clock() - int(header[CLOCK])
        delay = self.version - int(header[VERSION])
        self.param.grad = self.codec.decode(payload, self._grad)
        self.rule.step()
        self.version += 1
        self.pushes[w] += 1
        self.progress[w] = header_progress(header)
        self.max_staleness = max(self.max_staleness, staleness)
        self.max_delay = max(self.max_delay, delay)
        self.delay_sum += delay
        self.delay_n += 1
        self._rec.log(step=self.version, staleness=staleness, delay=delay, worker=w)

    def _want(self, w: int) -> None:
        self.waiting[w] = None if self.bound is None else self.pushes[w] - self.bound

    def after_events(self) -> None:
        if not self.waiting:
            return
        clock = self.clock()
        for w, need in list(self.waiting.items()):
            if need is None or clock >= need:
                del self.waiting[w]
                self.send(w, [REPLY, 0, clock, self.version], self.param.detach())

    def on_done(self, w: int, header: np.ndarray) -> None:
        self.live.discard(w)
        self.waiting.pop(w, None)

    def on_failure(self, w: int) -> None:
        self.live.discard(w)
        self.waiting.pop(w, None)

    def final_payload(self) -> torch.Tensor:
        return self.param.detach()

    # -- results and checkpoints ----------------------------------------------
    def summary(self, seconds: float) -> dict:
        return {
            "updates": self.version,
            "updates_per_s": self.version / seconds if seconds > 0 else 0.0,
            "max_staleness": self.max_staleness,
            "max_delay": self.max_delay,
            "mean_delay": self.delay_sum / self.delay_n if self.delay_n else 0.0,
        }

    def install(self, flat: FlatParams) -> None:
        """Put the final shard into this rank's own copy of the model."""
        flat.write(self.param.detach(), self.lo)

    def state(self) -> dict:
        return {
            "values": self.param.detach().clone(),
            "rule": self.rule.state_dict(),
            "version": self.version,
            "pushes": dict(self.pushes),
            "progress": dict(self.progress),
            "lo": self.lo,
        }

    def load_state(self, state: dict) -> None:
        if state["lo"] != self.lo or state["values"].shape != self.param.shape:
            raise ValueError("the saved shard does not match this server's shard")
        with torch.no_grad():
            self.param.copy_(state["values"])
        self.rule.load_state_dict(state["rule"])
        self.version = state["version"]
        self.pushes.update(state["pushes"])
        self.progress.update(state["progress"])
