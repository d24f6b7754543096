"""Fixtures of the GPU tests: skip with the reason when CuPy, NCCL or a GPU is missing.

The suite-wide conftest already skips tests marked ``gpu`` where CuPy sees no GPU; these
fixtures add the NCCL check (CuPy can run without libnccl).
"""

from __future__ import annotations

import pytest
from gpu_harness import gpu_skip_reason


@pytest.fixture
def cupy_gpu():
    """The cupy module, or a skip saying why there is none."""
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    import cupy
    return cupy


@pytest.fixture
def nccl_ready(cupy_gpu):
    """Skip unless the NCCL backend can start here; returns the number of GPUs."""
    from neural_arch.distributed.comm.nccl.support import missing_requirement
    reason = missing_requirement()
    if reason:
        pytest.skip(f"NCCL backend unavailable: {reason}")
    return int(cupy_gpu.cuda.runtime.getDeviceCount())
