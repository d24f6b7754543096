"""Solution to notebook 10's exercise: one decode step of one attention head with a KV cache.

The cache holds every earlier position's key and value; the new position appends its own, then
its query attends over all of them: ``softmax(K q / sqrt(d)) @ V``. Causality comes for free:
the cache holds no later position. The max is subtracted before ``exp`` (the same softmax).

>>> import numpy as np
>>> cache = {}
>>> decode_step(np.ones(2), np.ones(2), np.array([1.0, 2.0]), cache)      # one position: its own value
array([1., 2.])
>>> decode_step(np.ones(2), -np.ones(2), np.array([3.0, 4.0]), cache).round(3), len(cache["k"])
(array([1.112, 2.112]), 2)
"""
import numpy as np


def decode_step(q, k, v, cache):
    cache.setdefault("k", []).append(k)
    cache.setdefault("v", []).append(v)
    keys, values = np.stack(cache["k"]), np.stack(cache["v"])        # (t, d): every position so far
    scores = keys @ q / np.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max())
    return (weights / weights.sum()) @ values
