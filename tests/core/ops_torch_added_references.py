"""Plain float64 references for the torch-namespace ops of ``tests/core/test_ops_torch_added_explore.py``
(``sin``... ``erf``, ``flip``, ``roll``, ``movedim``, ``tile``, ``diagonal``, ``repeat_interleave``,
``masked_select``, ``sort``, ``cumprod``, ``count_nonzero``, ``nonzero``, ``einsum``): each written
element by element from torch's documented definition (index arithmetic and Python loops, not the
NumPy routine the op itself calls). Nothing here imports ``neural_arch``: the references must not
share a bug with the code they check.

Example::

    >>> import numpy as np
    >>> roll(np.arange(4.0), (1,), None).tolist()
    [3.0, 0.0, 1.0, 2.0]
    >>> einsum("ij,j->i", [np.ones((2, 3)), np.arange(3.0)]).tolist()
    [3.0, 3.0]
"""

from __future__ import annotations

import itertools
import math

import numpy as np

#: name -> (forward of one float, derivative of one float or None for piecewise-constant ops)
UNARY = {
    "sin": (math.sin, math.cos),
    "cos": (math.cos, lambda v: -math.sin(v)),
    "erf": (math.erf, lambda v: 2.0 / math.sqrt(math.pi) * math.exp(-v * v)),
    "expm1": (math.expm1, math.exp),
    "log1p": (lambda v: math.log1p(v) if v > -1 else (-math.inf if v == -1 else math.nan),
              lambda v: 1.0 / (1.0 + v)),
    "log2": (lambda v: math.log2(v) if v > 0 else (-math.inf if v == 0 else math.nan),
             lambda v: 1.0 / (v * math.log(2.0))),
    "floor": (math.floor, None),
    "ceil": (math.ceil, None),
    "sign": (lambda v: 0.0 if v == 0 or math.isnan(v) else math.copysign(1.0, v), None),
    "round": (lambda v: float(round(v)), None),  # Python's round: halves to even, as torch
}


def unary(name, a):
    """``(forward, derivative)`` of ``UNARY[name]`` over every element of ``a``."""
    f, df = UNARY[name]
    flat = np.asarray(a, dtype=np.float64).reshape(-1)
    out = np.array([float(f(v)) for v in flat.tolist()], dtype=np.float64).reshape(np.shape(a))
    if df is None:
        return out, np.zeros(np.shape(a))
    return out, np.array([float(df(v)) for v in flat.tolist()], dtype=np.float64).reshape(np.shape(a))


def _at(a, idx):
    return a[tuple(idx)]


def flip(a, dims):
    out = np.empty_like(a)
    for idx in np.ndindex(*a.shape):
        src = [a.shape[d] - 1 - i if d in dims else i for d, i in enumerate(idx)]
        out[idx] = _at(a, src)
    return out


def roll(a, shifts, dims):
    """torch's roll: ``out[i] = a[(i - shift) mod n]`` along each dim (the flattened tensor for None)."""
    if dims is None:
        flat = a.reshape(-1)
        n = flat.size
        return np.array([flat[(i - shifts[0]) % n] for i in range(n)], dtype=a.dtype).reshape(a.shape)
    out = np.empty_like(a)
    for idx in np.ndindex(*a.shape):
        src = list(idx)
        for s, d in zip(shifts, dims):
            src[d] = (src[d] - s) % a.shape[d]
        out[idx] = _at(a, src)
    return out


def movedim(a, source, destination):
    nd = a.ndim
    source = [s % nd for s in source]
    destination = [d % nd for d in destination]
    order = [None] * nd
    for s, d in zip(source, destination):
        order[d] = s
    rest = [d for d in range(nd) if d not in source]
    for i in range(nd):
        if order[i] is None:
            order[i] = rest.pop(0)
    out = np.empty([a.shape[o] for o in order], dtype=a.dtype)
    for idx in np.ndindex(*out.shape):
        src = [0] * nd
        for i, o in enumerate(order):
            src[o] = idx[i]
        out[idx] = _at(a, src)
    return out


def tile(a, reps):
    nd = max(a.ndim, len(reps))
    reps = (1,) * (nd - len(reps)) + tuple(reps)
    base = a.reshape((1,) * (nd - a.ndim) + a.shape)
    out = np.empty([s * r for s, r in zip(base.shape, reps)], dtype=a.dtype)
    for idx in np.ndindex(*out.shape):
        out[idx] = _at(base, [i % s for i, s in zip(idx, base.shape)])
    return out


