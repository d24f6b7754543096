"""Communication backends and the factory that picks one.

=========  ===========  ================================  =====================================================
name       devices      requirement                       use when
=========  ===========  ================================  =====================================================
``gloo``   cpu (cuda*)  nothing (pure Python + NumPy)     the default: CPU training on one or many hosts;
                                                          shared memory between ranks of one host, TCP between hosts
``mpi``    cpu (cuda*)  ``pip install neural_arch[mpi]``  the job is started by ``mpiexec``/``srun`` on a cluster
                        (mpi4py + an MPI library)         whose MPI is tuned for its network
``nccl``   cuda         ``pip install neural_arch[gpu]``  parameters live on NVIDIA GPUs
                        (CuPy with NCCL) and a GPU
``local``  cpu, cuda    nothing                           a world of one (notebook, plain ``python``)
=========  ===========  ================================  =====================================================

(*) CuPy arrays are staged through host memory on the CPU backends.

Backends are imported lazily: asking for ``gloo`` never imports mpi4py or cupy.

Example::

    from neural_arch.distributed.comm import get_backend_class, available_backends
    cls = get_backend_class("gloo")
    print(available_backends())     # e.g. ['gloo', 'local', 'mpi']
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Dict, List, Type

from neural_arch.distributed.comm.backend import Backend
from neural_arch.distributed.comm.work import OpInfo, ReduceOp, Work
from neural_arch.distributed.errors import (
    AuthenticationError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    DistributedError,
    NotInitializedError,
    PeerFailureError,
    RendezvousError,
)

# name -> "module:Class", resolved on first use
_REGISTRY: Dict[str, str] = {
    "gloo": "neural_arch.distributed.comm.gloo.backend:GlooBackend",
    "mpi": "neural_arch.distributed.comm.mpi.backend:MPIBackend",
    "nccl": "neural_arch.distributed.comm.nccl.backend:NCCLBackend",
    "local": "neural_arch.distributed.comm.local:LocalBackend",
}
_INSTALL_HINT = {
    "mpi": "pip install 'neural_arch[mpi]' (mpi4py and the mpich wheel)",
    "nccl": "pip install 'neural_arch[gpu]' (cupy-cuda12x) on a machine with an NVIDIA GPU",
}


def register_backend(name: str, target: "str | Type[Backend]") -> None:
    """Register a backend class (or a lazy ``"module:Class"`` path) under ``name``.

    Example::

        register_backend("mine", "my_package.comm:MyBackend")     # imported on first use
        init_process_group(backend="mine")
    """
    if not isinstance(target, str):
        target = f"{target.__module__}:{target.__qualname__}"
    _REGISTRY[name.lower()] = target


def get_backend_class(name: str) -> Type[Backend]:
    """The backend class registered as ``name`` (case-insensitive); a clear error otherwise.

    Example::

        >>> get_backend_class("Local").__name__
        'LocalBackend'
    """
    key = str(name).lower()
    if key not in _REGISTRY:
        raise ValueError(f"backend={name!r} is unknown; choose one of {sorted(_REGISTRY)}")
    module_name, cls_name = _REGISTRY[key].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = _INSTALL_HINT.get(key, "")
        raise ImportError(f"the {key!r} backend cannot be imported ({exc}). {hint}".strip()) from exc
    return getattr(module, cls_name)


def is_backend_available(name: str) -> bool:
    """Whether ``name``'s requirements are installed (imports the module, never starts it).

    Example::

        >>> is_backend_available("gloo")
        True
    """
    try:
        return bool(get_backend_class(name).is_available())
    except ImportError:
        return False


def mpi_importable() -> bool:
    """Whether mpi4py is installed, found without importing it: importing ``mpi4py.MPI``
    initialises MPI, which must not happen in a process that is not going to use it.

    Example::

        >>> mpi_importable() in (True, False)
        True
    """
    return importlib.util.find_spec("mpi4py") is not None


def installed_backends() -> List[str]:
    """Backends whose requirements are installed, found without importing them: importing
    cupy (for nccl) is slow, and on a machine without a GPU driver it can even crash the process.

    Example::

        >>> {"gloo", "local"} <= set(installed_backends())
        True
    """
    names = ["gloo", "local"]
    if mpi_importable():
        names.append("mpi")
    if importlib.util.find_spec("cupy") is not None:
        names.append("nccl")
    return sorted(names)


def available_backends() -> List[str]:
    """Backends that can be used here: each registered one whose module imports and whose
    requirements are met.

    Unlike :func:`~neural_arch.distributed.comm.registry.installed_backends`, this imports the
    backends.

    Example::

        >>> "gloo" in available_backends()
        True
    """
    return sorted(name for name in _REGISTRY if is_backend_available(name))


__all__ = [
    "Backend", "Work", "OpInfo", "ReduceOp", "register_backend", "get_backend_class", "is_backend_available",
    "available_backends", "installed_backends", "mpi_importable", "DistributedError", "NotInitializedError", "CollectiveTimeoutError",
    "PeerFailureError", "CollectiveMismatchError", "RendezvousError", "AuthenticationError",
]
