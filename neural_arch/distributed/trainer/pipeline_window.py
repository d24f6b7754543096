"""The trainer's ``'pp'`` strategy: this rank's pipeline stages, run over one accumulation window.

DeepSpeed's ``PipelineEngine`` and torchtitan treat a pipeline step the same way: the micro-batches
of one optimizer step are the schedule's micro-batches. :class:`PipelineWindow` holds what one rank
needs for that, built from :mod:`neural_arch.distributed.pipelining` (no second implementation):
the model cut by :func:`~neural_arch.distributed.pipelining.split.pipeline` (an ``nn.GPT`` by blocks, as
``examples/train_gpt_5d.py --pp`` does; an ``nn.Sequential`` by children, balancing parameters),
this rank's :class:`~neural_arch.distributed.pipelining.stage.PipelineStage` (s) over the ``pp`` group
(with a ``dp`` group: each stage averages its gradients over its replicas), and the schedule's plan
(``"1f1b"``, ``"gpipe"``, ``"interleaved"`` -- two stages per rank -- or ``"zbh1"``), run by the
pipelining executor over the window's buffered micro-batches.

Each micro-batch's loss is scaled by ``1/K`` (``K`` the accumulation steps, also for a shorter last
window of an epoch, as the other strategies do), so a window equals one step on the union of its
micro-batches. The global gradient norm sums every stage's part over the ``pp`` group.

Example (2 ranks; the trainer builds one of these for ``strategy="pp"``)::

    window = PipelineWindow(model, pp_group, dp_group=None, schedule="1f1b")
    losses = window.run(inputs, targets, F.cross_entropy, scale=1 / len(inputs))   # every rank
    norm = window.clip_grad_norm_(1.0)
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor
from neural_arch.nn.container import ModuleDict
from neural_arch.nn.module import Module

__all__ = ["PIPELINE_SCHEDULES", "PipelineWindow", "StageModules"]

#: ``pp_schedule`` name -> (schedule class in ``neural_arch.distributed.pipelining``, stages per rank)
PIPELINE_SCHEDULES = {
    "1f1b": ("Schedule1F1B", 1),
    "gpipe": ("ScheduleGPipe", 1),
    "interleaved": ("ScheduleInterleaved1F1B", 2),
    "zbh1": ("ScheduleZBH1", 1),
}


class StageModules(Module):
    """Several stage modules of one rank (interleaved schedules) as one module whose parameter
    names are the unsplit model's (``blocks.1.attn...``, ``3.weight``): what ``trainer.model`` is
    there, for the optimizer and the state dicts. It has no ``forward``: the schedule runs the stages.

    Example::

        >>> from neural_arch import nn
        >>> from neural_arch.distributed.pipelining import pipeline
        >>> pipe = pipeline(nn.Sequential(*[nn.Linear(2, 2) for _ in range(4)]), num_stages=4)
        >>> [n for n, _ in StageModules([pipe[0], pipe[2]]).named_parameters()]
        ['0.weight', '0.bias', '2.weight', '2.bias']
    """

    def __init__(self, parts):
        super().__init__()
        for part in parts:
            _merge_children(self, part)

    def forward(self, *args, **kwargs):
        raise RuntimeError("StageModules holds this rank's pipeline stages for their parameters; the pipeline "
                           "schedule runs them (DistributedTrainer.train_step)")


def _merge_children(dst: Module, src: Module) -> None:
    """``src``'s children into ``dst`` under their names; ``ModuleDict`` s (a GPT stage's
    ``blocks``) merged into fresh ones, so no stage's own containers change."""
    for name, child in src._modules.items():
        if child is None:
            continue
        if isinstance(child, ModuleDict):
            have = dst._modules.get(name)
            if have is None:
                have = ModuleDict()
                dst.add_module(name, have)
            _merge_children(have, child)
        elif name not in dst._modules:
            dst.add_module(name, child)


