"""Sequence parallelism (Megatron-LM's, with torch's ``SequenceParallel`` / ``PrepareModuleInput`` names).

Between a row-parallel layer and the next column-parallel one, a transformer runs LayerNorm,
dropout and the residual add on the *whole* activation on every rank: replicated work and
replicated memory. Sequence parallelism splits that region along the sequence: each rank keeps
``T/p`` positions ``(B, T/p, C)``. The row-parallel layer reduce-scatters instead of all-reducing
and the column-parallel layer all-gathers first (backward: the reverse), so the communication
volume is unchanged while the region's activations shrink p-fold.

Parameters inside the region (LayerNorm's weight and bias, a row-parallel bias) see only this
rank's positions, so their gradients are partial sums: :class:`SequenceParallel` all-reduces them
over the tensor-parallel group as they are produced, keeping them identical on every rank. It also
makes them ``Replicate()`` DTensor parameters on the tp mesh (as torch's does; same values).

Example (a pre-LN MLP block as a plan; ``x`` is this rank's ``(B, T/p, C)``)::

    parallelize_module(block, tp_group, {
        "ln": SequenceParallel(),
        "fc1": ColwiseParallel(input_layouts=Shard(1)),
        "fc2": RowwiseParallel(output_layouts=Shard(1)),
    })
"""

from __future__ import annotations

from neural_arch.distributed.device_mesh import resolve_group_or_mesh
from neural_arch.distributed.nn.functional import (
    _allreduce,
    gather_from_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
)
from neural_arch.distributed.tensor._api import DTensor
from neural_arch.distributed.tensor._parameter import DTensorParameter
from neural_arch.distributed.tensor.parallel.layers import tp_device_mesh
from neural_arch.distributed.tensor.parallel.style import ParallelStyle, Replicate, Shard, _local_output_only
from neural_arch.nn.module import Module

__all__ = ["PrepareModuleInput", "SequenceParallel"]


class SequenceParallel(ParallelStyle):
    """Run ``module`` on this rank's share of the sequence; all-reduce its parameters' gradients.

    For LayerNorm, RMSNorm-like and Dropout modules (anything that works position by position).
    Only ``sequence_dim=1`` (``(B, T, C)`` activations) is supported.

    Example::

        parallelize_module(block, tp_mesh, {
            "ln_1": SequenceParallel(),
            "attn.q_proj": ColwiseParallel(input_layouts=Shard(1)),
        })
    """

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False):
        if sequence_dim != 1:
            raise NotImplementedError(f"SequenceParallel(sequence_dim={sequence_dim}): only 1 is supported "
                                      "(activations are (batch, seq, hidden))")
        self.sequence_dim = sequence_dim

    def apply(self, module: Module, group) -> Module:
        if getattr(module, "_sequence_parallel_handles", None) is not None:
            # a second set of hooks would all-reduce every gradient twice (p times too large)
            raise ValueError(f"SequenceParallel: {type(module).__name__} is already sequence-parallel (two plan "
                             "keys match it, or parallelize_module ran twice on it)")
        mesh = None
        for name, p in list(module._parameters.items()):
            if p is not None and not isinstance(p, DTensor):
                # torch's SequenceParallel makes them Replicate() DTensors on the tp mesh: the same
                # local values (the Tensor face), now saying they are whole on every tp rank
                mesh = mesh if mesh is not None else tp_device_mesh(group, p.device)
                module._parameters[name] = DTensorParameter(p.data, mesh, [Replicate()], p.shape,
                                                            requires_grad=p.requires_grad, device=p.device)
        group = resolve_group_or_mesh(group, "SequenceParallel")

        def all_reduce_grad(grad):
            # the replicated parameter saw only this rank's positions: sum the parts over the group
            return type(grad)._wrap(_allreduce(group, grad.data)) if group.size() > 1 else grad

        handles = [p.register_hook(all_reduce_grad) for p in module.parameters() if p.requires_grad]
        object.__setattr__(module, "_sequence_parallel_handles", handles)  # not a submodule/parameter
        return module

    def __repr__(self) -> str:
        return "SequenceParallel()"


class PrepareModuleInput(ParallelStyle):
    """Convert ``module``'s first input from ``input_layouts`` to ``desired_input_layouts``.

    Supported conversions (``(B, T, C)`` activations):

    * ``Replicate()`` -> ``Shard(1)``: keep this rank's positions (backward all-gathers): enter a
      sequence-parallel region, e.g. after the embeddings;
    * ``Shard(1)`` -> ``Replicate()``: all-gather the sequence for replicated computation
      (backward keeps this rank's positions).

    Example::

        parallelize_module(model, tp_mesh, {
            "blocks.0": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1)),
        })
    """

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, use_local_output: bool = True):
        _local_output_only("PrepareModuleInput", use_local_output)
        self.input_layouts = _single(input_layouts, "input_layouts")
        self.desired_input_layouts = _single(desired_input_layouts, "desired_input_layouts")
        pair = (type(self.input_layouts), getattr(self.input_layouts, "dim", None),
                type(self.desired_input_layouts), getattr(self.desired_input_layouts, "dim", None))
        if pair not in ((Replicate, None, Shard, 1), (Shard, 1, Replicate, None)):
            raise NotImplementedError(f"PrepareModuleInput: {self.input_layouts!r} -> {self.desired_input_layouts!r} "
                                      "is not supported; use Replicate() <-> Shard(1)")

    # False: it only converts the input, so the module keeps its parameters (tied ones stay tied)
    replaces_parameters = False

    def apply(self, module: Module, group) -> Module:
        if getattr(module, "_prepare_module_input", None) is not None:
            # a second hook would convert the already converted input again (e.g. T/p -> T/p^2)
            raise ValueError(f"PrepareModuleInput: {type(module).__name__} already has {module._prepare_module_input!r}"
                             " (two plan keys match it, or parallelize_module ran twice on it)")
        group = resolve_group_or_mesh(group, "PrepareModuleInput")
        object.__setattr__(module, "_prepare_module_input", self)  # not a submodule/parameter
        enter = isinstance(self.desired_input_layouts, Shard)

        def convert(_module, args):
            if not args:
                return None
            first = (scatter_to_sequence_parallel_region(args[0], group) if enter
                     else gather_from_sequence_parallel_region(args[0], group, tensor_parallel_output_grad=False))
            return (first,) + tuple(args[1:])

        module.register_forward_pre_hook(convert)
        return module

    def __repr__(self) -> str:
        return (f"PrepareModuleInput(input_layouts={self.input_layouts!r}, "
                f"desired_input_layouts={self.desired_input_layouts!r})")


def _single(layout, name: str):
    if isinstance(layout, (tuple, list)):
        if len(layout) != 1:
            raise NotImplementedError(f"PrepareModuleInput: {name} for more than one input is not supported")
        layout = layout[0]
    if not isinstance(layout, (Shard, Replicate)):
        raise ValueError(f"PrepareModuleInput: {name} must be Shard(1) or Replicate(), got {layout!r}")
    return layout
