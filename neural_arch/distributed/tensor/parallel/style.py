"""``parallelize_module`` with torch's ``ColwiseParallel`` / ``RowwiseParallel`` styles.

A *plan* maps module names (``fnmatch`` patterns over dotted names, e.g. ``"blocks.*.mlp.fc1"``)
to a style; each matching ``nn.Linear`` / ``nn.Embedding`` / ``SKLinear`` is replaced, in place
and at the same position, by its sharded counterpart holding the same values:

=========================  ====================  =========================================
style                      on ``nn.Linear``      on ``nn.Embedding``
=========================  ====================  =========================================
``ColwiseParallel()``      ColumnParallelLinear  (not supported: NotImplementedError)
``RowwiseParallel()``      RowParallelLinear     VocabParallelEmbedding (rows = vocabulary)
=========================  ====================  =========================================

Layouts follow torch: ``ColwiseParallel(output_layouts=Replicate())`` all-gathers its output
(default ``Shard(-1)``: leave it sharded); ``RowwiseParallel(input_layouts=Replicate())``
takes a full input and scatters it (default ``Shard(-1)``: the input is already this rank's
slice). **Sequence parallelism** (activations ``(B, T, C)`` sharded on the sequence, ``Shard(1)``):
``ColwiseParallel(input_layouts=Shard(1))`` all-gathers the sequence first,
``RowwiseParallel(output_layouts=Shard(1))`` reduce-scatters its output along it, and
:class:`~neural_arch.distributed.tensor.parallel.sequence_parallel.SequenceParallel`
marks the LayerNorm/dropout modules that run on the local positions in between;
``PrepareModuleInput`` converts a module's input layout (e.g. into the region).

Example::

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    parallelize_module(mlp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
"""

from __future__ import annotations

import fnmatch

from neural_arch.distributed.device_mesh import DeviceMesh, resolve_group_or_mesh
from neural_arch.distributed.tensor.parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from neural_arch.distributed.tensor.placement_types import Replicate, Shard  # DTensor's placements
from neural_arch.nn.linear import Embedding, Linear
from neural_arch.nn.module import Module
from neural_arch.nn.sketched import SKLinear

__all__ = ["ColwiseParallel", "ParallelStyle", "Replicate", "RowwiseParallel", "Shard", "parallelize_module"]


def _is_shard_last(layout) -> bool:
    return isinstance(layout, Shard) and layout.dim in (-1,)


def _is_shard_sequence(layout) -> bool:
    return isinstance(layout, Shard) and layout.dim == 1


def _local_output_only(style: str, use_local_output: bool) -> bool:
    """``use_local_output=False`` asks torch for a DTensor output; here the output is always this
    rank's local tensor, and a reduction over a local shard (``y.sum()``) would silently differ
    from torch's over the DTensor: refuse it at the call.

    >>> _local_output_only("ColwiseParallel", True)
    True
    """
    if not use_local_output:
        raise NotImplementedError(f"{style}(use_local_output=False): a DTensor output is not implemented; the "
                                  "output is this rank's local tensor (use_local_output=True, the default)")
    return True


class ParallelStyle:
    """Base of the styles: ``apply(module, group) -> sharded module`` (``group``: a ProcessGroup or
    a 1-d DeviceMesh).

    Example::

        >>> ColwiseParallel()          # a style is a small record; apply() does the sharding
        ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(dim=-1))
        >>> RowwiseParallel(input_layouts=Shard(-1))
        RowwiseParallel(input_layouts=Shard(dim=-1), output_layouts=Replicate())
    """

    #: whether ``apply`` gives the module new (sharded) parameters; parallelize_module then
    #: refuses a module whose parameters are tied to a module outside it
    replaces_parameters = True

    def apply(self, module: Module, group) -> Module:  # pragma: no cover - abstract
        raise NotImplementedError


