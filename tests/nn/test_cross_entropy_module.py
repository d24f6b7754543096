"""nn.CrossEntropyLoss passes torch's options through: label_smoothing, soft (B, T, C) targets."""
import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core.tensor import Tensor


def _log_softmax(x):
    z = x - x.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_label_smoothing_matches_the_formula_on_sequence_logits():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 5))
    t = rng.integers(0, 5, size=(2, 3))
    eps = 0.2
    logp = _log_softmax(x.reshape(-1, 5))
    nll = -logp[np.arange(6), t.reshape(-1)]
    expected = ((1 - eps) * nll - eps * logp.mean(-1)).mean()
    got = nn.CrossEntropyLoss(label_smoothing=eps)(Tensor(x), Tensor(t)).item()
    assert got == pytest.approx(expected, rel=1e-12)
    assert "label_smoothing=0.2" in repr(nn.CrossEntropyLoss(label_smoothing=eps))


def test_soft_targets_of_the_logits_shape_keep_their_class_axis():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3, 4))
    p = rng.random((2, 3, 4))
    p /= p.sum(-1, keepdims=True)
    expected = -(p.reshape(-1, 4) * _log_softmax(x.reshape(-1, 4))).sum(-1).mean()
    got = nn.CrossEntropyLoss()(Tensor(x), Tensor(p)).item()
    assert got == pytest.approx(expected, rel=1e-12)


def test_label_smoothing_out_of_range_is_refused_at_construction():
    with pytest.raises(ValueError, match="label_smoothing"):
        nn.CrossEntropyLoss(label_smoothing=1.5)

