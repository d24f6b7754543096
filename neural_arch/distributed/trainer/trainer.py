"""``DistributedTrainer``: seed 003's trainer, composed from the project's parts.

Nothing here is a second implementation: the model is wrapped by
:class:`~neural_arch.distributed.DistributedDataParallel`,
:class:`~neural_arch.distributed.fsdp.FullyShardedDataParallel`, sharded in place by
:func:`~neural_arch.distributed.fsdp.fully_shard` (each block, then the root) or by a tensor-parallel
plan (``parallelize_gpt`` / ``parallelize_module``, with DDP over the ``dp`` dimension of a
``{"dp": a, "tp": b}`` mesh), cut into pipeline stages run by a schedule of
:mod:`neural_arch.distributed.pipelining` (``'pp'``, :mod:`.pipeline_window`), or trained with a
:class:`~neural_arch.distributed.optim.ZeroRedundancyOptimizer` (the strategy table:
:mod:`.strategies`); mixed precision is :class:`neural_arch.amp.autocast` (+ ``GradScaler`` /
``ShardedGradScaler`` for float16); activation checkpointing is
:func:`neural_arch.utils.checkpoint.apply_activation_checkpointing`; checkpoints are
:class:`~neural_arch.distributed.checkpoint.CheckpointManager` directories written through the
distributed checkpoint with shard-aware state dicts
(:func:`~neural_arch.distributed.checkpoint.state_dict.get_state_dict`), so an FSDP or ZeRO run
resumes exactly on another world size; timings are :class:`~neural_arch.distributed.metrics.DistributedMetrics`.

One :meth:`~DistributedTrainer.train_step` is one **micro-batch**. With
``gradient_accumulation_steps=K`` the loss is divided by ``K`` before backward, micro-batches
``step % K != K - 1`` skip the gradient synchronisation where the strategy can (DDP's
``no_sync()``, ``fully_shard``'s ``set_requires_gradient_sync(False)``), and the window's last
one clips, steps the optimizer (through the scaler when float16), zeroes the gradients and steps
the LR scheduler. ``K`` micro-batches of ``B`` samples
on ``W`` ranks then equal one single-process step on the ``K*W*B`` samples (tests: float64 <= 1e-10),
when the criterion is a mean over the batch. Micro-batches of unequal size (an epoch's last, token
batches with padding) weigh ``1/K`` each, as in torch's usual loop, unless ``count_items`` is given:
then each micro-batch's mean loss weighs its items over the window's items on every data-parallel
rank (Hugging Face's ``num_items_in_batch``), and the window again equals one mean over its union.

Example (seed 003; any world size, also plain ``python``)::

    trainer = DistributedTrainer(model, strategy="fsdp", gradient_accumulation_steps=4)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)   # re-pointed at trainer.model's shards
    for step, batch in enumerate(loader):
        metrics = trainer.train_step(batch, optimizer, F.cross_entropy, step)
    trainer.save_checkpoint(epoch=0, optimizer=optimizer, loss=metrics["loss"])
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import sys
import warnings
import weakref

import numpy as np

from neural_arch.core.tensor import Tensor
from neural_arch.distributed.trainer.strategies import resolve_strategy
from neural_arch.nn.module import Module
from neural_arch.optim.lr_scheduler import ReduceLROnPlateau
from neural_arch.optim.optimizer import Optimizer

__all__ = ["DistributedTrainer", "EnhancedDistributedTrainer"]

_AMP_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


class _ShardGradients:
    """What a GradScaler sees for ZeRO-2: the flat shards' gradients (``param_groups`` of the inner
    optimizer, where the reduce-scattered gradients live) and the full ZeRO step (step the shards,
    then all-gather the parameters)."""

    def __init__(self, zero):
        self.param_groups = zero.optim.param_groups
        self._zero = zero

    def step(self, *args, **kwargs):
        return self._zero.step(*args, **kwargs)


def _upcast(out):
    """Low-precision floating outputs as float32, for the criterion: autocast runs losses in
    float32 by patching ``neural_arch.nn.functional``'s names, which a criterion passed as a function
    object (``F.cross_entropy`` evaluated before the region) never sees."""
    if isinstance(out, Tensor):
        return out.astype(np.float32) if out.dtype.name in ("float16", "bfloat16") else out
    if isinstance(out, (tuple, list)):
        return type(out)(_upcast(o) for o in out)
    if isinstance(out, dict):
        return {k: _upcast(v) for k, v in out.items()}
    return out


def _with_last(iterable, snapshot=None):
    """``(item, is_last, state)`` triples: one item of lookahead, so an epoch's last batch is known.
    ``state`` is ``snapshot()`` taken right after the item arrived, before the lookahead pulls the
    next one (a loader's position counts what it yielded: taken later it would count one batch
    that has not been trained on); None without ``snapshot``."""
    it = iter(iterable)
    take = snapshot if snapshot is not None else (lambda: None)
    try:
        prev = next(it)
    except StopIteration:
        return
    prev_state = take()
    for item in it:
        yield prev, False, prev_state
        prev, prev_state = item, take()
    yield prev, True, prev_state


def _loader_state_fn(loader):
    """``loader.state_dict`` when the loader can resume mid-epoch (``DataLoader``, or anything with
    ``state_dict``/``load_state_dict``), else None."""
    if callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None)):
        return loader.state_dict
    return None


def _amp_dtype(mixed_precision, device: str):
    if mixed_precision is None or mixed_precision is False:
        return None
    if mixed_precision is True:
        return "float16" if device == "cuda" else "bfloat16"   # torch's defaults per device type
    name = getattr(mixed_precision, "name", mixed_precision)
    if isinstance(name, str) and name.lower() in _AMP_DTYPES:
        return _AMP_DTYPES[name.lower()]
    raise ValueError(f"DistributedTrainer: mixed_precision={mixed_precision!r}; use False, True (bfloat16 on "
                     "CPU, float16 on GPU), 'bf16' or 'fp16'")


def _default_checkpoint_targets(model) -> list:
    """Which submodules activation checkpointing wraps: transformer blocks when the model has
    them, else the model's direct children that own parameters."""
    from neural_arch.nn import TransformerBlock

    blocks = [m for _, m in model.named_modules() if isinstance(m, TransformerBlock)]
    if blocks:
        return blocks
    return [m for m in model.children() if any(True for _ in m.parameters())]


