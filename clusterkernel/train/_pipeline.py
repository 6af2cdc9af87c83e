"""Pipeline model parallelism: one ``nn.Sequential`` cut into stages, one per rank."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from clusterkernel import comm
from clusterkernel.partition import balance_by_size, split_sequential
from clusterkernel.protocol._errors import ClusterkernelError
from clusterkernel.train._sync import all_objects, broadcast_tensors, world_rank

_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]
_MAX_DIMS = 8
# header of each activation message: [status, micro-batch count, dtype code, ndim, dims...]
_HEADER = 4 + _MAX_DIMS
_OK, _FAILED = 0, 1
_TAG_HEADER, _TAG_ACT, _TAG_GRAD = 101, 102, 103
_UPSTREAM = object()  # "an earlier stage failed", as opposed to a failure here


class PipelineError(ClusterkernelError, RuntimeError):
    """A pipeline stage failed; raised on every rank of the pipeline.

    The message names the stage and rank that failed and the original error, so
    any rank's traceback explains it. The pipeline is usable again afterwards.

    Example::

        pipe = PipelineParallel(nn.Sequential(*(nn.Linear(64, 64) for _ in range(4))))
        try:
            loss = pipe.train_step(x[:, :60], y, F.cross_entropy)   # 60 features, not 64
        except PipelineError as exc:   # "pipeline stage 0 (rank 0) failed: ... mat1 and mat2 ..."
            print(exc)
    """


class PipelineParallel(nn.Module):
    """Run ``model`` (an ``nn.Sequential``) as a pipeline across the ranks.

    Rank ``i`` keeps stage ``i`` (``balance[i]`` consecutive layers) with rank
    0's initial weights. :meth:`train_step` cuts the batch into ``chunks``
    micro-batches and runs them in the GPipe schedule: all forwards (each stage
    sends activations on as soon as a micro-batch is done), then all backwards
    in reverse order (each stage sends the gradient of its input back). The
    parameter gradients equal one process's on the whole batch; each rank then
    steps an optimizer over its own stage.

    Example::

        net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                            nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
        pipe = PipelineParallel(net, balance=[2, 2, 2, 1], chunks=4)   # on 4 ranks
        opt = torch.optim.SGD(pipe.parameters(), lr=0.1)         # this stage only
        opt.zero_grad()
        loss = pipe.train_step(x, y, nn.functional.cross_entropy)
        opt.step()

    ``x`` is read on the first stage and ``y`` on the last; other ranks may pass
    ``None``. ``loss_fn`` must average over the batch (torch's default). If a
    stage fails in the forward pass, every rank raises :class:`PipelineError`
    naming that stage, instead of waiting forever for its message.
    """

    def __init__(
        self,
        model: nn.Sequential,
        balance: Sequence[int] | None = None,
        chunks: int = 4,
        group: comm.Group | None = None,
    ):
        """Keep this rank's stage of ``model``: ``balance[i]`` layers on rank ``i``
        (default: balanced by parameter size), ``chunks`` micro-batches per batch,
        over ``group`` (default all ranks).

        Example::

            layers = [nn.Linear(64, 64) for _ in range(7)] + [nn.Linear(64, 10)]
            pipe = PipelineParallel(nn.Sequential(*layers), balance=[2, 2, 2, 2], chunks=8)
        """
        super().__init__()
        self.group = group
        self.rank = comm.rank(group)
        self.world = comm.size(group)
        if chunks < 1:
            raise ValueError(f"chunks must be >= 1, got {chunks}.")
        balance = list(balance_by_size(model, self.world) if balance is None else balance)
        if len(balance) != self.world:
            raise ValueError(
                f"balance={balance} has {len(balance)} stages but the pipeline has "
                f"{self.world} ranks; give one layer count per rank."
            )
        stages = split_sequential(model, balance)
        # Every rank built the whole model; rank 0's weights become everyone's.
        broadcast_tensors([*model.parameters(), *model.buffers()], world_rank(group, 0), group)
        self.balance = balance
        self.chunks = chunks
        self.stage = stages[self.rank]
        self.first = self.rank == 0
        self.last = self.rank == self.world - 1
        self._prev = None if self.first else world_rank(group, self.rank - 1)
        self._next = None if self.last else world_rank(group, self.rank + 1)

    # -- messages --------------------------------------------------------------
    def _send_header(self, status: int, count: int, t: torch.Tensor | None) -> None:
        h = torch.zeros(_HEADER, dtype=torch.int64)
        h[0], h[1] = status, count
        if t is not None:
            h[2], h[3] = _DTYPES.index(t.dtype), t.dim()
            h[4 : 4 + t.dim()] = torch.tensor(t.shape)
        comm.send(h, self._next, tag=_TAG_HEADER, group=self.group)

    def _recv_header(self) -> tuple[int, int, torch.dtype, tuple[int, ...]]:
        h = torch.empty(_HEADER, dtype=torch.int64)
        comm.recv(h, self._prev, tag=_TAG_HEADER, group=self.group)
        status, count, code, ndim = (int(v) for v in h[:4])
        return status, count, _DTYPES[code], tuple(int(d) for d in h[4 : 4 + ndim])

    def _check_sendable(self, out) -> None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"stage output is a {type(out).__name__}; stages must return a tensor.")
        if out.dtype not in _DTYPES or out.dim() > _MAX_DIMS:
            raise TypeError(
                f"stage output of dtype {out.dtype} with {out.dim()} dims cannot be sent; "
                f"use one of {_DTYPES} with at most {_MAX_DIMS} dims."
            )

    # -- phases ----------------------------------------------------------------
    def _forward_phase(self, x: torch.Tensor | None, grad: bool):
        """All micro-batches forward. Returns (inputs, outputs, failure)."""
        inputs: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        sends = []
        failure = None
        count = None
        if self.first:
            if x is None:
                failure = ValueError("the first stage got x=None; pass the input batch on rank 0.")
            else:
                micro = list(torch.chunk(x, self.chunks))
                count = len(micro)
        k = 0
        while failure is None and (count is None or k < count):
            if self.first:
                inp = micro[k]
            else:
                status, count, dtype, shape = self._recv_header()
                if status != _OK:
                    failure = _UPSTREAM
                    break
                inp = torch.empty(shape, dtype=dtype)
                comm.recv(inp, self._prev, tag=_TAG_ACT, group=self.group)
                if grad and inp.is_floating_point():
                    inp.requires_grad_(True)
            try:
                with torch.set_grad_enabled(grad):
                    out = self.stage(inp)
                if not self.last:
                    self._check_sendable(out)
            except Exception as exc:  # every rank learns of it in _agree
                failure = exc
                break
            inputs.append(inp)
            outputs.append(out)
            if not self.last:
                self._send_header(_OK, count, out)
                sends.append(comm.isend(out.detach(), self._next, tag=_TAG_ACT, group=self.group))
            k += 1
        if failure is not None and not self.last:
            self._send_header(_FAILED, 0, None)
        for h in sends:
            h.wait()
        return inputs, outputs, failure

    def _losses(self, outputs, target, loss_fn) -> list[torch.Tensor]:
        if target is None:
            raise ValueError("the last stage got target=None; pass the targets on the last rank.")
        sizes = [len(o) for o in outputs]
        total = sum(sizes)
        if total != len(target):
            raise ValueError(f"the last stage got {len(target)} targets for {total} samples.")
        # Each micro-batch's mean loss weighted by its share: their sum is the
        # mean over the whole batch, so gradients match one process exactly.
        return [
            loss_fn(out, y) * (len(out) / total)
            for out, y in zip(outputs, torch.split(target, sizes))
        ]

    def _agree(self, failure, loss: float) -> float:
        """One allreduce tells every rank the loss, or that some stage failed."""
        real = failure is not None and failure is not _UPSTREAM
        vec = torch.tensor([loss if self.last else 0.0, 1.0 if real else 0.0], dtype=torch.float64)
        comm.all_reduce(vec, op=comm.SUM, group=self.group)
        if vec[1].item() == 0:
            return float(vec[0])
        msgs = all_objects(f"{type(failure).__name__}: {failure}" if real else None, self.group)
        bad = [i for i, m in enumerate(msgs) if m is not None]
        err = PipelineError(
            "; ".join(f"pipeline stage {i} (rank {i}) failed: {msgs[i]}" for i in bad)
        )
        if real:
            raise err from failure
        raise err

    def _backward_phase(self, inputs, outputs, losses) -> None:
        sends = []
        for k in reversed(range(len(outputs))):
            if self.last:
                torch.autograd.backward(losses[k])
            else:
                g = torch.empty_like(outputs[k])
                comm.recv(g, self._next, tag=_TAG_GRAD, group=self.group)
                if outputs[k].requires_grad:
                    torch.autograd.backward(outputs[k], g)
            if not self.first:
                inp = inputs[k]
                g_in = inp.grad if inp.grad is not None else torch.zeros_like(inp)
                sends.append(comm.isend(g_in, self._prev, tag=_TAG_GRAD, group=self.group))
        for h in sends:
            h.wait()

    # -- public ----------------------------------------------------------------
    def train_step(
        self,
        x: torch.Tensor | None,
        target: torch.Tensor | None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> float:
        """Forward and backward of one batch; gradients accumulate in ``.grad``.

        Returns the batch's mean loss on every rank.
        """
        inputs, outputs, failure = self._forward_phase(x, grad=True)
        losses: list[torch.Tensor] = []
        if self.last and failure is None:
            try:
                losses = self._losses(outputs, target, loss_fn)
            except Exception as exc:
                failure = exc
        loss = float(sum(t.item() for t in losses)) if losses else 0.0
        loss = self._agree(failure, loss)
        self._backward_phase(inputs, outputs, losses)
        return loss

    def forward(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """Inference through all stages (no gradients); the output on the last
        rank, ``None`` on the others."""
        _, outputs, failure = self._forward_phase(x, grad=False)
        self._agree(failure, 0.0)
        return torch.cat(outputs) if self.last else None
