"""``neural_arch.distributed.pipeline``: the public alias of
:mod:`neural_arch.distributed.parallel.pipeline` (pipeline parallelism).

Example::

    from neural_arch.distributed.pipeline import pipeline, PipelineStage, ScheduleGPipe
"""

from neural_arch.distributed.parallel.pipeline import *
from neural_arch.distributed.parallel.pipeline import __all__  # noqa: F401
