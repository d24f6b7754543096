"""The communication runtime: backends that move **arrays** (NumPy or CuPy), never Tensors.

==================  ==========================================================
module              what it owns
==================  ==========================================================
``backend``         the abstract :class:`Backend` (six primitives, the rest derived once)
``work``            :class:`Work` handles, :class:`ReduceOp`, :class:`OpInfo`
``debug``           per-op fingerprints for ``NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL``
``lanes``           the serial progress lane every collective runs on
``registry``        the name -> backend factory (lazy imports)
``algorithms/``     collective schedules as data (``plans``) and their ``executor``
``transport/``      framing, TCP and shared-memory links, the connection ``engine``
``gloo`` ``mpi`` ``local`` ``nccl/``   the backends
==================  ==========================================================

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
    is_backend_available,
    register_backend,
)