class PipelineWindow:
    """This rank's pipeline stages of ``model`` and the schedule that runs a window of micro-batches.

    Args:
        model: an ``nn.GPT`` (split by blocks, equal counts) or an ``nn.Sequential`` (split by
            children, balanced parameter counts); anything else raises saying what to do.
        group: the pipeline group; its ranks, in order, hold the stages.
        dp_group: the replicas of this rank's stage (None: no data parallelism).
        schedule: a key of :data:`PIPELINE_SCHEDULES`.
        split_points: where stages start (``pipeline(split_points=...)``), instead of the default split.

    Example::

        window = PipelineWindow(model, pp_group, schedule="gpipe")
        window.module          # this rank's stage (parameters under their unsplit names)
    """

    def __init__(self, model: Module, group, dp_group=None, schedule: str = "1f1b", split_points=None):
        from neural_arch.distributed import pipelining as pl
        from neural_arch.nn import GPT, Sequential

        key = schedule.lower() if isinstance(schedule, str) else schedule
        if key not in PIPELINE_SCHEDULES:
            raise ValueError(f"DistributedTrainer(strategy='pp'): pp_schedule={schedule!r}; use one of "
                             f"{sorted(PIPELINE_SCHEDULES)}")
        cls_name, v = PIPELINE_SCHEDULES[key]
        if not isinstance(model, (GPT, Sequential)):
            # ValueError, as the trainer's other "this strategy needs ..." configuration errors (tp's plan)
            raise ValueError(  # noqa: TRY004
                f"DistributedTrainer(strategy='pp'): cannot split a {type(model).__name__} into pipeline stages; "
                "pass an nn.GPT (split by blocks) or an nn.Sequential with one child per layer (split between "
                "children)")
        self.group, self.dp_group = group, dp_group
        self.schedule_name, self.virtual_stages = key, v
        self._schedule_cls = getattr(pl, cls_name)
        p = group.size()
        try:
            if split_points is not None:
                pipe = pl.pipeline(model, split_points=list(split_points))
            else:
                pipe = pl.pipeline(model, num_stages=p * v, balance="layers" if isinstance(model, GPT) else "params")
        except ValueError as exc:
            raise ValueError(f"DistributedTrainer(strategy='pp', pp_schedule={key!r}): {p} rank(s) x {v} stage(s) "
                             f"per rank: {exc}") from None
        if pipe.num_stages != p * v:
            raise ValueError(f"DistributedTrainer(strategy='pp'): split_points={list(split_points)} make "
                             f"{pipe.num_stages} stages; pp_schedule={key!r} on {p} rank(s) needs {p * v}")
        self.pipe = pipe
        indices = pl.stage_indices(group.rank(), p, v)
        self.stages = [pipe.build_stage(s, group=group, dp_group=dp_group) for s in indices]
        self.module = self.stages[0].submodule if v == 1 else StageModules([s.submodule for s in self.stages])
        self.has_first = any(s.is_first for s in self.stages)
        self.has_last = any(s.is_last for s in self.stages)
        #: the pp-group rank holding the last stage (the losses are broadcast from there)
        self.last_rank = self.stages[0].stage_index_to_group_rank[p * v - 1]
        self._plans: dict = {}

    def plan(self, n_microbatches: int):
        """The schedule's plan for ``n_microbatches`` (cached; the error names the schedule's rule)."""
        found = self._plans.get(n_microbatches)
        if found is None:
            builder = (self._schedule_cls(n_microbatches, self.virtual_stages) if self.virtual_stages > 1
                       else self._schedule_cls(n_microbatches))
            try:
                found = self._plans[n_microbatches] = builder.plan(num_stages=self.group.size())
            except (ValueError, AssertionError) as exc:
                raise ValueError(f"DistributedTrainer(strategy='pp', pp_schedule={self.schedule_name!r}): a window "
                                 f"of {n_microbatches} micro-batch(es) on {self.group.size()} rank(s): {exc}; choose "
                                 "gradient_accumulation_steps (and epoch lengths) the schedule accepts") from None
        return found

    def run(self, inputs: list, targets: list, loss_fn, scale: float) -> list[float]:
        """Forward and backward of the micro-batches ``inputs`` / ``targets`` (this window's, the same on
        every rank of the pipeline) by the schedule; each loss scaled by ``scale`` before backward; the
        stages' gradients then averaged over ``dp_group``. Returns every micro-batch's loss as
        ``loss_fn`` computed it, on every rank of the pipeline (broadcast from the last stage).

        The pipeline sends one activation shape per schedule run, so consecutive micro-batches of
        one shape run together: an epoch's short last batch is a second run of the schedule,
        whose gradients add to the first's."""
        from neural_arch.distributed.pipelining.executor import execute

        m = len(inputs)
        shape = [(tuple(np.shape(x)), tuple(np.shape(y))) for x, y in zip(inputs, targets)]
        runs, start = [], 0
        for i in range(1, m + 1):
            if i == m or shape[i] != shape[start]:
                runs.append((start, i))
                start = i
        by_index = {s.stage_index: s for s in self.stages}
        values = np.zeros(m, dtype=np.float64)
        for a, b in runs:
            by_mb = execute(self.plan(b - a).for_rank(self.group.rank()), by_index,
                            inputs[a:b] if self.has_first else None, targets[a:b] if self.has_last else None,
                            loss_fn, b - a, None, scale=scale)
            if self.has_last:
                values[a:b] = [float(by_mb[i].item()) for i in range(b - a)]
        for s in self.stages:
            s.sync_gradients()
        if self.group.size() > 1:
            self.group.backend.broadcast(values, self.last_rank)
        return [float(v) for v in values]

    def gather_whole_model(self) -> None:
        """Every stage's current parameters into the whole model on every rank of the pipeline (each
        stage's broadcast from the rank that trains it), so ``trainer.module`` can be evaluated or
        saved whole. Collective over the pipeline group; training is unaffected (each rank steps
        only its own stage)."""
        if self.group.size() == 1:
            return
        backend = self.group.backend
        for s in range(self.pipe.num_stages):
            params = list(self.pipe[s].parameters())
            if not params:
                continue
            owner = self.stages[0].stage_index_to_group_rank[s]
            dtype = np.result_type(*[p.data.dtype for p in params])
            if self.group.rank() == owner:
                flat = np.concatenate([_backend.to_host(p.data).ravel().astype(dtype) for p in params])
            else:
                flat = np.empty(sum(p.data.size for p in params), dtype=dtype)
            backend.broadcast(flat, owner)
            at = 0
            for p in params:
                n = p.data.size
                if self.group.rank() != owner:
                    p.data[...] = _backend.to_device(flat[at:at + n].reshape(p.data.shape).astype(p.data.dtype),
                                                     _backend.device_of(p.data))
                at += n

    def parameters(self) -> list:
        """This rank's stage parameters (each once)."""
        return list(self.module.parameters())

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scale this rank's gradients so the norm over **every stage** is at most ``max_norm``
        (``min(1, max_norm / (norm + 1e-6))``, as ``clip_grad_norm_``); returns that norm, the same on
        every rank. Collective over the pipeline group (the dp replicas of a stage hold equal
        gradients after :meth:`run`, so they are not summed again)."""
        grads = [p.grad.data for p in self.parameters() if p.grad is not None]
        local = np.zeros(1, dtype=np.float64)
        for g in grads:
            f = _backend.to_host(g).ravel().astype(np.float64, copy=False)
            local[0] += float(np.vdot(f, f))
        if self.group.size() > 1:
            from neural_arch.distributed.comm.work import ReduceOp

            self.group.backend.allreduce(local, ReduceOp.SUM)
        total = math.sqrt(float(local[0]))
        coef = float(max_norm) / (total + 1e-6)
        if coef < 1.0:
            for g in grads:
                g *= coef
        return total

    def __repr__(self) -> str:
        return (f"PipelineWindow({self.schedule_name}, stages {[s.stage_index for s in self.stages]} of "
                f"{self.pipe.num_stages}, group ranks {self.group.ranks})")


def _as_array(value):
    """A micro-batch's inputs or targets as an array (a Tensor's data; lists through NumPy)."""
    if isinstance(value, Tensor):
        return value.data
    return value if _backend.is_array(value) else np.asarray(value)
