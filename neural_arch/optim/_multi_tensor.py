"""Multi-tensor ("foreach") driver shared by RMSprop, Adagrad, LAMB and LARS.

A model with many small parameters spends most of a per-parameter update in Python and NumPy
call overhead (ten-odd calls per parameter). The foreach path instead gathers the gradients of a
group (with ``foreach=None``: its tensors of at most ``SMALL`` elements; ``foreach=True``: all of
them; ``foreach=False``: none) into one flat vector, keeps the group's optimizer state in flat vectors, runs the update
math once on the flat vectors, and writes each parameter back with one copy.

The per-parameter entries of ``optimizer.state`` stay the public face of the state: they are
*views* into the flat vectors, so ``state_dict()`` and ``optimizer.state[p]`` read as usual.
When the views are replaced (``load_state_dict``) or the set of parameters with gradients changes,
the flat vectors are rebuilt from the per-parameter entries before the next update.

Each optimizer writes its math once, against a :class:`Segments` description: the per-tensor
path calls it with a single segment, the foreach path with one segment per parameter (per-tensor
norms, as LAMB and LARS need, come from :meth:`Segments.norms`).

Example::

    >>> import numpy as np
    >>> seg = Segments([3, 2])
    >>> seg.norms(np.array([3.0, 4.0, 0.0, 0.0, 1.0])).tolist()
    [5.0, 5.0, 5.0, 1.0, 1.0]
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Segments", "foreach_usable", "run_group"]


class Segments:
    """Lengths of consecutive tensors inside one flat vector."""

    def __init__(self, sizes):
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.single = len(self.sizes) == 1

    def norms(self, x):
        """The 2-norm of each segment of ``x``, repeated over that segment's elements."""
        if self.single:  # NumPy or CuPy: vdot dispatches to the array's module
            return math.sqrt(float(x.ravel() @ x.ravel())) if x.size else 0.0
        sq = np.square(x, dtype=np.float64 if x.dtype.itemsize < 8 else x.dtype)
        nonempty = self.sizes > 0
        sums = np.zeros(len(self.sizes), dtype=sq.dtype)
        if nonempty.any():
            # reduceat misreads empty segments; reduce over the non-empty starts only.
            sums[nonempty] = np.add.reduceat(sq, self.starts[nonempty])
        return np.repeat(np.sqrt(sums).astype(x.dtype, copy=False), self.sizes)


# With foreach=None only tensors up to this many elements take the flat path: for them call
# overhead dominates; for larger ones the extra gather/scatter copies cost more than the calls
# they save (measured with benchmarks/bench_optim.py: 4x slower at 1M-element tensors).
SMALL = 16384


def foreach_usable(flag, pairs) -> bool:
    """Whether these ``(param, grad)`` pairs may take the flat path: ``foreach`` not False, at least
    two, NumPy arrays (not CuPy) of one dtype."""
    if flag is False or len(pairs) < 2:
        return False
    dtype = pairs[0][0].data.dtype
    for p, g in pairs:
        if type(p.data) is not np.ndarray or not isinstance(g, np.ndarray) or p.data.dtype != dtype:
            return False
    return True


def _flat_state(optimizer, gi, params, names, init):
    """Flat vectors for state ``names`` of group ``gi``, with ``state[p][name]`` as views into them."""
    cache = optimizer.__dict__.setdefault("_foreach_cache", {})
    key = tuple(id(p) for p in params)
    entry = cache.get(gi)
    if entry is not None and entry[0] == key and all(
            optimizer.state.get(p, {}).get(name) is view
            for p, views in zip(params, entry[2]) for name, view in views.items()):
        return entry[1]
    for p in params:
        state = optimizer.state.setdefault(p, {})
        if not state:
            init(state, p.data)
    flats, views = {}, [{} for _ in params]
    for name in names:
        flats[name] = np.concatenate([np.asarray(optimizer.state[p][name]).ravel() for p in params])
        off = 0
        for i, p in enumerate(params):
            n = p.data.size
            v = flats[name][off:off + n].reshape(p.data.shape)
            optimizer.state[p][name] = v
            views[i][name] = v
            off += n
    cache[gi] = (key, flats, views)
    return flats


def run_group(optimizer, gi, group, names, init, update):
    """Apply ``update(d, g, st, step, seg, group)`` to every parameter of ``group`` with a gradient.

    ``init(state, data)`` fills a fresh parameter's state (``step`` plus the arrays in ``names``);
    ``update`` changes ``d`` (parameter values) and the arrays of ``st`` in place. On the flat path
    ``d``, ``g`` and ``st`` are concatenations over the group and ``seg`` describes the layout.
    """
    pairs = list(optimizer._params_with_grad(group))
    flag = group.get("foreach")
    # foreach=True: every tensor flat (torch's meaning: the user asked for it); None: the small ones.
    flat = pairs if flag else [pr for pr in pairs if pr[0].data.size <= SMALL] if flag is None else []
    if foreach_usable(flag, flat) and _flat_step(optimizer, gi, group, flat, names, init, update):
        done = {id(p) for p, _ in flat}
        pairs = [pr for pr in pairs if id(pr[0]) not in done]
    for p, g in pairs:
        state = optimizer.state.setdefault(p, {})
        if not state:
            init(state, p.data)
        state["step"] += 1
        d = p.data
        one = Segments([d.size])
        if d.ndim == 0:  # 0-d arrays: work on a 1-element view so in-place ops apply
            d, g = d.reshape(1), np.asarray(g).reshape(1)
            st = {k: (v.reshape(1) if hasattr(v, "reshape") and getattr(v, "ndim", 1) == 0 else v)
                  for k, v in state.items()}
        else:
            st = state
        update(d, g, st, state["step"], one, group)


def _flat_step(optimizer, gi, group, pairs, names, init, update) -> bool:
    """The flat update of ``pairs``; False (nothing done) when their step counts differ."""
    params = [p for p, _ in pairs]
    flats = _flat_state(optimizer, gi, params, names, init)
    steps = {optimizer.state[p]["step"] for p in params}
    if len(steps) != 1:  # one shared step count (bias corrections, lr_decay) for the flat update
        return False
    step = steps.pop() + 1
    for p in params:
        optimizer.state[p]["step"] = step
    d = np.concatenate([p.data.ravel() for p in params])
    g = np.concatenate([gr.ravel() for _, gr in pairs]).astype(d.dtype, copy=False)
    update(d, g, flats, step, Segments([p.data.size for p in params]), group)
    off = 0
    for p in params:  # in place: DDP/ZeRO hold references to these very arrays
        n = p.data.size
        p.data[...] = d[off:off + n].reshape(p.data.shape)
        off += n
    return True
