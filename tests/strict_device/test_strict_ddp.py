"""DDP (2 gloo ranks) with parameters on the strict fake device, through the public API only:
gradients are averaged across ranks, everything stays on the device, and training equals
single-process NumPy training on the global batch.

The CPU backends stage device arrays through the host with the one host-transfer pair
(``backend.to_host`` / ``backend.to_device_like``) and recognise them with ``backend.is_array`` /
``backend.get_array_module``: a fake device array goes the same way a CuPy array does.
"""

from __future__ import annotations

import pytest
import strict_ddp_fns as fns

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(120)


def test_ddp_on_device_matches_single_process_training():
    with RankPool(2, backend="gloo", timeout=30.0) as pool:
        results = pool.run(fns.ddp_on_fake_device)
    for rank, (diff, on_device) in enumerate(results):
        assert on_device, f"rank {rank}: parameters or gradients left the device"
        assert diff <= 1e-10, f"rank {rank}: DDP differs from single-process training by {diff:g}"
