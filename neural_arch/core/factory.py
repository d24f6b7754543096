"""Tensor creation with torch's names, signatures and default dtypes.

``zeros/ones/empty/full/arange/linspace/eye``, the random ``randn/rand/randint/randperm`` and
``multinomial``, the ``*_like`` variants and ``from_numpy``. Every creation function takes ``dtype=``, ``device=`` and
``requires_grad=`` keywords. Defaults follow torch: float32 for floating results (``zeros``,
``randn``, a float ``fill_value``), int64 for integer ones (``arange(5)``, ``randint``, an int
``fill_value``), bool for a bool ``fill_value``.

Random numbers are drawn on the host from the global generator
(:func:`~neural_arch.core.manual_seed`), then moved to ``device``: a seed gives the same numbers on CPU and GPU (what DDP's identical-initial-weights
check relies on), at the price of a host-to-device copy. Pass ``generator=`` (a
:class:`~neural_arch.Generator`, or a ``numpy.random.Generator``) to use your own stream.

Example::

    >>> import neural_arch as na
    >>> na.manual_seed(0)
    >>> x = na.randn(2, 3, requires_grad=True)
    >>> x.shape, x.dtype, x.requires_grad
    ((2, 3), dtype('float32'), True)
    >>> na.arange(3).dtype, na.arange(0, 1, 0.5).tolist(), na.full((2,), 7).dtype
    (dtype('int64'), [0.0, 0.5], dtype('int64'))
    >>> na.zeros_like(x).shape, na.ones(2, dtype=na.int32).tolist()
    ((2, 3), [1, 1])
"""

from __future__ import annotations

import builtins
import numbers

import numpy as np

from .. import backend as _backend
from . import dtypes as _dtypes
from .rng import numpy_generator
from .tensor import Tensor

__all__ = [
    "arange",
    "device",
    "empty",
    "empty_like",
    "eye",
    "from_numpy",
    "full",
    "full_like",
    "is_tensor",
    "linspace",
    "multinomial",
    "ones",
    "ones_like",
    "rand",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "randperm",
    "zeros",
    "zeros_like",
]


def _size(args, kwargs, who: str) -> tuple:
    """The shape from ``f(2, 3)``, ``f((2, 3))``, ``f([2, 3])`` or ``f(size=(2, 3))``."""
    if "size" in kwargs:
        if args:
            raise TypeError(f"{who}(): give the size positionally or as size=, not both")
        args = (kwargs.pop("size"),)
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    try:
        shape = tuple(builtins.int(s) for s in args)
    except TypeError:
        raise TypeError(f"{who}(): size must be ints or a tuple of ints, got {args!r}") from None
    if builtins.any(s < 0 for s in shape):
        raise RuntimeError(f"{who}(): negative dimension in size {shape}")
    return shape


def _finish(arr, device, requires_grad) -> Tensor:
    if device is not None:
        arr = _backend.to_device(arr, device)
    return Tensor(arr, requires_grad=requires_grad)


def _float_dtype(dtype):
    return _dtypes.default_float_dtype if dtype is None else _dtypes.as_dtype(dtype)


def _xp(device):
    return np if device is None else _backend.xp_for_device(device)


def _make(fill: str, args, kwargs, who: str) -> Tensor:
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    requires_grad = kwargs.pop("requires_grad", False)
    shape = _size(args, kwargs, who)
    _no_extra(kwargs, who)
    dt = _float_dtype(dtype)
    if dt.name == "bfloat16":  # CuPy has no bfloat16: build on the host
        return _finish(getattr(np, fill)(shape, dtype=dt), device, requires_grad)
    xp = _xp(device)
    arr = getattr(xp, fill)(shape, dtype=dt)
    return Tensor(arr, requires_grad=requires_grad, device=device)


def _no_extra(kwargs, who):
    kwargs.pop("layout", None)
    kwargs.pop("pin_memory", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"{who}() got unexpected keyword argument(s) {sorted(kwargs)}")


def zeros(*size, **kwargs) -> Tensor:
    """``zeros(*size, dtype=None, device=None, requires_grad=False)``: float32 zeros by default.

    Example::

        >>> import neural_arch as na
        >>> na.zeros(2, 3).shape, na.zeros((2, 3)).dtype
        ((2, 3), dtype('float32'))
    """
    return _make("zeros", size, kwargs, "zeros")


