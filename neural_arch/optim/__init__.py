"""Optimizers, learning-rate schedules and gradient clipping (``from neural_arch import optim``).

Example::

    >>> from neural_arch import nn, optim
    >>> model = nn.Linear(4, 2)
    >>> opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> sched = optim.StepLR(opt, step_size=10, gamma=0.5)
"""

from neural_arch.optim import lr_scheduler
from neural_arch.optim.adadelta import Adadelta
from neural_arch.optim.adafactor import Adafactor
from neural_arch.optim.adagrad import Adagrad
from neural_arch.optim.adam import Adam, AdamW
from neural_arch.optim.adamax import Adamax
from neural_arch.optim.asgd import ASGD
from neural_arch.optim.clip import clip_grad_norm_, clip_grad_value_
from neural_arch.optim.lamb import LAMB
from neural_arch.optim.lars import LARS
from neural_arch.optim.lbfgs import LBFGS
from neural_arch.optim.lr_scheduler import (
    ChainedScheduler,
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CosineAnnealingWarmup,
    CosineWithWarmup,
    CyclicLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    OneCycleLR,
    PolynomialLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)
from neural_arch.optim.nadam import NAdam
from neural_arch.optim.optimizer import Optimizer
from neural_arch.optim.radam import RAdam
from neural_arch.optim.rmsprop import RMSprop
from neural_arch.optim.rprop import Rprop
from neural_arch.optim.sgd import SGD

__all__ = [
    "ASGD",
    "LAMB",
    "LARS",
    "LBFGS",
    "SGD",
    "Adadelta",
    "Adafactor",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "ChainedScheduler",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CosineAnnealingWarmup",
    "CosineWithWarmup",
    "CyclicLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "NAdam",
    "OneCycleLR",
    "Optimizer",
    "PolynomialLR",
    "RAdam",
    "RMSprop",
    "ReduceLROnPlateau",
    "Rprop",
    "SequentialLR",
    "StepLR",
    "clip_grad_norm_",
    "clip_grad_value_",
    "lr_scheduler",
]
