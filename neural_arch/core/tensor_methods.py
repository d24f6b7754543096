"""torch's ``Tensor`` method surface: the everyday methods a ported script calls on tensors (``t()``,
``repeat``, ``index_add_``, ``scatter_``, ``addcmul_``, ``normal_``, ``median``...), each with torch's
semantics, bound by :func:`_bind_methods`.

A method here is a thin binding of an op that already exists (``x.where(c, y)`` is ``where(c, x, y)``,
``x.mm(y)`` is ``matmul`` after torch's shape checks), a composition of existing differentiable ops
(``addcdiv``, ``kron``, ``cross``, ``nansum``), or one of the few small ops that had no home yet
(``fmod``, ``hypot``, ``fmax``/``fmin``, ``index_add``/``index_copy``/``index_fill``, ``scatter``,
``median``), written with the array module of the input so they run on NumPy and CuPy alike.

In-place methods follow :mod:`neural_arch.core.ops_inplace`'s rules through one wrapper,
:func:`_inplace`: with no graph involved the out-of-place result is written into the tensor's array
(every alias sees it) and the version counter moves; a leaf that requires grad under grad mode, and
a recorded (non-leaf) tensor, raise; a constant updated from an argument that requires grad becomes
that op's recorded result. A result torch could not store in the tensor's dtype (``int.sqrt_()``)
or shape (a broadcast that grows it) is torch's ``RuntimeError``. The random fills (``normal_``,
``uniform_``, ``bernoulli_``...) draw from the project's generator (``neural_arch.manual_seed``, or
``generator=``), as :mod:`neural_arch.nn.init` does.

Example::

    >>> import neural_arch as na
    >>> na.manual_seed(0)
    >>> exp_avg_sq = na.zeros(2)
    >>> g = na.tensor([1.0, 2.0])
    >>> exp_avg_sq.mul_(0.9).addcmul_(g, g, value=0.1).tolist()    # an Adam step's second moment
    [0.10000000149011612, 0.4000000059604645]
    >>> na.ones(2, 3).t().shape, na.ones(2, 3).repeat(2, 1).shape
    ((3, 2), (4, 3))
"""

from __future__ import annotations

import builtins
import itertools
import math

import numpy as np

from .. import backend as _backend
from . import autograd as _ag
from . import dtypes as _dtypes
from . import ops_activation as _oa
from . import ops_basic as _ob
from . import ops_reduce as _or
from . import ops_shape as _os
from .autograd import Node
from .op_utils import _SCALARS, _needs, _operand, _result, _xp, unbroadcast
from .ops_inplace import _adopt, _refuse_graph_tensor
from .rng import numpy_generator
from .tensor import Tensor, _check_dim, no_grad

_bmax, _bmin, _babs = builtins.max, builtins.min, builtins.abs


# ============================================================================ in-place wrapper
def _grad_args(args, kwargs) -> bool:
    """True when an argument requires grad under grad mode (the update must be recorded)."""
    if not _ag._grad_mode.enabled:
        return False
    return any(isinstance(a, Tensor) and a.requires_grad for a in (*args, *kwargs.values()))


def _store(self: Tensor, out: Tensor, op: str) -> Tensor:
    """Write ``out`` into ``self``'s array with torch's dtype and shape rules; bump the version."""
    xd, od = self.data, out.data
    if od.shape != xd.shape:
        raise RuntimeError(f"{op}: the result has shape {list(od.shape)}, which does not match this "
                           f"tensor's shape {list(xd.shape)} (an in-place op cannot grow a tensor by "
                           f"broadcasting); use the out-of-place form")
    if od.dtype != xd.dtype and not np.can_cast(od.dtype, xd.dtype, casting="same_kind"):
        raise RuntimeError(f"{op}: result type {od.dtype} can't be cast to the desired output type "
                           f"{xd.dtype}; use the out-of-place form, or convert the tensor first")
    xd[...] = od
    _ag.bump_version(xd)
    return self


def _inplace(name: str, fn, alt: str):
    """The in-place method ``name`` of the out-of-place ``fn(self, *args, **kwargs)``."""

    def method(self: Tensor, *args, **kwargs) -> Tensor:
        _refuse_graph_tensor(self, name, alt)
        if _grad_args(args, kwargs):
            out = fn(self, *args, **kwargs)
            if out.shape != self.shape:
                raise RuntimeError(f"{name}: the result has shape {list(out.shape)}, which does not "
                                   f"match this tensor's shape {list(self.shape)}")
            return _adopt(self, out if out.dtype == self.dtype else out.astype(self.dtype))
        with no_grad():
            out = fn(self, *args, **kwargs)
        return _store(self, out, name)

    method.__name__ = method.__qualname__ = name
    base = name[:-1]
    method.__doc__ = (
        f"``{base}`` in place: torch's ``Tensor.{name}``; returns self (see "
        f":mod:`neural_arch.core.tensor_methods` for the rules).\n\n"
        f"Example::\n\n"
        f"    >>> import neural_arch as na\n"
        f"    >>> t = {_INPLACE_SUBJECT.get(base, 'na.tensor([[0.25, 4.0], [1.0, 2.0]])')}\n"
        f"    >>> t.{name}{_INPLACE_EXAMPLES.get(base, '()')} is t\n"
        f"    True\n"
    )
    return method


#: arguments of each in-place method's docstring example (the rest take none)
_INPLACE_EXAMPLES = {
    "pow": "(2)", "masked_fill": "(t > 1, 0.0)", "clamp_min": "(0.5)", "clamp_max": "(0.5)",
    "index_add": "(0, na.tensor([1]), na.ones(1, 2))", "index_copy": "(0, na.tensor([1]), na.ones(1, 2))",
    "index_fill": "(0, na.tensor([1]), 2.0)", "scatter": "(0, na.tensor([[1]]), na.ones(1, 1))",
    "addcmul": "(t, t, value=0.5)", "addcdiv": "(t, t, value=0.5)", "lerp": "(na.ones(2), 0.5)",
    "fmod": "(2.0)", "remainder": "(2.0)", "floor_divide": "(2.0)", "true_divide": "(2.0)",
    "hypot": "(t)", "fmax": "(t)", "fmin": "(t)", "where": "(t > 1, 0.0)", "logical_and": "(t)",
    "logical_or": "(t)", "logical_xor": "(t)", "tril": "()", "triu": "()", "nan_to_num": "()",
    "leaky_relu": "()", "atan2": "(t)", "clamp": "(0.5, 1.0)", "round": "()", "rsub": "(1.0)",
    "addmm": "(na.ones(2, 1), na.ones(1, 2))", "baddbmm": "(na.ones(1, 2, 1), na.ones(1, 1, 2))",
}
#: the tensor an in-place example updates, where the default 2x2 float matrix does not fit
_INPLACE_SUBJECT = {"baddbmm": "na.zeros(1, 2, 2)"}


# ============================================================================ transposes and views
def t(self: Tensor) -> Tensor:
    """torch's ``t()``: the transpose of a matrix; a 0-d or 1-d tensor is returned as it is.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3).t().shape, na.ones(3).t().shape
        ((3, 2), (3,))
    """
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D; use "
                           f"transpose(dim0, dim1) or mT for the last two dims")
    return _os.transpose(self, 0, 1) if self.ndim == 2 else _os.transpose(self, ())


def _mT(self: Tensor) -> Tensor:
    if self.ndim < 2:
        raise RuntimeError(f"tensor.mT is only supported on matrices or batches of matrices. Got "
                           f"{self.ndim}-D tensor.")
    return _os.transpose(self, -2, -1)


def _real_only(self: Tensor, what: str) -> None:
    if self.data.dtype.kind == "c":
        raise NotImplementedError(f"tensor.{what} of a complex tensor (a conjugate transpose) is not "
                                  f"supported; use .mT and conjugate the values yourself")


def _H(self: Tensor) -> Tensor:
    if self.ndim not in (0, 2):
        raise RuntimeError(f"tensor.H is only supported on matrices (2-D tensors). Got {self.ndim}-D tensor.")
    _real_only(self, "H")
    return t(self)


def _mH(self: Tensor) -> Tensor:
    _real_only(self, "mH")
    return _mT(self)


mT = property(_mT, doc="""The transpose of the last two dims (torch's ``mT``): batches of matrices.

    Example::

        >>> import neural_arch as na
        >>> na.ones(4, 2, 3).mT.shape
        (4, 3, 2)
    """)