def ones(*size, **kwargs) -> Tensor:
    """``ones(*size, dtype=None, device=None, requires_grad=False)``: float32 ones by default.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2, 2).sum().item(), na.ones(2).dtype
        (4.0, dtype('float32'))
    """
    return _make("ones", size, kwargs, "ones")


def empty(*size, **kwargs) -> Tensor:
    """``empty(*size, dtype=None, device=None, requires_grad=False)``: uninitialised memory.

    Example::

        >>> import neural_arch as na
        >>> na.empty(2, 3).shape
        (2, 3)
    """
    return _make("empty", size, kwargs, "empty")


def _scalar_dtype(value):
    """torch's dtype for a Python scalar: bool, int64, float32 (the default), complex64."""
    if isinstance(value, Tensor):
        return value.dtype
    if isinstance(value, (np.generic, np.ndarray)):
        return value.dtype
    if isinstance(value, builtins.bool):
        return _dtypes.bool
    if isinstance(value, numbers.Integral):
        return _dtypes.int64
    if isinstance(value, numbers.Real):
        return _dtypes.default_float_dtype
    if isinstance(value, numbers.Complex):
        return _dtypes.complex64
    raise TypeError(f"fill_value must be a number, got {type(value).__name__}")


def full(size, fill_value, *, dtype=None, device=None, requires_grad: bool = False, **kwargs) -> Tensor:
    """An array of ``size`` filled with ``fill_value``; the dtype follows the value like torch
    (``full((2,), 1)`` is int64, ``full((2,), 1.0)`` float32).

    Example::

        >>> import neural_arch as na
        >>> na.full((2,), 7).tolist(), na.full((2,), 7).dtype, na.full((2,), 0.5).dtype
        ([7, 7], dtype('int64'), dtype('float32'))
    """
    _no_extra(kwargs, "full")
    shape = _size((size,), {}, "full")
    dt = _scalar_dtype(fill_value) if dtype is None else _dtypes.as_dtype(dtype)
    value = fill_value.item() if isinstance(fill_value, Tensor) else fill_value
    arr = np.full(shape, value, dtype=dt) if dt.name == "bfloat16" or device is None else (
        _xp(device).full(shape, value, dtype=dt))
    return Tensor(arr, requires_grad=requires_grad, device=device)


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad: bool = False,
           **kwargs) -> Tensor:
    """``arange(end)``, ``arange(start, end)``, ``arange(start, end, step)``: int64 when all
    arguments are integers, else float32 (torch's rule).

    Example::

        >>> import neural_arch as na
        >>> na.arange(3).tolist(), na.arange(0, 1, 0.5).dtype
        ([0, 1, 2], dtype('float32'))
    """
    _no_extra(kwargs, "arange")
    if end is None:
        start, end = 0, start
    vals = [v.item() if isinstance(v, Tensor) else v for v in (start, end, step)]
    if step == 0:
        raise RuntimeError("arange: step must be nonzero")
    if dtype is None:
        ints = builtins.all(isinstance(v, numbers.Integral) for v in vals)
        dtype = _dtypes.int64 if ints else _dtypes.default_float_dtype
    dt = _dtypes.as_dtype(dtype)
    # Computed in float64/int64 then cast: the values do not depend on the target precision.
    wide = np.int64 if dt.kind in "iu" else np.float64
    arr = np.arange(*vals, dtype=wide).astype(dt)
    return _finish(arr, device, requires_grad)


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad: bool = False,
             **kwargs) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive (float32 by default).

    Example::

        >>> import neural_arch as na
        >>> na.linspace(0, 1, 3).tolist()
        [0.0, 0.5, 1.0]
    """
    _no_extra(kwargs, "linspace")
    arr = np.linspace(start, end, builtins.int(steps), dtype=np.float64).astype(_float_dtype(dtype))
    return _finish(arr, device, requires_grad)


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad: bool = False,
        **kwargs) -> Tensor:
    """The ``n x m`` identity matrix (float32 by default).

    Example::

        >>> import neural_arch as na
        >>> na.eye(2).tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    _no_extra(kwargs, "eye")
    return _finish(np.eye(n, m, dtype=_float_dtype(dtype)), device, requires_grad)


