"""Automatic mixed precision: :class:`~neural_arch.amp.autocast` and
:class:`~neural_arch.amp.GradScaler` (torch's ``torch.amp``).

Example::

    from neural_arch.amp import autocast, GradScaler
    scaler = GradScaler()
    with autocast("cpu", dtype=neural_arch.bfloat16):
        loss = F.cross_entropy(model(x), y)      # linear/matmul in bf16, the loss in float32
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
"""

from neural_arch.amp.autocast_mode import (
    FP32_OPS,
    LOWER_PRECISION_OPS,
    autocast,
    get_autocast_dtype,
    is_autocast_enabled,
)
from neural_arch.amp.grad_scaler import GradScaler

__all__ = ["FP32_OPS", "LOWER_PRECISION_OPS", "GradScaler", "autocast", "get_autocast_dtype", "is_autocast_enabled"]
