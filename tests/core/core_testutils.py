"""Shared helpers for the core tests: a finite-difference gradient checker.

``check_grad(f, *arrays)`` builds float64 leaves from ``arrays``, runs ``f`` on them, backprops a
random upstream gradient, and compares every input's gradient with central differences of
``sum(f(...) * upstream)``.

Example::

    >>> import numpy as np
    >>> check_grad(lambda a: a * a, np.array([1.0, 2.0]))
"""

from __future__ import annotations

import numpy as np

from neural_arch.core.tensor import Tensor, no_grad

EPS = 1e-6


def numeric_grad(f, arrays, upstream, i, eps=EPS):
    """Central-difference gradient of ``sum(f(*arrays) * upstream)`` w.r.t. ``arrays[i]``."""
    base = [a.copy() for a in arrays]
    x = base[i]
    g = np.zeros_like(x)
    flat = x.reshape(-1)
    gflat = g.reshape(-1)
    with no_grad():
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + eps
            fp = float((f(*[Tensor(a) for a in base]).data * upstream).sum())
            flat[k] = old - eps
            fm = float((f(*[Tensor(a) for a in base]).data * upstream).sum())
            flat[k] = old
            gflat[k] = (fp - fm) / (2 * eps)
    return g


def check_grad(f, *arrays, wrt=None, seed=0, rtol=1e-5, atol=1e-6):
    """Assert analytic gradients of ``f`` match finite differences for inputs in ``wrt``."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    wrt = range(len(arrays)) if wrt is None else wrt
    leaves = [Tensor(a.copy(), requires_grad=(i in wrt)) for i, a in enumerate(arrays)]
    out = f(*leaves)
    rng = np.random.default_rng(seed)
    upstream = rng.standard_normal(out.shape)
    out.backward(Tensor(upstream))
    for i in wrt:
        num = numeric_grad(f, arrays, upstream, i)
        got = leaves[i].grad
        assert got is not None, f"input {i} received no gradient"
        assert got.shape == arrays[i].shape, f"input {i}: grad shape {got.shape} != {arrays[i].shape}"
        assert got.dtype == np.float64
        np.testing.assert_allclose(got.data, num, rtol=rtol, atol=atol, err_msg=f"input {i}")


def randn(seed, shape, positive=False, spread=False):
    """Seeded standard-normal float64 data (no ties, away from 0 when ``positive``)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.5
    if spread:
        # distinct values, well separated: safe for max/min/relu/abs/clip kinks
        n = int(np.prod(shape)) if shape else 1
        vals = (rng.permutation(n) - n / 2.0) * 0.3 + 0.05
        a = vals.reshape(shape)
    return a
