"""Public path ``neural_arch.distributed.tensor_parallel`` (torch's ``torch.distributed.tensor.parallel``).

Everything lives in :mod:`neural_arch.distributed.parallel.tensor_parallel`; this module re-exports it.

Example::

    from neural_arch.distributed.tensor_parallel import ColumnParallelLinear, RowParallelLinear
"""

from neural_arch.distributed.parallel.tensor_parallel import *
from neural_arch.distributed.parallel.tensor_parallel import __all__  # noqa: F401
