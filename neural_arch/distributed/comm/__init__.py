"""The communication runtime: backends that move **arrays** (NumPy or CuPy), never Tensors.

What each module owns:

* :mod:`~neural_arch.distributed.comm.backend`: the abstract
  :class:`~neural_arch.distributed.comm.backend.Backend` (six primitives, the rest derived once)
* :mod:`~neural_arch.distributed.comm.work`: :class:`~neural_arch.distributed.comm.work.Work` handles,
  :class:`~neural_arch.distributed.comm.work.ReduceOp`, :class:`~neural_arch.distributed.comm.work.OpInfo`
* :mod:`~neural_arch.distributed.comm.runner`: the :class:`~neural_arch.distributed.comm.runner.OpRunner`
  every backend runs its operations through (numbering, debug checks, failure)
* :mod:`~neural_arch.distributed.comm.debug`: per-op fingerprints for ``NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL``
* :mod:`~neural_arch.distributed.comm.lanes`: the serial progress lane every collective runs on
* :mod:`~neural_arch.distributed.comm.spans`: the operation in flight and the timeline spans
* :mod:`~neural_arch.distributed.comm.dtypes`: the dtypes the backends move and reduce (bfloat16 too)
* :mod:`~neural_arch.distributed.comm.registry`: the name -> backend factory (lazy imports)
* the backends: :mod:`~neural_arch.distributed.comm.gloo` (with its collective schedules as data,
  ``gloo.plans``, their ``gloo.executor`` and the ``gloo.transport`` links),
  :mod:`~neural_arch.distributed.comm.mpi`, :mod:`~neural_arch.distributed.comm.nccl`,
  :mod:`~neural_arch.distributed.comm.local`

Nothing here imports ``Tensor``, ``nn`` or a parallel strategy.
"""

from neural_arch.distributed.comm.registry import (  # noqa: F401 - the package's public face
    AuthenticationError,
    Backend,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    DistributedError,
    NotInitializedError,
    OpInfo,
    PeerFailureError,
    ReduceOp,
    RendezvousError,
    Work,
    __all__,
    available_backends,
    get_backend_class,
    installed_backends,
    is_backend_available,
    mpi_importable,
    register_backend,
)
