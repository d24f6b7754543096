"""torch's ``torch.distributed.tensor`` home. ``experimental`` holds context parallelism
(:mod:`neural_arch.distributed.tensor.experimental`)."""

from neural_arch.distributed.tensor._api import DTensor, distribute_tensor
from neural_arch.distributed.tensor._ops import bind_methods as _bind_methods
from neural_arch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = ["DTensor", "Partial", "Placement", "Replicate", "Shard", "distribute_tensor"]

# the ops with sharding rules (sum, softmax, reshape, gelu, ...) become DTensor methods, as the
# ops are Tensor's; bound here because the rules import DTensor
_bind_methods(DTensor)
