"""``Tensor``: an n-d array (NumPy or CuPy) plus the autograd bookkeeping.

The differentiable ops live in :mod:`~neural_arch.core.ops_basic`, :mod:`~neural_arch.core.ops_shape`
and :mod:`~neural_arch.core.ops_nn`;
this module binds them as methods and operators. The engine lives in
:mod:`neural_arch.core.autograd`.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.tensor import Tensor
    >>> w = Tensor(np.ones((3, 2)), requires_grad=True)     # float64 ndarray keeps float64
    >>> x = Tensor([[1.0, 2.0, 3.0]])                       # python lists become float32
    >>> y = (x @ w).relu().sum()
    >>> y.backward()
    >>> w.grad.shape, x.dtype
    ((3, 2), dtype('float32'))
"""

from __future__ import annotations

import weakref

import numpy as np

from .. import backend as _backend
from . import autograd as _ag
from . import dtypes as _dtypes
from .autograd import (  # noqa: F401  (re-exported: the spec names them in this module)
    RemovableHandle,
    enable_grad,
    is_backward_running,
    is_grad_enabled,
    no_grad,
    queue_callback,
    set_grad_enabled,
)
from .rng import get_generator, manual_seed  # noqa: F401  (re-exported)

__all__ = [
    "Tensor",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "is_grad_enabled",
    "queue_callback",
    "is_backward_running",
    "manual_seed",
    "get_generator",
    "tensor",
]


def _to_array(data, dtype):
    """Convert constructor input to an array without copying arrays that are already arrays."""
    if dtype is not None and type(dtype) is not np.dtype:
        dtype = _dtypes.as_dtype(dtype)  # "bfloat16", torch-style names, python types
    if type(data) is np.ndarray:
        return data if dtype is None else data.astype(dtype, copy=False)
    if isinstance(data, Tensor):
        arr = data.data
        return arr if dtype is None else arr.astype(dtype, copy=False)
    if isinstance(data, np.generic):
        # A NumPy scalar carries a dtype on purpose: keep it (0-d array).
        return np.asarray(data, dtype=dtype)
    if _backend.is_device_array(data):  # CuPy, or a device type registered with the backend
        return data if dtype is None else data.astype(dtype, copy=False)
    if isinstance(data, np.ndarray):  # ndarray subclasses (e.g. np.memmap)
        return np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
    if dtype is not None:
        return np.asarray(data, dtype=dtype)
    arr = np.asarray(data)
    # Python numbers and (nested) lists default to float32, the framework default; bools stay bool.
    if arr.dtype.kind in "fiu":
        arr = arr.astype(np.float32)
    elif arr.dtype.kind not in "bc":  # object (mixed items), strings, bytes...
        raise TypeError(
            f"Tensor(data): cannot make a tensor from {type(data).__name__} holding "
            f"mixed or non-numeric items; pass an ndarray, a number or a (nested) list of numbers"
        )
    return arr


