"""Differentiable shape ops: reshape/view, transpose/permute, expand, clone, casting and device
moves, indexing (basic, integer-array, boolean, the triangles ``tril``/``triu``, torch's ``gather``,
``scatter_add`` and ``index_select``) and joining/splitting (cat, stack, split, chunk).

Example::

    >>> import numpy as np
    >>> from neural_arch.core.tensor import Tensor
    >>> x = Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    >>> x[np.array([0, 0])].sum().backward()     # repeated rows: gradients accumulate
    >>> x.grad.tolist()
    [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]
"""

from __future__ import annotations

from builtins import max as builtins_max

import numpy as np

from .. import backend as _backend
from . import autograd as _ag
from . import dtypes as _dtypes
from .autograd import Node
from .op_utils import _SCALARS, _needs, _result, _same_device, _xp, unbroadcast
from .op_utils import scatter_add as _scatter_add_at
from .tensor import Tensor, _check_dim


# ============================================================================ shape ops
def _shape_arg(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return shape


def reshape(x: Tensor, *shape) -> Tensor:
    """Reshape (a view when possible). ``x.reshape(2, 3)`` or ``x.reshape((2, 3))``.

    Example::

        >>> import neural_arch as na
        >>> na.arange(6).reshape(2, 3).shape
        (2, 3)
    """
    shape = _shape_arg(shape)
    xd = x.data
    out = xd.reshape(shape)
    if not _needs(x):
        return _result(out, None)
    ish = xd.shape
    return _result(out, Node(lambda g: (g.reshape(ish),), (x,), "Reshape", fresh=False))


def _view_array(xd, shape):
    """``xd`` reshaped without copying, or torch's error when only a copy could do it."""
    try:
        return xd.reshape(shape, copy=False)
    except TypeError:  # NumPy < 2.1 / CuPy: no copy= keyword; their reshape of a view may copy
        out = xd.reshape(shape)
        if out.size and not _backend.get_array_module(xd).shares_memory(out, xd):
            raise _view_error(xd, shape) from None
        return out
    except ValueError as exc:
        if "copy" in str(exc):
            raise _view_error(xd, shape) from None
        raise RuntimeError(f"shape {list(shape)} is invalid for input of size {xd.size}") from None


def _view_error(xd, shape):
    return RuntimeError(
        f"view size {list(shape)} is not compatible with the input tensor's size and stride "
        f"(shape {list(xd.shape)}, not contiguous): use .reshape(...) instead (it copies when needed), "
        f"or .contiguous().view(...)"
    )


def view(x: Tensor, *shape) -> Tensor:
    """torch's ``view``: the same data with a new shape, never a copy (raises where one is needed).

    ``view(dtype)`` reinterprets the bytes as another dtype of the same size (no gradient).

    >>> import numpy as np
    >>> Tensor(np.arange(6.0)).view(2, -1).shape
    (2, 3)
    """
    if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int, np.integer)):
        return _result(x.data.view(_dtypes.as_dtype(shape[0])), None)
    shape = _shape_arg(shape)
    xd = x.data
    out = _view_array(xd, shape)
    if not _needs(x):
        return _result(out, None)
    ish = xd.shape
    return _result(out, Node(lambda g: (g.reshape(ish),), (x,), "View", fresh=False))


def clone(x: Tensor) -> Tensor:
    """A copy of the data with the gradient flowing back to ``x`` (torch's ``clone``).

    Example::

        >>> import neural_arch as na
        >>> x = na.ones(2)
        >>> y = x.clone()
        >>> y.data is x.data, y.tolist()
        (False, [1.0, 1.0])
    """
    xd = x.data
    out = xd.copy()
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g,), (x,), "Clone", fresh=False))


def contiguous(x: Tensor) -> Tensor:
    """``x`` itself when its data is C-contiguous, else a contiguous differentiable copy.

    Example::

        >>> import neural_arch as na
        >>> x = na.ones(2, 3)
        >>> x.contiguous() is x, x.T.contiguous().data.flags["C_CONTIGUOUS"]
        (True, True)
    """
    if x.data.flags.c_contiguous:
        return x
    xd = x.data
    out = _xp(xd).ascontiguousarray(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g,), (x,), "Contiguous", fresh=False))


def transpose(x: Tensor, *axes) -> Tensor:
    """Permute axes (reverse them when none given), like ``ndarray.transpose``.

    ``transpose(x, d0, d1)`` with exactly two axes swaps those two (torch style; the identity on a
    0-d or 1-d tensor), and a dim out of range raises ``IndexError`` as in torch.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3, 4).transpose(2, 0, 1).shape
        (4, 2, 3)
    """
    axes = _shape_arg(axes)
    xd = x.data
    if len(axes) == 2:
        # torch's transpose(dim0, dim1): a swap (out-of-range dims raise rather than wrap around;
        # on a 0-d or 1-d tensor the swap is the identity)
        perm = list(range(xd.ndim))
        i, j = _check_dim(axes[0], xd.ndim), _check_dim(axes[1], xd.ndim)
        if xd.ndim:
            perm[i], perm[j] = perm[j], perm[i]
        axes = tuple(perm)
    if not axes:
        axes = tuple(range(xd.ndim))[::-1]
    axes = tuple(_check_dim(a, xd.ndim) for a in axes) if xd.ndim else ()
    out = xd.transpose(axes)
    if not _needs(x):
        return _result(out, None)
    inv = tuple(np.argsort(axes)) if axes else ()
    return _result(out, Node(lambda g: (g.transpose(inv),), (x,), "Transpose", fresh=False))


def permute(x: Tensor, *axes) -> Tensor:
    """Reorder all axes: ``x.permute(2, 0, 1)``.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3, 4).permute(2, 0, 1).shape
        (4, 2, 3)
    """
    axes = _shape_arg(axes)
    if len(axes) != x.ndim:
        raise ValueError(f"permute needs {x.ndim} axes for a {x.ndim}-d tensor, got {axes}")
    axes = _unique_dims(axes, x.ndim, "permute") if x.ndim else tuple(axes)
    xd = x.data
    out = xd.transpose(axes)
    if not _needs(x):
        return _result(out, None)
    inv = tuple(np.argsort([a % xd.ndim for a in axes]))
    return _result(out, Node(lambda g: (g.transpose(inv),), (x,), "Permute", fresh=False))


