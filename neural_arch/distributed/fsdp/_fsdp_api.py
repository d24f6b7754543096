"""``fully_shard``'s policies, with torch's names (``torch.distributed.fsdp``).

==========================  ====================================================================
name                        meaning
==========================  ====================================================================
``MixedPrecisionPolicy``    ``param_dtype`` (the gathered parameters, so forward and backward),
                            ``reduce_dtype`` (every gradient reduction), ``output_dtype``,
                            ``cast_forward_inputs``
``OffloadPolicy``           the default: no offloading
``CPUOffloadPolicy``        the sharded parameters and their gradients (so the optimizer step)
                            live in host memory; on CPU-only runs they already do: a no-op
==========================  ====================================================================

Example::

    from neural_arch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=na.float32, reduce_dtype=na.float32))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neural_arch.core import dtypes as _dtypes

__all__ = ["CPUOffloadPolicy", "MixedPrecisionPolicy", "OffloadPolicy"]


def _dtype_or_none(value, name: str):
    if value is None:
        return None
    try:
        dtype = _dtypes.as_dtype(value)
    except TypeError:
        raise TypeError(f"MixedPrecisionPolicy: {name}={value!r} is not a dtype") from None
    if not _dtypes.is_floating_dtype(dtype):
        raise TypeError(f"MixedPrecisionPolicy: {name}={value!r} must be a floating dtype")
    return dtype


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """How ``fully_shard`` casts (torch's ``MixedPrecisionPolicy``).

    * ``param_dtype``: the dtype parameters are all-gathered in, so the dtype forward and backward
      compute in (default: the parameters' own). The sharded parameters the optimizer steps keep
      their own dtype (the *master* copy).
    * ``reduce_dtype``: the dtype of every gradient reduction (reduce-scatter, and HSDP's
      all-reduce); default ``param_dtype``. The result is stored in the sharded parameter's dtype.
    * ``output_dtype``: the module's floating outputs are cast to it (default: left alone).
    * ``cast_forward_inputs``: the module's floating positional inputs are cast to ``param_dtype``.

    Example:
        >>> import numpy as np
        >>> mp = MixedPrecisionPolicy(param_dtype=np.float32, reduce_dtype="float32")
        >>> mp.param_dtype, mp.reduce_dtype, mp.output_dtype
        (dtype('float32'), dtype('float32'), None)
    """

    param_dtype: Any = None
    reduce_dtype: Any = None
    output_dtype: Any = None
    cast_forward_inputs: bool = True

    def __post_init__(self):
        for name in ("param_dtype", "reduce_dtype", "output_dtype"):
            object.__setattr__(self, name, _dtype_or_none(getattr(self, name), name))


@dataclass(frozen=True)
class OffloadPolicy:
    """No offloading: the sharded parameters live where the module's parameters were (torch's default).

    Example:
        >>> OffloadPolicy()
        OffloadPolicy()
    """


@dataclass(frozen=True)
class CPUOffloadPolicy(OffloadPolicy):
    """Keep the sharded parameters and their gradients in host memory (so the optimizer steps there);
    each all-gather copies the shard to the module's device first, each reduced gradient comes back.
    On CPU-only runs the arrays already live on the host: accepted, and a no-op. ``pin_memory`` is
    accepted for torch's signature.

    Example:
        >>> CPUOffloadPolicy().pin_memory
        True
    """

    pin_memory: bool = True