class Tensor:
    """An array with optional gradient tracking (see the module docstring for an example).

    Args:
        data: ndarray (dtype kept, no copy), CuPy array, Tensor, python number or nested list
            (python numbers/lists become float32).
        requires_grad: record operations on this tensor so ``backward`` can compute ``.grad``.
            Only floating-point tensors may require gradients.
        dtype: optional dtype to convert to.
        device: optional ``"cpu"`` / ``"cuda[:N]"`` to place the data on.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.tensor import Tensor
        >>> w = Tensor(np.ones(3), requires_grad=True)
        >>> (w * 2).sum().backward()
        >>> w.grad.tolist(), w.dtype
        ([2.0, 2.0, 2.0], dtype('float64'))
    """

    __slots__ = ("data", "_grad", "requires_grad", "grad_fn", "_hooks", "_post_hooks", "__dict__",
                 "__weakref__")

    # Make numpy defer to our reflected operators (ndarray + Tensor -> Tensor.__radd__).
    __array_priority__ = 1000

    def __init__(self, data, requires_grad: bool = False, dtype=None, device=None):
        arr = _to_array(data, dtype)
        if device is not None:
            arr = _backend.to_device(arr, device)
        self.data = arr
        self._grad = None
        self.grad_fn = None
        self._hooks = None
        self._post_hooks = None
        if requires_grad and not _dtypes.is_floating_dtype(arr.dtype):
            raise TypeError(
                f"only floating-point tensors can require gradients, got dtype {arr.dtype}; "
                f"convert first, e.g. Tensor(data, dtype='float32', requires_grad=True)"
            )
        self.requires_grad = bool(requires_grad)

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def _wrap(cls, arr) -> "Tensor":
        """Wrap an array as a constant (no-grad) Tensor without any checks or copies."""
        t = object.__new__(Tensor)
        t.data = arr
        t._grad = None
        t.requires_grad = False
        t.grad_fn = None
        t._hooks = None
        t._post_hooks = None
        return t

    # ------------------------------------------------------------------ gradient attribute
    @property
    def grad(self):
        """The accumulated gradient (a Tensor) or None. Settable, like torch."""
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is None or isinstance(value, Tensor):
            if value is not None and value.shape != self.data.shape:
                raise RuntimeError(
                    f"assigned grad has shape {value.shape}, but the tensor has shape {self.data.shape}"
                )
            self._grad = value
        else:
            arr = _to_array(value, None) if not hasattr(value, "shape") else value
            if arr.shape != self.data.shape:
                raise RuntimeError(
                    f"assigned grad has shape {arr.shape}, but the tensor has shape {self.data.shape}"
                )
            self._grad = Tensor._wrap(arr)

    @property
    def _version(self) -> int:
        """torch's version counter: the number of in-place writes (``add_``, ``x[i] = v``,
        ``copy_`` ...) to this tensor's memory, shared with its views; an op that saved the
        tensor for backward checks it has not moved.

        Example::

            >>> import neural_arch as na
            >>> t = na.zeros(3)
            >>> v = t[1:]
            >>> _ = t.add_(1)
            >>> t._version, v._version
            (1, 1)
        """
        return _ag.version_of(self.data)

    @property
    def is_leaf(self) -> bool:
        """True for tensors created by the user (not by a recorded op)."""
        return self.grad_fn is None

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Set ``requires_grad`` in place (leaves only); returns self."""
        if self.grad_fn is not None and not requires_grad:
            raise RuntimeError("requires_grad_(False) is only allowed on leaf tensors; use .detach()")
        if requires_grad and not _dtypes.is_floating_dtype(self.data.dtype):
            raise TypeError(
                f"only floating-point tensors can require gradients, got dtype {self.data.dtype}"
            )
        self.requires_grad = bool(requires_grad)
        return self

    def retain_grad(self) -> None:
        """Also keep ``.grad`` for this non-leaf tensor after backward (a no-op on leaves).

        Example::

            >>> import neural_arch as na
            >>> y = na.ones(2, requires_grad=True) * 3
            >>> y.retain_grad()
            >>> (y * y).sum().backward()
            >>> y.grad.tolist()
            [6.0, 6.0]
        """
        if not self.requires_grad:
            # torch's error: there will never be a gradient to keep, and a silent no-op would
            # leave .grad None with no hint why
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is None:
            return
        self.grad_fn.retain = weakref.ref(self)

    # ------------------------------------------------------------------ simple properties
    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def size(self, dim=None):
        """The shape (a tuple), or the length of dimension ``dim``: torch's ``size()``.

        (Not NumPy's ``ndarray.size`` attribute: use :meth:`numel` for the element count.)

        >>> t = Tensor([[1.0, 2.0, 3.0]])
        >>> t.size(), t.size(1), t.size(-1), t.numel()
        ((1, 3), 3, 3, 3)
        """
        shape = self.data.shape
        if dim is None:
            return shape
        return shape[_check_dim(dim, len(shape))]

    def numel(self) -> int:
        """Number of elements."""
        return int(self.data.size)

    nelement = numel

    def dim(self) -> int:
        """Number of dimensions (torch's name for ``ndim``)."""
        return self.data.ndim

    ndimension = dim

    def element_size(self) -> int:
        """Bytes per element."""
        return int(self.data.dtype.itemsize)

    def is_floating_point(self) -> bool:
        """True for float16/bfloat16/float32/float64 tensors."""
        return _dtypes.is_floating_dtype(self.data.dtype) and self.data.dtype.kind != "c"

    @property
    def is_cuda(self) -> bool:
        return self.device != "cpu"

    @property
    def device(self) -> str:
        return _backend.device_of(self.data)

    @property
    def xp(self):
        """The array module (numpy or cupy) holding this tensor's data."""
        return _backend.get_array_module(self.data)

    @property
    def T(self) -> "Tensor":
        return self.transpose()

    def __len__(self) -> int:
        if self.data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    def __repr__(self) -> str:
        body = np.array2string(_backend.to_device(self.data, "cpu"), separator=", ", precision=4)
        extra = []
        if self.data.dtype != np.float32:
            extra.append(f"dtype={self.data.dtype}")
        dev = self.device
        if dev != "cpu":
            extra.append(f"device='{dev}'")
        if self.grad_fn is not None:
            extra.append(f"grad_fn={self.grad_fn!r}")
        elif self.requires_grad:
            extra.append("requires_grad=True")
        tail = (", " + ", ".join(extra)) if extra else ""
        return f"Tensor({body}{tail})"

    __hash__ = object.__hash__  # tensors are hashed by identity (comparisons return tensors)

    def __bool__(self) -> bool:
        if self.data.size != 1:
            raise RuntimeError(
                f"the truth value of a tensor with {self.data.size} elements is ambiguous; "
                f"use .any() or .all()"
            )
        return bool(self.data)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.data.dtype.kind not in "iub" or self.data.size != 1:
            raise TypeError("only integer tensors with one element can be used as an index")
        return int(self.item())

    # ------------------------------------------------------------------ conversion
    def item(self):
        """The single element as a Python number."""
        if self.data.size != 1:
            raise ValueError(f"item() needs a tensor with exactly one element, got shape {self.shape}")
        if self.data.dtype.name == "bfloat16":  # ml_dtypes scalars are not Python floats
            return float(self.data.reshape(-1)[0])
        return self.data.item() if hasattr(self.data, "item") else self.data.reshape(-1)[0]

    def tolist(self):
        """The data as (nested) Python lists of Python numbers."""
        arr = _backend.to_device(self.data, "cpu")
        if arr.dtype.name == "bfloat16":
            arr = arr.astype(np.float32)
        return arr.tolist()

    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (a view for cpu tensors, a copy for GPU ones)."""
        return _backend.to_device(self.data, "cpu")

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def detach(self) -> "Tensor":
        """A new leaf sharing the same data, with no history and no gradient."""
        return Tensor._wrap(self.data)

    def to(self, *args, **kwargs) -> "Tensor":
        """Move and/or cast, differentiably; returns ``self`` when nothing changes (like torch).

        Accepts torch's forms: ``to(device)``, ``to(dtype)``, ``to(device, dtype)``,
        ``to(other_tensor)``, and the keywords ``device=``, ``dtype=``, ``copy=``,
        ``non_blocking=`` (accepted, ignored: copies here are synchronous). An integer device is that
        CUDA device, as in torch: ``to(1)`` is ``to("cuda:1")`` (the usual ``to(local_rank)``).

        >>> import neural_arch as na
        >>> t = na.ones(2)
        >>> t.to(na.float64).dtype, t.to("cpu") is t, t.to("cpu", na.int64).dtype
        (dtype('float64'), True, dtype('int64'))
        """
        def cuda_index(device):
            # an int (not a bool: to(..., non_blocking) passes one positionally) names a CUDA device
            if isinstance(device, (int, np.integer)) and not isinstance(device, (bool, np.bool_)):
                if device < 0:
                    raise ValueError(f"to({device}): a device index must be >= 0 (an integer means cuda:N)")
                return f"cuda:{int(device)}"
            return device

        args = tuple(cuda_index(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = cuda_index(kwargs["device"])
        device, dtype, copy = _parse_to_args(args, kwargs)
        out = self
        if device is not None:
            out = _ops_shape.to_device(out, device)
        if dtype is not None:
            out = out.astype(dtype)
        if copy and out is self:
            out = _ops_shape.clone(self)
        return out

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(f"cuda:{index}")

    # ------------------------------------------------------------------ pickling / copying
    def __reduce_ex__(self, protocol):
        # The graph (closures) and hooks are process-local: a pickled or deep-copied tensor keeps
        # its data, grad, subclass and plain attributes, and becomes a leaf (like .detach()).
        state = dict(self.__dict__) if hasattr(self, "__dict__") else {}
        leaf_rg = self.requires_grad and self.grad_fn is None
        return (_rebuild_tensor, (type(self), self.data, leaf_rg, self._grad, state))

    # ------------------------------------------------------------------ autograd entry points
    def backward(self, gradient=None, retain_graph=None, create_graph: bool = False, inputs=None,
                 *, grad=None) -> None:
        """Compute gradients of this tensor w.r.t. graph leaves and accumulate them in ``.grad``.

        torch's signature: ``gradient`` defaults to 1 for single-element tensors; other shapes need
        one (a Tensor, array or number, cast to this tensor's dtype). The graph is freed afterwards
        unless ``retain_graph=True``. ``inputs`` (a tensor or a sequence of them) limits the
        accumulation to those tensors; a non-leaf among them gets ``.grad`` as with
        ``retain_grad()``. ``create_graph=True`` (higher-order gradients) is not supported: the
        backward formulas compute on arrays, so it raises rather than return a gradient without a
        graph. ``grad=`` is the older name of ``gradient``.

        Example::

            >>> import neural_arch as na
            >>> w = na.ones(2, requires_grad=True)
            >>> b = na.ones(2, requires_grad=True)
            >>> (w * 3 + b).backward(gradient=na.tensor([1.0, 2.0]), inputs=[w])
            >>> w.grad.tolist(), b.grad
            ([3.0, 6.0], None)
        """
        if grad is not None:
            if gradient is not None:
                raise TypeError("backward(): pass the gradient once, as gradient= (grad= is its older name)")
            gradient = grad
        if create_graph:
            raise NotImplementedError(
                "backward(create_graph=True): higher-order gradients are not supported here (backward "
                "formulas compute on arrays, so the gradient would have no graph); compute the second "
                "derivative analytically or by finite differences of first derivatives"
            )
        if not self.requires_grad:
            raise RuntimeError(
                "backward() called on a tensor that does not require grad: none of its inputs had "
                "requires_grad=True (or it was computed under no_grad())"
            )
        if inputs is not None:
            inputs = _check_backward_inputs(inputs)
        xp = _backend.get_array_module(self.data)
        if gradient is None:
            if self.data.size != 1:
                raise RuntimeError(
                    f"backward() without a gradient argument needs a single-element output, got shape "
                    f"{self.shape}; pass gradient=<tensor of that shape> (e.g. ones)"
                )
            g = xp.ones(self.data.shape, dtype=self.data.dtype)
        else:
            g = gradient.data if isinstance(gradient, Tensor) else xp.asarray(gradient, dtype=self.data.dtype)
            if g.dtype != self.data.dtype:
                # as torch: the gradient takes the output's dtype before anything reads it (a
                # float32 gradient would otherwise run a float64 graph's backward in float32 steps)
                g = g.astype(self.data.dtype)
            if g.shape != self.data.shape:
                if g.size == self.data.size == 1:
                    g = g.reshape(self.data.shape)
                else:
                    raise RuntimeError(
                        f"backward(gradient): gradient has shape {g.shape}, expected {self.data.shape}"
                    )
        _ag.run_backward(self, g, bool(retain_graph), Tensor._wrap, inputs)

    def register_hook(self, fn) -> RemovableHandle:
        """Call ``fn(grad)`` when the gradient w.r.t. this tensor is complete in a backward.

        For leaves it runs before the gradient is accumulated into ``.grad``. If ``fn`` returns a
        Tensor, that replaces the gradient (it must keep the gradient's shape and dtype, as in
        torch). Returns a handle with ``.remove()``.
        """
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that does not require grad")
        if self.grad_fn is not None:
            node = self.grad_fn
            if node.hooks is None:
                node.hooks = {}
            return _ag.add_hook(node.hooks, fn)
        if self._hooks is None:
            self._hooks = {}
        return _ag.add_hook(self._hooks, fn)

    def register_post_accumulate_grad_hook(self, fn) -> RemovableHandle:
        """Leaves only: call ``fn(tensor)`` once its ``.grad`` is final for the current backward.

        Fires as soon as the last contribution of this backward arrived (DDP overlaps its
        all-reduce with the rest of backward this way), exactly once per backward.
        """
        if self.grad_fn is not None:
            raise RuntimeError(
                "register_post_accumulate_grad_hook is only for leaf tensors (parameters); "
                "use register_hook on intermediate tensors"
            )
        if not self.requires_grad:
            raise RuntimeError(
                "cannot register a post-accumulate-grad hook on a tensor that does not require grad"
            )
        if self._post_hooks is None:
            self._post_hooks = {}
        return _ag.add_hook(self._post_hooks, fn)


def _check_backward_inputs(inputs) -> list:
    """``backward(inputs=...)`` as a list of tensors, with torch's errors for bad entries."""
    if isinstance(inputs, Tensor):
        inputs = [inputs]
    else:
        inputs = list(inputs)
    if not inputs:
        raise RuntimeError("`inputs` argument to `backward()` cannot be empty.")
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"backward(inputs=...): entry {i} is a {type(t).__name__}, not a Tensor")
        if not t.requires_grad:
            raise RuntimeError(
                f"backward(inputs=...): entry {i} does not require grad, so it can get no gradient"
            )
    return inputs


def _rebuild_tensor(cls, data, requires_grad, grad, state):
    t = object.__new__(cls)
    t.data = data
    t._grad = grad
    t.requires_grad = requires_grad
    t.grad_fn = None
    t._hooks = None
    t._post_hooks = None
    if state:
        t.__dict__.update(state)
    return t


def _check_dim(dim, ndim: int) -> int:
    """``dim`` normalised to ``[0, ndim)`` with torch's error for out-of-range dims."""
    lo, hi = (-ndim, ndim - 1) if ndim else (-1, 0)
    if not lo <= dim <= hi:
        raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {dim})")
    return dim % ndim if ndim else 0


def _parse_to_args(args, kwargs):
    """(device, dtype, copy) from the argument forms ``Tensor.to`` accepts."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    copy = bool(kwargs.pop("copy", False))
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword argument(s) {sorted(kwargs)}")
    for arg in args:
        if isinstance(arg, bool):
            continue  # to(device, dtype, non_blocking) positional form
        if isinstance(arg, Tensor):
            device, dtype = arg.device, arg.dtype
        elif isinstance(arg, (str, _backend.Device)) or (hasattr(arg, "type") and hasattr(arg, "index")):
            try:
                device = _backend.parse_device(arg)
            except ValueError:
                # not a device: a dtype name ("float64") is accepted too
                try:
                    dtype = _dtypes.as_dtype(arg)
                except TypeError:
                    raise ValueError(
                        f"to({arg!r}): not a device ('cpu', 'cuda', 'cuda:N') nor a dtype"
                    ) from None
        elif arg is not None:
            dtype = _dtypes.as_dtype(arg)
    return device, dtype, copy


def tensor(data, dtype=None, device=None, requires_grad: bool = False, pin_memory: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data``, with torch's dtype inference (``torch.tensor``).

    Python floats give float32, Python ints int64, Python bools bool; NumPy arrays and scalars
    keep their dtype. (The ``Tensor(data)`` constructor, like ``torch.Tensor``, gives float32 for
    any Python numbers and does not copy arrays.)

    >>> tensor([1, 2]).dtype, tensor([1.0, 2]).dtype, tensor(True).dtype
    (dtype('int64'), dtype('float32'), dtype('bool'))
    """
    if isinstance(data, Tensor):
        arr = data.data.copy()  # torch warns and suggests clone().detach(); a copy is the same
    elif isinstance(data, (np.ndarray, np.generic)) or _backend.is_device_array(data):
        arr = _backend.get_array_module(data).array(data, copy=True)
    else:
        arr = np.array(data)
        kind = arr.dtype.kind
        if kind not in "biufc":  # object (mixed items), strings, bytes...
            raise TypeError(
                f"tensor(data): cannot make a tensor from {type(data).__name__} holding mixed or "
                f"non-numeric items; pass a number, a (nested) list of numbers or an ndarray"
            )
        if dtype is None:  # (with a dtype, cast once: float64 data must not pass through float32)
            default = {"f": _dtypes.default_float_dtype, "i": np.int64, "u": np.int64, "c": np.complex64}
            arr = arr.astype(default.get(kind, arr.dtype), copy=False)
    if dtype is not None:
        arr = arr.astype(_dtypes.as_dtype(dtype), copy=False)
    return Tensor(arr, requires_grad=requires_grad, device=device)


# Ops are bound as methods at the end (they import Tensor from this module).
from . import factory as _factory
from . import ops_activation as _ops_activation
from . import ops_basic as _ops_basic
from . import ops_inplace as _ops_inplace
from . import ops_reduce as _ops_reduce
from . import ops_shape as _ops_shape
from . import tensor_methods as _tensor_methods

_ops_basic._bind_methods(Tensor)
_ops_reduce._bind_methods(Tensor)
_ops_shape._bind_methods(Tensor)
_ops_activation._bind_methods(Tensor)
_ops_inplace._bind_methods(Tensor)
_factory._bind_methods(Tensor)
_tensor_methods._bind_methods(Tensor)
