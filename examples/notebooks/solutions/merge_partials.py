"""Solution to notebook 05's exercise: merge two partial attentions of the same queries.

Each side is the attention over its own keys, normalised by its own mass ``exp(lse)``; together
the mass is ``exp(lse_a) + exp(lse_b)``, so ``lse = logaddexp(lse_a, lse_b)`` and each side's output
is weighted by its share, ``exp(lse_side - lse)`` (at most 1: nothing overflows, however large the
scores). A side with ``lse = -inf`` saw nothing and gets weight 0.

>>> import numpy as np
>>> out, lse = merge_partials(np.array([[0.0]]), np.array([0.0]), np.array([[2.0]]), np.array([0.0]))
>>> out, lse.round(4)                                    # equal mass: the mean; lse = log 2
(array([[1.]]), array([0.6931]))
"""
import numpy as np


def merge_partials(out_a, lse_a, out_b, lse_b):
    lse = np.logaddexp(lse_a, lse_b)
    safe = np.where(np.isneginf(lse), 0.0, lse)            # both empty: keep the zeros, no NaN
    w_a, w_b = np.exp(lse_a - safe)[..., None], np.exp(lse_b - safe)[..., None]
    return w_a * out_a + w_b * out_b, lse
