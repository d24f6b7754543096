"""The NCCL backend's native uneven all-to-all on a real GPU (marked ``gpu``: skips, with the reason,
where CuPy, libnccl or a GPU is missing). ``benchmarks/gpu_check.py`` runs this file as its
``alltoallv-nccl`` step.

One GPU runs the hook for one rank (its row slices, pointers and the local copy on real device memory);
the peer exchange needs one GPU per rank (NCCL's rule), so the multi-rank test needs 2 GPUs and skips
saying so on one. The same logic is checked on 2-4 ranks without a GPU in ``test_nccl_nogpu.py``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from gpu_harness import spawn

pytestmark = pytest.mark.gpu


@pytest.fixture
def solo(nccl_ready):
    from neural_arch.distributed.comm.nccl.backend import NCCLBackend
    from neural_arch.distributed.rendezvous.store import TCPStore
    store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=30)
    backend = NCCLBackend.create(store, 0, 1, timeout=30)
    yield backend
    backend.shutdown()
    store.close()


@pytest.mark.parametrize("rows", [0, 5])
def test_single_rank_alltoallv_hook_on_device(solo, rows):
    import cupy as cp
    x = cp.arange(rows * 3, dtype=cp.float64).reshape(rows, 3)
    out = cp.full((rows, 3), -1.0)
    info = solo._new_info("all_to_allv", x)
    info.deadline = time.monotonic() + 30
    solo._alltoallv(out, x, [rows], [rows], info)          # the hook itself: a world of one skips it
    np.testing.assert_array_equal(cp.asnumpy(out), cp.asnumpy(x))
    assert solo.alltoallv(out, x, [rows], [rows]).result() is out


def test_alltoallv_ranks_vs_numpy_moving_only_real_rows(nccl_ready):
    if nccl_ready < 2:
        pytest.skip(f"one GPU: the peer exchange needs one GPU per rank (NCCL), this machine has {nccl_ready}")
    results = spawn("alltoallv", min(nccl_ready, 4), timeout=120)
    bad = [r for r in results if not r.get("ok")]
    assert not bad, "\n".join(r.get("traceback") or r.get("error", "") for r in bad)
    for r in results:
        assert r["fails"] == [], r["fails"]