# ----------------------------------------------------------------------------------- random
def _random(draw, args, kwargs, who: str) -> Tensor:
    generator = kwargs.pop("generator", None)
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    requires_grad = kwargs.pop("requires_grad", False)
    shape = _size(args, kwargs, who)
    _no_extra(kwargs, who)
    dt = _float_dtype(dtype)
    if not _dtypes.is_floating_dtype(dt):
        raise TypeError(f"{who}(): dtype must be floating point, got {dt} (use randint for integers)")
    rng = numpy_generator(generator)
    wide = np.float64 if dt == np.float64 else np.float32
    arr = draw(rng, shape, wide)
    return _finish(arr.astype(dt, copy=False), device, requires_grad)


def randn(*size, **kwargs) -> Tensor:
    """Standard-normal samples: ``randn(*size, generator=None, dtype=None, device=None,
    requires_grad=False)`` (float32 by default).

    Example::

        >>> import neural_arch as na
        >>> na.manual_seed(0)
        >>> a = na.randn(2, 3)
        >>> na.manual_seed(0)
        >>> bool((na.randn(2, 3).data == a.data).all()), a.dtype
        (True, dtype('float32'))
    """
    return _random(lambda rng, shape, dt: rng.standard_normal(shape, dtype=dt), size, kwargs, "randn")


def rand(*size, **kwargs) -> Tensor:
    """Uniform samples on ``[0, 1)``, same arguments as :func:`randn`.

    Example::

        >>> import neural_arch as na
        >>> x = na.rand(1000)
        >>> bool((x.data >= 0).all() and (x.data < 1).all())
        True
    """
    return _random(lambda rng, shape, dt: rng.random(shape, dtype=dt), size, kwargs, "rand")


def randint(*args, size=None, generator=None, dtype=None, device=None, requires_grad: bool = False,
            low=None, high=None, **kwargs) -> Tensor:
    """Integers uniform on ``[low, high)``: ``randint(high, size)`` or ``randint(low, high, size)``
    (int64 by default, like torch).

    Example::

        >>> import neural_arch as na
        >>> x = na.randint(0, 10, (100,))
        >>> x.dtype, bool((x.data >= 0).all() and (x.data < 10).all())
        (dtype('int64'), True)
    """
    _no_extra(kwargs, "randint")
    args = list(args)
    if size is None and args and isinstance(args[-1], (tuple, list)):
        size = args.pop()
    if high is None and args:
        high = args.pop()
    if low is None:
        low = args.pop() if args else 0
    if args or high is None or size is None:
        raise TypeError("randint(): use randint(high, size), randint(low, high, size) or keywords "
                        "low=, high=, size=(...)")
    rng = numpy_generator(generator)
    dt = _dtypes.int64 if dtype is None else _dtypes.as_dtype(dtype)
    arr = rng.integers(low, high, size=_size((size,), {}, "randint"), dtype=np.int64).astype(dt)
    return _finish(arr, device, requires_grad)


def randperm(n: int, *, generator=None, dtype=None, device=None, requires_grad: bool = False,
             **kwargs) -> Tensor:
    """A random permutation of ``range(n)``, as int64.

    Example::

        >>> import neural_arch as na
        >>> sorted(na.randperm(4).tolist())
        [0, 1, 2, 3]
    """
    _no_extra(kwargs, "randperm")
    rng = numpy_generator(generator)
    dt = _dtypes.int64 if dtype is None else _dtypes.as_dtype(dtype)
    return _finish(rng.permutation(builtins.int(n)).astype(dt), device, requires_grad)


