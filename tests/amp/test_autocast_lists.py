"""Which ``F.*`` ops autocast casts, against torch's tables: the losses, norms and distances added to
``nn.functional`` run in float32 inside a bfloat16 region (torch's float32 list; before, they computed
their sums in bfloat16, about 3 significant digits), ``prelu`` in the region's dtype (its lower list)."""

from __future__ import annotations

import numpy as np
import pytest

import neural_arch as na
from neural_arch.amp import FP32_OPS, LOWER_PRECISION_OPS, autocast
from neural_arch.core.tensor import Tensor
from neural_arch.nn import functional as F


def _bf16(shape, seed):
    data = np.random.default_rng(seed).normal(size=shape).astype(na.bfloat16)
    return Tensor(data)


CASES = {
    "l1_loss": lambda a, b: F.l1_loss(a, b),
    "smooth_l1_loss": lambda a, b: F.smooth_l1_loss(a, b),
    "huber_loss": lambda a, b: F.huber_loss(a, b),
    "kl_div": lambda a, b: F.kl_div(a, b, reduction="batchmean", log_target=True),
    "binary_cross_entropy_with_logits": lambda a, b: F.binary_cross_entropy_with_logits(a, (b > 0).astype(a.dtype)),
    "soft_margin_loss": lambda a, b: F.soft_margin_loss(a, (b > 0).astype(a.dtype) * 2 - 1),
    "cosine_similarity": lambda a, b: F.cosine_similarity(a, b),
    "pairwise_distance": lambda a, b: F.pairwise_distance(a, b),
    "normalize": lambda a, b: F.normalize(a),
    "softmin": lambda a, b: F.softmin(a, dim=-1),
    "softplus": lambda a, b: F.softplus(a),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_float32_ops_compute_in_float32_inside_a_bfloat16_region(name):
    assert name in FP32_OPS
    a, b = _bf16((4, 6), 0), _bf16((4, 6), 1)
    with autocast("cpu", dtype=na.bfloat16):
        got = CASES[name](a, b)
    want = CASES[name](a.astype(np.float32), b.astype(np.float32))     # the same inputs, in float32
    assert got.dtype == np.float32, (name, got.dtype)
    np.testing.assert_array_equal(got.data, want.data)


def test_prelu_runs_in_the_regions_dtype():
    assert "prelu" in LOWER_PRECISION_OPS
    x, w = Tensor(np.linspace(-2, 2, 8, dtype=np.float32)), Tensor(np.array([0.25], dtype=np.float32))
    with autocast("cpu", dtype=na.bfloat16):
        y = F.prelu(x, w)
    assert y.dtype == na.bfloat16