class ColwiseParallel(ParallelStyle):
    """Shard a Linear's output features (torch's ``ColwiseParallel``).

    Example::

        parallelize_module(mlp, tp_mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    """

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True):
        self.input_layouts = input_layouts or Replicate()
        self.output_layouts = output_layouts or Shard(-1)
        if not (isinstance(self.input_layouts, Replicate) or _is_shard_sequence(self.input_layouts)):
            raise ValueError(f"ColwiseParallel: input_layouts must be Replicate() or Shard(1) (sequence "
                             f"parallelism), got {self.input_layouts!r}")
        if not (isinstance(self.output_layouts, Replicate) or _is_shard_last(self.output_layouts)):
            raise ValueError(f"ColwiseParallel: output_layouts must be Shard(-1) or Replicate(), got "
                             f"{self.output_layouts!r}")
        self.use_local_output = _local_output_only(type(self).__name__, use_local_output)

    def apply(self, module: Module, group) -> Module:
        gather = isinstance(self.output_layouts, Replicate)
        sequence = _is_shard_sequence(self.input_layouts)
        if isinstance(module, Linear):
            return ColumnParallelLinear.from_linear(module, group, gather_output=gather, sequence_parallel=sequence)
        if sequence:
            raise NotImplementedError(f"ColwiseParallel(input_layouts=Shard(1)) is implemented for nn.Linear, not "
                                      f"{type(module).__name__}")
        if isinstance(module, SKLinear):
            from neural_arch.distributed.tensor.parallel.sketched import TensorParallelSKLinear

            return TensorParallelSKLinear.from_sklinear(module, group, gather_output=gather)
        if isinstance(module, Embedding):
            raise NotImplementedError("ColwiseParallel on nn.Embedding (sharding the embedding dim) is not "
                                      "implemented; use RowwiseParallel() (vocabulary-parallel) instead")
        raise TypeError(f"ColwiseParallel applies to nn.Linear or SKLinear, not {type(module).__name__}")

    def __repr__(self) -> str:
        return f"ColwiseParallel(input_layouts={self.input_layouts!r}, output_layouts={self.output_layouts!r})"


class RowwiseParallel(ParallelStyle):
    """Shard a Linear's input features, or an Embedding's rows (torch's ``RowwiseParallel``).

    Example::

        parallelize_module(model, tp_mesh, {"tok_emb": RowwiseParallel(), "out_proj": RowwiseParallel()})
    """

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True):
        self.input_layouts = input_layouts or Shard(-1)
        self.output_layouts = output_layouts or Replicate()
        if not (isinstance(self.output_layouts, Replicate) or _is_shard_sequence(self.output_layouts)):
            raise ValueError(f"RowwiseParallel: output_layouts must be Replicate() or Shard(1) (sequence "
                             f"parallelism), got {self.output_layouts!r}")
        if not (isinstance(self.input_layouts, Replicate) or _is_shard_last(self.input_layouts)):
            raise ValueError(f"RowwiseParallel: input_layouts must be Shard(-1) or Replicate(), got "
                             f"{self.input_layouts!r}")
        self.use_local_output = _local_output_only(type(self).__name__, use_local_output)

    def apply(self, module: Module, group) -> Module:
        sequence = _is_shard_sequence(self.output_layouts)
        if isinstance(module, Linear):
            return RowParallelLinear.from_linear(module, group,
                                                 input_is_parallel=not isinstance(self.input_layouts, Replicate),
                                                 sequence_parallel=sequence)
        if sequence:
            raise NotImplementedError("RowwiseParallel(output_layouts=Shard(1)) is implemented for nn.Linear, "
                                      f"not {type(module).__name__}")
        if isinstance(module, Embedding):
            return VocabParallelEmbedding.from_embedding(module, group)
        raise TypeError(f"RowwiseParallel applies to nn.Linear or nn.Embedding, not {type(module).__name__}")

    def __repr__(self) -> str:
        return f"RowwiseParallel(input_layouts={self.input_layouts!r}, output_layouts={self.output_layouts!r})"