def multinomial(input, num_samples: int, replacement: bool = False, *, generator=None) -> Tensor:
    """Indices drawn from the categories weighted by ``input`` (``torch.multinomial``).

    ``input`` holds non-negative weights, 1-d ``(C,)`` or 2-d ``(N, C)`` (one distribution per
    row); they need not sum to one. Returns int64 indices ``(num_samples,)`` or
    ``(N, num_samples)`` on ``input``'s device. Without ``replacement`` each row's indices are
    distinct, in the order drawn, and a row needs at least ``num_samples`` non-zero weights.
    Raises ``RuntimeError`` as torch does for a negative, ``inf`` or ``nan`` weight, an all-zero
    row, ``num_samples <= 0`` or more samples than categories without replacement.

    Example::

        >>> import neural_arch as na
        >>> g = na.Generator().manual_seed(0)
        >>> na.multinomial(na.tensor([0.0, 1.0, 0.0]), 2, replacement=True, generator=g).tolist()
        [1, 1]
        >>> sorted(na.multinomial(na.tensor([[1.0, 2.0, 3.0]]), 3, generator=g).tolist()[0])
        [0, 1, 2]
    """
    ref = input if isinstance(input, Tensor) else Tensor(input)
    if ref.ndim not in (1, 2):
        raise RuntimeError(f"prob_dist must be 1 or 2 dim, got {ref.ndim}")
    if not _dtypes.is_floating_dtype(ref.dtype):
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {ref.dtype}")
    n = builtins.int(num_samples)
    if n <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    categories = ref.shape[-1]
    if not replacement and n > categories:
        raise RuntimeError(f"cannot sample n_sample > prob_dist.size(-1) samples without replacement "
                           f"({n} > {categories})")
    # Drawn on the host in float64 (as the random functions above): same seed, same indices on
    # every device, and no round-off in the cumulative sums of a large vocabulary.
    probs = np.atleast_2d(_backend.to_host(ref.data).astype(np.float64))
    if not np.isfinite(probs).all() or (probs < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    totals = probs.sum(axis=-1)
    if (totals <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    rng = numpy_generator(generator)
    if replacement:
        cdf = np.cumsum(probs, axis=-1)
        cdf /= cdf[:, -1:]  # the last entry is exactly 1: a uniform in [0, 1) always lands
        uniforms = rng.random((probs.shape[0], n))
        # side="right": a zero-weight category has an empty interval and is never picked
        out = np.stack([np.searchsorted(c, u, side="right") for c, u in zip(cdf, uniforms)])
    else:
        if ((probs > 0).sum(axis=-1) < n).any():
            raise RuntimeError("invalid multinomial distribution (with replacement=False, not enough "
                               "non-negative category to sample)")
        # torch's algorithm: the top n of p / q with q ~ Exp(1) is a draw without replacement,
        # in the order drawn (the exponential race).
        keys = probs / rng.standard_exponential(probs.shape)
        out = np.argsort(-keys, axis=-1, kind="stable")[:, :n]
    out = out.astype(np.int64).reshape(ref.shape[:-1] + (n,))
    return _finish(out, ref.device, False)


# ----------------------------------------------------------------------------------- *_like
def _like(fn, input, dtype, device, requires_grad, *extra, **kw) -> Tensor:
    ref = input if isinstance(input, Tensor) else Tensor(input)
    return fn(*extra, ref.shape, dtype=ref.dtype if dtype is None else dtype,
              device=ref.device if device is None else device, requires_grad=requires_grad, **kw)


def zeros_like(input, *, dtype=None, device=None, requires_grad: bool = False, **kwargs) -> Tensor:
    """Zeros with ``input``'s shape, dtype and device (each may be overridden).

    Example::

        >>> import neural_arch as na
        >>> na.zeros_like(na.ones(2)).tolist()
        [0.0, 0.0]
    """
    _no_extra(kwargs, "zeros_like")
    return _like(zeros, input, dtype, device, requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad: bool = False, **kwargs) -> Tensor:
    """Ones with ``input``'s shape, dtype and device.

    Example::

        >>> import neural_arch as na
        >>> na.ones_like(na.zeros(2, 3)).shape
        (2, 3)
    """
    _no_extra(kwargs, "ones_like")
    return _like(ones, input, dtype, device, requires_grad)


def empty_like(input, *, dtype=None, device=None, requires_grad: bool = False, **kwargs) -> Tensor:
    """Uninitialised memory with ``input``'s shape, dtype and device.

    Example::

        >>> import neural_arch as na
        >>> na.empty_like(na.ones(2, dtype=na.float64)).dtype
        dtype('float64')
    """
    _no_extra(kwargs, "empty_like")
    return _like(empty, input, dtype, device, requires_grad)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad: bool = False,
              **kwargs) -> Tensor:
    """``fill_value`` everywhere, with ``input``'s shape, dtype and device.

    Example::

        >>> import neural_arch as na
        >>> na.full_like(na.zeros(2), 3.0).tolist()
        [3.0, 3.0]
    """
    _no_extra(kwargs, "full_like")
    ref = input if isinstance(input, Tensor) else Tensor(input)
    return full(ref.shape, fill_value, dtype=ref.dtype if dtype is None else dtype,
                device=ref.device if device is None else device, requires_grad=requires_grad)


def randn_like(input, *, generator=None, dtype=None, device=None, requires_grad: bool = False,
               **kwargs) -> Tensor:
    """Standard-normal samples with ``input``'s shape, dtype and device.

    Example::

        >>> import neural_arch as na
        >>> na.randn_like(na.zeros(2, 3, dtype=na.float64)).dtype
        dtype('float64')
    """
    _no_extra(kwargs, "randn_like")
    return _like(randn, input, dtype, device, requires_grad, generator=generator)


def rand_like(input, *, generator=None, dtype=None, device=None, requires_grad: bool = False,
              **kwargs) -> Tensor:
    """Uniform ``[0, 1)`` samples with ``input``'s shape, dtype and device.

    Example::

        >>> import neural_arch as na
        >>> na.rand_like(na.zeros(2, 3)).shape
        (2, 3)
    """
    _no_extra(kwargs, "rand_like")
    return _like(rand, input, dtype, device, requires_grad, generator=generator)


def randint_like(input, low, high=None, *, generator=None, dtype=None, device=None,
                 requires_grad: bool = False, **kwargs) -> Tensor:
    """Integers on ``[low, high)`` (or ``[0, low)``) with ``input``'s shape, dtype and device.

    Example::

        >>> import neural_arch as na
        >>> x = na.randint_like(na.zeros(5), 3)
        >>> x.shape, bool((x.data < 3).all())
        ((5,), True)
    """
    _no_extra(kwargs, "randint_like")
    if high is None:
        low, high = 0, low
    ref = input if isinstance(input, Tensor) else Tensor(input)
    return randint(low, high, ref.shape, generator=generator, dtype=ref.dtype if dtype is None else dtype,
                   device=ref.device if device is None else device, requires_grad=requires_grad)


# ----------------------------------------------------------------------------------- misc
def from_numpy(ndarray: np.ndarray) -> Tensor:
    """A tensor sharing memory with ``ndarray`` (no copy, dtype kept), like ``torch.from_numpy``.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> a = np.zeros(2)
        >>> t = na.from_numpy(a)
        >>> a[0] = 1.0
        >>> t.tolist(), t.dtype
        ([1.0, 0.0], dtype('float64'))
    """
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"from_numpy: expected np.ndarray (got {type(ndarray).__name__}); "
                        f"use neural_arch.tensor(data) for other inputs")
    return Tensor(ndarray)


