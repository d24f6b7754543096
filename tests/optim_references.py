"""Reference optimizer updates in plain NumPy (one tensor, float64), written from torch's documented
formulas: what the optimizer tests compare against.

Example::

    want = rmsprop_ref(p0, grads, lr=0.01, momentum=0.5)
"""

from __future__ import annotations

import numpy as np


def rmsprop_ref(p, grads, lr, alpha=0.99, eps=1e-8, wd=0.0, momentum=0.0, centered=False, maximize=False):
    p = p.copy(); v = np.zeros_like(p); ga = np.zeros_like(p); buf = np.zeros_like(p)
    for g in grads:
        g = -g if maximize else g
        g = g + wd * p
        v = alpha * v + (1 - alpha) * g * g
        if centered:
            ga = alpha * ga + (1 - alpha) * g
            avg = np.sqrt(v - ga * ga) + eps
        else:
            avg = np.sqrt(v) + eps
        if momentum > 0:
            buf = momentum * buf + g / avg
            p = p - lr * buf
        else:
            p = p - lr * g / avg
    return p
