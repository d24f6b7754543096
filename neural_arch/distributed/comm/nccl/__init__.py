"""The NCCL backend on CuPy (:mod:`.backend`) and its CuPy-facing helpers (:mod:`.support`)."""

from neural_arch.distributed.comm.nccl.backend import NCCLBackend  # noqa: F401
