"""torch's ``torch.distributed.tensor`` home. ``experimental`` holds context parallelism
(:mod:`neural_arch.distributed.tensor.experimental`)."""

from neural_arch.distributed.tensor._api import DTensor, distribute_tensor
from neural_arch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = ["DTensor", "Partial", "Placement", "Replicate", "Shard", "distribute_tensor"]