def swapaxes(input: Tensor, axis0: int, axis1: int) -> Tensor:
    """Exchange axes ``axis0`` and ``axis1`` (a view; torch's ``swapaxes``, an alias of
    ``transpose(input, dim0, dim1)``); a dim out of range is torch's ``IndexError``.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3).swapaxes(0, 1).shape
        (3, 2)
    """
    return transpose(input, axis0, axis1)


def swapdims(input: Tensor, dim0: int, dim1: int) -> Tensor:
    """torch's ``transpose(input, dim0, dim1)`` (also named ``swapdims``): exactly two dims swapped,
    the form ``neural_arch.transpose`` takes (the method ``x.transpose(...)`` also takes NumPy's
    full permutation).

    Example::

        >>> import neural_arch as na
        >>> na.transpose(na.ones(2, 3, 4), 0, -1).shape, na.swapdims(na.ones(2, 3), dim0=0, dim1=1).shape
        ((4, 3, 2), (3, 2))
    """
    return transpose(input, dim0, dim1)


def squeeze(x: Tensor, dim=None, *, axis=None) -> Tensor:
    """Drop dimensions of size 1: all of them, or those among ``dim`` (an int or a tuple).

    As in torch, naming a dimension whose size is not 1 leaves it alone (NumPy would raise).

    Example::

        >>> import neural_arch as na
        >>> na.ones(1, 3, 1).squeeze().shape, na.ones(1, 3, 1).squeeze(0).shape
        ((3,), (3, 1))
    """
    dim = axis if dim is None else dim
    shape = x.shape
    if dim is None:
        new = tuple(s for s in shape if s != 1)
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        drop = {_check_dim(d, len(shape)) for d in dims}
        new = tuple(s for i, s in enumerate(shape) if not (i in drop and s == 1))
    return reshape(x, *new) if new != shape else x


