"""The issue's path for context parallelism; it lives at torch's path,
:mod:`neural_arch.distributed.tensor.experimental` (this is a one-line face)."""

from neural_arch.distributed.tensor.experimental import *
from neural_arch.distributed.tensor.experimental import __all__  # noqa: F401
