"""Which device (and which backend) a rank of a launched job should use: ``--device cuda`` in the examples.

torch scripts write ``torch.cuda.set_device(local_rank)`` and ``init_process_group("nccl")``; a
neural_arch script calls :func:`select_device` once, before ``init_process_group``:

* ``"cpu"`` -> ``("cpu", None)``: the backend comes from the environment (launcher -> gloo,
  ``mpiexec`` -> mpi);
* ``"cuda"`` -> ``("cuda:<local_rank % device_count>", backend)``: the backend is ``"nccl"`` when
  every rank on this host has a GPU of its own (NCCL refuses two ranks on one GPU) and the job was
  not started by ``mpiexec``; otherwise ``None`` (gloo or mpi, which stage CuPy arrays through the
  host). The chosen GPU is made current.

Example::

    device, backend = select_device(args.device)          # e.g. ("cuda:1", "nccl")
    dist.init_process_group(backend)
    model = model.to(device)
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from neural_arch import backend as _backend
from neural_arch.distributed.launch_env import detect_launch_env, launched_by_mpiexec

__all__ = ["select_device"]


def _gpu_count(stand_in: bool) -> int:
    from neural_arch import cuda

    count = cuda.device_count()
    return 1 if count == 0 and stand_in else count  # strict CUDA mode: the stand-in is one GPU


def select_device(requested: str = "cpu", environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """``(device string, backend name or None)`` for this rank; see the module docstring.

    >>> select_device("cpu", {})
    ('cpu', None)
    """
    environ = os.environ if environ is None else environ
    kind = str(requested).strip().lower()
    if kind == "cpu":
        return "cpu", None
    if kind != "cuda":
        raise ValueError(f"select_device: device must be 'cpu' or 'cuda', got {requested!r}")
    stand_in = _backend.is_registered_device_type("cuda")  # strict CUDA mode (tests), no CuPy
    count = _gpu_count(stand_in)
    if count == 0:
        raise RuntimeError("--device cuda: no CUDA GPU is visible here (neural_arch.cuda.device_count() == 0; "
                           "install the GPU extra `pip install neural_arch[gpu]` on a GPU machine) - or use "
                           "--device cpu")
    launch = detect_launch_env(environ)
    local_rank = launch["local_rank"] if launch else 0
    local_size = launch["local_world_size"] if launch else 1
    device = f"cuda:{local_rank % count}"
    if not stand_in:  # a real GPU: make it this thread's current device
        from neural_arch import cuda

        cuda.set_device(local_rank % count)
    own_gpu = local_size <= count
    backend = "nccl" if own_gpu and not stand_in and not launched_by_mpiexec(environ) else None
    return device, backend
