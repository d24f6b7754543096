"""FSDP's configuration objects, with torch's names (the wrap policies are in :mod:`.wrap`).

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
==========================  ===================================================================

Example::

    mp = MixedPrecision(param_dtype=na.bfloat16, reduce_dtype=na.float32)
    fsdp = FullyShardedDataParallel(model, mixed_precision=mp)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "MixedPrecision",
    "ShardingStrategy",
    "StateDictType",
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

    Example:
        >>> CPUOffload(offload_params=True)
        CPUOffload(offload_params=True)
    """

    offload_params: bool = False


@dataclass
class MixedPrecision:
    """``param_dtype``: dtype of the gathered parameters used in forward/backward;
    ``reduce_dtype``: dtype of the gradient reduce-scatter (default: ``param_dtype``);
    ``buffer_dtype``: dtype buffers are cast to once at wrap time. The sharded *master*
    parameters keep their original dtype (float32 or float64), which the optimizer steps.

    Example:
        >>> import numpy as np
        >>> mp = MixedPrecision(param_dtype=np.float16, reduce_dtype=np.float32)
        >>> mp.buffer_dtype is None
        True
    """

    param_dtype: Any = None
    reduce_dtype: Any = None
    buffer_dtype: Any = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True
