"""``TensorParallel``: wrap a module so it runs sharded across a tensor-parallel group.

The name seed 001 left as a placeholder (``neural_arch.distributed.model_parallel.TensorParallel``).
It applies a plan (default for an ``nn.GPT``:
:func:`~neural_arch.distributed.tensor.parallel.gpt.gpt_tp_plan` with gathered logits, so the wrapped model
is a drop-in replacement returning ``(B, T, vocab)``) and adds the state-dict helpers.

Example (every rank)::

    init_process_group()
    manual_seed(0)
    model = TensorParallel(nn.GPT(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32))
    logits = model(idx)                               # equals the single-process GPT's logits
    full = model.full_state_dict()                    # collective: the unsharded weights
"""

from __future__ import annotations

from neural_arch.distributed.device_mesh import resolve_group_or_mesh
from neural_arch.distributed.tensor.parallel.gpt import parallelize_gpt
from neural_arch.distributed.tensor.parallel.state_dict import (
    full_state_dict,
    load_full_state_dict,
    sharded_state_dict,
)
from neural_arch.distributed.tensor.parallel.style import parallelize_module
from neural_arch.nn.module import Module
from neural_arch.nn.transformer import GPT

__all__ = ["TensorParallel"]


class TensorParallel(Module):
    """Shard ``module`` across ``device_mesh`` (1-d DeviceMesh / ProcessGroup / None = world).

    Args:
        module: the model, built identically (same seed) on every rank of the group.
        device_mesh: the tensor-parallel group.
        parallelize_plan: a ``{pattern: style}`` plan; default: the GPT plan for ``nn.GPT``
            (other modules need a plan).
        loss_parallel: for the GPT plan, keep logits vocabulary-sharded (use
            ``vocab_parallel_cross_entropy``) instead of gathering them.

    Example::

        model = TensorParallel(nn.GPT(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32))
        loss = F.cross_entropy(model(idx), targets)
        full = model.full_state_dict()                 # the single-process model's state dict
    """

    def __init__(self, module: Module, device_mesh=None, parallelize_plan=None, loss_parallel: bool = False):
        super().__init__()
        group = resolve_group_or_mesh(device_mesh, "TensorParallel")
        if parallelize_plan is None:
            if not isinstance(module, GPT):
                raise ValueError(f"TensorParallel: no default plan for {type(module).__name__}; pass "
                                 "parallelize_plan={'layer.name': ColwiseParallel() | RowwiseParallel(), ...}")
            parallelize_gpt(module, group, loss_parallel=loss_parallel)
        else:
            module = parallelize_module(module, group, parallelize_plan)
        self.module = module
        self.process_group = group

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def sharded_state_dict(self):
        """This rank's shards (see :func:`sharded_state_dict`), keys of the unwrapped model."""
        return sharded_state_dict(self.module)

    def full_state_dict(self):
        """The unsharded state dict of the unwrapped model (collective over the group)."""
        return full_state_dict(self.module)

    def load_full_state_dict(self, state_dict, strict: bool = True):
        """Load an unsharded state dict of the unwrapped model; each rank keeps its slices."""
        return load_full_state_dict(self.module, state_dict, strict=strict)