def is_tensor(obj) -> bool:
    """True for :class:`~neural_arch.core.tensor.Tensor` (and ``Parameter``) objects.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> na.is_tensor(na.ones(1)), na.is_tensor(np.ones(1))
        (True, False)
    """
    return isinstance(obj, Tensor)


def device(type_or_str, index: int | None = None) -> _backend.Device:
    """torch's ``device``: ``device("cuda:1")``, ``device("cuda", 1)`` or ``device("cpu")``.

    >>> device("cuda", 1), str(device("cpu"))
    (Device(type='cuda', index=1), 'cpu')
    """
    if index is not None:
        return _backend.parse_device(f"{type_or_str}:{builtins.int(index)}" if type_or_str != "cpu"
                                     else "cpu")
    return _backend.parse_device(type_or_str)


def _bind_methods(T) -> None:
    """``new_zeros`` / ``new_ones`` / ``new_full`` / ``new_empty`` / ``new_tensor``: same dtype and
    device as ``self`` unless given."""
    from .tensor import tensor

    def _new(fn):
        def method(self, *size, dtype=None, device=None, requires_grad=False, **kwargs):
            return fn(*size, dtype=self.dtype if dtype is None else dtype,
                      device=self.device if device is None else device,
                      requires_grad=requires_grad, **kwargs)
        return method

    T.new_zeros, T.new_ones, T.new_empty = _new(zeros), _new(ones), _new(empty)

    def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False):
        return full(size, fill_value, dtype=self.dtype if dtype is None else dtype,
                    device=self.device if device is None else device, requires_grad=requires_grad)

    def new_tensor(self, data, *, dtype=None, device=None, requires_grad=False):
        return tensor(data, dtype=self.dtype if dtype is None else dtype,
                      device=self.device if device is None else device, requires_grad=requires_grad)

    T.new_full, T.new_tensor = new_full, new_tensor
    T.multinomial = multinomial
