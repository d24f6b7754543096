"""Public path ``neural_arch.distributed.model_parallel`` (seed 001 names ``TensorParallel`` here).

A re-export of :mod:`neural_arch.distributed.tensor.parallel`. Example::

    from neural_arch.distributed.model_parallel import TensorParallel
    model = TensorParallel(nn.GPT(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32))
"""

from neural_arch.distributed.tensor.parallel import *
from neural_arch.distributed.tensor.parallel import __all__  # noqa: F401