class DistributedTrainer:
    """Train ``model`` with one of the project's parallel strategies (see the module docstring).

    Args:
        model: an ``nn.Module`` (the same on every rank).
        strategy: ``'ddp'``, ``'zero1'``, ``'zero2'``, ``'fsdp'``, ``'fully_shard'``, ``'tp'``, ``'pp'``
            or a device-mesh dict ``{"dp": a}`` / ``{"dp": a, "tp": b}`` / ``{"dp": a, "pp": b}`` (see
            :mod:`.strategies`; anything else raises, listing the valid ones).
        mixed_precision: False, True (bfloat16 on CPU, float16 + a GradScaler on GPU), ``'bf16'``, ``'fp16'``.
            Autocast, except under ``'fully_shard'``: there a ``MixedPrecisionPolicy`` (parameters
            gathered and computed in that dtype, gradients reduced in float32, outputs float32).
        gradient_accumulation_steps: micro-batches per optimizer step.
        gradient_clip_val: clip the global gradient norm to this (None: no clipping; the norm is
            still reported as ``grad_norm``).
        enable_activation_checkpointing: recompute activations in backward (transformer blocks,
            else the model's direct children with parameters; see ``checkpoint_targets``).
        cpu_offload: FSDP's ``CPUOffload(offload_params=True)`` (strategy ``'fsdp'``), or
            ``CPUOffloadPolicy()`` (``'fully_shard'``); the identity on CPU-only runs.
        checkpoint_dir: where :meth:`save_checkpoint` writes ``step_<N>`` checkpoints (None: no checkpoints).
        log_dir: where :meth:`fit` logs through a :class:`~.monitor.DistributedMonitor` (rank 0).
        keep_last: checkpoints kept besides the best one.
        lr_scheduler: stepped once per optimizer step (may also be set later as ``trainer.lr_scheduler``).
        process_group: the data-parallel group (default: the world).
        auto_wrap_policy: FSDP units (default: one per ``TransformerBlock`` if any, else one unit);
            for ``'fully_shard'`` the modules sharded before the root (a set of classes or a
            predicate ``module -> bool``; default: the ``TransformerBlock`` s, else the model's
            direct children that own parameters).
        tp_plan: strategy ``'tp'`` / a ``"tp"`` mesh dimension: ``parallelize_module``'s
            ``{pattern: ParallelStyle}`` plan; not needed for an ``nn.GPT`` (``parallelize_gpt``
            with the logits gathered, so the criterion sees whole logits).
        checkpoint_targets: a predicate ``module -> bool`` overriding activation checkpointing's default.
        pp_schedule: strategy ``'pp'`` / a ``"pp"`` mesh dimension: ``"1f1b"`` (default), ``"gpipe"``,
            ``"interleaved"`` (two stages per rank; ``gradient_accumulation_steps`` a multiple of the
            pipeline ranks) or ``"zbh1"`` (zero bubble). The window's micro-batches are the schedule's.
        pp_split_points: where stages start (blocks of an ``nn.GPT``, children of an ``nn.Sequential``;
            ``pipeline(split_points=...)``); default: equal block counts (GPT), balanced parameters.
        count_items: how a micro-batch's loss is weighted in its window. None (default): ``1/K``
            each, torch's usual loop. ``"samples"`` (the inputs' first dimension) or a function
            ``batch -> int`` (e.g. the targets that are not padding: ``lambda b: int((b[1] !=
            -100).sum())``): the criterion's mean over a micro-batch's items weighs ``n / N``, ``N``
            the window's items summed over the data-parallel ranks (one small all-reduce per window,
            :meth:`window_items`), so a window of unequal micro-batches trains as one mean over all
            its items, as Hugging Face's ``num_items_in_batch`` with ``average_tokens_across_devices``.
            :meth:`fit` counts each window itself; a hand-written loop passes ``train_step(...,
            window_items=trainer.window_items(window))``. Not with strategy ``'pp'``.

    Data: each rank's loader must give it its share of the data-parallel dimension,
    ``trainer.dp_rank`` of ``trainer.dp_size`` (the world for every strategy but tensor and pipeline
    parallelism, where the ranks of one ``tp`` row or of one pipeline take the same batches), e.g.
    ``DistributedSampler(dataset, num_replicas=trainer.dp_size, rank=trainer.dp_rank)``;
    ``trainer.dp_group`` is that group (None: the world or ``process_group``).

    If no process group is initialised the trainer calls ``init_process_group()`` (a world of
    one under plain ``python``) and :meth:`close` destroys it again.

    Example::

        trainer = DistributedTrainer(model, strategy="ddp", gradient_accumulation_steps=2)
        optimizer = optim.Adam(trainer.model.parameters(), lr=1e-3)
        history = trainer.fit(loader, epochs=3, optimizer=optimizer, criterion=F.cross_entropy)
    """

    def __init__(self, model, strategy="ddp", mixed_precision=False, gradient_accumulation_steps: int = 1, *,
                 gradient_clip_val: float | None = None, enable_activation_checkpointing: bool = False,
                 cpu_offload: bool = False, checkpoint_dir=None, log_dir=None, keep_last: int | None = 3,
                 lr_scheduler=None, process_group=None, auto_wrap_policy=None, checkpoint_targets=None,
                 tp_plan=None, pp_schedule: str = "1f1b", pp_split_points=None, count_items=None):
        from neural_arch.distributed import groups as dist

        if not isinstance(model, Module):
            raise TypeError(f"DistributedTrainer(model): expected an nn.Module, got {type(model).__name__}")
        if isinstance(gradient_accumulation_steps, bool) or not isinstance(gradient_accumulation_steps, int) \
                or gradient_accumulation_steps < 1:
            raise ValueError(f"DistributedTrainer: gradient_accumulation_steps must be an int >= 1, "
                             f"got {gradient_accumulation_steps!r}")
        if gradient_clip_val is not None and not float(gradient_clip_val) > 0:
            raise ValueError(f"DistributedTrainer: gradient_clip_val must be > 0 or None, got {gradient_clip_val!r}")
        if count_items is not None and count_items != "samples" and not callable(count_items):
            raise ValueError(f"DistributedTrainer: count_items must be None, 'samples' or a function batch -> int "
                             f"(the items a micro-batch's mean loss is taken over), got {count_items!r}")
        self.count_items = count_items
        self._owns_process_group = not dist.is_initialized()
        if self._owns_process_group:
            dist.init_process_group()
        try:
            self._setup(model, strategy, mixed_precision, gradient_accumulation_steps, gradient_clip_val,
                        enable_activation_checkpointing, cpu_offload, checkpoint_dir, log_dir, keep_last,
                        lr_scheduler, process_group, auto_wrap_policy, checkpoint_targets, tp_plan,
                        pp_schedule, pp_split_points)
        except BaseException:
            self.monitor = None
            self.close()   # a group this constructor created must not outlive its error
            raise

    def _setup(self, model, strategy, mixed_precision, gradient_accumulation_steps, gradient_clip_val,
               enable_activation_checkpointing, cpu_offload, checkpoint_dir, log_dir, keep_last, lr_scheduler,
               process_group, auto_wrap_policy, checkpoint_targets, tp_plan=None, pp_schedule="1f1b",
               pp_split_points=None) -> None:
        from neural_arch.distributed.resolve import _resolve_group

        self.process_group = process_group
        self._group = _resolve_group(process_group, "DistributedTrainer")
        self.rank, self.world_size = self._group.rank(), self._group.size()
        self.strategy = resolve_strategy(strategy, self.world_size)
        if cpu_offload and self.strategy.name not in ("fsdp", "fully_shard"):
            raise ValueError(f"DistributedTrainer: cpu_offload=True offloads FSDP's parameter shards; it needs "
                             f"strategy='fsdp' or 'fully_shard', not {self.strategy.name!r}")
        if tp_plan is not None and self.strategy.name != "tp":
            raise ValueError(f"DistributedTrainer: tp_plan is a tensor-parallel plan; it needs strategy='tp' or a "
                             f"mesh with a 'tp' dimension, not {self.strategy.name!r}")
        if self.strategy.name in ("tp", "pp") and process_group is not None:
            raise ValueError(f"DistributedTrainer: strategy={self.strategy.name!r} builds its device mesh over the "
                             "whole world; leave process_group=None")
        if self.strategy.name != "pp" and (pp_split_points is not None or pp_schedule != "1f1b"):
            raise ValueError(f"DistributedTrainer: pp_schedule / pp_split_points configure pipeline parallelism; they "
                             f"need strategy='pp' or a mesh with a 'pp' dimension, not {self.strategy.name!r}")
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.gradient_clip_val = None if gradient_clip_val is None else float(gradient_clip_val)
        self.cpu_offload = bool(cpu_offload)
        self.module = model                       # the bare model (state-dict names)
        first = next(iter(model.parameters()), None)
        self.device = "cuda" if first is not None and getattr(first, "device", "cpu") not in (None, "cpu") and \
            str(first.device).startswith("cuda") else "cpu"
        self.amp_dtype = _amp_dtype(mixed_precision, self.device)
        self.mixed_precision = self.amp_dtype is not None
        if self.amp_dtype == "float16" and self.strategy.name == "pp":
            raise ValueError("DistributedTrainer(strategy='pp'): float16 needs a GradScaler whose inf/NaN check "
                             "spans every stage, which the pipeline strategy does not have yet; use "
                             "mixed_precision='bf16' (no scaler)")
        if self.mixed_precision and all(p.dtype == np.float64 for p in model.parameters()):
            warnings.warn("DistributedTrainer: mixed_precision has no effect on a float64 model (autocast leaves "
                          "float64 alone, as torch's does); build the model in float32", stacklevel=3)

        self.checkpointed_modules: list = []
        if enable_activation_checkpointing:
            from neural_arch.utils.checkpoint import checkpoint_wrapper

            targets = ([m for _, m in model.named_modules() if m is not model and checkpoint_targets(m)]
                       if checkpoint_targets is not None else _default_checkpoint_targets(model))
            for m in targets:   # before wrapping: FSDP's hooks then run again in the recomputation
                checkpoint_wrapper(m)
            self.checkpointed_modules = targets
        # the parameters before wrapping, by name: fully_shard and tensor parallelism replace them,
        # and an optimizer built over them is re-pointed at their replacements (weakly: no copies kept)
        originals = {name: p for name, p in model.named_parameters()}
        self.mp_policy = None
        self.device_mesh = None
        self.pipeline = None                      # strategy 'pp': this rank's PipelineWindow
        self._window: list = []                   # 'pp': the open window's (inputs, targets)
        self.model = self._wrap(model, auto_wrap_policy, tp_plan, pp_schedule, pp_split_points)
        self._replacements = {id(p): (weakref.ref(p), new) for name, new in model.named_parameters()
                              if (p := originals.get(name)) is not None and p is not new}
        del originals
        # the ranks that split the data: tensor-parallel ranks of one row must see the same batches
        self.dp_group = self.device_mesh.get_group("dp") if self.strategy.name in ("tp", "pp") else process_group
        dp = self._group if self.dp_group is None else self.dp_group
        self.dp_rank, self.dp_size = dp.rank(), dp.size()
        self._dp = dp
        if self.count_items is not None and self.strategy.name == "pp":
            raise ValueError("DistributedTrainer(count_items=...) weighs each micro-batch by its items, but the "
                             "pipeline schedule scales every micro-batch of a window alike; leave count_items=None "
                             "with strategy 'pp'")

        self.scaler = None
        if self.amp_dtype == "float16":
            if self.strategy.shards_gradients:
                from neural_arch.distributed.fsdp import ShardedGradScaler

                self.scaler = ShardedGradScaler(self.device, process_group=process_group)
            else:
                from neural_arch.amp import GradScaler

                self.scaler = GradScaler(self.device)   # DDP's gradients are equal on every rank
        self.lr_scheduler = lr_scheduler
        self.optimizer = None                     # the last optimizer given (resume uses it)
        self._effective: dict = {}                # id(user optimizer) -> (user optimizer, what steps)

        from neural_arch.distributed.metrics import DistributedMetrics

        self.metrics = DistributedMetrics(group=process_group)
        self.global_step = 0                      # optimizer steps (accumulation windows) done
        self.micro_step = 0                       # train_step calls done
        self.epoch = 0
        self.batch_in_epoch = 0                   # micro-batches of the current epoch done (fit)
        self._open_window = 0                     # micro-batches accumulated since the last step
        self.checkpoint_manager = None
        if checkpoint_dir is not None:
            from neural_arch.distributed.checkpoint import CheckpointManager

            self.checkpoint_manager = CheckpointManager(checkpoint_dir, keep_last=keep_last, best_metric="best",
                                                        mode="max", process_group=process_group)
        self.log_dir = log_dir
        self.monitor = None

    # ------------------------------------------------------------------ wrapping
    def _wrap(self, model, auto_wrap_policy, tp_plan=None, pp_schedule="1f1b", pp_split_points=None):
        name = self.strategy.name
        if name == "pp":
            return self._pipeline_parallel(model, pp_schedule, pp_split_points)
        if name == "fully_shard":
            return self._fully_shard(model, auto_wrap_policy)
        if name == "tp":
            return self._tensor_parallel(model, tp_plan)
        if name in ("ddp", "zero1"):
            from neural_arch.distributed.ddp.distributed_data_parallel import DistributedDataParallel

            return DistributedDataParallel(model, process_group=self.process_group)
        if name == "fsdp":
            from neural_arch.distributed.fsdp import CPUOffload, FullyShardedDataParallel
            from neural_arch.nn import TransformerBlock

            if auto_wrap_policy is None and any(isinstance(m, TransformerBlock) for m in model.modules()):
                auto_wrap_policy = {TransformerBlock}
            return FullyShardedDataParallel(model, process_group=self.process_group, auto_wrap_policy=auto_wrap_policy,
                                            cpu_offload=CPUOffload(offload_params=self.cpu_offload),
                                            sync_module_states=True)
        # zero2: the optimizer owns the gradient reduction; the replicas must start equal (as DDP's do)
        self._broadcast_initial(model)
        return model

    def _broadcast_initial(self, model) -> None:
        """Rank 0's parameters and buffers on every rank (fully_shard and the tensor-parallel styles
        cut each rank's piece from the values they find: those must be equal everywhere)."""
        from neural_arch.distributed.ddp.replicas import broadcast_arrays

        if self.world_size > 1:
            broadcast_arrays([p.data for p in model.parameters()], self._group.backend, root=0)
            broadcast_arrays([b.data for b in model.buffers() if b is not None], self._group.backend, root=0)

    def _fully_shard(self, model, auto_wrap_policy):
        """``fully_shard`` each block (bottom-up), then the root, on a 1-d mesh over the group."""
        from neural_arch.distributed.device_mesh import DeviceMesh, init_device_mesh
        from neural_arch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        self._broadcast_initial(model)
        if self.process_group is None:
            mesh = init_device_mesh(self.device, (self.world_size,))
        else:   # a mesh over the given group itself (no new group: the other ranks may not be here)
            mesh = DeviceMesh.from_group(self._group, self.device)
        self.device_mesh = mesh
        if self.amp_dtype is not None:
            import neural_arch as na

            low = getattr(na, self.amp_dtype)
            self.mp_policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=np.float32, output_dtype=np.float32)
        offload = CPUOffloadPolicy() if self.cpu_offload else None
        if auto_wrap_policy is None:
            targets = _default_checkpoint_targets(model)
        elif callable(auto_wrap_policy) and not isinstance(auto_wrap_policy, (set, frozenset, list, tuple, type)):
            targets = [m for _, m in model.named_modules() if m is not model and auto_wrap_policy(m)]
        else:
            classes = tuple(auto_wrap_policy) if not isinstance(auto_wrap_policy, type) else (auto_wrap_policy,)
            targets = [m for _, m in model.named_modules() if m is not model and isinstance(m, classes)]
        depth = {id(m): name.count(".") for name, m in model.named_modules()}
        for m in sorted(targets, key=lambda m: -depth[id(m)]):   # bottom-up: inner blocks first
            fully_shard(m, mesh=mesh, mp_policy=self.mp_policy, offload_policy=offload)
        fully_shard(model, mesh=mesh, mp_policy=self.mp_policy, offload_policy=offload)
        return model

    def _tensor_parallel(self, model, tp_plan):
        """The tensor-parallel plan over each ``tp`` row of a ``(dp, tp)`` mesh; DDP over ``dp``."""
        from neural_arch.distributed.device_mesh import init_device_mesh
        from neural_arch.nn import GPT

        sizes = dict(self.strategy.mesh)
        dp = int(sizes.get("dp", 1))
        tp = int(sizes.get("tp") or self.world_size // dp)
        if tp_plan is None and not isinstance(model, GPT):
            raise ValueError(f"DistributedTrainer(strategy={self.strategy.name!r}): tensor parallelism needs a "
                             f"plan for {type(model).__name__}: pass tp_plan={{'pattern': ColwiseParallel() | "
                             "RowwiseParallel(), ...}} (parallelize_module's plan, from "
                             "neural_arch.distributed.tensor.parallel); nn.GPT has one built in (parallelize_gpt)")
        self._broadcast_initial(model)
        mesh = init_device_mesh(self.device, (dp, tp), mesh_dim_names=("dp", "tp"))
        self.device_mesh = mesh
        if tp_plan is not None:
            from neural_arch.distributed.tensor.parallel import parallelize_module

            parallelize_module(model, mesh["tp"], tp_plan)
        else:
            from neural_arch.distributed.tensor.parallel.gpt import parallelize_gpt

            # the logits gathered: the user's criterion (F.cross_entropy) sees whole rows
            parallelize_gpt(model, mesh["tp"], loss_parallel=False)
        if dp > 1:
            from neural_arch.distributed.ddp.distributed_data_parallel import DistributedDataParallel

            return DistributedDataParallel(model, process_group=mesh.get_group("dp"))
        return model

    def _pipeline_parallel(self, model, pp_schedule, pp_split_points):
        """This rank's stage(s) of a ``(pp, dp)`` mesh (``pp`` outermost, as torchtitan's); the
        model itself stays whole on every rank (``trainer.module``), its stages share its parameters."""
        from neural_arch.distributed.device_mesh import init_device_mesh
        from neural_arch.distributed.trainer.pipeline_window import PipelineWindow

        sizes = dict(self.strategy.mesh)
        dp = int(sizes.get("dp", 1))
        pp = int(sizes.get("pp") or self.world_size // dp)
        mesh = init_device_mesh(self.device, (pp, dp), mesh_dim_names=("pp", "dp"))
        self.device_mesh = mesh
        self.pipeline = PipelineWindow(model, mesh.get_group("pp"), dp_group=mesh.get_group("dp") if dp > 1 else None,
                                       schedule=pp_schedule, split_points=pp_split_points)
        return self.pipeline.module

    # ------------------------------------------------------------------ the optimizer
    def _resolve_optimizer(self, optimizer):
        """The optimizer that actually steps for the user's ``optimizer`` (made once per optimizer)."""
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"DistributedTrainer: optimizer must be an Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        hit = self._effective.get(id(optimizer))
        if hit is not None and hit[0] is optimizer:
            return hit[1]
        eff = self._make_effective(optimizer)
        self._effective[id(optimizer)] = (optimizer, eff)
        return eff

    def _make_effective(self, optimizer):
        from neural_arch.distributed.optim import ZeroRedundancyOptimizer

        mine = [p for g in optimizer.param_groups for p in g["params"]]
        model_ids = {id(p) for p in self.model.parameters()}
        orig_ids = {id(p) for p in self.module.parameters()}
        stage = self.strategy.zero_stage
        if stage:
            if isinstance(optimizer, ZeroRedundancyOptimizer):
                if optimizer.stage != stage:
                    raise ValueError(f"DistributedTrainer(strategy={self.strategy.name!r}): the optimizer is a "
                                     f"ZeroRedundancyOptimizer of stage {optimizer.stage}; build it with stage={stage} "
                                     "or pass a plain optimizer (the trainer shards it)")
                return optimizer
            if not all(id(p) in orig_ids for p in mine):
                raise ValueError("DistributedTrainer: the optimizer holds parameters that are not the model's; "
                                 "build it over model.parameters()")
            if len(optimizer.state):
                raise ValueError(f"DistributedTrainer(strategy={self.strategy.name!r}): the optimizer already has "
                                 "state, which ZeRO would have to shard; give a fresh optimizer built over "
                                 "model.parameters() (or a ZeroRedundancyOptimizer) before its first step")
            groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": list(g["params"])}
                      for g in optimizer.param_groups]
            # the user's optimizer stays the face (its param_groups feed the LR scheduler): its
            # hyper-parameters are copied into the sharded one before every step (_sync_hyper)
            return ZeroRedundancyOptimizer(groups, type(optimizer), process_group=self.process_group, stage=stage,
                                           **optimizer.defaults)
        if all(id(p) in model_ids for p in mine):
            return optimizer
        if self.pipeline is not None and all(id(p) in orig_ids for p in mine):
            if len(optimizer.state):
                raise ValueError("DistributedTrainer(strategy='pp'): the optimizer was built over the whole model and "
                                 "already has state; build it over trainer.model.parameters() (this rank's stage)")
            # re-point in place at this rank's stage: the other stages' parameters step on their ranks
            for g in optimizer.param_groups:
                g["params"] = [p for p in g["params"] if id(p) in model_ids]
            return optimizer
        if self._replacements and all(id(p) in model_ids or self._replaced(p) is not None for p in mine):
            if len(optimizer.state):
                raise ValueError(f"DistributedTrainer(strategy={self.strategy.name!r}): the optimizer was built over "
                                 "the model's parameters before they were sharded and already has state; build it "
                                 "over trainer.model.parameters()")
            # re-point in place: the user's object (and a scheduler holding it) stays valid
            for g in optimizer.param_groups:
                g["params"] = [p if id(p) in model_ids else self._replaced(p) for p in g["params"]]
            return optimizer
        if self.strategy.name == "fsdp" and all(id(p) in orig_ids for p in mine):
            if len(optimizer.state) or len(optimizer.param_groups) != 1:
                raise ValueError("DistributedTrainer(strategy='fsdp'): the optimizer was built over the original "
                                 "model's parameters and has state or several param groups, so it cannot be "
                                 "re-pointed at the flat shards; build it over trainer.model.parameters()")
            # re-point in place: the user's object (and a scheduler holding it) stays valid
            optimizer.param_groups[0]["params"] = list(self.model.parameters())
            return optimizer
        raise ValueError(f"DistributedTrainer(strategy={self.strategy.name!r}): the optimizer holds parameters "
                         "that are not the model's; build it over trainer.model.parameters()")

    def _replaced(self, p):
        """What sharding put in place of the original parameter ``p`` (None: ``p`` was not replaced)."""
        hit = self._replacements.get(id(p))
        return hit[1] if hit is not None and hit[0]() is p else None

    @staticmethod
    def _sync_hyper(optimizer, eff) -> None:
        """Copy the user's hyper-parameters (an LR schedule) into the ZeRO optimizer (whose step passes
        them on to its inner optimizer)."""
        if eff is optimizer:
            return
        for user, zero in zip(optimizer.param_groups, eff.param_groups):
            zero.update({k: v for k, v in user.items() if k != "params"})

    # ------------------------------------------------------------------ one micro-batch
    def _no_sync(self):
        if self.strategy.skips_sync_while_accumulating and self.world_size > 1:
            if self.strategy.name == "fully_shard":
                return self._gradient_sync_off()
            return self.model.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _gradient_sync_off(self):
        """FSDP2's accumulation: unsharded gradients add up locally; the next synced backward
        reduce-scatters their sum."""
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def _autocast(self):
        if self.amp_dtype is None or self.mp_policy is not None:   # fully_shard casts by its policy
            return contextlib.nullcontext()
        import neural_arch as na
        from neural_arch.amp import autocast

        return autocast(self.device, dtype=getattr(na, self.amp_dtype))

    @staticmethod
    def _split_batch(batch):
        if isinstance(batch, dict):
            keys = ("input", "inputs", "x")
            x = next((batch[k] for k in keys if k in batch), None)
            y = next((batch[k] for k in ("target", "targets", "labels", "y") if k in batch), None)
            if x is None or y is None:
                raise ValueError(f"DistributedTrainer.train_step: a dict batch needs an input key {keys} and a "
                                 f"target key ('target', 'targets', 'labels', 'y'); got {sorted(batch)}")
            return x, y
        if isinstance(batch, (tuple, list)) and len(batch) == 2:
            return batch[0], batch[1]
        raise ValueError("DistributedTrainer.train_step: batch must be (inputs, targets) or a dict with input and "
                         f"target keys, got {type(batch).__name__}")

    def train_step(self, batch, optimizer, criterion, step: int | None = None, *,
                   end_window: bool | None = None, window_items=None) -> dict:
        """Run one micro-batch; at an accumulation window's end also clip, step, zero and schedule.

        ``step`` is the micro-batch's index (the seed's ``enumerate(loader)``): the window ends
        when ``(step + 1) % gradient_accumulation_steps == 0``. None: the trainer counts, and the
        window ends at the ``K``-th micro-batch since the last optimizer step (so a window that
        ``end_window`` closed early does not shorten the next one).
        ``end_window=True`` ends the window here anyway (the last batch of an epoch: :meth:`fit`
        does this, so no partial window leaks into the next epoch; its micro-batches keep their
        ``1/K`` weight, as torch's usual loop and Accelerate do).
        ``window_items``: with ``count_items`` (required then), the items of this micro-batch's whole
        window summed over the data-parallel ranks (:meth:`window_items`); the loss then weighs
        ``count_items(batch) * dp_size / window_items`` instead of ``1/K``.

        Returns ``{"loss", "compute_time", "communication_time", "step", "lr", "grad_norm",
        "skipped", "accumulating"}``: ``loss`` as the criterion computed it (not divided by the
        accumulation steps); ``communication_time`` the seconds collectives ran during this call
        and ``compute_time`` the rest of its wall time (both from
        :class:`~neural_arch.distributed.metrics.DistributedMetrics`);
        ``step`` the optimizer steps done; ``grad_norm`` the global gradient norm before
        clipping (None while accumulating); ``skipped``: the GradScaler skipped the step (inf/NaN).

        Strategy ``'pp'``: the window's micro-batches are the pipeline schedule's, so a micro-batch
        before the window's last one is only buffered: its loss is not known yet, ``loss`` is NaN
        and ``losses`` is ``[]``. The window's last call runs the schedule over all of them and
        returns ``losses``, every micro-batch's loss of the window in order (as the criterion
        computed it, broadcast from the last stage: the same on every rank of the pipeline), with
        ``loss`` the last one (:meth:`fit` averages ``losses``).
        """
        eff = self._resolve_optimizer(optimizer)
        k = self.gradient_accumulation_steps
        if end_window is not None:
            last = bool(end_window)
        elif step is None:   # the trainer counts: K micro-batches since the last optimizer step
            last = self._open_window + 1 >= k
        else:
            last = (int(step) + 1) % k == 0
        weight = self._item_weight(batch, window_items)
        x, y = self._split_batch(batch)
        if self.pipeline is not None:
            return self._pipeline_step(x, y, optimizer, eff, criterion, last)
        if not isinstance(x, Tensor):
            x = Tensor(np.asarray(x))
        out = {"grad_norm": None, "skipped": False}
        with self.metrics.step(samples=int(x.shape[0]) if x.ndim else 1):
            with (contextlib.nullcontext() if last else self._no_sync()):
                with self._autocast():
                    output = _upcast(self.model(x))
                    loss = criterion(output, y)
                if weight is None:
                    scaled = loss / k if k > 1 else loss
                elif weight > 0:
                    scaled = loss * weight
                else:
                    # no items here (the criterion's mean over none is 0/0): zero gradients through the
                    # same graph, so the window's gradient hooks (DDP's buckets, FSDP's reduce) run as
                    # on every other rank, with no collective of its own (a sharded parameter's sum has one)
                    scaled = (output * 0.0).sum() if isinstance(output, Tensor) else loss * 0.0
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
            self._open_window += 1
            if last:
                out.update(self._optimizer_step(optimizer, eff))
        rec = self.metrics.steps[-1] if self.metrics.steps else {}
        self.micro_step += 1
        self.batch_in_epoch += 1
        return self._metrics(out, float(loss.item()), rec, optimizer, last)

    def _count(self, batch) -> int:
        """``count_items(batch)``: this micro-batch's items (samples, or tokens that are not padding)."""
        if self.count_items == "samples":
            x = self._split_batch(batch)[0]
            return int(np.shape(x)[0]) if np.ndim(x) else 1
        n = self.count_items(batch)
        value = float(n.item() if hasattr(n, "item") else n)
        if value < 0 or value != int(value):
            raise ValueError(f"DistributedTrainer: count_items(batch) must be a count (an int >= 0), got {n!r}")
        return int(value)

    def window_items(self, batches) -> int:
        """The items of an accumulation window (``count_items`` of each of this rank's ``batches``),
        summed over the data-parallel ranks: ``train_step``'s ``window_items``. A collective over the
        data-parallel group (every rank calls it once per window).

        Example::

            window = [next(it) for _ in range(trainer.gradient_accumulation_steps)]
            n = trainer.window_items(window)
            for batch in window:
                trainer.train_step(batch, optimizer, criterion, window_items=n)
        """
        if self.count_items is None:
            raise ValueError("DistributedTrainer.window_items: the trainer counts no items (count_items=None: each "
                             "micro-batch weighs 1/K); pass count_items='samples' or a function to the trainer")
        total = np.array([float(sum(self._count(b) for b in batches))])
        if self.dp_size > 1:
            self._dp.backend.allreduce(total)      # SUM: every data-parallel rank's window
        return int(total[0])

    def _item_weight(self, batch, window_items):
        """This micro-batch's loss weight under ``count_items``, None under the ``1/K`` rule."""
        if self.count_items is None:
            if window_items is not None:
                raise ValueError("DistributedTrainer.train_step: window_items= weighs micro-batches by their items, "
                                 "which needs DistributedTrainer(count_items=...); the trainer counts none")
            return None
        if window_items is None:
            raise ValueError("DistributedTrainer(count_items=...) weighs each micro-batch by its share of its "
                             "window's items: pass train_step(..., window_items=trainer.window_items(window)) "
                             "(the window's items summed over the data-parallel ranks; fit() does this)")
        total = float(window_items)
        n = self._count(batch)
        if n > total:
            raise ValueError(f"DistributedTrainer.train_step: window_items={window_items!r} is fewer than this "
                             f"micro-batch's {n} items; it must count the whole window on every "
                             "data-parallel rank")
        return 0.0 if n == 0 else n * self.dp_size / total

    def _windows(self, triples):
        """``fit``'s batches with ``count_items``: each accumulation window read whole first (to count
        its items, :meth:`window_items`), then yielded ``(batch, is_last, state, window_items)``."""
        k = self.gradient_accumulation_steps
        index, window = self.batch_in_epoch, []
        for triple in triples:
            window.append(triple)
            if (index + 1) % k == 0 or triple[1]:
                n = self.window_items([t[0] for t in window])
                for item in window:
                    yield (*item, n)
                window = []
            index += 1

    def _pipeline_step(self, x, y, optimizer, eff, criterion, last: bool) -> dict:
        """Strategy 'pp': buffer the micro-batch; at the window's end run the schedule over the
        window, then clip and step (see :meth:`train_step`)."""
        from neural_arch.distributed.trainer.pipeline_window import _as_array

        x, y = _as_array(x), _as_array(y)
        out = {"grad_norm": None, "skipped": False, "losses": []}
        with self.metrics.step(samples=int(x.shape[0]) if x.ndim else 1):
            self._window.append((x, y))
            self._open_window += 1
            if last:
                inputs, targets = [a for a, _ in self._window], [b for _, b in self._window]
                self._window = []

                def loss_fn(output, target):
                    return criterion(_upcast(output), target)

                try:
                    with self._autocast():
                        out["losses"] = self.pipeline.run(inputs, targets, loss_fn,
                                                          scale=1.0 / self.gradient_accumulation_steps)
                except BaseException:
                    self._open_window = 0
                    raise
                out.update(self._optimizer_step(optimizer, eff))
        rec = self.metrics.steps[-1] if self.metrics.steps else {}
        self.micro_step += 1
        self.batch_in_epoch += 1
        return self._metrics(out, out["losses"][-1] if out["losses"] else math.nan, rec, optimizer, last)

    def _metrics(self, out: dict, loss: float, rec: dict, optimizer, last: bool) -> dict:
        """The seed's metrics dict of one train_step: ``out`` (grad_norm, skipped, ...) plus the loss,
        the step's compute and communication time from ``rec`` (DistributedMetrics), step and lr."""
        out.update({
            "loss": loss,
            "compute_time": float(rec.get("step_time_s", 0.0) - rec.get("exposed_comm_s", 0.0)),
            "communication_time": float(rec.get("comm_time_s", 0.0)),
            "step": self.global_step,
            "lr": float(optimizer.param_groups[0]["lr"]),
            "accumulating": not last,
        })
        return out

    def _clip(self, eff) -> float:
        limit = self.gradient_clip_val if self.gradient_clip_val is not None else math.inf
        if self.pipeline is not None:
            return self.pipeline.clip_grad_norm_(limit)
        if self.strategy.zero_stage:
            return float(eff.clip_grad_norm_(limit))
        if self.strategy.name == "fsdp":
            return float(self.model.clip_grad_norm_(limit))
        # fully_shard's and tensor parallel's DTensor parameters: clip_grad_norm_ sums each piece's
        # part over the groups it is sharded on (the global norm, as torch's on DTensors)
        from neural_arch.optim.clip import clip_grad_norm_

        return float(clip_grad_norm_(list(self.model.parameters()), limit))

    def _optimizer_step(self, optimizer, eff) -> dict:
        if isinstance(self.lr_scheduler, ReduceLROnPlateau):   # before the step: nothing half done
            raise TypeError("DistributedTrainer: lr_scheduler is stepped once per optimizer step without a metric, "
                             "but ReduceLROnPlateau.step needs one (a validation loss); leave "
                             "trainer.lr_scheduler=None and call scheduler.step(val_loss) yourself after evaluating")
        self._sync_hyper(optimizer, eff)
        skipped = False
        if self.scaler is not None:
            holder = _ShardGradients(eff) if self.strategy.zero_stage == 2 else eff
            before = self.scaler.get_scale()
            self.scaler.unscale_(holder)
            norm = self._clip(eff)
            self.scaler.step(holder)
            self.scaler.update()
            skipped = self.scaler.get_scale() < before   # backed off: inf/NaN somewhere, no step
        else:
            norm = self._clip(eff)
            eff.step()
        eff.zero_grad()
        if eff is not optimizer:
            optimizer.zero_grad()
        if self.lr_scheduler is not None and not skipped:
            self.lr_scheduler.step()
        self.global_step += 1
        self._open_window = 0
        return {"grad_norm": norm, "skipped": skipped}

    # ------------------------------------------------------------------ metrics
    def get_performance_metrics(self) -> dict:
        """Seed 003's numbers from this rank's
        :class:`~neural_arch.distributed.metrics.DistributedMetrics` (no collective).

        ``samples_per_second_per_gpu`` is **this rank's** throughput (on CPU a rank is a process,
        not a GPU); ``communication_overhead_percent`` is the exposed (not overlapped)
        communication time over the step time. Also ``step_time_s``, ``communication_time_s``,
        ``steps`` (micro-batches timed), ``optimizer_steps`` and ``world_size``.
        """
        s = self.metrics.summary()
        return {
            "samples_per_second_per_gpu": float(s.get("samples_per_s", 0.0)),
            "communication_overhead_percent": float(s.get("comm_overhead_pct", 0.0)),
            "step_time_s": float(s.get("step_time_s", 0.0)),
            "communication_time_s": float(s.get("comm_time_s", 0.0)),
            "steps": int(s.get("steps", 0)),
            "optimizer_steps": self.global_step,
            "world_size": self.world_size,
            "device": self.device,
        }

    # ------------------------------------------------------------------ checkpoints
    def _manager(self):
        if self.checkpoint_manager is None:
            raise ValueError("DistributedTrainer: no checkpoint_dir was given; pass checkpoint_dir=... to the trainer")
        return self.checkpoint_manager

    def _state_targets(self, optimizer):
        from neural_arch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if optimizer is None:
            return get_model_state_dict(self.model), None, None
        eff = self._resolve_optimizer(optimizer)
        msd, osd = get_state_dict(self.model, eff)
        return msd, osd, eff

    def _all_stages_names(self, osd: dict) -> None:
        """Strategy 'pp': each optimizer group's parameter names over every stage (in the model's
        order), so every rank saves the same groups and one process (or any layout) resumes them."""
        order = {name: i for i, (name, _) in enumerate(self.module.named_parameters())}
        every = self._group.backend.allgather_object([list(g["params"]) for g in osd["param_groups"]])
        for i, g in enumerate(osd["param_groups"]):
            names = {n for groups in every for n in groups[i]}
            g["params"] = sorted(names, key=lambda n: order.get(n, len(order)))

    def save_checkpoint(self, epoch: int, optimizer, loss: float, is_best: bool = False, data_state=None) -> str:
        """Save model, optimizer, scaler, scheduler, counters, every rank's RNG state and the data
        position as checkpoint ``step_<global_step>`` (collective; atomic; the last ``keep_last``
        are kept, and the newest one saved with ``is_best=True`` besides). Returns its path.

        ``loss`` may differ between ranks (each its own micro-batch's): the mean over the ranks is
        saved; ``is_best`` is rank 0's.

        ``data_state``: e.g. an ``ElasticDistributedSampler.state_dict()`` to resume mid-epoch on
        any world size (saved as given; must be equal on every rank).
        """
        from neural_arch.core import rng

        if self._open_window:
            warnings.warn(f"DistributedTrainer.save_checkpoint: {self._open_window} micro-batch(es) of an open "
                          "accumulation window are not saved (their gradients are lost on resume); save at a "
                          "window's end", stacklevel=2)
        msd, osd, _ = self._state_targets(optimizer)
        if osd is not None and self.pipeline is not None:
            self._all_stages_names(osd)
        gathered = self._group.backend.allgather_object(
            (rng.get_generator().bit_generator.state, float(loss), bool(is_best)))
        rng_states = [g[0] for g in gathered]
        # each rank passes its own micro-batch's loss: the checkpoint keeps their mean (the step's loss),
        # and rank 0 decides is_best, so every rank saves the same metadata
        loss = sum(g[1] for g in gathered) / len(gathered)
        is_best = gathered[0][2]
        meta = {
            "epoch": int(epoch), "global_step": self.global_step, "micro_step": self.micro_step,
            "batch_in_epoch": self.batch_in_epoch, "loss": float(loss), "world_size": self.world_size,
            "strategy": self.strategy.name, "rng": rng_states, "data": data_state,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
        }
        state = {"model": msd, "trainer": json.dumps(meta)}
        if osd is not None:
            state["optim"] = osd
        metrics = {"loss": float(loss)}
        if is_best:
            metrics["best"] = float(self.global_step)   # mode="max": the newest best wins
        mgr = self._manager()
        mgr.save(state, step=self.global_step, metrics=metrics)
        return mgr.path(self.global_step)

    def load_checkpoint(self, path="latest", optimizer=None) -> dict | None:
        """Restore a checkpoint (``"latest"`` in ``checkpoint_dir``, ``"best"``, or a path) saved on
        any world size and strategy. Restores the model, the optimizer (``optimizer``, else the
        last one given to :meth:`train_step`), the scaler, the scheduler, the counters, this rank's
        RNG state (rank ``r`` takes saved rank ``r % saved_world``) and the data position.
        Returns the saved trainer metadata (``epoch``, ``global_step``, ``batch_in_epoch``, ``loss``,
        ``data``...), or None when ``"latest"`` finds no checkpoint. Collective."""
        from neural_arch.core import rng
        from neural_arch.distributed import checkpoint as dcp
        from neural_arch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if path in ("latest", "best"):
            mgr = self._manager()
            found = mgr.latest() if path == "latest" else mgr.best()
            if found is None:
                return None
            path = found[1]
        optimizer = optimizer if optimizer is not None else self.optimizer
        msd, osd, eff = self._state_targets(optimizer)
        state = {"model": msd, "trainer": ""}
        if osd is not None:
            state["optim"] = osd
            mine = [list(g["params"]) for g in osd["param_groups"]]
        dcp.load(state, checkpoint_id=path)
        if eff is not None and self.pipeline is not None:
            # a checkpoint names every stage's parameters in its groups (any layout's does): keep this
            # rank's, in this optimizer's order
            groups = state["optim"]["param_groups"]
            if len(groups) == len(mine):
                for g, names in zip(groups, mine):
                    if set(names) <= set(g["params"]):
                        g["params"] = names
        if eff is not None:
            set_state_dict(self.model, eff, model_state_dict=state["model"], optim_state_dict=state["optim"])
            if eff is not optimizer:   # ZeRO: the user's optimizer is the face the scheduler edits
                for user, zero in zip(optimizer.param_groups, eff.param_groups):
                    user.update({k: v for k, v in zero.items() if k != "params"})
        else:
            set_model_state_dict(self.model, state["model"])
        meta = json.loads(state["trainer"])
        self.global_step, self.micro_step = int(meta["global_step"]), int(meta["micro_step"])
        self.epoch, self.batch_in_epoch = int(meta["epoch"]), int(meta["batch_in_epoch"])
        self._open_window = 0
        states = meta["rng"]
        rng.get_generator().bit_generator.state = states[self.rank % len(states)]
        if self.scaler is not None and meta.get("scaler"):
            self.scaler.load_state_dict(meta["scaler"])
        if self.lr_scheduler is not None and meta.get("scheduler") is not None:
            self.lr_scheduler.load_state_dict(meta["scheduler"])
        if eff is not None and eff is not optimizer:
            self._sync_hyper(optimizer, eff)
        meta["path"] = path
        return meta

    def resume(self, optimizer=None) -> dict | None:
        """``load_checkpoint("latest")``: the saved metadata, or None when there is nothing to resume."""
        return self.load_checkpoint("latest", optimizer=optimizer)

    # ------------------------------------------------------------------ a whole run
    def fit(self, train_loader, epochs: int, eval_loader=None, *, optimizer=None, criterion=None,
            eval_metric=("loss",), checkpoint_every_epoch: bool = True, progress: bool = True,
            resume=True, checkpoint_every_n_steps: int | None = None) -> dict:
        """Train ``epochs`` epochs over ``train_loader`` (an iterable of ``(inputs, targets)``
        batches; its ``sampler.set_epoch(epoch)`` is called when it has one), evaluate on
        ``eval_loader`` (``(inputs, targets)`` arrays or a dataset, through
        :func:`~neural_arch.distributed.data.sampler.distributed_evaluate`) after each epoch,
        save a checkpoint per epoch when ``checkpoint_dir`` was given (the best by eval loss, else
        train loss), and resume from the latest one first. Rank 0 shows a progress bar (tqdm when
        installed) and prints a summary. Returns ``{"history": [...], "performance": {...}}``.

        ``resume``: True resumes from the latest checkpoint of ``checkpoint_dir`` (if any), a path
        from that checkpoint, False starts afresh. A checkpoint taken at an epoch's end resumes
        at the next epoch (the seed's ``save_checkpoint(epoch, ...)`` after each epoch); one saved
        mid-epoch with ``data_state={"epoch_complete": False}`` resumes that epoch, skipping its
        batches already done (same loader order, e.g. a seeded ``DistributedSampler``).

        The loader's data state goes into every checkpoint ``fit`` saves: when ``train_loader`` has
        ``state_dict``/``load_state_dict`` (a :class:`~neural_arch.data.DataLoader`, whose state holds
        its ``DistributedSampler``'s), ``data_state`` is ``{"epoch_complete": ..., "loader":
        train_loader.state_dict()}`` as of the last batch trained on (at an epoch's end also
        ``"next_epoch_loader"``, its state between epochs, which a resume loads so that a shuffling
        loader's next epoch has the uninterrupted run's order). ``checkpoint_every_n_steps=N``
        also saves one every N optimizer steps within an epoch (at a window's end); a run stopped
        after one resumes that epoch through ``train_loader.load_state_dict``, so every sample of it is
        trained on exactly once, also on another world size (the sampler re-partitions the rest).

        Example (a resumable run: kill it at any time, start it again with the same command)::

            loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
            trainer = DistributedTrainer(model, "fsdp", checkpoint_dir="ckpt")
            trainer.fit(loader, epochs=10, optimizer=optimizer, criterion=F.cross_entropy,
                        checkpoint_every_n_steps=100)
        """
        from neural_arch.distributed.data.sampler import distributed_evaluate

        optimizer = optimizer if optimizer is not None else self.optimizer
        if optimizer is None or criterion is None:
            raise ValueError("DistributedTrainer.fit: pass optimizer=... and criterion=... (e.g. "
                             "optim.Adam(model.parameters()), F.cross_entropy)")
        if self.log_dir is not None and self.monitor is None:
            from neural_arch.distributed.trainer.monitor import DistributedMonitor

            self.monitor = DistributedMonitor(self.log_dir, rank=self.rank)
        if checkpoint_every_n_steps is not None and int(checkpoint_every_n_steps) < 1:
            raise ValueError(f"DistributedTrainer.fit: checkpoint_every_n_steps must be >= 1 or None, got "
                             f"{checkpoint_every_n_steps!r}")
        every = int(checkpoint_every_n_steps) if checkpoint_every_n_steps is not None else None
        loader_state = _loader_state_fn(train_loader)
        start_epoch, skip = 0, 0
        restored_loader = False
        meta = None
        if resume is not False and resume is not None:
            if resume is True:
                meta = self.resume(optimizer) if self.checkpoint_manager is not None else None
            else:
                meta = self.load_checkpoint(resume, optimizer=optimizer)
            if meta is not None:
                done = meta["data"] is None or meta["data"].get("epoch_complete", True)
                start_epoch = meta["epoch"] + 1 if done else meta["epoch"]
                skip = 0 if done else meta["batch_in_epoch"]
                saved_loader = None if done else meta["data"].get("loader")
                if saved_loader is not None and loader_state is not None:
                    # the loader resumes itself (on any world size); no batches to skip here
                    train_loader.load_state_dict(saved_loader)
                    restored_loader = True
                elif done and loader_state is not None and (meta["data"] or {}).get("next_epoch_loader") is not None:
                    # a fresh loader would shuffle the next epoch as its first one (DataLoader(shuffle=True)
                    # draws each epoch's order from its own generator): continue from where it stood
                    train_loader.load_state_dict(meta["data"]["next_epoch_loader"])
        history, best = [], math.inf
        found = self.checkpoint_manager.best() if self.checkpoint_manager is not None else None
        if found is not None:   # a resumed run keeps the earlier best: it must beat that one
            best = float(found[2].get("loss", math.inf))
        for epoch in range(start_epoch, int(epochs)):
            self.epoch = epoch
            sampler = getattr(train_loader, "sampler", None)
            self.batch_in_epoch = skip
            if restored_loader:   # set_epoch would restart the epoch the loader's state resumes
                restored_loader = False
                batches = _with_last(iter(train_loader), loader_state)
                total = skip + len(train_loader) if hasattr(train_loader, "__len__") else None
            else:
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch)
                batches = _with_last(itertools.islice(iter(train_loader), skip, None), loader_state)
                total = len(train_loader) if hasattr(train_loader, "__len__") else None
            skip = 0
            bar = self._progress(batches, epoch, total, progress)
            losses = []
            data_state = None
            counted = (self._windows(bar) if self.count_items is not None
                       else ((*triple, None) for triple in bar))
            for batch, is_last, data_state, window_items in counted:
                index = self.batch_in_epoch
                steps_before = self.global_step
                m = self.train_step(batch, optimizer, criterion, index,
                                    end_window=True if is_last else None, window_items=window_items)
                if "losses" in m:   # 'pp': a window's losses arrive at its end
                    losses.extend(m["losses"])
                else:
                    losses.append(m["loss"])
                if (every is not None and not is_last and self.checkpoint_manager is not None
                        and self.global_step != steps_before and self.global_step % every == 0):
                    self.save_checkpoint(epoch, optimizer, m["loss"], is_best=False,
                                         data_state=self._data_state(False, data_state))
                if self.monitor is not None and not math.isnan(m["loss"]):
                    x = self._split_batch(batch)[0]
                    self.monitor.log_training_step(m["loss"], int(np.shape(x)[0]) if np.ndim(x) else 1,
                                                   m["compute_time"] + m["communication_time"],
                                                   m["communication_time"], step=self.micro_step)
                if hasattr(bar, "set_postfix") and not math.isnan(m["loss"]):
                    bar.set_postfix(loss=f"{m['loss']:.4f}", step=m["step"], refresh=False)
            record = {"epoch": epoch, "train_loss": float(np.mean(losses)) if losses else math.nan,
                      "optimizer_steps": self.global_step}
            if eval_loader is not None:
                model = self.model
                if self.pipeline is not None:   # every stage's parameters into the whole model, evaluated whole
                    self.pipeline.gather_whole_model()
                    model = self.module
                metric = list(eval_metric) if isinstance(eval_metric, (list, tuple)) else [eval_metric]
                record.update({f"eval_{k}": v for k, v in
                               distributed_evaluate(model, eval_loader, metric, group=self.dp_group).items()})
            history.append(record)
            score = record.get("eval_loss", record["train_loss"])
            if self.checkpoint_manager is not None and checkpoint_every_epoch:
                state = self._data_state(True, data_state)
                if loader_state is not None:
                    # the loader between epochs (its shuffle generator past this epoch's draw): a run
                    # resumed from here must shuffle the next epoch as the uninterrupted one does
                    state["next_epoch_loader"] = loader_state()
                self.save_checkpoint(epoch, optimizer, score, is_best=score < best, data_state=state)
            best = min(best, score)
            if self.rank == 0 and progress:
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()),
                      file=sys.stderr)
        perf = self.get_performance_metrics()
        if self.rank == 0 and progress:
            print(f"Training finished: {len(history)} epoch(s), {self.global_step} optimizer steps, strategy "
                  f"{self.strategy.name} on {self.world_size} rank(s); {perf['samples_per_second_per_gpu']:.1f} "
                  f"samples/s per rank, communication overhead {perf['communication_overhead_percent']:.1f}%",
                  file=sys.stderr)
        return {"history": history, "performance": perf}

    @staticmethod
    def _data_state(epoch_complete: bool, loader_state) -> dict:
        """What :meth:`fit` saves as ``data_state``: whether the epoch is done, and the loader's
        position (when it has one) as of the last batch trained on."""
        state = {"epoch_complete": bool(epoch_complete)}
        if loader_state is not None:
            state["loader"] = loader_state
        return state

    def _progress(self, batches, epoch: int, total, progress: bool):
        if self.rank != 0 or not progress:
            return batches
        try:
            from tqdm import tqdm
        except ImportError:   # the examples extra brings tqdm; without it, the per-epoch line suffices
            return batches
        return tqdm(batches, total=total, initial=self.batch_in_epoch, desc=f"epoch {epoch}", file=sys.stderr,
                    leave=False)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Close the monitor and destroy the process group if the trainer created it."""
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
        if self._owns_process_group:
            from neural_arch.distributed import groups as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_process_group = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class EnhancedDistributedTrainer(DistributedTrainer):
    """Seed 003's production trainer: the same trainer with the seed's positional order
    ``(model, strategy, mixed_precision, gradient_accumulation_steps, gradient_clip_val,
    enable_activation_checkpointing, cpu_offload, checkpoint_dir, log_dir)``.

    Example::

        trainer = EnhancedDistributedTrainer(model, strategy="fsdp", mixed_precision=True,
                                             gradient_accumulation_steps=4, gradient_clip_val=1.0,
                                             enable_activation_checkpointing=True,
                                             checkpoint_dir="./checkpoints", log_dir="./logs")
    """

    def __init__(self, model, strategy="ddp", mixed_precision=False, gradient_accumulation_steps: int = 1,
                 gradient_clip_val: float | None = None, enable_activation_checkpointing: bool = False,
                 cpu_offload: bool = False, checkpoint_dir=None, log_dir=None, **kwargs):
        super().__init__(model, strategy, mixed_precision, gradient_accumulation_steps,
                         gradient_clip_val=gradient_clip_val,
                         enable_activation_checkpointing=enable_activation_checkpointing,
                         cpu_offload=cpu_offload, checkpoint_dir=checkpoint_dir, log_dir=log_dir, **kwargs)