def diagonal(a, offset, d1, d2):
    d1, d2 = d1 % a.ndim, d2 % a.ndim
    rest = [d for d in range(a.ndim) if d not in (d1, d2)]
    n = max(0, min(a.shape[d1] - max(0, -offset), a.shape[d2] - max(0, offset)))
    out = np.empty([a.shape[d] for d in rest] + [n], dtype=a.dtype)
    for idx in np.ndindex(*out.shape):
        src = [0] * a.ndim
        for d, i in zip(rest, idx[:-1]):
            src[d] = i
        k = idx[-1]
        src[d1], src[d2] = k + max(0, -offset), k + max(0, offset)
        out[idx] = _at(a, src)
    return out


def repeat_interleave(a, counts, dim):
    if dim is None:
        a, dim = a.reshape(-1), 0
    pieces = []
    for i, c in enumerate(counts):
        pieces += [np.take(a, [i], axis=dim)] * int(c)
    shape = list(a.shape)
    shape[dim] = 0
    return np.concatenate(pieces, axis=dim) if pieces else np.empty(shape, dtype=a.dtype)


def masked_select(a, mask):
    shape = np.broadcast_shapes(a.shape, mask.shape)
    ab, mb = np.broadcast_to(a, shape), np.broadcast_to(mask, shape)
    return np.array([ab[idx] for idx in np.ndindex(*shape) if mb[idx]], dtype=a.dtype)


def _sort_key(v):
    return (1, 0.0) if math.isnan(v) else (0, v)  # NaN after every number (torch: NaN is the largest)


def sort(a, dim, descending):
    """``(values, indices)``: each slice along ``dim`` sorted stably (equal values keep their order
    in both directions), NaN as the largest value."""
    dim = dim % a.ndim
    moved = np.moveaxis(a, dim, -1)
    vals, inds = np.empty_like(moved), np.empty(moved.shape, dtype=np.int64)
    for idx in np.ndindex(*moved.shape[:-1]):
        row = moved[idx].tolist()
        if descending:  # sorted() is stable: negate the key, keep the index order for ties
            order = sorted(range(len(row)), key=lambda i: (-_sort_key(row[i])[0], -_sort_key(row[i])[1]))
        else:
            order = sorted(range(len(row)), key=lambda i: _sort_key(row[i]))
        inds[idx] = order
        vals[idx] = [row[i] for i in order]
    return np.moveaxis(vals, -1, dim), np.moveaxis(inds, -1, dim)


def cumprod(a, dim):
    dim = dim % a.ndim
    out = np.empty_like(a)
    for idx in np.ndindex(*a.shape):
        acc = 1.0
        for k in range(idx[dim] + 1):
            acc *= _at(a, idx[:dim] + (k,) + idx[dim + 1:])
        out[idx] = acc
    return out


def cumprod_grad(a, dim, g):
    """``d/dx_i = sum_{j >= i} g_j prod_{k <= j, k != i} x_k`` along ``dim`` (exact with zeros)."""
    dim = dim % a.ndim
    out = np.zeros_like(a)
    n = a.shape[dim]
    for idx in np.ndindex(*a.shape):
        i = idx[dim]
        line = [_at(a, idx[:dim] + (k,) + idx[dim + 1:]) for k in range(n)]
        gline = [_at(g, idx[:dim] + (k,) + idx[dim + 1:]) for k in range(n)]
        out[idx] = sum(gline[j] * math.prod(line[k] for k in range(j + 1) if k != i) for j in range(i, n))
    return out


def count_nonzero(a, dims):
    keep = [d for d in range(a.ndim) if d not in dims]
    out = np.zeros([a.shape[d] for d in keep], dtype=np.int64)
    for idx in np.ndindex(*a.shape):
        if a[idx] != 0:
            out[tuple(idx[d] for d in keep)] += 1
    return out


def nonzero(a):
    return np.array([idx for idx in np.ndindex(*a.shape) if a[idx] != 0], dtype=np.int64).reshape(-1, a.ndim)


def einsum(equation, arrays):
    """Brute force over every assignment of the letters (explicit ``->`` and no ellipsis)."""
    lhs, rhs = equation.split("->") if "->" in equation else (equation, None)
    subs = lhs.split(",")
    if rhs is None:
        letters = "".join(subs)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    sizes = {}
    for sub, arr in zip(subs, arrays):
        for c, n in zip(sub, arr.shape):
            if n != 1 or c not in sizes:  # a size-1 dim broadcasts against the letter's other size
                sizes[c] = n
    letters = sorted(sizes)
    out = np.zeros([sizes[c] for c in rhs])
    for values in itertools.product(*(range(sizes[c]) for c in letters)):
        at = dict(zip(letters, values))
        term = 1.0
        for sub, arr in zip(subs, arrays):  # a size-1 dim broadcasts: index 0
            term *= arr[tuple(at[c] if n != 1 else 0 for c, n in zip(sub, arr.shape))]
        out[tuple(at[c] for c in rhs)] += term
    return out
