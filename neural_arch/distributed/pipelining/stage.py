"""``PipelineStage``: one piece of a model, placed on one rank of a pipeline group.

The stage runs its submodule forward on one micro-batch at a time and keeps what backward
needs: the received input as a **leaf** tensor (its ``.grad`` is what travels back to the
previous stage) and the output (which receives the next stage's gradient). Sending and
receiving are the executor's job; the stage only computes.

With ``dp_group`` (pipeline x data parallel) the stage's parameters are broadcast from the dp
group's first rank at construction (as DDP does) and
:meth:`~neural_arch.distributed.pipelining.stage.PipelineStage.sync_gradients` averages its gradients
over the dp group once per step, after the schedule's last backward.

Example (2 ranks, each runs its own stage)::

    pipe = pipeline(model, num_stages=2)
    stage = PipelineStage(pipe[rank], rank, 2)          # group: the default (world) group
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=F.cross_entropy)
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.groups import get_default_group
from neural_arch.distributed.pipelining.schedules import generate_stage_to_rank_mapping, stage_to_rank
from neural_arch.distributed.pipelining.weight_grad import WeightGradStash, defer_linear_weight_grads
from neural_arch.distributed.process_group import GroupMember, ProcessGroup
from neural_arch.nn.module import Module


def _resolve(group, what: str) -> ProcessGroup:
    if group is None:
        return get_default_group()
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"PipelineStage: {what} is GroupMember.NON_GROUP_MEMBER on this rank; pass the "
                         "group this rank belongs to (new_group returns the sentinel to non-members)")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"PipelineStage: {what} must be a ProcessGroup from new_group(), got {type(group).__name__}")
    return group


class PipelineStage:
    """Stage ``stage_index`` of ``num_stages``, run by group rank ``stage_index % group.size()``
    (or, for ZB-V's two stages per rank, by rank ``r`` for stages ``r`` and ``2*size-1-r``).

    Args:
        submodule: the stage's layers (a ``Module`` whose ``forward`` takes one tensor and
            returns one tensor; :func:`~neural_arch.distributed.pipelining.split.pipeline` builds these).
        stage_index, num_stages: position in the pipeline. ``num_stages`` may be a multiple of
            the group size (interleaved schedules: stage s runs on group rank ``s % size``;
            ``ScheduleZBVZeroBubble``: ``num_stages = 2 * size``, V placement).
        device: accepted for torch compatibility; arrays stay where the submodule's are.
        group: the pipeline group (default: the world); its ranks, in order, hold the stages.
        dp_group: optional data-parallel group of replicas of *this* stage.

    Example::

        pipe = pipeline(model, num_stages=2)
        stage = PipelineStage(pipe[rank], stage_index=rank, num_stages=2)   # or pipe.build_stage(rank)
        schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=F.cross_entropy)
    """

    def __init__(self, submodule: Module, stage_index: int, num_stages: int, device=None,
                 group=None, dp_group=None):
        if not isinstance(submodule, Module):
            raise TypeError(f"PipelineStage: submodule must be an nn.Module, got {type(submodule).__name__}")
        if not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"PipelineStage: num_stages must be a positive int, got {num_stages!r}")
        if not isinstance(stage_index, int) or not 0 <= stage_index < num_stages:
            raise ValueError(f"PipelineStage: stage_index={stage_index!r} must be in [0, num_stages={num_stages})")
        self.group = _resolve(group, "group")
        size = self.group.size()
        if num_stages % size:
            raise ValueError(f"PipelineStage: num_stages={num_stages} must be a multiple of the pipeline group's "
                             f"size ({size}); stage s runs on group rank s % {size}")
        rank = self.group.rank()
        # stage s runs on group rank s % size ("loop"), or, with two stages per rank, in ZB-V's
        # "v" placement (ranks r and 2*size-1-r): the schedule that runs the stage picks which
        in_v = num_stages == 2 * size and stage_to_rank(stage_index, size, num_stages, "v") == rank
        if stage_to_rank(stage_index, size, num_stages) != rank and not in_v:
            v_hint = f" (ZB-V: {rank} and {2 * size - 1 - rank})" if num_stages == 2 * size else ""
            raise ValueError(f"PipelineStage: stage {stage_index} belongs on group rank {stage_index % size}, but "
                             f"this process is group rank {rank} of {self.group.ranks}; build stage "
                             f"{rank} (or {rank} + k*{size}){v_hint} here")
        self.submodule = submodule
        first = next(iter(submodule.parameters()), None)
        #: The array module of this stage's parameters, NumPy or CuPy. Activations and gradients
        #: received for it are allocated there, so a stage on a GPU never stages through the host.
        self.xp = _backend.get_array_module(first.data) if first is not None else np
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.device = device
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        #: Stage index -> group rank (torch's name); the ZB-V schedule sets the ``"v"`` placement.
        self.stage_index_to_group_rank = generate_stage_to_rank_mapping(size, num_stages)
        # micro-batch -> (input leaf or None, output tensor, loss or None)
        self._cache: dict[int, tuple[Tensor | None, Tensor, Tensor | None]] = {}
        # micro-batch -> deferred weight gradients (split backward), from its forward to its W
        self._wstash: dict[int, WeightGradStash] = {}
        self.dp_group = None if dp_group is None else _resolve(dp_group, "dp_group")
        if self.dp_group is not None and self.dp_group.size() > 1:
            self._broadcast_parameters()

    @property
    def prev_rank(self) -> int:
        """Group rank of the previous stage (this rank itself for a local hand-off)."""
        return self.stage_index_to_group_rank[(self.stage_index - 1) % self.num_stages]

    @property
    def next_rank(self) -> int:
        """Group rank of the next stage."""
        return self.stage_index_to_group_rank[(self.stage_index + 1) % self.num_stages]

    # -- compute ------------------------------------------------------------------------------------
    def forward_one_chunk(self, microbatch: int, inputs, target=None, loss_fn=None,
                          split_backward: bool = False) -> Tensor:
        """Run the submodule on ``inputs`` (an array or Tensor) and keep what backward needs.

        On the last stage with ``loss_fn``, ``loss_fn(output, target)`` is computed and kept too.
        With ``split_backward`` (zero-bubble schedules) the Linear layers' weight gradients are
        left out of the graph: :meth:`backward_one_chunk` then computes input gradients only and
        :meth:`backward_weight_one_chunk` the weight gradients (see :mod:`.weight_grad`).
        Returns the output tensor.
        """
        if microbatch in self._cache or microbatch in self._wstash:
            raise RuntimeError(f"stage {self.stage_index}: micro-batch {microbatch} ran forward twice "
                               "without a backward in between")
        leaf = None
        if isinstance(inputs, Tensor):
            x = inputs
        elif self.is_first or not np.issubdtype(inputs.dtype, np.floating):
            x = Tensor(inputs)
        else:
            # the received activation is a leaf: its gradient is what the previous stage needs
            x = leaf = Tensor(inputs, requires_grad=True)
        if split_backward:
            stash = WeightGradStash()
            with defer_linear_weight_grads(self.submodule, stash):
                out = self.submodule(x)
            self._wstash[microbatch] = stash
        else:
            out = self.submodule(x)
        if not isinstance(out, Tensor):
            raise TypeError(f"stage {self.stage_index}: the submodule returned {type(out).__name__}; a pipeline "
                            "stage must return one Tensor (wrap tuples in a module that returns one)")
        loss = None
        if self.is_last and loss_fn is not None:
            loss = loss_fn(out, target)
        self._cache[microbatch] = (leaf, out, loss)
        return out

    def backward_one_chunk(self, microbatch: int, grad=None, scale: float = 1.0):
        """Backward of ``microbatch``: from ``loss * scale`` (last stage) or from ``grad`` (the next
        stage's gradient of this stage's output). Returns the input's gradient array (None on the
        first stage)."""
        try:
            leaf, out, loss = self._cache.pop(microbatch)
        except KeyError:
            raise RuntimeError(f"stage {self.stage_index}: backward of micro-batch {microbatch} before its "
                               "forward") from None
        if loss is not None:
            if loss.requires_grad:
                # scaled on the device (a Python scalar is a kernel argument): seeding backward with a host
                # array of the scale would copy it to the device every micro-batch
                (loss * scale if scale != 1.0 else loss).backward()
        elif grad is not None and out.requires_grad:
            out.backward(grad)
        elif self.is_last:
            raise RuntimeError(f"stage {self.stage_index} is the last stage but has no loss: pass loss_fn= to "
                               "the schedule and target= to step()")
        if leaf is None or self.is_first:
            return None
        xp = _backend.get_array_module(leaf.data)
        if leaf.grad is None:  # the stage ignored its input: the previous stage still needs a gradient
            return xp.zeros_like(leaf.data)
        return xp.ascontiguousarray(leaf.grad.data)

    def backward_weight_one_chunk(self, microbatch: int) -> None:
        """``W`` of a split backward: add ``microbatch``'s deferred Linear weight gradients to ``.grad``.

        Needs a forward with ``split_backward=True`` and its :meth:`backward_one_chunk` first."""
        try:
            stash = self._wstash.pop(microbatch)
        except KeyError:
            raise RuntimeError(f"stage {self.stage_index}: W of micro-batch {microbatch} without a split "
                               "forward (forward_one_chunk(..., split_backward=True)) or run twice") from None
        if microbatch in self._cache:
            self._wstash[microbatch] = stash
            raise RuntimeError(f"stage {self.stage_index}: W of micro-batch {microbatch} before its B")
        stash.apply()

    def clear(self) -> None:
        """Drop every cached micro-batch (after a failed step)."""
        self._cache.clear()
        self._wstash.clear()

    # -- data parallel ----------------------------------------------------------------------------------
    def _broadcast_parameters(self) -> None:
        backend = self.dp_group.backend
        for p in self.submodule.parameters():
            buf = self.xp.ascontiguousarray(p.data)
            backend.broadcast(buf, 0)
            p.data[...] = buf

    def sync_gradients(self) -> None:
        """Average this stage's gradients over ``dp_group`` (one flat all-reduce; no-op without one)."""
        if self.dp_group is None or self.dp_group.size() == 1:
            return
        params = [p for p in self.submodule.parameters() if p.requires_grad]
        if not params:
            return
        dtype = np.result_type(*[p.data.dtype for p in params])
        xp = self.xp
        flat = xp.concatenate([(p.grad.data if p.grad is not None else xp.zeros_like(p.data)).ravel().astype(dtype)
                               for p in params])
        self.dp_group.backend.allreduce(flat, ReduceOp.SUM)
        flat /= self.dp_group.size()
        offset = 0
        for p in params:
            n = p.data.size
            p.grad = Tensor(flat[offset:offset + n].reshape(p.data.shape).astype(p.data.dtype))
            offset += n

    def __repr__(self) -> str:
        return (f"PipelineStage(stage {self.stage_index} of {self.num_stages}, group rank {self.group.rank()} "
                f"of {self.group.ranks}{', dp ' + str(self.dp_group.ranks) if self.dp_group else ''})")


__all__ = ["PipelineStage"]
