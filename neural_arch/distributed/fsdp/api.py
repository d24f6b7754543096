"""FSDP's configuration objects and wrap policies, with torch's names.

==========================  ===================================================================
name                        meaning
==========================  ===================================================================
``ShardingStrategy``        ``FULL_SHARD`` (ZeRO-3), ``SHARD_GRAD_OP`` (ZeRO-2), ``NO_SHARD``
                            (DDP-like), ``HYBRID_SHARD`` (shard in a node, replicate across)
``CPUOffload``              ``offload_params=True``: shards and their gradients live on the host
``MixedPrecision``          ``param_dtype`` (compute), ``reduce_dtype`` (gradient reduction),
                            ``buffer_dtype``
``BackwardPrefetch``        accepted for compatibility (see FSDP's docstring: no effect here)
``StateDictType``           ``FULL_STATE_DICT`` / ``SHARDED_STATE_DICT`` (``LOCAL_STATE_DICT``
                            is the same as sharded here)
wrap policies               ``ModuleWrapPolicy({Block})``, ``transformer_auto_wrap_policy``,
                            ``size_based_auto_wrap_policy`` (use with ``functools.partial``)
==========================  ===================================================================

Example::

    policy = ModuleWrapPolicy({nn.TransformerBlock})
    mp = MixedPrecision(param_dtype=na.bfloat16, reduce_dtype=na.float32)
    fsdp = FullyShardedDataParallel(model, auto_wrap_policy=policy, mixed_precision=mp)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "MixedPrecision",
    "ModuleWrapPolicy",
    "ShardingStrategy",
    "StateDictType",
    "resolve_policy",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]


class ShardingStrategy(enum.Enum):
    FULL_SHARD = 1
    SHARD_GRAD_OP = 2
    NO_SHARD = 3
    HYBRID_SHARD = 4
    _HYBRID_SHARD_ZERO2 = 5


class BackwardPrefetch(enum.Enum):
    BACKWARD_PRE = 1
    BACKWARD_POST = 2


class StateDictType(enum.Enum):
    FULL_STATE_DICT = 1
    LOCAL_STATE_DICT = 2
    SHARDED_STATE_DICT = 3


@dataclass
class CPUOffload:
    """Keep the flat parameter shards (and their gradients, and so the optimizer state) on the host.

    On CPU-only runs this is the identity (the arrays already live on the host).
    """

    offload_params: bool = False


@dataclass
class MixedPrecision:
    """``param_dtype``: dtype of the gathered parameters used in forward/backward;
    ``reduce_dtype``: dtype of the gradient reduce-scatter (default: ``param_dtype``);
    ``buffer_dtype``: dtype buffers are cast to once at wrap time. The sharded *master*
    parameters keep their original dtype (float32 or float64), which the optimizer steps."""

    param_dtype: Any = None
    reduce_dtype: Any = None
    buffer_dtype: Any = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True


def size_based_auto_wrap_policy(module, recurse: bool, nonwrapped_numel: int,
                                min_num_params: int = int(1e8), exclude_wrap_modules=None, **_) -> bool:
    """torch's rule: wrap a module once its not-yet-wrapped parameters reach ``min_num_params``."""
    if recurse:
        return True
    if exclude_wrap_modules and isinstance(module, tuple(exclude_wrap_modules)):
        return False
    return nonwrapped_numel >= min_num_params


def transformer_auto_wrap_policy(module, recurse: bool, nonwrapped_numel: int,
                                 transformer_layer_cls=(), **_) -> bool:
    """Wrap every instance of ``transformer_layer_cls`` (a set of classes)."""
    if recurse:
        return True
    return isinstance(module, tuple(transformer_layer_cls))


class ModuleWrapPolicy:
    """Wrap every submodule that is an instance of one of ``module_classes``."""

    def __init__(self, module_classes):
        self.module_classes = tuple(module_classes)
        if not all(isinstance(c, type) for c in self.module_classes):
            raise TypeError(f"ModuleWrapPolicy needs module classes, got {module_classes!r}")

    def __call__(self, module, recurse: bool, nonwrapped_numel: int) -> bool:
        return True if recurse else isinstance(module, self.module_classes)


def resolve_policy(policy):
    """A callable ``(module, recurse, nonwrapped_numel) -> bool`` from what users may pass."""
    if policy is None:
        return None
    if isinstance(policy, (set, frozenset, list, tuple)):
        return ModuleWrapPolicy(policy)
    if callable(policy):
        return policy
    raise TypeError(f"auto_wrap_policy must be a callable (module, recurse, nonwrapped_numel) -> bool, "
                    f"a ModuleWrapPolicy, or a set of module classes; got {policy!r}")
