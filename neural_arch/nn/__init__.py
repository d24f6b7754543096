"""Layers, containers, losses and initialisers (``from neural_arch import nn``).

Example::

    >>> from neural_arch import nn
    >>> model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    >>> model
    Sequential(
      (0): Linear(in_features=4, out_features=16, bias=True)
      (1): ReLU()
      (2): Linear(in_features=16, out_features=3, bias=True)
    )
"""

from neural_arch.nn import functional, init, utils
from neural_arch.nn.activation import GELU, LogSoftmax, ReLU, Sigmoid, Softmax, Softplus, Tanh
from neural_arch.nn.attention import CausalSelfAttention, MultiheadAttention
from neural_arch.nn.batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from neural_arch.nn.container import ModuleDict, ModuleList, Sequential
from neural_arch.nn.conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from neural_arch.nn.flatten import Flatten, Unflatten
from neural_arch.nn.kv_cache import KVCache
from neural_arch.nn.linear import Embedding, Identity, Linear
from neural_arch.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from neural_arch.nn.module import IncompatibleKeys, Module
from neural_arch.nn.moe import MoE
from neural_arch.nn.normalization import Dropout, Dropout2d, GroupNorm, LayerNorm, RMSNorm
from neural_arch.nn.parameter import Parameter
from neural_arch.nn.pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AvgPool1d,
    AvgPool2d,
    MaxPool1d,
    MaxPool2d,
)
from neural_arch.nn.sketched import SKLinear
from neural_arch.nn.transformer import GPT, TransformerBlock

__all__ = [
    "SKLinear",
    "functional", "init", "Module", "Parameter", "IncompatibleKeys",
    "Linear", "Embedding", "Identity", "LayerNorm", "Dropout",
    "ReLU", "GELU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax",
    "Sequential", "ModuleList", "ModuleDict",
    "MultiheadAttention", "CausalSelfAttention", "TransformerBlock", "GPT", "MoE", "KVCache",
    "CrossEntropyLoss", "MSELoss", "utils",
    "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "BatchNorm1d", "BatchNorm2d",
    "Dropout2d", "Flatten", "Unflatten", "Softplus", "RMSNorm", "GroupNorm",
    "Conv1d", "BatchNorm3d", "MaxPool1d", "AvgPool1d", "AdaptiveAvgPool1d", "L1Loss", "SmoothL1Loss",
    "HuberLoss", "BCELoss", "BCEWithLogitsLoss", "KLDivLoss", "NLLLoss",
    "ConvTranspose1d", "ConvTranspose2d",
]


def __getattr__(name: str):
    # torch spells it nn.SyncBatchNorm, but its statistics are all-reduced over a process group:
    # it lives in neural_arch.distributed, and nn never imports the distributed package.
    if name == "SyncBatchNorm":
        raise AttributeError("SyncBatchNorm is a distributed layer here: use "
                             "neural_arch.distributed.SyncBatchNorm (same arguments and convert_sync_batchnorm)")
    raise AttributeError(f"module 'neural_arch.nn' has no attribute {name!r}")
