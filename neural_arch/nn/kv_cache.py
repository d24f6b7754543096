"""A key/value cache for incremental (autoregressive) decoding, as Hugging Face's ``DynamicCache``.

Each attention layer appends the keys and values of the new tokens to its slot and attends over
everything cached so far, so decoding token ``t`` costs O(t) instead of recomputing the whole
prefix. ``CausalSelfAttention.forward(x, kv_cache=cache, layer_idx=i)`` calls :meth:`KVCache.update`;
``GPT.generate`` creates one cache per call.

The cache holds plain arrays (NumPy or CuPy) of shape ``(batch, heads, seq, head_dim)``: it is an
inference tool, so gradients do not flow into cached keys and values from earlier steps.

Example::

    >>> import numpy as np
    >>> from neural_arch.nn.kv_cache import KVCache
    >>> cache = KVCache()
    >>> k, v = cache.update(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4)), layer_idx=0)
    >>> k, v = cache.update(np.ones((1, 2, 1, 4)), np.ones((1, 2, 1, 4)), layer_idx=0)
    >>> k.shape, cache.get_seq_length()
    ((1, 2, 4, 4), 4)
"""

from __future__ import annotations

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor

__all__ = ["KVCache"]


def _array(x):
    return x.data if isinstance(x, Tensor) else x


class KVCache:
    """Per-layer growing key/value arrays; ``len(cache)`` is the number of layers seen so far.

    Example::

        >>> import numpy as np
        >>> from neural_arch.nn.kv_cache import KVCache
        >>> cache = KVCache()
        >>> k, v = cache.update(np.ones((1, 2, 3, 4)), np.ones((1, 2, 3, 4)), layer_idx=0)
        >>> k, v = cache.update(np.ones((1, 2, 1, 4)), np.ones((1, 2, 1, 4)), layer_idx=0)
        >>> k.shape, len(cache), cache.get_seq_length()
        ((1, 2, 4, 4), 1, 4)
    """

    def __init__(self) -> None:
        self.key_cache: list = []
        self.value_cache: list = []
        #: Set by ``GPT.forward`` when an attention mask with padding came with the cached positions:
        #: then every later step must bring the mask too (without it the padding would be attended).
        self.padded = False

    def __len__(self) -> int:
        return len(self.key_cache)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """How many positions layer ``layer_idx`` has cached (0 before its first update)."""
        if layer_idx >= len(self.key_cache):
            return 0
        return int(self.key_cache[layer_idx].shape[-2])

    def update(self, key_states, value_states, layer_idx: int):
        """Append ``(B, H, T, D)`` keys and values to layer ``layer_idx``; return all of its keys and
        values, ``(B, H, past + T, D)`` arrays (the new ones last)."""
        k, v = _array(key_states), _array(value_states)
        if layer_idx > len(self.key_cache):
            raise ValueError(f"KVCache.update: layer_idx {layer_idx} skips layers (the cache holds "
                             f"{len(self.key_cache)}); update the layers in order, starting at 0")
        if layer_idx == len(self.key_cache):
            self.key_cache.append(k)
            self.value_cache.append(v)
        else:
            old_k, old_v = self.key_cache[layer_idx], self.value_cache[layer_idx]
            if old_k.shape[:2] != k.shape[:2] or old_k.shape[-1] != k.shape[-1]:
                raise ValueError(f"KVCache.update: layer {layer_idx} caches keys of shape {tuple(old_k.shape)}, "
                                 f"the new ones have shape {tuple(k.shape)}; batch, heads and head_dim must "
                                 "stay the same (start a new KVCache for a new batch)")
            xp = _backend.get_array_module(old_k)
            self.key_cache[layer_idx] = xp.concatenate([old_k, k], axis=-2)
            self.value_cache[layer_idx] = xp.concatenate([old_v, v], axis=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self)}, seq_length={self.get_seq_length()})"
