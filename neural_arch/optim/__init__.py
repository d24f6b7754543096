"""Optimizers, learning-rate schedules and gradient clipping (``from neural_arch import optim``).

Example::

    >>> from neural_arch import nn, optim
    >>> model = nn.Linear(4, 2)
    >>> opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> sched = optim.StepLR(opt, step_size=10, gamma=0.5)
"""

from neural_arch.optim import lr_scheduler
from neural_arch.optim.adam import Adam, AdamW
from neural_arch.optim.clip import clip_grad_norm_, clip_grad_value_
from neural_arch.optim.lr_scheduler import (
    CosineAnnealingWarmup,
    CosineWithWarmup,
    LambdaLR,
    LRScheduler,
    StepLR,
)
from neural_arch.optim.optimizer import Optimizer
from neural_arch.optim.sgd import SGD

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "CosineAnnealingWarmup",
    "CosineWithWarmup",
    "LRScheduler",
    "LambdaLR",
    "Optimizer",
    "StepLR",
    "clip_grad_norm_",
    "clip_grad_value_",
    "lr_scheduler",
]