def _refuse_tied(root: Module, name: str, holders: dict) -> None:
    """Raise if a parameter of ``root.<name>`` (or below it) is also held by a module outside it
    (``holders``: id of a parameter -> the dotted names it is held under, from :func:`_holders`).

    Sharding gives the module new parameters: a tied weight (nanoGPT's ``head.weight =
    tok_emb.weight``) would silently become two independent ones, each getting only its own
    gradient, so the model would no longer compute what the dense one does.
    """
    for pname, p in root.get_submodule(name).named_parameters():
        for where in holders.get(id(p), ()):
            if not where.startswith(name + "."):
                raise NotImplementedError(
                    f"parallelize_module: {name}.{pname} is the same parameter as {where} (tied weights); "
                    f"sharding {name!r} would untie them and silently change the model. Untie them first "
                    f"(e.g. give {where} its own copy), or leave {name!r} out of the plan")


def _holders(root: Module) -> dict:
    """id of each parameter -> every dotted name a module of ``root`` holds it under."""
    out: dict = {}
    for module_name, sub in root.named_modules():
        for pname, p in sub._parameters.items():
            if p is not None:
                out.setdefault(id(p), []).append(f"{module_name}.{pname}" if module_name else pname)
    return out


def parallelize_module(module: Module, device_mesh=None, parallelize_plan=None) -> Module:
    """Shard ``module`` across ``device_mesh`` (a 1-d DeviceMesh, a ProcessGroup, or None = world).

    ``parallelize_plan`` is a style (applied to ``module`` itself; the sharded module is returned)
    or a dict ``{pattern: style}`` applied to the matching submodules in place (``module`` is
    returned). A pattern that matches nothing is an error (a typo would silently leave a layer
    replicated), and so is a module to shard whose parameter is tied to a module outside it
    (sharding would untie them). Every rank of the group must call it with the same model and plan.

    Example::

        mesh = init_device_mesh("cpu", (2,))
        mlp = parallelize_module(mlp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    """
    group = resolve_group_or_mesh(device_mesh, "parallelize_module")
    # the styles take the 1-d mesh itself when there is one: the DTensor parameters they make
    # then live on it (``param.device_mesh == mesh``), as torch's do
    target = device_mesh if isinstance(device_mesh, DeviceMesh) else group
    if parallelize_plan is None:
        raise ValueError("parallelize_module: parallelize_plan is required (a ParallelStyle or a dict "
                         "{'name.pattern': ColwiseParallel() | RowwiseParallel()})")
    if isinstance(parallelize_plan, ParallelStyle):
        return parallelize_plan.apply(module, target)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_module: parallelize_plan must be a ParallelStyle or a dict, got "
                        f"{type(parallelize_plan).__name__}")
    names = [name for name, _ in module.named_modules() if name]
    planned = []
    for pattern, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_module: plan[{pattern!r}] must be a ParallelStyle (ColwiseParallel(), "
                            f"RowwiseParallel(), SequenceParallel(), PrepareModuleInput(...)), got {style!r}")
        matches = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matches:
            raise ValueError(f"parallelize_module: plan key {pattern!r} matches no submodule of "
                             f"{type(module).__name__}; names look like {names[:6]}")
        planned.append((style, matches))
    # checked before anything is sharded, so an error leaves the model as it was
    holders = _holders(module) if any(style.replaces_parameters for style, _ in planned) else {}
    for style, matches in planned:
        if style.replaces_parameters:
            for name in matches:
                _refuse_tied(module, name, holders)
    for style, matches in planned:
        for name in matches:
            parent_name, _, child = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            # Replace in the registry directly: setattr would move the child to the end of
            # the ordered registry, and Sequential runs its children in that order.
            parent._modules[child] = style.apply(parent._modules[child], target)
    return module
