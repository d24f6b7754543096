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
from neural_arch.nn.activation import (
    CELU,
    ELU,
    GELU,
    GLU,
    SELU,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LogSigmoid,
    LogSoftmax,
    Mish,
    PReLU,
    ReLU,
    ReLU6,
    Sigmoid,
    Softmax,
    Softmin,
    Softplus,
    Softsign,
    Tanh,
    Tanhshrink,
    Threshold,
)
from neural_arch.nn.attention import CausalSelfAttention, MultiheadAttention
from neural_arch.nn.batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from neural_arch.nn.bilinear import Bilinear
from neural_arch.nn.container import ModuleDict, ModuleList, Sequential
from neural_arch.nn.conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from neural_arch.nn.distance import CosineSimilarity, PairwiseDistance
from neural_arch.nn.flatten import Flatten, Unflatten
from neural_arch.nn.instancenorm import InstanceNorm1d, InstanceNorm2d
from neural_arch.nn.kv_cache import KVCache
from neural_arch.nn.linear import Embedding, Identity, Linear
from neural_arch.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CosineEmbeddingLoss,
    CrossEntropyLoss,
    GaussianNLLLoss,
    HingeEmbeddingLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MarginRankingLoss,
    MSELoss,
    MultiLabelSoftMarginLoss,
    NLLLoss,
    PoissonNLLLoss,
    SmoothL1Loss,
    SoftMarginLoss,
    TripletMarginLoss,
)
from neural_arch.nn.module import IncompatibleKeys, Module
from neural_arch.nn.moe import MoE
from neural_arch.nn.normalization import (
    AlphaDropout,
    Dropout,
    Dropout1d,
    Dropout2d,
    GroupNorm,
    LayerNorm,
    LocalResponseNorm,
    RMSNorm,
)
from neural_arch.nn.parameter import Parameter
from neural_arch.nn.parameter_containers import ParameterDict, ParameterList
from neural_arch.nn.pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AvgPool1d,
    AvgPool2d,
    MaxPool1d,
    MaxPool2d,
)
from neural_arch.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from neural_arch.nn.sketched import SKLinear
from neural_arch.nn.transformer import GPT, TransformerBlock
from neural_arch.nn.transformer_layers import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from neural_arch.nn.upsample import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d

__all__ = [
    "CELU",
    "ELU",
    "GELU",
    "GLU",
    "GPT",
    "GRU",
    "LSTM",
    "RNN",
    "SELU",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AlphaDropout",
    "AvgPool1d",
    "AvgPool2d",
    "BCELoss",
    "BCEWithLogitsLoss",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Bilinear",
    "CausalSelfAttention",
    "Conv1d",
    "Conv2d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "CosineEmbeddingLoss",
    "CosineSimilarity",
    "CrossEntropyLoss",
    "Dropout",
    "Dropout1d",
    "Dropout2d",
    "Embedding",
    "Flatten",
    "GRUCell",
    "GaussianNLLLoss",
    "GroupNorm",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "HingeEmbeddingLoss",
    "HuberLoss",
    "Identity",
    "IncompatibleKeys",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "KLDivLoss",
    "KVCache",
    "L1Loss",
    "LSTMCell",
    "LayerNorm",
    "Linear",
    "LocalResponseNorm",
    "LogSigmoid",
    "LogSoftmax",
    "MSELoss",
    "MarginRankingLoss",
    "MaxPool1d",
    "MaxPool2d",
    "Mish",
    "MoE",
    "Module",
    "ModuleDict",
    "ModuleList",
    "MultiLabelSoftMarginLoss",
    "MultiheadAttention",
    "NLLLoss",
    "PReLU",
    "PairwiseDistance",
    "Parameter",
    "ParameterDict",
    "ParameterList",
    "PoissonNLLLoss",
    "RMSNorm",
    "RNNBase",
    "RNNCell",
    "RNNCellBase",
    "ReLU",
    "ReLU6",
    "SKLinear",
    "Sequential",
    "Sigmoid",
    "SmoothL1Loss",
    "SoftMarginLoss",
    "Softmax",
    "Softmin",
    "Softplus",
    "Softsign",
    "Tanh",
    "Tanhshrink",
    "Threshold",
    "Transformer",
    "TransformerBlock",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "TripletMarginLoss",
    "Unflatten",
    "Upsample",
    "UpsamplingBilinear2d",
    "UpsamplingNearest2d",
    "functional",
    "init",
    "utils",
]


def __getattr__(name: str):
    # torch spells it nn.SyncBatchNorm, but its statistics are all-reduced over a process group:
    # it lives in neural_arch.distributed, and nn never imports the distributed package.
    if name == "SyncBatchNorm":
        raise AttributeError("SyncBatchNorm is a distributed layer here: use "
                             "neural_arch.distributed.SyncBatchNorm (same arguments and convert_sync_batchnorm)")
    raise AttributeError(f"module 'neural_arch.nn' has no attribute {name!r}")