H = property(_H, doc="""The conjugate transpose of a matrix (torch's ``H``): for real tensors ``t()``.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3).H.shape
        (3, 2)
    """)
mH = property(_mH, doc="""The conjugate transpose of the last two dims (torch's ``mH``): ``mT`` for real tensors.

    Example::

        >>> import neural_arch as na
        >>> na.ones(4, 2, 3).mH.shape
        (4, 3, 2)
    """)


def _metadata_inplace(name: str, fn, alt: str):
    """An in-place shape change (``t_``, ``unsqueeze_``...): the tensor takes the view ``fn`` makes.

    The values do not change, so no version bump: an op that saved the old array keeps it whole.
    """

    def method(self: Tensor, *args, **kwargs) -> Tensor:
        _refuse_graph_tensor(self, name, alt)
        with no_grad():
            self.data = fn(self, *args, **kwargs).data
        return self

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"``{name[:-1]}`` in place (torch's ``Tensor.{name}``): this tensor takes the new shape; "
        f"returns self.\n\n"
        f"Example::\n\n"
        f"    >>> import neural_arch as na\n"
        f"    >>> {_METADATA_EXAMPLES[name][0]}.shape\n"
        f"    {_METADATA_EXAMPLES[name][1]}\n"
    )
    return method


_METADATA_EXAMPLES = {
    "t_": ("na.ones(2, 3).t_()", "(3, 2)"), "unsqueeze_": ("na.ones(2, 3).unsqueeze_(0)", "(1, 2, 3)"),
    "squeeze_": ("na.ones(2, 1, 3).squeeze_(1)", "(2, 3)"),
    "transpose_": ("na.ones(2, 1, 3).transpose_(0, 2)", "(3, 1, 2)"),
}


def is_contiguous(self: Tensor, memory_format=None) -> bool:
    """True when the data is laid out row-major with no gaps (torch's ``is_contiguous``).

    ``memory_format`` other than ``None`` / ``"contiguous_format"`` is refused: arrays here have no
    channels-last layout.

    Example::

        >>> import neural_arch as na
        >>> x = na.ones(2, 3)
        >>> x.is_contiguous(), x.t().is_contiguous()
        (True, False)
    """
    if memory_format not in (None, "contiguous_format", "torch.contiguous_format"):
        raise ValueError(f"is_contiguous(memory_format={memory_format!r}): only the default (row-major) "
                         f"layout exists here")
    return bool(self.data.flags.c_contiguous)


def stride(self: Tensor, dim=None):
    """The step in elements between neighbours along each dim (torch's ``stride()``), or along ``dim``.

    A view made by ``flip`` reports a negative stride (NumPy's layout; torch copies instead).

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3).stride(), na.ones(2, 3).t().stride(0)
        ((3, 1), 1)
    """
    item = self.data.dtype.itemsize
    strides = tuple(s // item for s in self.data.strides)
    if dim is None:
        return strides
    return strides[_check_dim(dim, self.ndim)]


def storage_offset(self: Tensor) -> int:
    """The offset in elements of this tensor's first element from the start of its memory block.

    Example::

        >>> import neural_arch as na
        >>> x = na.arange(6)
        >>> x[2:].storage_offset(), x.storage_offset()
        (2, 0)
    """
    arr = self.data
    base = arr
    while getattr(base, "base", None) is not None and hasattr(base.base, "dtype"):
        base = base.base
    if base is arr or arr.size == 0:
        return 0
    if isinstance(arr, np.ndarray):
        start = arr.__array_interface__["data"][0]
        origin = base.__array_interface__["data"][0]
    else:  # CuPy: device pointers
        start, origin = arr.data.ptr, base.data.ptr
    return int((start - origin) // arr.dtype.itemsize)


def unflatten(self: Tensor, dim: int, sizes) -> Tensor:
    """Split dim ``dim`` into ``sizes`` (one entry may be -1): torch's ``unflatten``.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 6).unflatten(1, (2, -1)).shape
        (2, 2, 3)
    """
    sizes = tuple(int(s) for s in sizes)
    if not sizes:
        raise RuntimeError("unflatten: sizes must be non-empty")
    ax = _check_dim(dim, self.ndim)
    n = self.shape[ax] if self.ndim else 1
    if sizes.count(-1) > 1:
        raise RuntimeError("unflatten: only one dimension can be inferred (-1)")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if known == 0 or n % known:
            raise RuntimeError(f"unflatten: provided sizes {list(sizes)} don't multiply up to the size of "
                               f"dim {dim} ({n}) in the input tensor")
        sizes = tuple(n // known if s == -1 else s for s in sizes)
    elif known != n:
        raise RuntimeError(f"unflatten: provided sizes {list(sizes)} don't multiply up to the size of dim "
                           f"{dim} ({n}) in the input tensor")
    return _os.reshape(self, self.shape[:ax] + sizes + self.shape[ax + 1:])


def _along(self: Tensor, ax: int, index) -> tuple:
    return (slice(None),) * ax + (index,)


def tensor_split(self: Tensor, indices_or_sections, dim: int = 0) -> tuple:
    """torch's ``tensor_split``: ``n`` pieces as equal as can be (the first ``size % n`` one longer),
    or the pieces between the given indices, along ``dim``; always a tuple of views.

    Example::

        >>> import neural_arch as na
        >>> [p.tolist() for p in na.arange(5).tensor_split(3)]
        [[0, 1], [2, 3], [4]]
        >>> [p.tolist() for p in na.arange(5).tensor_split([1, 4])]
        [[0], [1, 2, 3], [4]]
    """
    if self.ndim == 0:
        raise RuntimeError("tensor_split expected at least a 1-dimensional tensor, but got a tensor "
                           "with 0 dims")
    ax = _check_dim(dim, self.ndim)
    n = self.shape[ax]
    ios = indices_or_sections
    if isinstance(ios, Tensor):
        if ios.data.dtype.kind not in "iu" or ios.ndim > 1:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to be a zero-dimensional "
                               "or one-dimensional tensor of integers")
        ios = int(ios.item()) if ios.ndim == 0 else [int(v) for v in ios.tolist()]
    if isinstance(ios, (int, np.integer)):
        k = int(ios)
        if k <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {k}")
        small, extra = divmod(n, k)
        bounds, start = [], 0
        for i in range(k):
            stop = start + small + (1 if i < extra else 0)
            bounds.append((start, stop))
            start = stop
    else:
        cuts = [int(i) for i in ios]
        edges = [0] + cuts + [n]
        bounds = []
        for a, b in itertools.pairwise(edges):
            a = _bmin(_bmax(a + n if a < 0 else a, 0), n)
            b = _bmin(_bmax(b + n if b < 0 else b, 0), n)
            bounds.append((a, _bmax(a, b)))
    return tuple(_os.getitem(self, _along(self, ax, slice(a, b))) for a, b in bounds)


def select(self: Tensor, dim: int, index: int) -> Tensor:
    """The slice at ``index`` along ``dim``, that dim removed (torch's ``select``; a view).

    Example::

        >>> import neural_arch as na
        >>> na.arange(6).reshape(2, 3).select(1, -1).tolist()
        [2, 5]
    """
    if self.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    ax = _check_dim(dim, self.ndim)
    n = self.shape[ax]
    index = int(index)
    if not -n <= index < n:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(self.shape)} at "
                         f"dimension {ax}")
    return _os.getitem(self, _along(self, ax, index))