def unsqueeze(x: Tensor, dim=None, *, axis=None) -> Tensor:
    """Insert a dimension of size 1 at ``dim`` (``-1`` appends one, as in torch).

    Example::

        >>> import neural_arch as na
        >>> na.ones(3).unsqueeze(0).shape, na.ones(3).unsqueeze(-1).shape
        ((1, 3), (3, 1))
    """
    dim = axis if dim is None else dim
    if dim is None:
        raise TypeError("unsqueeze() missing required argument 'dim'")
    return reshape(x, *_xp(x.data).expand_dims(x.data, dim).shape)


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims ``start_dim`` to ``end_dim`` (inclusive) into one, as torch's ``flatten``.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3, 4).flatten().shape, na.ones(2, 3, 4).flatten(1).shape
        ((24,), (2, 12))
    """
    shape = x.shape
    s, e = _check_dim(start_dim, len(shape)), _check_dim(end_dim, len(shape))
    if s > e:
        raise RuntimeError(f"flatten() has invalid args: start_dim ({start_dim}) cannot come after end_dim "
                           f"({end_dim}) for a {len(shape)}-d tensor")
    if not shape:
        return reshape(x, 1)
    n = 1
    for d in shape[s : e + 1]:
        n *= d
    return reshape(x, *(shape[:s] + (n,) + shape[e + 1 :]))


def expand(x: Tensor, *sizes) -> Tensor:
    """torch's ``expand``: broadcast to ``sizes`` (a view); ``-1`` keeps that dimension's size.

    Example::

        >>> import neural_arch as na
        >>> na.ones(1, 3).expand(2, -1).shape
        (2, 3)
    """
    sizes = tuple(_shape_arg(sizes))
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise RuntimeError(
            f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to the "
            f"number of dimensions in the tensor ({x.ndim})"
        )
    shape = []
    for i, s in enumerate(sizes):
        if s == -1:
            if i < lead:
                raise RuntimeError(f"expand: -1 is not allowed for a new leading dimension (sizes {sizes})")
            s = x.shape[i - lead]
        shape.append(int(s))
    return broadcast_to(x, tuple(shape))


def broadcast_to(x: Tensor, shape) -> Tensor:
    """Broadcast to ``shape`` with NumPy's rules (a view); the gradient is summed back to ``x``'s shape.

    Example::

        >>> import neural_arch as na
        >>> na.ones(3).broadcast_to((2, 3)).shape
        (2, 3)
    """
    xd = x.data
    out = _xp(xd).broadcast_to(xd, tuple(shape))
    if not _needs(x):
        return _result(out, None)
    ish = xd.shape
    return _result(out, Node(lambda g: (unbroadcast(g, ish),), (x,), "BroadcastTo", fresh=False))


def astype(x: Tensor, dtype) -> Tensor:
    """Cast (differentiable between float dtypes; casting to int/bool gives a no-grad tensor).

    Example::

        >>> import neural_arch as na
        >>> na.ones(2).astype(na.float64).dtype
        dtype('float64')
    """
    xd = x.data
    dtype = _dtypes.as_dtype(dtype)
    if dtype.name == "bfloat16" and type(xd) is not np.ndarray:
        raise TypeError("bfloat16 is CPU-only here (CuPy has no bfloat16): use float16 on the GPU")
    out = xd.astype(dtype, copy=False)
    if out is xd:
        return x
    if not _needs(x) or not _dtypes.is_floating_dtype(out.dtype):
        return _result(out, None)
    src = xd.dtype
    return _result(out, Node(lambda g: (g.astype(src),), (x,), "Cast"))


def to_device(x: Tensor, device) -> Tensor:
    """Move to ``device``; gradients flow back to the source device.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2).to("cpu").device
        'cpu'
    """
    xd = x.data
    out = _backend.to_device(xd, device)
    if out is xd:
        return x
    if not _needs(x):
        return _result(out, None)
    src = _backend.device_of(xd)
    return _result(out, Node(lambda g: (_backend.to_device(g, src),), (x,), "ToDevice"))


# ============================================================================ indexing
def _is_basic_index(idx) -> bool:
    if not isinstance(idx, tuple):
        idx = (idx,)
    for i in idx:
        if not (i is None or i is Ellipsis or isinstance(i, (slice, int, np.integer))) or isinstance(
            i, bool
        ):
            return False
    return True


def _convert_index(idx, like=None):
    """Unwrap Tensor indices; lists become arrays. For GPU data, index arrays move to its device."""
    if isinstance(idx, Tensor):
        idx = idx.data
    elif isinstance(idx, tuple):
        idx = tuple(i.data if isinstance(i, Tensor) else i for i in idx)
    elif isinstance(idx, list):
        idx = np.asarray(idx)
    if like is not None and type(like) is not np.ndarray:
        dev = _backend.device_of(like)
        def move(i):
            is_array = hasattr(i, "__array__") and not isinstance(i, np.generic)
            return _backend.to_device(i, dev) if is_array else i

        idx = tuple(move(i) for i in idx) if isinstance(idx, tuple) else move(idx)
    return idx


def _index_tensors(idx):
    """The Tensors inside an index (the backward scatters through their arrays), or None."""
    if isinstance(idx, Tensor):
        return (idx,)
    if isinstance(idx, tuple):
        return tuple(i for i in idx if isinstance(i, Tensor)) or None
    return None


def getitem(x: Tensor, idx) -> Tensor:
    """``x[idx]``: slicing, integer-array and boolean indexing. The gradient is scattered back
    with ``add.at`` for advanced indices (repeated indices accumulate).

    Example::

        >>> import neural_arch as na
        >>> x = na.arange(6).reshape(2, 3)
        >>> x[1].tolist(), x[:, 0].tolist()
        ([3, 4, 5], [0, 3])
    """
    xd = x.data
    given = idx
    idx = _convert_index(idx, xd)
    out = xd[idx]
    if not _needs(x):
        return _result(out, None)
    basic = _is_basic_index(idx)
    # A lone boolean mask selects each element at most once, so assignment is exact too.
    mask_only = getattr(idx, "dtype", None) is not None and idx.dtype == bool

    def fn(g):
        xp = _xp(xd)
        gx = xp.zeros(xd.shape, dtype=g.dtype)
        if basic or mask_only:
            gx[idx] = g  # basic indices never repeat: plain assignment is exact and fast
        else:
            _scatter_add_at(xp, gx, idx, g)
        return (gx,)

    return _result(out, Node(fn, (x,), "Index", saved=_index_tensors(given)))


def setitem(x: Tensor, idx, value) -> None:
    """``x[idx] = value`` in place on the data (not recorded by autograd).

    Allowed on constants, and on leaves that require grad under ``no_grad()`` (like writing
    ``x.data[idx]``). Refused while grad mode is on, as torch refuses it, on a tensor that an op
    produced (ops that saved it for backward would compute wrong gradients) and on a leaf that
    requires grad (an op may already have saved it: ``y = x * w; x[0] = 5`` would change ``w``'s
    gradient); also refused: a ``value`` that requires grad (the assignment is not recorded, so its
    gradient would be lost without a word). On a constant the write bumps its version counter
    (``x._version``), so an op that saved ``x`` for backward refuses to run that backward.

    Example::

        >>> import neural_arch as na
        >>> x = na.zeros(3)
        >>> x[1] = 5.0
        >>> x.tolist()
        [0.0, 5.0, 0.0]
    """
    if x.grad_fn is not None and _ag._grad_mode.enabled:
        raise RuntimeError(
            "in-place assignment to a tensor that is part of an autograd graph would corrupt its "
            "gradients; build a new tensor instead (e.g. F.where or F.cat), or write under no_grad()"
        )
    if x.requires_grad and _ag._grad_mode.enabled:
        raise RuntimeError(
            "a leaf tensor that requires grad is being used in an in-place assignment (x[idx] = value); "
            "an op that already used it would compute wrong gradients. Write under "
            "`with neural_arch.no_grad():` (as initialisers do), or build a new tensor (F.where, F.cat)"
        )
    if isinstance(value, Tensor) and value.requires_grad and _ag._grad_mode.enabled:
        raise RuntimeError(
            "x[idx] = value: value requires grad, but the assignment is not recorded by autograd, so its "
            "gradient would be lost; build the result with F.where or F.cat (recorded), or assign "
            "value.detach() if no gradient should flow"
        )
    idx = _convert_index(idx, x.data)
    val = value.data if isinstance(value, Tensor) else value
    if not isinstance(val, _SCALARS) and _backend.device_of(val) != _backend.device_of(x.data):
        val = _backend.to_device(val, _backend.device_of(x.data))
    x.data[idx] = val
    _ag.bump_version(x.data)


def _triangle(x: Tensor, diagonal, keep: str) -> Tensor:
    """The lower (``keep="tril"``) or upper triangle of the last two dims; zeros elsewhere."""
    if x.ndim < 2:
        raise RuntimeError(f"{keep}: input tensor must have at least 2 dimensions, got {x.ndim}")
    k = int(diagonal)
    xd = x.data
    pick = getattr(_xp(xd), keep)  # NumPy's and CuPy's tril/triu act on the last two axes
    out = pick(xd, k)
    if not _needs(x):
        return _result(out, None)
    # the gradient of a masking op is the same mask applied to the upstream gradient
    return _result(out, Node(lambda g: (pick(g, k),), (x,), keep.capitalize()))


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of each matrix (the last two dims), zeros above diagonal ``diagonal``
    (0 the main one, positive above it, negative below), as ``torch.tril``. Differentiable.

    Example::

        >>> import neural_arch as na
        >>> na.tril(na.ones(3, 3)).tolist()
        [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
        >>> na.ones(2, 3).tril(diagonal=1).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    """
    return _triangle(input, diagonal, "tril")


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of each matrix (the last two dims), zeros below diagonal ``diagonal``,
    as ``torch.triu``. Differentiable.

    Example::

        >>> import neural_arch as na
        >>> na.triu(na.ones(3, 3), diagonal=1).tolist()
        [[0.0, 1.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    """
    return _triangle(input, diagonal, "triu")


# ============================================================================ joining / splitting
def concatenate(tensors, axis: int = 0, *, dim=None) -> Tensor:
    """Join tensors along an existing axis (``cat``; ``dim=`` is torch's alias).

    Example::

        >>> import neural_arch as na
        >>> na.core.ops_shape.concatenate([na.ones(2), na.zeros(1)]).tolist()
        [1.0, 1.0, 0.0]
    """
    if dim is not None:
        axis = dim
    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("concatenate needs at least one tensor")
    datas = [t.data for t in tensors]
    _same_device(datas, "concatenate")
    xp = _xp(datas[0])
    out = xp.concatenate(datas, axis=axis)
    if not _needs(*tensors):
        return _result(out, None)
    ax = axis % out.ndim
    bounds = np.cumsum([d.shape[ax] for d in datas])[:-1].tolist()

    def fn(g):
        return tuple(xp.split(g, bounds, axis=ax))

    parents = tuple(t if t.requires_grad else None for t in tensors)
    return _result(out, Node(fn, parents, "Cat", fresh=False))


cat = concatenate


def stack(tensors, axis: int = 0, *, dim=None) -> Tensor:
    """Join tensors along a new axis (alias ``dim=``).

    Example::

        >>> import neural_arch as na
        >>> na.stack([na.ones(3), na.zeros(3)]).shape
        (2, 3)
    """
    if dim is not None:
        axis = dim
    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    datas = [t.data for t in tensors]
    _same_device(datas, "stack")
    xp = _xp(datas[0])
    out = xp.stack(datas, axis=axis)
    if not _needs(*tensors):
        return _result(out, None)
    ax = axis % out.ndim
    n = len(datas)

    def fn(g):
        return tuple(xp.take(g, i, axis=ax) for i in range(n))

    parents = tuple(t if t.requires_grad else None for t in tensors)
    return _result(out, Node(fn, parents, "Stack"))


def split(x: Tensor, split_size_or_sections, axis: int = 0, *, dim=None) -> list:
    """Split into pieces of ``split_size`` (int, last may be smaller) or of the listed sizes
    (torch semantics; alias ``dim=``).

    Example::

        >>> import neural_arch as na
        >>> [p.tolist() for p in na.arange(5).split(2)]
        [[0, 1], [2, 3], [4]]
    """
    if dim is not None:
        axis = dim
    ax = _check_dim(axis, x.ndim)
    n = x.shape[ax]
    if isinstance(split_size_or_sections, (int, np.integer)):
        s = int(split_size_or_sections)
        if s < 0 or (s == 0 and n):
            raise ValueError(f"split: split_size must be positive (0 only for an empty dimension), got {s} "
                             f"for a dimension of size {n}")
        # torch: an empty dimension gives one empty piece
        sizes = [s] * (n // s) + ([n % s] if n % s else []) if n else [0]
    else:
        sizes = [int(v) for v in split_size_or_sections]
        if any(v < 0 for v in sizes):
            raise ValueError(f"split: section sizes must be non-negative, got {sizes}")
        if np.sum(sizes) != n:
            raise ValueError(f"split: sections {sizes} do not add up to the axis length {n}")
    pieces, start = [], 0
    for sz in sizes:
        sl = [slice(None)] * x.ndim
        sl[ax] = slice(start, start + sz)
        pieces.append(getitem(x, tuple(sl)))
        start += sz
    return pieces


def chunk(x: Tensor, chunks: int, axis: int = 0, *, dim=None) -> list:
    """Split into ``chunks`` pieces of size ``ceil(n / chunks)`` (torch semantics; alias ``dim=``).

    Example::

        >>> import neural_arch as na
        >>> [p.shape for p in na.ones(5, 2).chunk(2)]
        [(3, 2), (2, 2)]
    """
    if dim is not None:
        axis = dim
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    n = x.shape[_check_dim(axis, x.ndim)]
    if n == 0:
        return split(x, [0] * chunks, axis)  # torch: `chunks` empty pieces
    return split(x, -(-n // chunks), axis)


# ============================================================================ gather / scatter_add / index_select
def _index_data(index, like, op: str):
    """``index`` (Tensor, array or list) as an integer array on ``like``'s device; a float or bool
    index is torch's error, named after the argument."""
    idx = index.data if isinstance(index, Tensor) else index
    xp = _xp(like)
    if isinstance(idx, (list, tuple, int, np.integer)):
        idx = xp.asarray(idx)
    elif type(idx) is not type(like):
        idx = _backend.to_device(idx, _backend.device_of(like))
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{op}(): index must be an integer tensor (int64, as torch), got dtype {idx.dtype}")
    return idx


def _check_index_bounds(idx, size: int, dim: int, op: str, error) -> None:
    """torch's out-of-range error for a host index (negative or ``>= size``). A device index is not
    checked: reading its bounds would make the host wait for the device."""
    if type(idx) is np.ndarray and idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= size:
            raise error(f"{op}(): index {lo if lo < 0 else hi} is out of bounds for dimension {dim} with "
                        f"size {size}")


def _leading(arr, shape, skip=None):
    """``arr`` cut to its first ``shape[d]`` entries along every dim but ``skip``."""
    return arr[tuple(slice(None) if d == skip else slice(0, s) for d, s in enumerate(shape))]


def _along_grid(xp, idx, ax: int):
    """Full advanced-index tuple addressing ``target[..., idx[i, j, k], ...]`` (``idx`` along ``ax``,
    every other dim its own position), for a scatter-add along one dim."""
    nd = idx.ndim
    return tuple(idx if d == ax else xp.arange(s).reshape((-1,) + (1,) * (nd - d - 1))
                 for d, s in enumerate(idx.shape))


def _gather_array(xp, arr, ax: int, idx):
    return xp.take_along_axis(_leading(arr, idx.shape, skip=ax), idx, axis=ax)


def _as_1d(xd, idx):
    """torch treats a 0-d input and index as one element along dim 0."""
    return (xd.reshape(1), idx.reshape(1)) if xd.ndim == 0 else (xd, idx)


def gather(input: Tensor, dim: int, index, *, sparse_grad: bool = False) -> Tensor:
    """torch's ``gather``: ``out[i][j][k] = input[i][index[i][j][k]][k]`` for ``dim=1`` (likewise for
    any dim); the result has ``index``'s shape. ``index`` is an integer tensor with ``input``'s number
    of dims, no larger than ``input`` along every other dim; an index outside ``[0, size)`` is torch's
    ``RuntimeError`` (checked for host arrays). The gradient scatter-adds back, so repeated indices
    accumulate. ``sparse_grad`` is accepted for torch's signature; the gradient is dense.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> x = na.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
        >>> y = na.gather(x, 1, np.array([[0, 0], [1, 0]]))
        >>> y.tolist()
        [[1.0, 1.0], [4.0, 3.0]]
        >>> y.sum().backward()
        >>> x.grad.tolist()
        [[2.0, 0.0], [1.0, 1.0]]
    """
    xd = input.data
    idx = _index_data(index, xd, "gather")
    if idx.ndim != xd.ndim and not (xd.ndim <= 1 and idx.ndim <= 1):
        raise RuntimeError(f"gather(): index must have the same number of dimensions as input: index "
                           f"{list(idx.shape)}, input {list(xd.shape)}")
    xp = _xp(xd)
    ax = _check_dim(dim, xd.ndim)
    shape, ishape = xd.shape, idx.shape
    xw, iw = _as_1d(xd, idx)
    for d in range(xw.ndim):
        if d != ax and iw.shape[d] > xw.shape[d]:
            raise RuntimeError(f"gather(): size does not match at dimension {d}: expected index "
                               f"{list(iw.shape)} to be no larger than input {list(xw.shape)} apart from "
                               f"dimension {ax}")
    _check_index_bounds(iw, xw.shape[ax], ax, "gather", RuntimeError)
    out = _gather_array(xp, xw, ax, iw).reshape(ishape)
    if not _needs(input):
        return _result(out, None)

    def fn(g):
        gx = xp.zeros(xw.shape, dtype=g.dtype)
        _scatter_add_at(xp, gx, _along_grid(xp, iw, ax), g.reshape(iw.shape))
        return (gx.reshape(shape),)

    return _result(out, Node(fn, (input,), "Gather", saved=(index,)))


def _scatter_operands(xd, dim, index, src, op: str):
    """Checked operands of ``scatter_add``: ``(axis, index, src values cut to index's shape)``."""
    sd = src.data if isinstance(src, Tensor) else src
    if isinstance(sd, (*_SCALARS, np.generic)):
        raise TypeError(f"{op}(): src must be a tensor (torch's scatter_add takes no scalar src), got {src!r}")
    if type(sd) is not type(xd):
        sd = _backend.to_device(_xp(xd).asarray(sd) if isinstance(sd, (list, tuple)) else sd,
                                _backend.device_of(xd))
    idx = _index_data(index, xd, op)
    if sd.dtype != xd.dtype:
        raise RuntimeError(f"{op}(): expected src's dtype to equal input's: src {sd.dtype}, input {xd.dtype}")
    if not idx.ndim == sd.ndim == xd.ndim and not max(idx.ndim, sd.ndim, xd.ndim) <= 1:
        raise RuntimeError(f"{op}(): index, src and input must have the same number of dimensions: index "
                           f"{list(idx.shape)}, src {list(sd.shape)}, input {list(xd.shape)}")
    ax = _check_dim(dim, xd.ndim)
    xw, iw = _as_1d(xd, idx)
    sw = sd.reshape(1) if sd.ndim == 0 else sd
    for d in range(xw.ndim):
        if iw.shape[d] > sw.shape[d] or (d != ax and iw.shape[d] > xw.shape[d]):
            raise RuntimeError(f"{op}(): expected index {list(iw.shape)} to be no larger than src "
                               f"{list(sw.shape)} and, apart from dimension {ax}, than input {list(xw.shape)}")
    _check_index_bounds(iw, xw.shape[ax], ax, op, RuntimeError)
    return ax, iw, sw, _leading(sw, iw.shape)


def scatter_add(input: Tensor, dim: int, index, src) -> Tensor:
    """torch's ``scatter_add`` (out of place): a copy of ``input`` with
    ``out[index[i][j][k]][j][k] += src[i][j][k]`` for ``dim=0`` (likewise for any dim), over
    ``index``'s extent; repeated indices accumulate. ``index``, ``src`` and ``input`` have the same
    number of dims, ``index`` no larger than ``src`` and, apart from ``dim``, than ``input``; ``src``
    has ``input``'s dtype; an index outside ``[0, size)`` is torch's ``RuntimeError`` (host arrays).
    Gradients: ``input`` gets the upstream gradient, ``src`` gathers it at ``index`` (zero beyond
    ``index``'s extent).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> src = na.tensor([1.0, 2.0, 3.0], requires_grad=True)
        >>> y = na.scatter_add(na.zeros(2), 0, np.array([1, 0, 1]), src)
        >>> y.tolist()
        [2.0, 4.0]
        >>> (y * na.tensor([10.0, 100.0])).sum().backward()
        >>> src.grad.tolist()
        [100.0, 10.0, 100.0]
    """
    xd = input.data
    ax, iw, sw, vals = _scatter_operands(xd, dim, index, src, "scatter_add")
    xp = _xp(xd)
    xw = xd.reshape(1) if xd.ndim == 0 else xd
    out = xw.copy()
    _scatter_add_at(xp, out, _along_grid(xp, iw, ax), vals)
    out = out.reshape(xd.shape)
    st = src if isinstance(src, Tensor) and src.requires_grad else None
    rx = input.requires_grad
    if not _needs(input if rx else None, st):
        return _result(out, None)
    sshape = st.data.shape if st is not None else None

    def fn(g):
        gs = None
        if st is not None:
            gs = xp.zeros(sw.shape, dtype=g.dtype)
            gs[tuple(slice(0, s) for s in iw.shape)] = _gather_array(xp, g.reshape(xw.shape), ax, iw)
            gs = gs.reshape(sshape)
        return (g if rx else None), gs

    return _result(out, Node(fn, (input if rx else None, st), "ScatterAdd", saved=(index,)))


def scatter_add_(self: Tensor, dim: int, index, src) -> Tensor:
    """``self.scatter_add_(dim, index, src)``: ``scatter_add`` in place; returns self.

    torch's in-place rules (those of ``neural_arch.core.ops_inplace``): refused on a leaf that requires
    grad or a recorded result while grad mode is on; a constant updated from a ``src`` that requires
    grad becomes the recorded out-of-place result.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> t = na.zeros(3)
        >>> t.scatter_add_(0, np.array([2, 2]), na.ones(2)).tolist()
        [0.0, 0.0, 2.0]
    """
    # imported here: the in-place rules' module builds on the op modules
    from .ops_inplace import _adopt, _records, _refuse_graph_tensor

    _refuse_graph_tensor(self, "scatter_add_", "t = t.scatter_add(dim, index, src)")
    if _records(self, src):
        return _adopt(self, scatter_add(self, dim, index, src))
    xd = self.data
    ax, iw, _, vals = _scatter_operands(xd, dim, index, src, "scatter_add_")
    xp = _xp(xd)
    _scatter_add_at(xp, xd.reshape(1) if xd.ndim == 0 else xd, _along_grid(xp, iw, ax), vals)
    _ag.bump_version(xd)
    return self


def index_select(input: Tensor, dim: int, index) -> Tensor:
    """torch's ``index_select``: the entries of ``input`` at ``index`` (a 1-d integer tensor, repeats
    allowed) along ``dim``; an index outside ``[0, size)`` is torch's ``IndexError`` (host arrays).
    The gradient scatter-adds back, so repeated indices accumulate.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> x = na.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
        >>> y = x.index_select(1, np.array([2, 0, 2]))
        >>> y.tolist()
        [[3.0, 1.0, 3.0], [6.0, 4.0, 6.0]]
        >>> y.sum().backward()
        >>> x.grad.tolist()
        [[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]]
    """
    xd = input.data
    idx = _index_data(index, xd, "index_select")
    if idx.ndim > 1:
        raise IndexError(f"index_select(): index must be a vector (1-d), got shape {list(idx.shape)}")
    idx = idx.reshape(-1)
    xp = _xp(xd)
    ax = _check_dim(dim, xd.ndim)
    xw = xd.reshape(1) if xd.ndim == 0 else xd
    _check_index_bounds(idx, xw.shape[ax], ax, "index_select", IndexError)
    out = xp.take(xw, idx, axis=ax)
    if xd.ndim == 0 and idx.size == 1:
        out = out.reshape(())  # a 0-d input picked once stays 0-d
    if not _needs(input):
        return _result(out, None)
    shape = xd.shape

    def fn(g):
        gx = xp.zeros(xw.shape, dtype=g.dtype)
        _scatter_add_at(xp, gx, (slice(None),) * ax + (idx,), g if xd.ndim else g.reshape(-1))
        return (gx.reshape(shape),)

    return _result(out, Node(fn, (input,), "IndexSelect", saved=(index,)))


# ============================================================================ torch's reordering and selection ops
def _dims_arg(dims) -> tuple:
    """``dims`` given as ints, a tuple/list, or one tuple/list (torch's ``x.flip(0, 1)`` / ``flip(x, (0, 1))``)."""
    if isinstance(dims, (int, np.integer)):
        return (int(dims),)
    dims = _shape_arg(tuple(dims))
    if isinstance(dims, (int, np.integer)):
        return (int(dims),)
    return tuple(dims)


def _unique_dims(dims, ndim: int, op: str) -> tuple:
    axes = tuple(_check_dim(int(d), ndim) for d in dims)
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"{op}: dim {list(dims)} appears multiple times in the list of dims")
    return axes


def flip(input: Tensor, *dims) -> Tensor:
    """torch's ``flip(input, dims)``: reverse the order along every dim in ``dims`` (a copy, as torch).

    Example::

        >>> import neural_arch as na
        >>> na.flip(na.tensor([[1, 2], [3, 4]]), (0, 1)).tolist(), na.arange(3).flip(0).tolist()
        ([[4, 3], [2, 1]], [2, 1, 0])
    """
    xd = input.data
    axes = _unique_dims(_dims_arg(dims), xd.ndim, "flip")
    xp = _xp(xd)
    out = xp.flip(xd, axis=axes).copy() if axes and xd.ndim else xd.copy()
    if not _needs(input):
        return _result(out, None)
    return _result(out, Node(lambda g: (xp.flip(g, axis=axes) if axes and g.ndim else g,), (input,), "Flip"))


def roll(input: Tensor, shifts, dims=None) -> Tensor:
    """torch's ``roll(input, shifts, dims=None)``: shift elements along ``dims`` cyclically
    (``dims=None``: over the flattened tensor, the shape kept). ``shifts`` and ``dims`` are ints or
    tuples of one length.

    Example::

        >>> import neural_arch as na
        >>> na.roll(na.arange(5), 2).tolist(), na.roll(na.tensor([[1, 2], [3, 4]]), 1, 1).tolist()
        ([3, 4, 0, 1, 2], [[2, 1], [4, 3]])
    """
    xd = input.data
    xp = _xp(xd)
    sh = _dims_arg(shifts)
    if dims is None:
        if len(sh) != 1:
            raise RuntimeError(f"roll: with dims=None, shifts must be one int, got {shifts!r}")
        axes = None
    else:
        if xd.ndim == 0:
            raise IndexError("roll: Dimension specified as 0 but tensor has no dimensions")
        axes = tuple(_check_dim(int(d), xd.ndim) for d in _dims_arg(dims))
        if len(axes) != len(sh):
            raise RuntimeError(f"roll: shifts and dimensions must align: shifts {len(sh)}, dims {len(axes)}")
    shift = sh[0] if axes is None else sh
    out = xp.roll(xd, shift, axis=axes) if xd.ndim or axes is None else xd.copy()
    if not _needs(input):
        return _result(out, None)
    back = -shift if axes is None else tuple(-s for s in sh)

    def fn(g):
        return (xp.roll(g, back, axis=axes) if g.ndim or axes is None else g,)

    return _result(out, Node(fn, (input,), "Roll"))


def unbind(input: Tensor, dim: int = 0) -> tuple:
    """torch's ``unbind``: the slices along ``dim`` as a tuple, that dim removed.

    Example::

        >>> import neural_arch as na
        >>> [t.tolist() for t in na.unbind(na.tensor([[1, 2], [3, 4]]), 1)]
        [[1, 3], [2, 4]]
    """
    if input.ndim == 0:
        raise IndexError("unbind: dimension specified as 0 but tensor has no dimensions")
    ax = _check_dim(dim, input.ndim)
    lead = (slice(None),) * ax
    return tuple(getitem(input, lead + (i,)) for i in range(input.shape[ax]))


def narrow(input: Tensor, dim: int, start: int, length: int) -> Tensor:
    """torch's ``narrow(input, dim, start, length)``: ``length`` entries from ``start`` along ``dim``
    (a negative ``start`` counts from the end); out of range is torch's error, not a shorter result.

    Example::

        >>> import neural_arch as na
        >>> na.arange(6).reshape(2, 3).narrow(1, 1, 2).tolist()
        [[1, 2], [4, 5]]
    """
    if input.ndim == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    ax = _check_dim(dim, input.ndim)
    size = input.shape[ax]
    start, length = int(start), int(length)
    if not -size <= start <= size:
        raise IndexError(f"narrow(): start ({start}) out of range for dimension {ax} of size {size}")
    if start < 0:
        start += size
    if length < 0 or start + length > size:
        raise RuntimeError(f"narrow(): start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return getitem(input, (slice(None),) * ax + (slice(start, start + length),))


def movedim(input: Tensor, source, destination) -> Tensor:
    """torch's ``movedim(input, source, destination)`` (alias ``moveaxis``): move the dims
    ``source`` (an int or a tuple) to the positions ``destination``, the others in their order.

    Example::

        >>> import neural_arch as na
        >>> na.movedim(na.ones(2, 3, 4), 0, -1).shape, na.ones(2, 3, 4).movedim((0, 1), (2, 0)).shape
        ((3, 4, 2), (3, 4, 2))
    """
    nd = input.ndim
    src, dst = _dims_arg(source), _dims_arg(destination)
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should "
                           f"contain the same number of dims as destination ({list(dst)} dims)")
    src, dst = _unique_dims(src, nd, "movedim"), _unique_dims(dst, nd, "movedim")
    if not nd:
        return clone(input) if src else input
    perm = [None] * nd
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(d for d in range(nd) if d not in src)
    perm = [p if p is not None else next(rest) for p in perm]
    return permute(input, *perm)


def tile(input: Tensor, *dims) -> Tensor:
    """torch's ``tile(input, dims)``: repeat the whole tensor ``dims[i]`` times along each dim
    (fewer ``dims`` than dims: leading 1s; more: the tensor gains leading dims). The gradient sums
    the copies back.

    Example::

        >>> import neural_arch as na
        >>> na.tile(na.tensor([1, 2]), (2,)).tolist(), na.tensor([[1], [2]]).tile(1, 2).tolist()
        ([1, 2, 1, 2], [[1, 1], [2, 2]])
    """
    reps = tuple(int(r) for r in _dims_arg(dims))
    if any(r < 0 for r in reps):
        raise RuntimeError(f"tile: repeats can not be negative, got {list(reps)}")
    xd = input.data
    xp = _xp(xd)
    nd = builtins_max(len(reps), xd.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - xd.ndim) + xd.shape
    out = xp.tile(xd.reshape(shape), reps)
    if not _needs(input):
        return _result(out, None)
    ish = xd.shape

    def fn(g):
        inter = tuple(v for pair in zip(reps, shape) for v in pair)  # (r0, s0, r1, s1, ...)
        return (g.reshape(inter).sum(axis=tuple(range(0, 2 * nd, 2))).reshape(ish),)

    return _result(out, Node(fn, (input,), "Tile"))


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """torch's ``diagonal(input, offset=0, dim1=0, dim2=1)``: the diagonal of the (``dim1``,
    ``dim2``) planes as the last dim (``offset > 0`` above the main diagonal, ``< 0`` below).

    Example::

        >>> import neural_arch as na
        >>> x = na.arange(9).reshape(3, 3)
        >>> na.diagonal(x).tolist(), x.diagonal(1).tolist(), x.diagonal(-1).tolist()
        ([0, 4, 8], [1, 5], [3, 7])
    """
    xd = input.data
    if xd.ndim < 2:
        raise RuntimeError(f"diagonal: expected a tensor of at least 2 dims, got {xd.ndim}")
    d1, d2 = _check_dim(dim1, xd.ndim), _check_dim(dim2, xd.ndim)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    xp = _xp(xd)
    out = xp.diagonal(xd, int(offset), d1, d2).copy()
    if not _needs(input):
        return _result(out, None)
    shape = xd.shape

    def fn(g):
        gx = xp.zeros(shape, dtype=g.dtype)
        n = g.shape[-1]
        if n:
            moved = xp.moveaxis(gx, (d1, d2), (-2, -1))  # a view: writing it writes gx
            i = xp.arange(n)
            rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
            moved[..., rows, cols] = g
        return (gx,)

    return _result(out, Node(fn, (input,), "Diagonal"))


def diag(input: Tensor, diagonal: int = 0) -> Tensor:
    """torch's ``diag(input, diagonal=0)``: a 1-d input becomes a square matrix with it on the
    ``diagonal``-th diagonal; a 2-d input gives that diagonal as 1-d.

    Example::

        >>> import neural_arch as na
        >>> na.diag(na.tensor([1, 2])).tolist(), na.diag(na.arange(4).reshape(2, 2)).tolist()
        ([[1, 0], [0, 2]], [0, 3])
    """
    xd = input.data
    if xd.ndim not in (1, 2):
        raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {xd.ndim}D")
    if xd.ndim == 2:
        return globals()["diagonal"](input, diagonal, 0, 1)
    xp = _xp(xd)
    k = int(diagonal)
    out = xp.diag(xd, k)
    if not _needs(input):
        return _result(out, None)
    return _result(out, Node(lambda g: (xp.diagonal(g, k).copy(),), (input,), "Diag"))


def repeat_interleave(input: Tensor, repeats, dim=None, *, output_size=None) -> Tensor:
    """torch's ``repeat_interleave(input, repeats, dim=None)``: each element repeated ``repeats``
    times (an int, or one count per element along ``dim``) along ``dim``; ``dim=None`` flattens
    first. The gradient sums each element's copies.

    Example::

        >>> import neural_arch as na
        >>> na.repeat_interleave(na.tensor([1, 2]), 2).tolist()
        [1, 1, 2, 2]
        >>> na.tensor([[1, 2], [3, 4]]).repeat_interleave(na.tensor([1, 2]), dim=0).tolist()
        [[1, 2], [3, 4], [3, 4]]
    """
    if dim is not None and input.ndim == 0:
        raise IndexError("repeat_interleave: Dimension specified as 0 but tensor has no dimensions")
    x = input if dim is not None else reshape(input, -1)
    xd = x.data
    xp = _xp(xd)
    ax = _check_dim(0 if dim is None else dim, xd.ndim)
    n = xd.shape[ax] if xd.ndim else 1
    rd = repeats.data if isinstance(repeats, Tensor) else repeats
    if isinstance(rd, (list, tuple)):
        rd = np.asarray(rd, dtype=np.int64)
    if hasattr(rd, "dtype") and not isinstance(rd, np.generic):
        if rd.dtype.kind not in "iu":
            raise RuntimeError(f"repeat_interleave: repeats must be an integer tensor, got dtype {rd.dtype}")
        if rd.ndim > 1 or (rd.size != 1 and rd.size != n):
            raise RuntimeError(f"repeat_interleave: repeats must have the same size as input along dim, but got "
                               f"repeats.size(0) = {rd.size} and input.size({ax}) = {n}")
        counts = np.asarray(_backend.to_device(rd, "cpu")).reshape(-1).astype(np.int64)
        if counts.size == 1:
            counts = np.full(n, int(counts[0]), dtype=np.int64)
    else:
        counts = np.full(n, int(rd), dtype=np.int64)
    if (counts < 0).any():
        raise RuntimeError("repeat_interleave: repeats can not be negative")
    if output_size is not None and int(output_size) != int(counts.sum()):
        raise RuntimeError(f"repeat_interleave: output_size {output_size} does not match the sum of repeats "
                           f"{int(counts.sum())}")
    src = np.repeat(np.arange(n), counts)
    if xd.ndim == 0:
        xd = xd.reshape(1)
    out = xp.take(xd, xp.asarray(src), axis=ax)
    if not _needs(x):
        return _result(out, None)
    shape = x.data.shape
    isrc = xp.asarray(src)

    def fn(g):
        gx = xp.zeros(xd.shape, dtype=g.dtype)
        _scatter_add_at(xp, gx, (slice(None),) * ax + (isrc,), g)
        return (gx.reshape(shape),)

    return _result(out, Node(fn, (x,), "RepeatInterleave"))


def masked_select(input: Tensor, mask) -> Tensor:
    """torch's ``masked_select(input, mask)``: the elements where the boolean ``mask`` (broadcast with
    ``input``) is true, as a 1-d tensor in row-major order.

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> na.masked_select(x, x > 2).tolist(), x.masked_select(na.tensor([True, False])).tolist()
        ([3.0, 4.0], [1.0, 3.0])
    """
    md = mask.data if isinstance(mask, Tensor) else mask
    if getattr(md, "dtype", None) is None or md.dtype != np.bool_:
        got = getattr(md, "dtype", type(md).__name__)
        raise RuntimeError(f"masked_select: expected a boolean mask, got dtype {got}")
    xd = input.data
    _same_device([xd, md], "masked_select")
    xp = _xp(xd)
    shape = xp.broadcast_shapes(xd.shape, md.shape) if hasattr(xp, "broadcast_shapes") else \
        np.broadcast_shapes(xd.shape, md.shape)
    mb = xp.broadcast_to(md, shape)
    out = xp.broadcast_to(xd, shape)[mb]
    if not _needs(input):
        return _result(out, None)
    ish = xd.shape

    def fn(g):
        gx = xp.zeros(shape, dtype=g.dtype)
        gx[mb] = g
        return (unbroadcast(gx, ish),)

    return _result(out, Node(fn, (input,), "MaskedSelect", saved=(mask,)))


# ============================================================================ method binding
def _bind_methods(T) -> None:
    T.__getitem__ = getitem
    T.__setitem__ = setitem
    T.reshape = reshape
    T.view = view
    T.view_as = lambda self, other: view(self, other.shape)
    T.reshape_as = lambda self, other: reshape(self, other.shape)
    T.clone = clone
    T.contiguous = contiguous
    T.transpose = transpose
    T.permute = permute
    T.swapaxes = swapaxes
    T.swapdims = swapdims
    T.squeeze = squeeze
    T.unsqueeze = unsqueeze
    T.flatten = flatten
    T.broadcast_to = broadcast_to
    T.expand = expand
    T.expand_as = lambda self, other: expand(self, other.shape)
    T.astype = astype
    T.type_as = lambda self, other: astype(self, other.dtype)
    T.split = split
    T.chunk = chunk
    T.tril = tril
    T.triu = triu
    T.float = lambda self: astype(self, np.float32)
    T.double = lambda self: astype(self, np.float64)
    T.half = lambda self: astype(self, np.float16)
    T.long = lambda self: astype(self, np.int64)
    T.int = lambda self: astype(self, np.int32)
    T.short = lambda self: astype(self, np.int16)
    T.char = lambda self: astype(self, np.int8)
    T.byte = lambda self: astype(self, np.uint8)
    T.bool = lambda self: astype(self, np.bool_)
    T.bfloat16 = lambda self: astype(self, "bfloat16")
    T.gather = gather
    T.scatter_add = scatter_add
    T.scatter_add_ = scatter_add_
    T.index_select = index_select
    T.flip, T.roll, T.unbind, T.narrow, T.tile = flip, roll, unbind, narrow, tile
    T.movedim = T.moveaxis = movedim
    T.diagonal, T.diag = diagonal, diag
    T.repeat_interleave, T.masked_select = repeat_interleave, masked_select