def repeat(self: Tensor, *sizes) -> Tensor:
    """torch's ``repeat``: tile the tensor ``sizes[i]`` times along each dim (leading sizes add dims);
    ``len(sizes)`` may not be below ``ndim`` (that is ``tile``'s job). Copies; the gradient sums them.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1, 2]).repeat(2, 2).tolist()
        [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    reps = sizes[0] if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
    reps = tuple(int(r) for r in reps)
    if len(reps) < self.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of "
                           f"dimensions of tensor (got {len(reps)} for a {self.ndim}-d tensor)")
    return _os.tile(self, reps)


def fliplr(self: Tensor) -> Tensor:
    """Flip dim 1 (left/right): torch's ``fliplr``, for tensors of 2 dims or more.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([[1, 2], [3, 4]]).fliplr().tolist()
        [[2, 1], [4, 3]]
    """
    if self.ndim < 2:
        raise RuntimeError("Input must be >= 2-d.")
    return _os.flip(self, 1)


def flipud(self: Tensor) -> Tensor:
    """Flip dim 0 (up/down): torch's ``flipud``, for tensors of 1 dim or more.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([[1, 2], [3, 4]]).flipud().tolist()
        [[3, 4], [1, 2]]
    """
    if self.ndim < 1:
        raise RuntimeError("Input must be >= 1-d.")
    return _os.flip(self, 0)


def sum_to_size(self: Tensor, *size) -> Tensor:
    """Sum this tensor down to ``size``, which must broadcast to its shape (torch's ``sum_to_size``).

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3).sum_to_size(1, 3).tolist()
        [[2.0, 2.0, 2.0]]
    """
    size = tuple(int(s) for s in (size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size))
    shape = self.shape
    lead = len(shape) - len(size)
    if lead < 0 or any(s not in (1, d) for s, d in zip(size, shape[lead:])):
        raise RuntimeError(f"size {list(size)} is not expandable to size {list(shape)}.")
    out = self
    if lead:
        out = out.sum(dim=tuple(range(lead)))
    axes = tuple(i for i, (s, d) in enumerate(zip(size, out.shape)) if s == 1 and d != 1)
    if axes:
        out = out.sum(dim=axes, keepdim=True)
    return out


# ============================================================================ small new ops
def _binary_operands(self: Tensor, other, op: str):
    """``(self data, other data, other Tensor or None, array module)`` with one device."""
    od, ot = _operand(self, other)
    if isinstance(other, Tensor) and not other.requires_grad:
        ot = None
    return self.data, od, ot, _xp(self.data)


def _float_binary(op: str, self: Tensor, other, forward, grads):
    """A binary op with the derivative pair ``grads(xp, a, b, out) -> (da, db)`` (float math)."""
    ad, bd, bt, xp = _binary_operands(self, other, op)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = forward(xp, ad, bd)
    if isinstance(bd, _SCALARS) and ad.dtype.kind == "f":
        out = out.astype(ad.dtype, copy=False)  # a Python number never promotes (torch)
    elif out.dtype.kind == "f" and ad.dtype.kind in "biu" and getattr(bd, "dtype", np.dtype(np.int64)).kind in "biu":
        out = out.astype(_dtypes.default_float_dtype, copy=False)
    ra = self.requires_grad
    if not _needs(self if ra else None, bt):
        return _result(out, None)
    ash, bsh = ad.shape, getattr(bd, "shape", ())

    def fn(g):
        with np.errstate(divide="ignore", invalid="ignore"):
            da, db = grads(xp, ad, bd, out)
        return (unbroadcast((g * da).astype(g.dtype, copy=False), ash) if ra else None,
                unbroadcast((g * db).astype(bd.dtype, copy=False), bsh) if bt is not None else None)

    return _result(out, Node(fn, (self if ra else None, bt), op.capitalize(), saved=(self, other)))


def fmod(self: Tensor, other) -> Tensor:
    """torch's ``fmod``: the C remainder ``a - trunc(a / b) * b`` (the sign of ``self``; ``remainder``
    takes the divisor's). Gradients: 1 for ``self``, ``-trunc(self / other)`` for ``other``.
    Integer division by zero is torch's ``RuntimeError``.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([-3.0, 3.0]).fmod(2).tolist(), na.tensor([-3.0, 3.0]).remainder(2).tolist()
        ([-1.0, 1.0], [1.0, 1.0])
    """
    bd = other.data if isinstance(other, Tensor) else other
    integral = self.data.dtype.kind in "iu" and getattr(bd, "dtype", np.dtype(type(bd))).kind in "iub"
    # torch's error for an integer division by zero (a host divisor only: a device one would sync)
    if integral and (type(bd) is np.ndarray or isinstance(bd, (int, np.integer))) and np.any(np.asarray(bd) == 0):
        raise RuntimeError("ZeroDivisionError: fmod of an integer tensor by zero")
    return _float_binary("fmod", self, other, lambda xp, a, b: xp.fmod(a, b),
                         lambda xp, a, b, out: (1.0, -xp.trunc(a / b)))


def hypot(self: Tensor, other) -> Tensor:
    """``sqrt(self**2 + other**2)`` without overflow (torch's ``hypot``, floating tensors).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([3.0]).hypot(na.tensor([4.0])).tolist()
        [5.0]
    """
    if self.data.dtype.kind not in "f":
        raise RuntimeError(f"hypot: expected a floating-point tensor, got {self.data.dtype}")
    return _float_binary("hypot", self, other, lambda xp, a, b: xp.hypot(a, b),
                         lambda xp, a, b, out: (a / out, b / out))


def _fextreme(name: str, ufunc: str, pick_self):
    def op(self: Tensor, other) -> Tensor:
        # torch's derivative: self gets the gradient where it was picked (ties go to self, and a NaN
        # in other picks self); other gets the rest
        return _float_binary(name, self, other, lambda xp, a, b: getattr(xp, ufunc)(a, b),
                             lambda xp, a, b, out: _picked(xp, pick_self(a, b) | xp.isnan(b)))

    op.__name__ = op.__qualname__ = name
    word = "maximum" if name == "fmax" else "minimum"
    op.__doc__ = (
        f"torch's ``{name}``: the elementwise {word}, where a NaN loses to a number (``{word}`` "
        f"propagates it).\n\n"
        f"Example::\n\n"
        f"    >>> import neural_arch as na\n"
        f"    >>> na.tensor([1.0, float('nan')]).{name}(na.tensor([float('nan'), 2.0])).tolist()\n"
        f"    [1.0, 2.0]\n"
    )
    return op


def _picked(xp, mask):
    return mask.astype(np.float64), (~mask).astype(np.float64)


fmax = _fextreme("fmax", "fmax", lambda a, b: a >= b)
fmin = _fextreme("fmin", "fmin", lambda a, b: a <= b)


def floor_divide(self: Tensor, other) -> Tensor:
    """``self / other`` rounded down (torch's ``floor_divide``, ``//``), as ``div(rounding_mode="floor")``.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([-7, 7]).floor_divide(2).tolist()
        [-4, 3]
    """
    return _ob.torch_div(self, other, rounding_mode="floor")


def true_divide(self: Tensor, other) -> Tensor:
    """``self / other`` (torch's ``true_divide``, an alias of ``div``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0]).true_divide(4).tolist()
        [0.25]
    """
    return _ob.div(self, other)


def rsub(self: Tensor, other, *, alpha=1) -> Tensor:
    """``other - alpha * self`` (torch's ``rsub``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, 2.0]).rsub(10, alpha=2).tolist()
        [8.0, 6.0]
    """
    scaled = self if alpha == 1 else _ob.mul(self, alpha)
    return _ob.rsub(scaled, other) if not isinstance(other, Tensor) else _ob.sub(other, scaled)


# ============================================================================ logical and bitwise
def _logical(name: str):
    arity = 1 if name == "logical_not" else 2

    def op(self: Tensor, *other) -> Tensor:
        if 1 + len(other) != arity:     # (a third array would be the ufunc's ``out``)
            raise TypeError(f"{name}() takes {arity - 1} tensor argument(s) ({len(other)} given)")
        arrays = [self.data] + [o.data if isinstance(o, Tensor) else o for o in other]
        return _result(getattr(_xp(self.data), name)(*arrays), None)

    op.__name__ = op.__qualname__ = name
    args = "" if name == "logical_not" else "na.tensor([1.0, 1.0, 0.0])"
    want = "[False, True, False]" if name == "logical_not" else {
        "logical_and": "[True, False, False]", "logical_or": "[True, True, True]",
        "logical_xor": "[False, True, True]"}[name]
    op.__doc__ = (
        f"torch's ``{name}``: a bool tensor (nonzero is true), no gradient.\n\n"
        f"Example::\n\n"
        f"    >>> import neural_arch as na\n"
        f"    >>> na.tensor([1.0, 0.0, 2.0]).{name}({args}).tolist()\n"
        f"    {want}\n"
    )
    return op


logical_and = _logical("logical_and")
logical_or = _logical("logical_or")
logical_xor = _logical("logical_xor")
logical_not = _logical("logical_not")


def _bitwise(name: str, ufunc: str):
    def op(self: Tensor, *other) -> Tensor:
        arrays = [self.data] + [_operand(self, o)[0] for o in other]
        for a in arrays:
            kind = getattr(a, "dtype", np.dtype(type(a))).kind
            if kind not in "biu":
                raise RuntimeError(f"{name}: only integer and bool tensors are supported, got "
                                   f"{getattr(a, 'dtype', type(a).__name__)}")
        return _result(getattr(_xp(self.data), ufunc)(*arrays), None)

    op.__name__ = op.__qualname__ = name
    example, want = ("na.tensor([12, 10]).bitwise_not().tolist()", "[-13, -11]") if name == "bitwise_not" \
        else (f"na.tensor([12, 10]).{name}(na.tensor([10, 6])).tolist()",
              {"bitwise_and": "[8, 2]", "bitwise_or": "[14, 14]", "bitwise_xor": "[6, 12]"}[name])
    op.__doc__ = (
        f"torch's ``{name}`` of integer or bool tensors (float input is torch's ``RuntimeError``).\n\n"
        f"Example::\n\n    >>> import neural_arch as na\n    >>> {example}\n    {want}\n"
    )
    return op


bitwise_and = _bitwise("bitwise_and", "bitwise_and")
bitwise_or = _bitwise("bitwise_or", "bitwise_or")
bitwise_xor = _bitwise("bitwise_xor", "bitwise_xor")
bitwise_not = _bitwise("bitwise_not", "invert")


def _float_test(self: Tensor, ufunc: str, integers: bool) -> Tensor:
    """A bool tensor of ``xp.<ufunc>`` on a float tensor; on an integer or bool one (no NaN, no inf) the
    answer ``integers`` everywhere."""
    xp = _xp(self.data)
    if self.data.dtype.kind in "biu":
        return _result((xp.ones if integers else xp.zeros)(self.shape, dtype=bool), None)
    return _result(getattr(xp, ufunc)(self.data), None)


def isnan(self: Tensor) -> Tensor:
    """A bool tensor: True where the value is NaN (torch's ``isnan``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, float("nan")]).isnan().tolist()
        [False, True]
    """
    return _float_test(self, "isnan", integers=False)


def isinf(self: Tensor) -> Tensor:
    """A bool tensor: True where the value is +-inf (torch's ``isinf``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, float("-inf")]).isinf().tolist()
        [False, True]
    """
    return _float_test(self, "isinf", integers=False)


def isfinite(self: Tensor) -> Tensor:
    """A bool tensor: True where the value is neither NaN nor +-inf (torch's ``isfinite``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, float("inf"), float("nan")]).isfinite().tolist()
        [True, False, False]
    """
    return _float_test(self, "isfinite", integers=True)


def where(self: Tensor, condition, other) -> Tensor:
    """``self`` where ``condition`` is true, else ``other`` (torch's ``Tensor.where``, which is
    ``torch.where(condition, self, other)``).

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([-1.0, 2.0])
        >>> x.where(x > 0, 0.0).tolist()
        [0.0, 2.0]
    """
    return _oa.where(condition, self, other)


# ============================================================================ clamping, pointwise
def clamp_min(self: Tensor, min) -> Tensor:
    """``clamp(min=min)`` (torch's ``clamp_min``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([-1.0, 2.0]).clamp_min(0).tolist()
        [0.0, 2.0]
    """
    return _oa.clip(self, min=min)


def clamp_max(self: Tensor, max) -> Tensor:
    """``clamp(max=max)`` (torch's ``clamp_max``).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([-1.0, 2.0]).clamp_max(0).tolist()
        [-1.0, 0.0]
    """
    return _oa.clip(self, max=max)


def square(self: Tensor) -> Tensor:
    """``self * self`` (torch's ``square``: an integer tensor stays integer).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([3, -2]).square().tolist()
        [9, 4]
    """
    if self.data.dtype.kind == "b":
        return _ob.mul(_os.astype(self, np.int64), _os.astype(self, np.int64))
    return _ob.mul(self, self)


def addcmul(self: Tensor, tensor1, tensor2, *, value=1) -> Tensor:
    """``self + value * tensor1 * tensor2`` (torch's ``addcmul``; broadcasting).

    Example::

        >>> import neural_arch as na
        >>> na.ones(2).addcmul(na.tensor([1.0, 2.0]), na.tensor([3.0, 4.0]), value=0.5).tolist()
        [2.5, 5.0]
    """
    prod = _ob.mul(tensor1, tensor2)
    return _ob.add(self, prod if value == 1 else _ob.mul(prod, value))


def addcdiv(self: Tensor, tensor1, tensor2, *, value=1) -> Tensor:
    """``self + value * tensor1 / tensor2`` (torch's ``addcdiv``; integer operands are torch's error).

    Example::

        >>> import neural_arch as na
        >>> na.ones(2).addcdiv(na.tensor([1.0, 2.0]), na.tensor([4.0, 4.0]), value=-2).tolist()
        [0.5, 0.0]
    """
    for arg in (tensor1, tensor2):
        if isinstance(arg, Tensor) and arg.data.dtype.kind in "biu":
            raise RuntimeError("Integer division with addcdiv is no longer supported, and in a future "
                               "release addcdiv will perform a true division of tensor1 and tensor2. Use "
                               "(input + value * trunc(tensor1 / tensor2)) for integer inputs")
    quot = _ob.div(tensor1, tensor2)
    return _ob.add(self, quot if value == 1 else _ob.mul(quot, value))


# ============================================================================ products
def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise RuntimeError(msg)


def _same_dtype(op: str, *ts) -> None:
    dts = {t.data.dtype for t in ts}
    if len(dts) > 1:
        raise RuntimeError(f"{op}: expected both operands to have the same dtype, but got "
                           f"{' and '.join(str(t.data.dtype) for t in ts)}")


def mm(self: Tensor, mat2: Tensor) -> Tensor:
    """The matrix product of two 2-d tensors (torch's ``mm``: no broadcasting, no 1-d).

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3).mm(na.ones(3, 4)).shape
        (2, 4)
    """
    _require(self.ndim == 2, f"self must be a matrix (got a {self.ndim}-d tensor)")
    _require(isinstance(mat2, Tensor) and mat2.ndim == 2, "mat2 must be a matrix")
    _require(self.shape[1] == mat2.shape[0], f"mat1 and mat2 shapes cannot be multiplied "
                                              f"({self.shape[0]}x{self.shape[1]} and {mat2.shape[0]}x{mat2.shape[1]})")
    _same_dtype("mm", self, mat2)
    return _ob.matmul(self, mat2)


def mv(self: Tensor, vec: Tensor) -> Tensor:
    """Matrix times vector (torch's ``mv``: ``self`` 2-d, ``vec`` 1-d).

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3).mv(na.ones(3)).tolist()
        [3.0, 3.0]
    """
    _require(self.ndim == 2 and isinstance(vec, Tensor) and vec.ndim == 1,
             f"vector + matrix @ vector expected, got {self.ndim}, {getattr(vec, 'ndim', None)}")
    _require(self.shape[1] == vec.shape[0], f"size mismatch, got input ({self.shape[0]}), mat "
                                             f"({self.shape[0]}x{self.shape[1]}), vec ({vec.shape[0]})")
    _same_dtype("mv", self, vec)
    return _ob.matmul(self, vec)


def dot(self: Tensor, other: Tensor) -> Tensor:
    """The inner product of two 1-d tensors of one length and dtype (torch's ``dot``): a 0-d tensor.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, 2.0]).dot(na.tensor([3.0, 4.0])).item()
        11.0
    """
    _require(self.ndim == 1 and isinstance(other, Tensor) and other.ndim == 1,
             f"1D tensors expected, but got {self.ndim}D and {getattr(other, 'ndim', None)}D tensors")
    _require(self.shape[0] == other.shape[0], f"inconsistent tensor size, expected tensor [{self.shape[0]}] "
                                               f"and src [{other.shape[0]}] to have the same number of elements")
    _same_dtype("dot", self, other)
    return _ob.matmul(self, other)


def _scaled_sum(self: Tensor, product: Tensor, beta, alpha) -> Tensor:
    """``beta * self + alpha * product``; ``beta == 0`` ignores ``self`` (its NaN and inf too: torch)."""
    scaled = product if alpha == 1 else _ob.mul(product, alpha)
    if beta == 0:
        return _os.clone(_os.broadcast_to(scaled, _out_shape(self, scaled))) if self.shape != scaled.shape \
            else scaled
    return _ob.add(self if beta == 1 else _ob.mul(self, beta), scaled)


def _out_shape(a: Tensor, b: Tensor) -> tuple:
    return tuple(np.broadcast_shapes(a.shape, b.shape))


def addmm(self: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * self + alpha * (mat1 @ mat2)`` (torch's ``addmm``; ``self`` broadcasts to the product).

    Example::

        >>> import neural_arch as na
        >>> na.ones(3).addmm(na.ones(2, 4), na.ones(4, 3), beta=2).tolist()
        [[6.0, 6.0, 6.0], [6.0, 6.0, 6.0]]
    """
    return _scaled_sum(self, mm(mat1, mat2), beta, alpha)


def addmv(self: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * self + alpha * (mat @ vec)`` (torch's ``addmv``).

    Example::

        >>> import neural_arch as na
        >>> na.ones(2).addmv(na.ones(2, 3), na.ones(3), alpha=2).tolist()
        [7.0, 7.0]
    """
    return _scaled_sum(self, mv(mat, vec), beta, alpha)


def baddbmm(self: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * self + alpha * bmm(batch1, batch2)`` (torch's ``baddbmm``: 3-d batches of matrices).

    Example::

        >>> import neural_arch as na
        >>> na.zeros(2, 1, 1).baddbmm(na.ones(2, 1, 3), na.ones(2, 3, 1)).tolist()
        [[[3.0]], [[3.0]]]
    """
    return _scaled_sum(self, _ob.bmm(batch1, batch2), beta, alpha)


def kron(self: Tensor, other: Tensor) -> Tensor:
    """The Kronecker product (torch's ``kron``): block ``(i, j)`` of the result is ``self[i, j] * other``;
    the operand with fewer dims gains leading size-1 dims.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([[1, 2]]).kron(na.tensor([[1], [10]])).tolist()
        [[1, 2], [10, 20]]
    """
    nd = _bmax(self.ndim, other.ndim)
    a = _os.reshape(self, (1,) * (nd - self.ndim) + self.shape)
    b = _os.reshape(other, (1,) * (nd - other.ndim) + other.shape)
    a_il = _os.reshape(a, tuple(v for s in a.shape for v in (s, 1)))       # (a0, 1, a1, 1, ...)
    b_il = _os.reshape(b, tuple(v for s in b.shape for v in (1, s)))       # (1, b0, 1, b1, ...)
    out = _ob.mul(a_il, b_il)
    return _os.reshape(out, tuple(x * y for x, y in zip(a.shape, b.shape)))


def cross(self: Tensor, other: Tensor, dim=None) -> Tensor:
    """The 3-vector cross product along ``dim`` (torch's ``Tensor.cross``; the inputs broadcast).

    ``dim=None`` takes the first dim of size 3, as torch's (deprecated) default does;
    ``torch.linalg.cross``'s default is ``dim=-1``, so pass ``dim=-1`` to mean that.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, 0.0, 0.0]).cross(na.tensor([0.0, 1.0, 0.0])).tolist()
        [0.0, 0.0, 1.0]
    """
    if self.ndim != other.ndim:
        raise RuntimeError(f"linalg.cross: inputs must have the same number of dimensions, got "
                           f"{self.ndim} and {other.ndim}")
    shape = _out_shape(self, other)
    if dim is None:
        dim = next((i for i, n in enumerate(shape) if n == 3), None)
        if dim is None:
            raise RuntimeError(f"no dimension of size 3 in input (shape {list(shape)})")
    ax = _check_dim(dim, len(shape))
    if self.shape[ax] != 3 or other.shape[ax] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got "
                           f"{self.shape[ax]} and {other.shape[ax]}")
    a = _os.broadcast_to(self, shape) if self.shape != shape else self
    b = _os.broadcast_to(other, shape) if other.shape != shape else other
    # c_i = a_{i+1} b_{i+2} - a_{i+2} b_{i+1}: rolls by -1 and -2 line the components up
    a1, a2 = _os.roll(a, -1, ax), _os.roll(a, -2, ax)
    b1, b2 = _os.roll(b, -1, ax), _os.roll(b, -2, ax)
    return _ob.sub(_ob.mul(a1, b2), _ob.mul(a2, b1))


def trace(self: Tensor) -> Tensor:
    """The sum of the main diagonal of a 2-d tensor (torch's ``trace``; integers sum to int64).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([[1, 2], [3, 4]]).trace().item()
        5
    """
    _require(self.ndim == 2, f"trace: expected a matrix, but got tensor with dim {self.ndim}")
    diag = _os.diagonal(self)
    return _or.sum(diag, dtype=np.int64) if self.data.dtype.kind in "biu" else _or.sum(diag)


# ============================================================================ reductions
def nansum(self: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The sum treating NaN as zero (torch's ``nansum``); NaN entries get no gradient.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, float("nan"), 2.0]).nansum().item()
        3.0
    """
    x = self
    if self.data.dtype.kind in "fc":  # (where, not masked_fill: a Python 0 needs no host-to-device copy)
        x = _oa.where(_result(_xp(self.data).isnan(self.data), None), 0.0, self)
    return _or.sum(x, dim=dim, keepdim=keepdim, dtype=dtype)


def nanmean(self: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The mean of the non-NaN entries (torch's ``nanmean``; NaN where all are NaN; floats only).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([1.0, float("nan"), 2.0]).nanmean().item()
        1.5
    """
    if self.data.dtype.kind not in "fc":
        raise RuntimeError(f"nanmean(): expected input to have floating point or complex dtype but got "
                           f"{self.data.dtype}")
    count = _or.sum(_result(~_xp(self.data).isnan(self.data), None), dim=dim, keepdim=keepdim)
    total = nansum(self, dim=dim, keepdim=keepdim, dtype=dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _ob.div(total, _os.astype(count, total.dtype))


def _median_index(xp, xd, ax: int, ignore_nan: bool):
    """Index (keepdims) along ``ax`` of the lower median; a slice with NaN picks its first NaN
    (``median``) or, for ``nanmedian``, the lower median of the rest (a NaN where all are NaN)."""
    order = xp.argsort(xd, axis=ax, kind="stable")     # NaN sorts last, ties keep their order
    n = xd.shape[ax]
    nans = xp.isnan(xd).sum(axis=ax, keepdims=True) if xd.dtype.kind in "fc" else xp.zeros(
        tuple(1 if i == ax else s for i, s in enumerate(xd.shape)), dtype=np.int64)
    if ignore_nan:
        valid = n - nans
        pos = xp.where(valid > 0, (valid - 1) // 2, 0)
    else:
        pos = xp.where(nans > 0, n - nans, (n - 1) // 2)
    return xp.take_along_axis(order, pos.astype(np.int64), axis=ax)


def _median(name: str, ignore_nan: bool):
    def op(self: Tensor, dim=None, keepdim: bool = False):
        xd = self.data
        xp = _xp(xd)
        if dim is None:
            if xd.size == 0:  # torch: NaN for a float tensor, an error for an integer one
                if xd.dtype.kind != "f":
                    raise RuntimeError(f"{name}() input tensor cannot be empty")
                return _result(xp.full((), np.nan, dtype=xd.dtype), None)
            flat = _os.reshape(self, (-1,))
            idx = _median_index(xp, flat.data, 0, ignore_nan)
            return _os.reshape(_os.gather(flat, 0, _result(idx, None)), ())
        ax = _check_dim(dim, xd.ndim)
        if xd.ndim and xd.shape[ax] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {ax} to have non-zero size.")
        x = _os.reshape(self, (1,)) if xd.ndim == 0 else self
        idx = _median_index(xp, x.data, ax, ignore_nan)
        values = _os.gather(x, ax, _result(idx, None))
        if not keepdim or xd.ndim == 0:
            values = _os.reshape(values, xd.shape[:ax] + xd.shape[ax + 1:]) if xd.ndim else _os.reshape(values, ())
            idx = idx.reshape(xd.shape[:ax] + xd.shape[ax + 1:]) if xd.ndim else idx.reshape(())
        return _or.return_types.median(values, _result(idx, None))

    op.__name__ = op.__qualname__ = name
    return op


median = _median("median", ignore_nan=False)
median.__doc__ = """torch's ``median``: the lower of the two middle values (NaN if the slice holds one).

    Without ``dim``, a 0-d tensor over all elements; with ``dim``, ``return_types.median(values,
    indices)``, the index of a value holding the median. The gradient goes to that element.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([4.0, 1.0, 3.0, 2.0]).median().item()
        2.0
        >>> values, indices = na.tensor([[3.0, 1.0, 2.0]]).median(dim=1)
        >>> values.tolist(), indices.tolist()
        ([2.0], [2])
    """
nanmedian = _median("nanmedian", ignore_nan=True)
nanmedian.__doc__ = """torch's ``nanmedian``: ``median`` of the non-NaN values (NaN where all are NaN).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([4.0, float("nan"), 1.0]).nanmedian().item()
        1.0
    """


def std_mean(self: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> tuple:
    """``(std, mean)`` in one call (torch's ``std_mean``; ``correction`` as in ``std``).

    Example::

        >>> import neural_arch as na
        >>> s, m = na.tensor([1.0, 3.0]).std_mean()
        >>> round(s.item(), 4), m.item()
        (1.4142, 2.0)
    """
    return (_or.std(self, dim, unbiased, keepdim, correction=correction),
            _or.mean(self, dim=dim, keepdim=keepdim))


def var_mean(self: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> tuple:
    """``(var, mean)`` in one call (torch's ``var_mean``; ``correction`` as in ``var``).

    Example::

        >>> import neural_arch as na
        >>> v, m = na.tensor([1.0, 3.0]).var_mean(correction=0)
        >>> v.item(), m.item()
        (1.0, 2.0)
    """
    return (_or.var(self, dim, unbiased, keepdim, correction=correction),
            _or.mean(self, dim=dim, keepdim=keepdim))


# ============================================================================ indexed writes
def _index_1d(self: Tensor, dim: int, index, op: str, negative_ok: bool = False):
    """``(axis, 1-d integer index on self's device)`` with torch's checks (host bounds checked; a
    device index is not, as reading it would make the host wait). torch's ``index_fill`` counts a
    negative index from the end; ``index_add`` and ``index_copy`` refuse it."""
    xd = self.data
    ax = _check_dim(dim, xd.ndim)
    idx = _os._index_data(index, xd, op)
    if idx.ndim > 1:
        raise IndexError(f"{op}(): Index is supposed to be a vector")
    idx = idx.reshape(-1)
    n = xd.shape[ax] if xd.ndim else 1
    lowest = -n if negative_ok else 0
    if type(idx) is np.ndarray and idx.size and (idx.min() < lowest or idx.max() >= n):
        bad = int(idx.min()) if idx.min() < lowest else int(idx.max())
        raise IndexError(f"{op}(): index {bad} is out of bounds for dimension {ax} with size {n}")
    return ax, idx


def _source(self: Tensor, ax: int, idx, source, op: str):
    sd = source.data if isinstance(source, Tensor) else _xp(self.data).asarray(source)
    want = list(self.shape)
    if want:
        want[ax] = idx.size
    if list(sd.shape) != want and not (sd.size == idx.size == 1 and self.ndim <= 1):
        raise RuntimeError(f"{op}(): source has shape {list(sd.shape)}, expected {want} (self's shape "
                           f"with dim {ax} the index's length)")
    if sd.dtype != self.data.dtype:
        raise RuntimeError(f"{op}(): self ({self.data.dtype}) and source ({sd.dtype}) must have the same "
                           f"dtype")
    return sd.reshape(want) if want else sd.reshape(())


def _grid(self: Tensor, ax: int, idx):
    return _along(self, ax, idx) if self.ndim else ()


def index_add(self: Tensor, dim: int, index, source, *, alpha=1) -> Tensor:
    """A copy of ``self`` with ``alpha * source`` added at ``index`` along ``dim`` (torch's
    ``index_add``; repeated indices accumulate). Gradients: ``self`` the upstream gradient,
    ``source`` the gradient at ``index`` times ``alpha``.

    Example::

        >>> import neural_arch as na
        >>> na.zeros(3).index_add(0, na.tensor([0, 2, 0]), na.tensor([1.0, 2.0, 3.0])).tolist()
        [4.0, 0.0, 2.0]
    """
    ax, idx = _index_1d(self, dim, index, "index_add")
    sd = _source(self, ax, idx, source, "index_add")
    xp = _xp(self.data)
    out = self.data.copy()
    vals = sd if alpha == 1 else sd * alpha
    from .op_utils import scatter_add as _scatter_add_at

    if out.ndim:
        moved = xp.moveaxis(out, ax, 0)          # a view: the add lands in `out`
        _scatter_add_at(xp, moved, idx, xp.moveaxis(vals, ax, 0))
    else:
        out = out + vals.sum() if idx.size else out
    st = source if isinstance(source, Tensor) and source.requires_grad else None
    rx = self.requires_grad
    if not _needs(self if rx else None, st):
        return _result(out, None)
    ssh = source.shape if st is not None else None

    def fn(g):
        gs = None
        if st is not None:
            gs = (g[_grid(self, ax, idx)] if g.ndim else xp.broadcast_to(g, idx.shape)).reshape(ssh)
            gs = gs if alpha == 1 else gs * alpha
        return (g if rx else None), gs

    return _result(out, Node(fn, (self if rx else None, st), "IndexAdd", saved=(index,)))


def index_copy(self: Tensor, dim: int, index, source) -> Tensor:
    """A copy of ``self`` with the slices at ``index`` along ``dim`` replaced by ``source`` (torch's
    ``index_copy``). Gradients: ``self`` zero at the copied slices, ``source`` the gradient there.

    Example::

        >>> import neural_arch as na
        >>> na.zeros(2, 2).index_copy(1, na.tensor([1]), na.ones(2, 1)).tolist()
        [[0.0, 1.0], [0.0, 1.0]]
    """
    ax, idx = _index_1d(self, dim, index, "index_copy")
    sd = _source(self, ax, idx, source, "index_copy")
    xp = _xp(self.data)
    out = self.data.copy()
    if out.ndim:
        out[_grid(self, ax, idx)] = sd
    elif idx.size:
        out = sd.reshape(()).copy()
    st = source if isinstance(source, Tensor) and source.requires_grad else None
    rx = self.requires_grad
    if not _needs(self if rx else None, st):
        return _result(out, None)
    ssh = source.shape if st is not None else None

    def fn(g):
        gx = gs = None
        if rx:
            gx = g.copy()
            if gx.ndim:
                gx[_grid(self, ax, idx)] = 0
            elif idx.size:
                gx = xp.zeros_like(g)
        if st is not None:
            gs = (g[_grid(self, ax, idx)] if g.ndim else xp.broadcast_to(g, idx.shape)).reshape(ssh)
        return gx, gs

    return _result(out, Node(fn, (self if rx else None, st), "IndexCopy", saved=(index,)))


def index_fill(self: Tensor, dim: int, index, value) -> Tensor:
    """A copy of ``self`` with the slices at ``index`` along ``dim`` set to ``value`` (a number or a
    0-d tensor; torch's ``index_fill``). ``self``'s gradient is zero there; a 0-d ``value`` that
    requires grad gets the sum of the gradient over the filled slices.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 3).index_fill(1, na.tensor([0, 2]), -1.0).tolist()
        [[-1.0, 1.0, -1.0], [-1.0, 1.0, -1.0]]
    """
    ax, idx = _index_1d(self, dim, index, "index_fill", negative_ok=True)
    vt = value if isinstance(value, Tensor) else None
    if vt is not None and vt.ndim != 0:
        raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{vt.ndim} dimension(s).")
    xp = _xp(self.data)
    # a Python number goes into where() as it is (no host-to-device copy); the result takes self's dtype
    fill = vt.data.astype(self.data.dtype) if vt is not None else value
    mask = xp.zeros(self.shape[ax] if self.ndim else 1, dtype=bool)
    mask[idx] = True
    mask = mask.reshape((-1,) + (1,) * (self.ndim - ax - 1)) if self.ndim else mask.reshape(())
    out = xp.where(mask, fill, self.data).astype(self.data.dtype, copy=False)
    rv = vt is not None and vt.requires_grad
    rx = self.requires_grad
    if not _needs(self if rx else None, vt if rv else None):
        return _result(out, None)

    def fn(g):
        zero = xp.zeros((), dtype=g.dtype)
        gx = xp.where(mask, zero, g) if rx else None
        gv = xp.where(mask, g, zero).sum().astype(vt.data.dtype) if rv else None
        return gx, gv

    return _result(out, Node(fn, (self if rx else None, vt if rv else None), "IndexFill", saved=(index,)))


def scatter(self: Tensor, dim: int, index, src=None, *, value=None, reduce=None) -> Tensor:
    """A copy of ``self`` with ``out[index[i][j]][j] = src[i][j]`` for ``dim=0`` (likewise for any dim;
    torch's ``scatter``), or ``value`` (a number) at those places. ``reduce=`` is refused: use
    ``scatter_add`` (torch's ``reduce="add"``) or ``scatter_reduce``-style code. With repeated indices
    torch leaves the winner unspecified; here the last write wins. Gradients: ``self`` zero at the
    written places, ``src`` the gradient gathered at ``index``.

    Example::

        >>> import neural_arch as na
        >>> na.zeros(3).scatter(0, na.tensor([2, 0]), na.tensor([5.0, 7.0])).tolist()
        [7.0, 0.0, 5.0]
        >>> na.zeros(2, 2).scatter(1, na.tensor([[1], [0]]), value=1.0).tolist()
        [[0.0, 1.0], [1.0, 0.0]]
    """
    if reduce is not None:
        raise NotImplementedError(f"scatter(reduce={reduce!r}) is not supported: use scatter_add for "
                                  f"'add', or compute the product by hand for 'multiply'")
    if src is None and value is None:
        raise TypeError("scatter(dim, index, src) or scatter(dim, index, value=...): give one of them")
    if src is not None and not isinstance(src, Tensor) and isinstance(src, (*_SCALARS, np.generic)):
        src, value = None, src                      # scatter(dim, index, 1.5): torch's value overload
    xd = self.data
    xp = _xp(xd)
    if value is not None:
        if isinstance(value, Tensor):
            raise TypeError("scatter(value=...) takes a number; pass a tensor as src")
        idx = _os._index_data(index, xd, "scatter")
        src_t = _result(xp.full(idx.shape, value, dtype=xd.dtype), None)
    else:
        src_t = src if isinstance(src, Tensor) else Tensor._wrap(xp.asarray(src))
    ax, iw, sw, vals = _os._scatter_operands(xd, dim, index, src_t, "scatter")
    xw = xd.reshape(1) if xd.ndim == 0 else xd
    out = xw.copy()
    grid = _os._along_grid(xp, iw, ax)
    out[grid] = vals
    out = out.reshape(xd.shape)
    st = src_t if src_t.requires_grad else None
    rx = self.requires_grad
    if not _needs(self if rx else None, st):
        return _result(out, None)
    sshape = src_t.shape

    def fn(g):
        gx = gs = None
        gw = g.reshape(xw.shape)
        if rx:
            gx = gw.copy()
            gx[grid] = 0
            gx = gx.reshape(xd.shape)
        if st is not None:
            gs = xp.zeros(sw.shape, dtype=g.dtype)
            gs[tuple(slice(0, s) for s in iw.shape)] = _os._gather_array(xp, gw, ax, iw)
            gs = gs.reshape(sshape)
        return gx, gs

    return _result(out, Node(fn, (self if rx else None, st), "Scatter", saved=(index,)))


# ============================================================================ random fills
def _random_fill(name: str, draw, doc: str, example: str):
    """``name``: fill in place with host draws from the project's generator (moved to the device)."""

    def method(self: Tensor, *args, generator=None, **kwargs) -> Tensor:
        _refuse_graph_tensor(self, name, f"t = <a new random tensor> (or call {name} under no_grad())")
        values = draw(numpy_generator(generator), self, *args, **kwargs)
        values = np.asarray(values).astype(np.dtype(self.data.dtype), copy=False)
        self.data[...] = _backend.to_device(values, self.device) if self.device != "cpu" else values
        _ag.bump_version(self.data)
        return self

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (f"{doc}; in place, from ``neural_arch.manual_seed``'s generator (or ``generator=``); "
                      f"returns self.\n\nExample::\n\n    >>> import neural_arch as na\n    >>> {example}\n")
    return method


def _draw_uniform(rng, self, from_=0.0, to=1.0, **kw):
    lo, hi = kw.pop("from", from_), to
    _no_kwargs(kw, "uniform_")
    if lo > hi:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={lo} > to={hi}")
    return rng.uniform(lo, hi, size=self.shape)


def _draw_normal(rng, self, mean=0.0, std=1.0):
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    return rng.normal(mean, std, size=self.shape)


def _draw_bernoulli(rng, self, p=0.5):
    pd = _backend.to_device(p.data, "cpu") if isinstance(p, Tensor) else np.asarray(p, dtype=np.float64)
    if np.any((pd < 0) | (pd > 1)):
        raise RuntimeError("bernoulli_ expects p to be in [0, 1]")
    return rng.random(self.shape) < np.broadcast_to(pd, self.shape)


def _draw_exponential(rng, self, lambd=1.0):
    if lambd <= 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    return rng.exponential(1.0 / lambd, size=self.shape)


def _draw_log_normal(rng, self, mean=1.0, std=2.0):
    if std <= 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")
    return rng.lognormal(mean, std, size=self.shape)


def _draw_cauchy(rng, self, median=0.0, sigma=1.0):
    return median + sigma * rng.standard_cauchy(size=self.shape)


def _draw_geometric(rng, self, p):
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    return rng.geometric(p, size=self.shape)


def _draw_random(rng, self, from_=None, to=None, **kw):
    """torch's ``random_``: ``[0, 2**mantissa]`` for floats (the dtype's max for integers) with no
    bounds, ``[0, to)`` with one, ``[from, to)`` with two."""
    lo = kw.pop("from", from_)
    _no_kwargs(kw, "random_")
    dt = np.dtype(self.data.dtype)
    if lo is not None and to is None:
        lo, to = 0, lo                           # random_(to)
    lo = 0 if lo is None else lo
    if to is None:
        if dt.kind == "f" or dt.name == "bfloat16":
            mant = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}.get(dt.name, 24)
            to = 2 ** mant + 1
        elif dt.kind == "b":
            to = 2
        else:
            to = int(np.iinfo(dt).max) + 1
    if lo >= to:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={lo} >= to={to}")
    return rng.integers(int(lo), int(to), size=self.shape, dtype=np.int64 if to <= 2 ** 63 - 1 else np.uint64)


def _no_kwargs(kw, op):
    if kw:
        raise TypeError(f"{op}() got unexpected keyword argument(s) {sorted(kw)}")


uniform_ = _random_fill("uniform_", _draw_uniform, "Fill with U(from, to)",
                        "bool(((na.zeros(3).uniform_(-1, 1)).abs() <= 1).all())\n    True")
normal_ = _random_fill("normal_", _draw_normal, "Fill with N(mean, std**2)",
                       "na.zeros(3).normal_(0, 0.02).shape\n    (3,)")
bernoulli_ = _random_fill("bernoulli_", _draw_bernoulli, "Fill with 1 with probability ``p`` (a number "
                          "or a tensor broadcast to this one), else 0",
                          "na.zeros(3).bernoulli_(1.0).tolist()\n    [1.0, 1.0, 1.0]")
exponential_ = _random_fill("exponential_", _draw_exponential, "Fill with Exp(lambd) draws",
                            "bool((na.zeros(3).exponential_(2.0) >= 0).all())\n    True")
log_normal_ = _random_fill("log_normal_", _draw_log_normal, "Fill with exp(N(mean, std**2)) draws",
                           "bool((na.zeros(3).log_normal_() > 0).all())\n    True")
cauchy_ = _random_fill("cauchy_", _draw_cauchy, "Fill with Cauchy(median, sigma) draws",
                       "na.zeros(3).cauchy_().shape\n    (3,)")
geometric_ = _random_fill("geometric_", _draw_geometric, "Fill with the number of Bernoulli(p) trials "
                          "to the first success (1, 2, ...)",
                          "bool((na.zeros(3).geometric_(0.5) >= 1).all())\n    True")
random_ = _random_fill("random_", _draw_random, "Fill with integers from ``[from, to)`` (``random_(to)``: "
                       "``[0, to)``; no bounds: ``[0, 2**mantissa]`` for floats, the dtype's range for "
                       "integers)", "na.zeros(4, dtype=na.int64).random_(3, 4).tolist()\n    [3, 3, 3, 3]")


def bernoulli(self: Tensor, p=None, *, generator=None) -> Tensor:
    """A new tensor of 0/1 draws, 1 with probability given by ``self`` (or by ``p``): torch's
    ``bernoulli``. No gradient (torch's is zero).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([0.0, 1.0]).bernoulli().tolist()
        [0.0, 1.0]
    """
    out = Tensor._wrap(_xp(self.data).empty_like(self.data))
    with no_grad():
        return bernoulli_(out, self if p is None else p, generator=generator)


# ============================================================================ misc
def detach_(self: Tensor) -> Tensor:
    """Make this tensor a leaf with no history and no gradient requirement, in place (torch's
    ``detach_``); returns self.

    Example::

        >>> import neural_arch as na
        >>> y = na.ones(2, requires_grad=True) * 2
        >>> y.detach_().requires_grad, y.grad_fn is None
        (False, True)
    """
    self.grad_fn = None
    self.requires_grad = False
    return self


_TYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
               "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
               "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


def type_(self: Tensor, dtype=None, non_blocking: bool = False, **kwargs):
    """torch's ``Tensor.type``: with no ``dtype``, the type string (``'torch.FloatTensor'``,
    ``'torch.cuda.LongTensor'``: the strings ported scripts compare with); with one (a dtype or such a
    string), this tensor cast to it.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2).type(), na.ones(2).type(na.int64).dtype, na.ones(1).type("torch.DoubleTensor").dtype
        ('torch.FloatTensor', dtype('int64'), dtype('float64'))
    """
    if dtype is None:
        name = _TYPE_NAMES.get(np.dtype(self.data.dtype).name, np.dtype(self.data.dtype).name)
        return f"torch.{'cuda.' if self.device != 'cpu' else ''}{name}Tensor"
    if isinstance(dtype, str) and dtype.endswith("Tensor"):
        base = dtype.rsplit(".", 1)[-1][:-len("Tensor")]
        names = {v: k for k, v in _TYPE_NAMES.items()}
        if base not in names:
            raise ValueError(f"type({dtype!r}): unknown tensor type")
        out = _os.astype(self, names[base])
        return _os.to_device(out, "cuda") if ".cuda." in dtype and self.device == "cpu" else out
    return _os.astype(self, dtype)


def is_complex(self: Tensor) -> bool:
    """True for complex dtypes.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2).is_complex()
        False
    """
    return self.data.dtype.kind == "c"


def is_signed(self: Tensor) -> bool:
    """True unless the dtype is unsigned or bool (torch's ``is_signed``).

    Example::

        >>> import neural_arch as na
        >>> na.ones(2).is_signed(), na.ones(2, dtype=na.uint8).is_signed()
        (True, False)
    """
    return self.data.dtype.kind not in "ub"


def positive(self: Tensor) -> Tensor:
    """``self`` itself (torch's ``positive``; bool is refused as torch does).

    Example::

        >>> import neural_arch as na
        >>> na.tensor([-1.0]).positive().tolist()
        [-1.0]
    """
    if self.data.dtype.kind == "b":
        raise TypeError("The `+` operator, on a bool tensor is not supported.")
    return self


def _comparison_alias(name: str, compare, base: str):
    def method(self: Tensor, other) -> Tensor:
        return compare(self, other)

    method.__name__ = method.__qualname__ = name
    want = {"gt": "[False, False, True]", "ge": "[False, True, True]", "lt": "[True, False, False]",
            "le": "[True, True, False]", "ne": "[True, False, True]"}[base]
    method.__doc__ = (f"torch's ``{name}``, another name of ``{base}``: a bool tensor (no gradient).\n\n"
                      f"Example::\n\n    >>> import neural_arch as na\n"
                      f"    >>> na.tensor([1.0, 2.0, 3.0]).{name}(2.0).tolist()\n    {want}\n")
    return method


# ============================================================================ binding
def _masked_fill_alt(self, mask, value):
    return _oa.masked_fill(self, mask, value)


def _bind_methods(T) -> None:
    """Bind torch's Tensor methods defined or composed here onto ``T``."""
    T.t, T.mT, T.H, T.mH = t, mT, H, mH
    T.t_ = _metadata_inplace("t_", t, "t = t.t()")
    T.unsqueeze_ = _metadata_inplace("unsqueeze_", _os.unsqueeze, "t = t.unsqueeze(dim)")
    T.squeeze_ = _metadata_inplace("squeeze_", _os.squeeze, "t = t.squeeze(dim)")
    T.transpose_ = _metadata_inplace("transpose_", lambda x, d0, d1: _os.transpose(x, d0, d1),
                                     "t = t.transpose(dim0, dim1)")
    T.is_contiguous, T.stride, T.storage_offset = is_contiguous, stride, storage_offset
    T.unflatten, T.tensor_split, T.select, T.repeat = unflatten, tensor_split, select, repeat
    T.fliplr, T.flipud, T.sum_to_size = fliplr, flipud, sum_to_size
    T.fmod, T.hypot, T.fmax, T.fmin = fmod, hypot, fmax, fmin
    T.floor_divide, T.true_divide, T.rsub = floor_divide, true_divide, rsub
    T.divide, T.multiply, T.subtract = _ob.torch_div, _ob.mul, _ob.torch_sub
    T.logical_and, T.logical_or, T.logical_xor, T.logical_not = logical_and, logical_or, logical_xor, logical_not
    T.bitwise_and, T.bitwise_or, T.bitwise_xor, T.bitwise_not = bitwise_and, bitwise_or, bitwise_xor, bitwise_not
    T.isnan, T.isinf, T.isfinite, T.where = isnan, isinf, isfinite, where
    T.clamp_min, T.clamp_max, T.square = clamp_min, clamp_max, square
    T.addcmul, T.addcdiv = addcmul, addcdiv
    T.mm, T.mv, T.dot = mm, mv, dot
    T.addmm, T.addmv, T.baddbmm, T.kron, T.cross, T.trace = addmm, addmv, baddbmm, kron, cross, trace
    T.nansum, T.nanmean, T.median, T.nanmedian = nansum, nanmean, median, nanmedian
    T.std_mean, T.var_mean = std_mean, var_mean
    T.index_add, T.index_copy, T.index_fill, T.scatter = index_add, index_copy, index_fill, scatter
    T.uniform_, T.normal_, T.bernoulli_, T.exponential_ = uniform_, normal_, bernoulli_, exponential_
    T.log_normal_, T.cauchy_, T.geometric_, T.random_ = log_normal_, cauchy_, geometric_, random_
    T.bernoulli, T.detach_, T.type = bernoulli, detach_, type_
    T.is_complex, T.is_signed, T.positive = is_complex, is_signed, positive
    T.negative, T.sgn, T.absolute = _ob.neg, _oa.sign, _oa.abs
    for alias, base in (("greater", "gt"), ("greater_equal", "ge"), ("less", "lt"), ("less_equal", "le"),
                        ("not_equal", "ne")):
        setattr(T, alias, _comparison_alias(alias, getattr(T, base), base))
    # in place: each is its out-of-place op written back (the rules of ops_inplace)
    pointwise = {
        "abs": _oa.abs, "neg": _ob.neg, "exp": _oa.exp, "log": _oa.log, "sqrt": _oa.sqrt, "pow": _ob.pow,
        "reciprocal": _oa.reciprocal, "square": square, "rsqrt": _oa.rsqrt, "sin": _oa.sin,
        "cos": _oa.cos, "tan": _oa.tan, "tanh": _oa.tanh, "sigmoid": _oa.sigmoid, "relu": _oa.relu,
        "floor": _oa.floor, "ceil": _oa.ceil, "round": _oa._round, "trunc": _oa.trunc, "frac": _oa.frac,
        "sign": _oa.sign, "log1p": _oa.log1p, "expm1": _oa.expm1, "log2": _oa.log2, "log10": _oa.log10,
        "erf": _oa.erf, "sinh": _oa.sinh, "cosh": _oa.cosh, "asin": _oa.asin, "acos": _oa.acos,
        "atan": _oa.atan, "atan2": _oa.atan2, "nan_to_num": _oa.nan_to_num,
        "clamp_min": clamp_min, "clamp_max": clamp_max, "masked_fill": _masked_fill_alt,
        "index_add": index_add, "index_copy": index_copy, "index_fill": index_fill, "scatter": scatter,
        "addcmul": addcmul, "addcdiv": addcdiv, "lerp": _ob.lerp, "fmod": fmod,
        "remainder": _ob.remainder, "floor_divide": floor_divide, "true_divide": true_divide,
        "hypot": hypot, "tril": _os.tril, "triu": _os.triu, "logical_not": logical_not,
        "logical_and": logical_and, "logical_or": logical_or, "logical_xor": logical_xor,
        "addmm": addmm, "baddbmm": baddbmm, "fix": _oa.trunc,
    }
    for base, fn in pointwise.items():
        setattr(T, base + "_", _inplace(base + "_", fn, f"t = t.{base}(...)"))
    T.absolute_, T.negative_ = T.abs_, T.neg_
    T.arcsin_, T.arccos_, T.arctan_ = T.asin_, T.acos_, T.atan_
